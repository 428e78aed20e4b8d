//! Launcher of `shaders/backward/dh_scan_coop.wgsl`: the reverse scan of the state gradient
//! with its chunk GEMMs on f16 cooperative matrices (f32 accumulators), writing dh per chunk,
//! dh0, and dV', dv per token as `dh_scan` does.

use crate::error::Result;
use crate::wgpu_backend::coop_scan::{
    check_coop_shapes, coop_scan_grid, head_constants, k_variant,
};
use crate::wgpu_backend::launch::{Bindings, Launch};
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::{Context, GpuTensor};

/// The tensors the coop reverse scan reads and writes.
pub struct DhScanCoopBuffers<'a> {
    /// `[rows + 64, H, K]` f16: k (from `wy_inverse_coop`), padding rows zero.
    pub k16: &'a GpuTensor,
    /// `[rows + 64, HV, K]` f16: γ ⊙ q per v-head (from `wy_inverse_coop`), padding rows zero.
    pub qg16: &'a GpuTensor,
    /// `[rows, HV, 2]` f32: the forward's (G, β).
    pub gate_beta: &'a GpuTensor,
    /// `[rows + 64, HV, 128]` f16: Γ⊙A⊙β | Γ⊙QKᵀ rows, padding rows zero.
    pub gated16: &'a GpuTensor,
    /// `[rows, HV, V]` in the storage dtype: the upstream gradient of o.
    pub d_o: &'a GpuTensor,
    /// Segment table: (start token, length, first chunk, sequence) per segment.
    pub segments: &'a wgpu::Buffer,
    /// `[chunks + N, HV, K, V]`: the gradients w.r.t. the end states in the tail slots on
    /// entry; per chunk dh and, in the tail slots, w.r.t. the start states out.
    pub dstates: &'a GpuTensor,
    /// `[2, rows, HV, V]` f32: dV', then dv.
    pub dvnew_dv: &'a GpuTensor,
}

/// Record the coop reverse scan over `num_segments` segments (K = 128, V a multiple of 32).
pub fn dh_scan_coop(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    bufs: &DhScanCoopBuffers<'_>,
    num_segments: usize,
    heads_v: usize,
) -> Result<()> {
    let value_dim = bufs.d_o.shape[bufs.d_o.shape.len() - 1];
    check_coop_shapes(
        "the coop backward",
        bufs.k16,
        value_dim,
        &[
            ("k16", bufs.k16),
            ("qg16", bufs.qg16),
            ("gated16", bufs.gated16),
        ],
    )?;
    Launch {
        name: "dh_scan_coop",
        source: source(k_variant(ctx, Pass::DhScanCoop), bufs.d_o.dtype)?,
        entry: "dh_scan_coop",
        constants: &head_constants(ctx, bufs.k16, heads_v),
        bindings: Bindings::Ordered(&[
            params,
            bufs.k16,
            bufs.qg16,
            bufs.gate_beta,
            bufs.gated16,
            bufs.d_o,
            bufs.segments,
            bufs.dstates,
            bufs.dvnew_dv,
        ]),
        grid: coop_scan_grid(num_segments, heads_v, value_dim),
    }
    .record(ctx, encoder)
}
