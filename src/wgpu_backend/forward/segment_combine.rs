//! Launcher of `shaders/forward/segment_combine.wgsl`: the sequential step of intra-device
//! sequence parallelism (start states of every segment from the segments' transitions and
//! zero-start end states).

use crate::error::Result;
use crate::tensor::DType;
use crate::wgpu_backend::launch::{Bindings, Grid, Launch};
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::{Context, GpuTensor};

/// The buffers of [`segment_combine`].
pub struct CombineBuffers<'a> {
    /// Per sequence: (first segment, segment count).
    pub seq_segments: &'a wgpu::Buffer,
    /// The problem's initial state (its layout), if any.
    pub h0: Option<&'a GpuTensor>,
    /// `[S, HV, K, K]` segment transitions.
    pub trans: &'a GpuTensor,
    /// `[S, HV, K, V]` end states from a zero start.
    pub ends: &'a GpuTensor,
    /// `[S, HV, K, V]` start states (written).
    pub starts: &'a GpuTensor,
    /// The problem's final state (its layout; written).
    pub final_state: &'a GpuTensor,
    /// With the gate-driven window: `[S, HV]` warm-up lengths from `segment_window` (a pair
    /// not marked exact takes its end state alone, and [`final_copy`] writes the final
    /// states after the final scan).
    pub warmup: Option<&'a wgpu::Buffer>,
}

/// Record the combine for `num_sequences` sequences (`params`: the problem's own).
pub fn segment_combine(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    bufs: &CombineBuffers<'_>,
    num_sequences: usize,
    heads_v: usize,
    value_dim: usize,
) -> Result<()> {
    let has_h0 = bufs.h0.is_some();
    // Without h0 the binding is never read; any f32 buffer fills it. Likewise the warm-up
    // table without the window (any u32 buffer).
    let h0 = bufs.h0.unwrap_or(bufs.ends);
    let h0_flag = ("HAS_H0", if has_h0 { 1.0 } else { 0.0 });
    let (warmup, constants): (&wgpu::Buffer, &[(&str, f64)]) = match bufs.warmup {
        Some(w) => (w, &[h0_flag, ("WINDOWED", 1.0)]),
        None => (bufs.seq_segments, &[h0_flag]),
    };
    Launch {
        name: "segment combine",
        source: source(Pass::SegmentCombine, DType::F32)?,
        entry: "combine",
        constants,
        bindings: Bindings::At(&[
            (0, params),
            (1, bufs.seq_segments),
            (2, h0),
            (3, bufs.trans),
            (4, bufs.ends),
            (5, bufs.starts),
            (6, bufs.final_state),
            (8, warmup),
        ]),
        // 16 value columns per workgroup.
        grid: Grid([
            (num_sequences, "sequences"),
            (heads_v, "v-heads"),
            (value_dim.div_ceil(16), "V-blocks of 16"),
        ]),
    }
    .record(ctx, encoder)
}

/// Record the final states of a windowed forward (after the final scan): each sequence's last
/// segment's end state, left in `starts`, into `final_state` in the problem's layout, where
/// that segment skipped its scans (`warmup` not exact).
#[allow(clippy::too_many_arguments)]
pub fn final_copy(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    seq_segments: &wgpu::Buffer,
    warmup: &wgpu::Buffer,
    starts: &GpuTensor,
    final_state: &GpuTensor,
    num_sequences: usize,
    heads_v: usize,
    value_dim: usize,
) -> Result<()> {
    Launch {
        name: "segment final copy",
        source: source(Pass::SegmentCombine, DType::F32)?,
        entry: "final_copy",
        constants: &[],
        bindings: Bindings::At(&[
            (0, params),
            (1, seq_segments),
            (5, starts),
            (6, final_state),
            (8, warmup),
        ]),
        grid: Grid([
            (num_sequences, "sequences"),
            (heads_v, "v-heads"),
            (value_dim.div_ceil(16), "V-blocks of 16"),
        ]),
    }
    .record(ctx, encoder)
}
