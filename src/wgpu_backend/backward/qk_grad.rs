//! Launcher of `shaders/backward/qk_grad.wgsl`: dq and dk per v-head, and the gate gradient
//! of each chunk after its reverse chunk-local cumsum.

use crate::error::Result;
use crate::wgpu_backend::launch::{Bind, Bindings, Grid, Launch};
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::{Context, GpuTensor};

/// The tensors the pass reads and writes.
pub struct QkGradBuffers<'a> {
    /// `[B,T,H,K]` q in the storage dtype (normalized with `l2norm_qk`).
    pub q: &'a GpuTensor,
    /// `[B,T,H,K]` k in the storage dtype (normalized with `l2norm_qk`).
    pub k: &'a GpuTensor,
    /// dP and dAt from `wy_grad`.
    pub mats: &'a GpuTensor,
    /// The chunk table (start, length).
    pub chunks: &'a wgpu::Buffer,
    /// The state terms on entry, dq and dk per v-head on exit.
    pub dqk_parts: &'a GpuTensor,
    /// (dG, dβ) on entry, (dg, dβ) on exit.
    pub dg_dbeta: &'a GpuTensor,
}

impl QkGradBuffers<'_> {
    /// The pass's bindings in order, shared by the scalar and the coop kernel.
    pub(crate) fn ordered<'s>(&'s self, params: &'s wgpu::Buffer) -> [&'s dyn Bind; 7] {
        [
            params,
            self.q,
            self.k,
            self.mats,
            self.chunks,
            self.dqk_parts,
            self.dg_dbeta,
        ]
    }
}

/// Record the pass over `num_chunks` chunks × `heads_v` v-heads.
pub fn qk_grad(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    bufs: &QkGradBuffers<'_>,
    num_chunks: usize,
    heads_v: usize,
) -> Result<()> {
    let k = bufs.k;
    let key_dim = k.shape[k.shape.len() - 1];
    Launch {
        name: "qk_grad",
        source: source(Pass::QkGrad, k.dtype)?,
        entry: "qk_grad",
        constants: &[("K_DIM", key_dim as f64)],
        bindings: Bindings::Ordered(&bufs.ordered(params)),
        grid: Grid([(num_chunks, "chunks"), (heads_v, "v-heads"), (1, "")]),
    }
    .record(ctx, encoder)
}
