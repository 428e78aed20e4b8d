//! Launcher of `shaders/backward/state_recompute_coop.wgsl`: the forward scan replayed with its
//! chunk GEMMs on f16 cooperative matrices (f32 accumulators), writing the chunk-start states
//! and W, V' per token as `state_recompute` does.

use crate::error::Result;
use crate::wgpu_backend::coop_scan::{
    check_coop_shapes, coop_scan_grid, head_constants, k_variant,
};
use crate::wgpu_backend::launch::{Bindings, Launch};
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::{Context, GpuTensor};

/// The tensors the coop replay reads and writes.
pub struct RecomputeCoopBuffers<'a> {
    /// `[rows + 64, H, K]` f16: k (from `wy_inverse_coop`), padding rows zero.
    pub k16: &'a GpuTensor,
    /// `[rows, HV, V]` in the storage dtype.
    pub v: &'a GpuTensor,
    /// `[rows, HV, 2]` f32: the forward's (G, β).
    pub gate_beta: &'a GpuTensor,
    /// `[rows + 64, HV, 128]` f16: Γ⊙A⊙β | Γ⊙QKᵀ rows (from `wy_inverse_coop`), padding rows
    /// zero.
    pub gated16: &'a GpuTensor,
    /// Segment table: (start token, length, first chunk, sequence) per segment.
    pub segments: &'a wgpu::Buffer,
    /// `[chunks + N, HV, K, V]`: start states in the tail slots on entry, chunk-start states out.
    pub states: &'a GpuTensor,
    /// `[2, rows, HV, V]` f32: W, then V'.
    pub w_vnew: &'a GpuTensor,
}

/// Record the coop replay over `num_segments` segments (K = 128, V a multiple of 32).
pub fn state_recompute_coop(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    bufs: &RecomputeCoopBuffers<'_>,
    num_segments: usize,
    heads_v: usize,
) -> Result<()> {
    let value_dim = bufs.v.shape[bufs.v.shape.len() - 1];
    check_coop_shapes(
        "the coop backward",
        bufs.k16,
        value_dim,
        &[("k16", bufs.k16), ("gated16", bufs.gated16)],
    )?;
    Launch {
        name: "state_recompute_coop",
        source: source(k_variant(ctx, Pass::StateRecomputeCoop), bufs.v.dtype)?,
        entry: "state_recompute_coop",
        constants: &head_constants(ctx, bufs.k16, heads_v),
        bindings: Bindings::Ordered(&[
            params,
            bufs.k16,
            bufs.v,
            bufs.gate_beta,
            bufs.gated16,
            bufs.segments,
            bufs.states,
            bufs.w_vnew,
        ]),
        grid: coop_scan_grid(num_segments, heads_v, value_dim),
    }
    .record(ctx, encoder)
}
