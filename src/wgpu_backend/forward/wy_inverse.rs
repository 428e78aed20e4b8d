//! Launcher of `shaders/forward/wy_inverse.wgsl`: the gate-free WY inverse per chunk and
//! v-head; one workgroup per chunk and q/k head, whose Gram products serve every v-head of its
//! group.

use crate::error::{Error, Result};
use crate::tensor::DType;
use crate::wgpu_backend::launch::{Bindings, Grid, Launch};
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::tensor::qk_heads_for;
use crate::wgpu_backend::{Context, GpuTensor};

/// The tensors the pass reads and writes.
pub struct WyInverseBuffers<'a> {
    /// `[B,T,H,K]` in the storage dtype (normalized with `l2norm_qk`).
    pub k: &'a GpuTensor,
    /// `[B,T,H,K]` in the storage dtype (normalized with `l2norm_qk`).
    pub q: &'a GpuTensor,
    /// `[B·T, HV, 2]` f32: (G, β) from `prepare_gate`.
    pub gate_beta: &'a GpuTensor,
    /// The chunk table (start, length).
    pub chunks: &'a wgpu::Buffer,
    /// `[B·T, HV, 64]` f32 (written).
    pub a: &'a GpuTensor,
    /// `[B·T, HV, 128]` f32 (written): rows of Γ⊙A⊙β then Γ⊙QKᵀ.
    pub gated: &'a GpuTensor,
}

/// Record `A = (I + strict_lower(diag(β) K Kᵀ))⁻¹` and the scan's gated matrices for
/// `num_chunks` chunks × `heads_v` v-heads.
pub fn wy_inverse(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    bufs: &WyInverseBuffers<'_>,
    num_chunks: usize,
    heads_v: usize,
) -> Result<()> {
    let k = bufs.k;
    let key_dim = k.shape[k.shape.len() - 1];
    let heads_qk = qk_heads_for(k, heads_v)?;
    if bufs.gated.dtype != DType::F32 {
        return Err(Error::DType {
            name: "gated".into(),
            expected: "F32".into(),
            got: bufs.gated.dtype.to_string(),
        });
    }
    Launch {
        name: "wy_inverse",
        source: source(Pass::WyInverse, k.dtype)?,
        entry: "wy_inverse",
        constants: &[("K_DIM", key_dim as f64)],
        bindings: Bindings::Ordered(&[
            params,
            k,
            bufs.q,
            bufs.gate_beta,
            bufs.chunks,
            bufs.a,
            bufs.gated,
        ]),
        grid: Grid([(num_chunks, "chunks"), (heads_qk, "q/k heads"), (1, "")]),
    }
    .record(ctx, encoder)
}
