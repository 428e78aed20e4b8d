//! Launcher of `shaders/forward/state_scan.wgsl`: the sequential inter-chunk scan, writing o
//! and leaving each segment's end state in its state slot. The same file runs with f32
//! workgroup-memory operands (the scalar path) or f16 ones multiplied in f16 and accumulated
//! in f32 (the f16-math path, `Pass::StateScanF16`).

use crate::error::{Error, Result};
use crate::wgpu_backend::params::{bind, dispatch};
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::tuning::{
    state_scan_arena_words, state_scan_f16_arena_slots, state_scan_token_slice,
};
use crate::wgpu_backend::{Context, GpuTensor};

/// The tensors the scan reads and writes.
pub struct ScanBuffers<'a> {
    pub q: &'a GpuTensor,
    pub k: &'a GpuTensor,
    pub v: &'a GpuTensor,
    pub gate_beta: &'a GpuTensor,
    /// `[B·T, HV, 128]`: Γ⊙A⊙β and Γ⊙QKᵀ rows from `wy_inverse`.
    pub gated: &'a GpuTensor,
    /// Segment table: (start token, length, state slot) per segment.
    pub segments: &'a wgpu::Buffer,
    /// Start states on entry, end states on exit.
    pub state: &'a GpuTensor,
    pub o: &'a GpuTensor,
}

/// The scan's arithmetic on workgroup-memory operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanMath {
    /// f32 operands, f32 multiply-adds (the scalar path).
    F32,
    /// f16 operands multiplied in f16, four-term sums accumulated in f32 (needs SHADER_F16).
    F16,
}

/// Record the scan over `num_segments` segments with V-block width `v_block`, on the scalar
/// path's f32 arithmetic.
#[allow(clippy::too_many_arguments)]
pub fn state_scan(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    bufs: &ScanBuffers<'_>,
    num_segments: usize,
    heads_v: usize,
    key_dim: usize,
    value_dim: usize,
    v_block: u32,
) -> Result<()> {
    state_scan_with_math(
        ctx,
        encoder,
        params,
        bufs,
        num_segments,
        heads_v,
        key_dim,
        value_dim,
        v_block,
        ScanMath::F32,
    )
}

/// [`state_scan`] with the given operand arithmetic; `ScanMath::F16` without the device's
/// SHADER_F16 is an `Error::Unsupported`.
#[allow(clippy::too_many_arguments)]
pub fn state_scan_with_math(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    bufs: &ScanBuffers<'_>,
    num_segments: usize,
    heads_v: usize,
    key_dim: usize,
    value_dim: usize,
    v_block: u32,
    math: ScanMath,
) -> Result<()> {
    let (pass, arena) = match math {
        ScanMath::F32 => (Pass::StateScan, state_scan_arena_words(v_block)),
        ScanMath::F16 => {
            if !ctx.features().contains(wgpu::Features::SHADER_F16) {
                return Err(Error::unsupported(
                    "compute path",
                    "the f16-math scan on a device without SHADER_F16",
                ));
            }
            (Pass::StateScanF16, state_scan_f16_arena_slots(v_block))
        }
    };
    let max = ctx.limits().max_compute_workgroups_per_dimension as usize;
    if num_segments > max {
        return Err(Error::TooLarge {
            name: "segments".into(),
            bytes: num_segments as u64,
            limit_name: "max_compute_workgroups_per_dimension (segments)",
            limit: max as u64,
        });
    }
    let constants = [
        ("K_DIM", key_dim as f64),
        ("V_BLOCK", v_block as f64),
        ("ARENA", arena as f64),
        ("T_SLICE", state_scan_token_slice(key_dim as u32) as f64),
    ];
    let pipeline = ctx
        .pipelines
        .get(source(pass, bufs.q.dtype)?, "state_scan", &constants);
    let bg = bind(
        ctx,
        &pipeline,
        "state_scan",
        &[
            params,
            &bufs.q.buffer,
            &bufs.k.buffer,
            &bufs.v.buffer,
            &bufs.gate_beta.buffer,
            &bufs.gated.buffer,
            bufs.segments,
            &bufs.state.buffer,
            &bufs.o.buffer,
        ],
    );
    let grid = (
        num_segments as u32,
        heads_v as u32,
        (value_dim as u32).div_ceil(v_block),
    );
    dispatch(encoder, "state_scan", &pipeline, &bg, grid);
    Ok(())
}
