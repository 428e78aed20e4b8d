//! Launcher of `shaders/backward/wy_grad.wgsl`: gradients through A·diag(β) and the gate-free
//! WY inverse — dβ, the Γ-mask part of dG, and dAt for dk. One workgroup per chunk and q/k
//! head: P = Q Kᵀ and K Kᵀ once, then each v-head of the GVA group in turn.

use crate::error::Result;
use crate::wgpu_backend::launch::{Bind, Bindings, Grid, Launch};
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::tensor::qk_heads_for;
use crate::wgpu_backend::{Context, GpuTensor};

/// The tensors the pass reads and writes.
pub struct WyGradBuffers<'a> {
    /// `[B,T,H,K]` q in the storage dtype (normalized with `l2norm_qk`).
    pub q: &'a GpuTensor,
    /// `[B,T,H,K]` k in the storage dtype (normalized with `l2norm_qk`).
    pub k: &'a GpuTensor,
    /// The forward's gate-free inverse A, `[B·T, HV, 64]` f32.
    pub a: &'a GpuTensor,
    /// `[B·T, HV, 2]` f32: the forward's (G, β).
    pub gate_beta: &'a GpuTensor,
    /// The chunk table (start, length).
    pub chunks: &'a wgpu::Buffer,
    /// dP and dAb on entry, dP and dAt on exit.
    pub mats: &'a GpuTensor,
    /// `[B·T, HV, 2]` f32 (written).
    pub dg_dbeta: &'a GpuTensor,
}

impl WyGradBuffers<'_> {
    /// The pass's bindings in order, shared by the scalar and the coop kernel.
    pub(crate) fn ordered<'s>(&'s self, params: &'s wgpu::Buffer) -> [&'s dyn Bind; 8] {
        [
            params,
            self.q,
            self.k,
            self.a,
            self.gate_beta,
            self.chunks,
            self.mats,
            self.dg_dbeta,
        ]
    }
}

/// Record the pass over `num_chunks` chunks × `heads_v` v-heads.
pub fn wy_grad(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    bufs: &WyGradBuffers<'_>,
    num_chunks: usize,
    heads_v: usize,
) -> Result<()> {
    let k = bufs.k;
    let key_dim = k.shape[k.shape.len() - 1];
    let heads_qk = qk_heads_for(k, heads_v)?;
    Launch {
        name: "wy_grad",
        source: source(Pass::WyGrad, k.dtype)?,
        entry: "wy_grad",
        constants: &[("K_DIM", key_dim as f64)],
        bindings: Bindings::Ordered(&bufs.ordered(params)),
        grid: Grid([(num_chunks, "chunks"), (heads_qk, "q/k heads"), (1, "")]),
    }
    .record(ctx, encoder)
}
