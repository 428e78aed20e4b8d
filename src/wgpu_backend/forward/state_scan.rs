//! Launcher of `shaders/forward/state_scan.wgsl`: the sequential inter-chunk scan, writing o
//! and leaving each segment's end state in its state slot. The same file runs with f32
//! workgroup-memory operands (the scalar path) or f16 ones multiplied in f16 and accumulated
//! in f32 (the f16-math path, `Pass::StateScanF16`).

use crate::error::{Error, Result};
use crate::wgpu_backend::launch::{Bindings, Grid, Launch};
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::tuning::{
    state_scan_arena_words, state_scan_f16_arena_slots, state_scan_token_slice,
};
use crate::wgpu_backend::{Context, GpuTensor};

/// The tensors the scan reads and writes.
pub struct ScanBuffers<'a> {
    /// `[B,T,H,K]` in the storage dtype (normalized with `l2norm_qk`).
    pub q: &'a GpuTensor,
    /// `[B,T,H,K]` in the storage dtype (normalized with `l2norm_qk`).
    pub k: &'a GpuTensor,
    /// `[B,T,HV,V]`, in the dtype of k.
    pub v: &'a GpuTensor,
    /// `[B·T, HV, 2]` f32: (G, β) from `prepare_gate`.
    pub gate_beta: &'a GpuTensor,
    /// `[B·T, HV, 128]`: Γ⊙A⊙β and Γ⊙QKᵀ rows from `wy_inverse`.
    pub gated: &'a GpuTensor,
    /// Segment table: (start token, length, state slot) per segment, or per (segment, v-head)
    /// with `segments_per_head`.
    pub segments: &'a wgpu::Buffer,
    /// Whether `segments` has a row per (segment, v-head) (the gate-driven window's tables:
    /// a row of length 0 skips its workgroups).
    pub segments_per_head: bool,
    /// Start states on entry, end states on exit.
    pub state: &'a GpuTensor,
    /// `[B,T,HV,V]` (written), in the dtype of v.
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

/// The size of a sequential scan's dispatch: one workgroup per segment, v-head and V-block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanDims {
    /// Rows of the segment table: one workgroup row each.
    pub num_segments: usize,
    /// HV, the number of v-heads.
    pub heads_v: usize,
    /// K, the key head dimension.
    pub key_dim: usize,
    /// V, the value head dimension (split into V-blocks of `v_block`).
    pub value_dim: usize,
    /// V-block width (the launcher's caller picks it: `Tuning::state_scan_v_block` for the
    /// forward, `backward::scan_v_block` for the backward).
    pub v_block: u32,
}

/// Record the scan on the scalar path's f32 arithmetic.
pub fn state_scan(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    bufs: &ScanBuffers<'_>,
    dims: ScanDims,
) -> Result<()> {
    state_scan_with_math(ctx, encoder, params, bufs, dims, ScanMath::F32)
}

/// [`state_scan`] with the given operand arithmetic; `ScanMath::F16` without the device's
/// SHADER_F16 is an `Error::Unsupported`.
pub fn state_scan_with_math(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    bufs: &ScanBuffers<'_>,
    dims: ScanDims,
    math: ScanMath,
) -> Result<()> {
    let v_block = dims.v_block;
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
    let key_dim = dims.key_dim;
    let mut constants = vec![
        ("K_DIM", key_dim as f64),
        ("V_BLOCK", v_block as f64),
        ("ARENA", arena as f64),
        ("T_SLICE", state_scan_token_slice(key_dim as u32) as f64),
    ];
    // Only where set, so the plain scan's pipeline stays the one it always was.
    if bufs.segments_per_head {
        constants.push(("SEGMENTS_PER_HEAD", 1.0));
    }
    Launch {
        name: "state_scan",
        source: source(pass, bufs.q.dtype)?,
        entry: "state_scan",
        constants: &constants,
        bindings: Bindings::Ordered(&[
            params,
            bufs.q,
            bufs.k,
            bufs.v,
            bufs.gate_beta,
            bufs.gated,
            bufs.segments,
            bufs.state,
            bufs.o,
        ]),
        // The kernel masks columns past V, so the last V-block may be partial.
        grid: Grid([
            (dims.num_segments, "segments"),
            (dims.heads_v, "v-heads"),
            (dims.value_dim.div_ceil(v_block as usize), "V-blocks"),
        ]),
    }
    .record(ctx, encoder)
}
