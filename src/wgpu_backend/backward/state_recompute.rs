//! Launcher of `shaders/backward/state_recompute.wgsl`: the forward scan replayed, writing the
//! chunk-start states and W, V' per token.

use crate::error::Result;
use crate::wgpu_backend::backward::{recompute_token_slice, scan_arena_words};
use crate::wgpu_backend::forward::ScanDims;
use crate::wgpu_backend::launch::{Bindings, Grid, Launch};
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::{Context, GpuTensor};

/// The tensors the replay reads and writes.
pub struct RecomputeBuffers<'a> {
    /// `[B,T,H,K]` k in the storage dtype (normalized with `l2norm_qk`).
    pub k: &'a GpuTensor,
    /// `[B,T,HV,V]`, in the dtype of k.
    pub v: &'a GpuTensor,
    /// `[B·T, HV, 2]` f32: the forward's (G, β).
    pub gate_beta: &'a GpuTensor,
    /// `[B·T, HV, 128]` f32: rows of Γ⊙A⊙β, then Γ⊙QKᵀ (the forward's `wy_inverse` output).
    pub gated: &'a GpuTensor,
    /// Segment table: (start token, length, first chunk, sequence) per segment.
    pub segments: &'a wgpu::Buffer,
    /// `[chunks + N, HV, K, V]`: start states in the tail slots on entry, chunk-start states out.
    pub states: &'a GpuTensor,
    /// `[2, B·T, HV, V]` f32: W, then V'.
    pub w_vnew: &'a GpuTensor,
}

/// Record the replay (`dims.v_block` from [`scan_v_block`](super::scan_v_block)).
pub fn state_recompute(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    bufs: &RecomputeBuffers<'_>,
    dims: ScanDims,
) -> Result<()> {
    let (key_dim, v_block) = (dims.key_dim, dims.v_block);
    Launch {
        name: "state_recompute",
        source: source(Pass::StateRecompute, bufs.k.dtype)?,
        entry: "state_recompute",
        constants: &[
            ("K_DIM", key_dim as f64),
            ("V_BLOCK", v_block as f64),
            ("ARENA", scan_arena_words(v_block) as f64),
            ("T_SLICE", recompute_token_slice(key_dim as u32) as f64),
        ],
        bindings: Bindings::Ordered(&[
            params,
            bufs.k,
            bufs.v,
            bufs.gate_beta,
            bufs.gated,
            bufs.segments,
            bufs.states,
            bufs.w_vnew,
        ]),
        // The V-block divides V (`scan_v_block`).
        grid: Grid([
            (dims.num_segments, "segments"),
            (dims.heads_v, "v-heads"),
            (dims.value_dim / v_block as usize, "V-blocks"),
        ]),
    }
    .record(ctx, encoder)
}
