//! Launcher of `shaders/backward/state_recompute.wgsl`: the forward scan replayed, writing the
//! chunk-start states and W, V' per token.

use crate::error::Result;
use crate::wgpu_backend::backward::{recompute_token_slice, scan_arena_words};
use crate::wgpu_backend::params::{bind, dispatch};
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::{Context, GpuTensor};

/// The tensors the replay reads and writes.
pub struct RecomputeBuffers<'a> {
    pub k: &'a GpuTensor,
    pub v: &'a GpuTensor,
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

/// Record the replay over `num_segments` segments with V-block width `v_block`.
#[allow(clippy::too_many_arguments)]
pub fn state_recompute(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    bufs: &RecomputeBuffers<'_>,
    num_segments: usize,
    heads_v: usize,
    key_dim: usize,
    value_dim: usize,
    v_block: u32,
) -> Result<()> {
    let constants = [
        ("K_DIM", key_dim as f64),
        ("V_BLOCK", v_block as f64),
        ("ARENA", scan_arena_words(v_block) as f64),
        ("T_SLICE", recompute_token_slice(key_dim as u32) as f64),
    ];
    let pipeline = ctx.pipelines.get(
        source(Pass::StateRecompute, bufs.k.dtype)?,
        "state_recompute",
        &constants,
    );
    let bg = bind(
        ctx,
        &pipeline,
        "state_recompute",
        &[
            params,
            &bufs.k.buffer,
            &bufs.v.buffer,
            &bufs.gate_beta.buffer,
            &bufs.gated.buffer,
            bufs.segments,
            &bufs.states.buffer,
            &bufs.w_vnew.buffer,
        ],
    );
    dispatch(
        encoder,
        "state_recompute",
        &pipeline,
        &bg,
        (
            num_segments as u32,
            heads_v as u32,
            (value_dim as u32) / v_block,
        ),
    );
    Ok(())
}
