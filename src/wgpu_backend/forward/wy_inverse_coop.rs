//! Launcher of `shaders/forward/wy_inverse_coop.wgsl`: the coop path's gate-free WY inverse
//! per chunk and v-head (wy_inverse's f32 arithmetic), writing the coop scan's f16 operands on
//! the way; one workgroup per chunk and q/k head, whose Gram products serve every v-head of
//! its group.

use crate::error::{Error, Result};
use crate::tensor::DType;
use crate::wgpu_backend::coop_scan::check_coop_key_dim;
use crate::wgpu_backend::launch::{Bindings, Grid, Launch};
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::tensor::qk_heads_for;
use crate::wgpu_backend::{Context, GpuTensor};

/// The tensors the pass reads and writes.
pub struct WyInverseCoopBuffers<'a> {
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
    /// `[B·T + 64, HV, 128]` f16 (rows of chunks written): Γ⊙A⊙β then Γ⊙QKᵀ.
    pub gated16: &'a GpuTensor,
    /// `[B·T + 64, H, K]` f16 (rows of chunks written): k.
    pub k16: &'a GpuTensor,
    /// `[B·T + 64, HV, K]` f16 (rows of chunks written): γ ⊙ q per v-head.
    pub qg16: &'a GpuTensor,
}

/// Record the coop path's `A = (I + strict_lower(diag(β) K Kᵀ))⁻¹`, gated matrices and f16
/// operands for `num_chunks` chunks × `heads_v` v-heads (K = 128). The padding rows past B·T
/// are the caller's to zero.
pub fn wy_inverse_coop(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    bufs: &WyInverseCoopBuffers<'_>,
    num_chunks: usize,
    heads_v: usize,
) -> Result<()> {
    check_coop_key_dim("the coop WY inverse", bufs.k)?;
    let heads_qk = qk_heads_for(bufs.k, heads_v)?;
    for (name, t) in [
        ("gated16", bufs.gated16),
        ("k16", bufs.k16),
        ("qg16", bufs.qg16),
    ] {
        if t.dtype != DType::F16 {
            return Err(Error::DType {
                name: name.into(),
                expected: "F16".into(),
                got: t.dtype.to_string(),
            });
        }
    }
    Launch {
        name: "wy_inverse_coop",
        source: source(Pass::WyInverseCoop, bufs.k.dtype)?,
        entry: "wy_inverse_coop",
        constants: &[],
        bindings: Bindings::Ordered(&[
            params,
            bufs.k,
            bufs.q,
            bufs.gate_beta,
            bufs.chunks,
            bufs.a,
            bufs.gated16,
            bufs.k16,
            bufs.qg16,
        ]),
        grid: Grid([(num_chunks, "chunks"), (heads_qk, "q/k heads"), (1, "")]),
    }
    .record(ctx, encoder)
}
