//! Launcher of `shaders/backward/state_grad.wgsl`: the dq, dk and gate terms that go through
//! the chunk-start state and the chunk-end state gradient.

use crate::error::Result;
use crate::wgpu_backend::launch::{Bind, Bindings, Grid, Launch};
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::{Context, GpuTensor};

/// The tensors the pass reads and writes.
pub struct StateGradBuffers<'a> {
    /// `[B,T,HV,V]`: the upstream gradient of o, in the dtype of v.
    pub d_o: &'a GpuTensor,
    /// `[2, B·T, HV, V]` f32: W, then V' (from `state_recompute`).
    pub w_vnew: &'a GpuTensor,
    /// `[2, B·T, HV, V]` f32: dV', then dv (from `dh_scan`).
    pub dvnew_dv: &'a GpuTensor,
    /// `[chunks + N, HV, K, V]` f32: the chunk-start states from `state_recompute`.
    pub states: &'a GpuTensor,
    /// `[chunks + N, HV, K, V]` f32: the chunk-end state gradients from `dh_scan`.
    pub dstates: &'a GpuTensor,
    /// `[B·T, HV, 2]` f32: the forward's (G, β).
    pub gate_beta: &'a GpuTensor,
    /// The chunk table (start, length).
    pub chunks: &'a wgpu::Buffer,
    /// `[B·T, HV, 3K + 1]` f32.
    pub dqk_parts: &'a GpuTensor,
}

impl StateGradBuffers<'_> {
    /// The pass's bindings in order, shared by the scalar and the coop kernel.
    pub(crate) fn ordered<'s>(&'s self, params: &'s wgpu::Buffer) -> [&'s dyn Bind; 9] {
        [
            params,
            self.d_o,
            self.w_vnew,
            self.dvnew_dv,
            self.states,
            self.dstates,
            self.gate_beta,
            self.chunks,
            self.dqk_parts,
        ]
    }
}

/// Record the pass over `num_chunks` chunks × `heads_v` v-heads.
pub fn state_grad(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    bufs: &StateGradBuffers<'_>,
    num_chunks: usize,
    heads_v: usize,
    key_dim: usize,
) -> Result<()> {
    Launch {
        name: "state_grad",
        source: source(Pass::StateGrad, bufs.d_o.dtype)?,
        entry: "state_grad",
        constants: &[("K_DIM", key_dim as f64)],
        bindings: Bindings::Ordered(&bufs.ordered(params)),
        grid: Grid([(num_chunks, "chunks"), (heads_v, "v-heads"), (1, "")]),
    }
    .record(ctx, encoder)
}
