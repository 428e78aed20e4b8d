//! Launcher of `shaders/forward/segment_window.wgsl`: the gate-driven window of sequence
//! parallelism, the warm-up length of every (segment, v-head) and the per-(segment, v-head)
//! segment tables of the end-state and transition scans.

use crate::error::Result;
use crate::tensor::DType;
use crate::wgpu_backend::config::SegmentWindow;
use crate::wgpu_backend::launch::{Bindings, Grid, Launch};
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::{Context, GpuTensor};

/// `warmup` of a (segment, v-head) that takes the exact transition.
#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
pub(crate) const FALLBACK: u32 = u32::MAX;

/// The buffers of [`segment_window`].
pub(crate) struct WindowBuffers<'a> {
    /// The window's segment table (start, length, slot).
    pub segments: &'a wgpu::Buffer,
    /// `[S]`: 1 where the segment is the last of its sequence (piece).
    pub last_segment: &'a wgpu::Buffer,
    /// `[tokens, HV, 2]` f32 from prepare_gate: (G, β).
    pub gate_beta: &'a GpuTensor,
    /// `[S, HV, 3]` (written): the end-state scan's rows.
    pub end_rows: &'a wgpu::Buffer,
    /// `[S, HV, 3]` (written): the transition scan's rows.
    pub trans_rows: &'a wgpu::Buffer,
    /// `[S, HV]` (written): warm-up chunks, or [`FALLBACK`].
    pub warmup: &'a wgpu::Buffer,
}

/// Record the window pass over `pairs` = segments × v-heads (`params.rows`).
pub(crate) fn segment_window(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    bufs: &WindowBuffers<'_>,
    pairs: usize,
    window: SegmentWindow,
) -> Result<()> {
    let max_warmup = window
        .max_warmup_chunks()
        .map_or(u32::MAX, |n| n.min(u32::MAX as usize) as u32);
    Launch {
        name: "segment window",
        source: source(Pass::SegmentWindow, DType::F32)?,
        entry: "segment_window",
        constants: &[
            ("THRESHOLD", window.threshold() as f64),
            ("MAX_WARMUP", max_warmup as f64),
        ],
        bindings: Bindings::Ordered(&[
            params,
            bufs.segments,
            bufs.last_segment,
            bufs.gate_beta,
            bufs.end_rows,
            bufs.trans_rows,
            bufs.warmup,
        ]),
        grid: Grid::items_64(pairs, "(segment, v-head) pairs"),
    }
    .record(ctx, encoder)
}
