//! Launcher of `shaders/backward/state_recompute_coop.wgsl`: the forward scan replayed with its
//! chunk GEMMs on f16 cooperative matrices (f32 accumulators), writing the chunk-start states
//! and W, V' per token as `state_recompute` does.

use crate::error::{Error, Result};
use crate::tensor::DType;
use crate::wgpu_backend::launch::{Bindings, Grid, Launch};
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::tuning::{COOP_KEY_DIM, COOP_V_BLOCK};
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
    let key_dim = bufs.k16.shape[bufs.k16.shape.len() - 1];
    let value_dim = bufs.v.shape[bufs.v.shape.len() - 1];
    if key_dim != COOP_KEY_DIM || !value_dim.is_multiple_of(COOP_V_BLOCK) {
        return Err(Error::unsupported(
            "compute path",
            format!(
                "the coop backward at K = {key_dim}, V = {value_dim} (needs K = {COOP_KEY_DIM}, V a multiple of {COOP_V_BLOCK})"
            ),
        ));
    }
    for (name, t) in [("k16", bufs.k16), ("gated16", bufs.gated16)] {
        if t.dtype != DType::F16 {
            return Err(Error::DType {
                name: name.into(),
                expected: "F16".into(),
                got: t.dtype.to_string(),
            });
        }
    }
    Launch {
        name: "state_recompute_coop",
        source: source(Pass::StateRecomputeCoop, bufs.v.dtype)?,
        entry: "state_recompute_coop",
        constants: &[],
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
        grid: Grid([
            (num_segments, "segments"),
            (heads_v, "v-heads"),
            (value_dim / COOP_V_BLOCK, "V-blocks"),
        ]),
    }
    .record(ctx, encoder)
}
