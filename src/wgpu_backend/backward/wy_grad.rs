//! Launcher of `shaders/backward/wy_grad.wgsl`: gradients through A·diag(β) and the gate-free
//! WY inverse — dβ, the Γ-mask part of dG, and dAt for dk.

use crate::error::Result;
use crate::wgpu_backend::launch::{Bindings, Grid, Launch};
use crate::wgpu_backend::shaders::{Pass, source};
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
    Launch {
        name: "wy_grad",
        source: source(Pass::WyGrad, k.dtype)?,
        entry: "wy_grad",
        constants: &[("K_DIM", key_dim as f64)],
        bindings: Bindings::Ordered(&[
            params,
            bufs.q,
            k,
            bufs.a,
            bufs.gate_beta,
            bufs.chunks,
            bufs.mats,
            bufs.dg_dbeta,
        ]),
        grid: Grid([(num_chunks, "chunks"), (heads_v, "v-heads"), (1, "")]),
    }
    .record(ctx, encoder)
}
