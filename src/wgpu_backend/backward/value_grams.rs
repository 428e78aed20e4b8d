//! Launcher of `shaders/backward/value_grams.wgsl`: dP = scale·Γ⊙(dO V'ᵀ) and
//! dAb = Γ⊙(dV' Wᵀ) per chunk and v-head.

use crate::error::Result;
use crate::wgpu_backend::launch::{Bind, Bindings, Grid, Launch};
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::{Context, GpuTensor};

/// The tensors the pass reads and writes.
pub struct ValueGramsBuffers<'a> {
    /// `[B,T,HV,V]`: the upstream gradient of o, in the dtype of v.
    pub d_o: &'a GpuTensor,
    /// `[2, B·T, HV, V]` f32: W, then V' (from `state_recompute`).
    pub w_vnew: &'a GpuTensor,
    /// `[2, B·T, HV, V]` f32: dV', then dv (from `dh_scan`).
    pub dvnew_dv: &'a GpuTensor,
    /// `[B·T, HV, 2]` f32: the forward's (G, β).
    pub gate_beta: &'a GpuTensor,
    /// The chunk table (start, length).
    pub chunks: &'a wgpu::Buffer,
    /// `[2, B·T, HV, 64]` f32 (written).
    pub mats: &'a GpuTensor,
}

impl ValueGramsBuffers<'_> {
    /// The pass's bindings in order, shared by the scalar and the coop kernel.
    pub(crate) fn ordered<'s>(&'s self, params: &'s wgpu::Buffer) -> [&'s dyn Bind; 7] {
        [
            params,
            self.d_o,
            self.w_vnew,
            self.dvnew_dv,
            self.gate_beta,
            self.chunks,
            self.mats,
        ]
    }
}

/// Record the pass over `num_chunks` chunks × `heads_v` v-heads.
pub fn value_grams(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    bufs: &ValueGramsBuffers<'_>,
    num_chunks: usize,
    heads_v: usize,
) -> Result<()> {
    Launch {
        name: "value_grams",
        source: source(Pass::ValueGrams, bufs.d_o.dtype)?,
        entry: "value_grams",
        constants: &[],
        bindings: Bindings::Ordered(&bufs.ordered(params)),
        grid: Grid([(num_chunks, "chunks"), (heads_v, "v-heads"), (1, "")]),
    }
    .record(ctx, encoder)
}
