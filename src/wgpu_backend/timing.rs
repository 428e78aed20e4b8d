//! GPU time of recorded work, from timestamp queries written into the encoder between passes.

use std::sync::Mutex;

#[cfg(not(target_arch = "wasm32"))]
use crate::error::{Error, Result};
use crate::wgpu_backend::Context;

/// Up to `capacity` labelled timestamps written into an encoder. Needs
/// `TIMESTAMP_QUERY_INSIDE_ENCODERS` (`GpuTimer::new` returns `None` without it; callers fall
/// back to wall-clock time). Use: `reset`, `mark` at span boundaries, `resolve`, submit, then
/// `read_spans` / `read_total_ms`.
pub struct GpuTimer {
    set: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    readback: wgpu::Buffer,
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))] // read natively only, for now
    period_ns: f64,
    capacity: u32,
    labels: Mutex<Vec<&'static str>>,
}

impl GpuTimer {
    /// A timer of up to `capacity` marks, or `None` when the device lacks timestamp queries
    /// inside encoders or `capacity < 2`.
    pub fn new(ctx: &Context, capacity: u32) -> Option<Self> {
        let need =
            wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS;
        if !ctx.features().contains(need) || capacity < 2 {
            return None;
        }
        let set = ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("gdn timer"),
            ty: wgpu::QueryType::Timestamp,
            count: capacity,
        });
        let size = 8 * capacity as u64;
        let buffer = |usage| {
            ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("gdn timer"),
                size,
                usage,
                mapped_at_creation: false,
            })
        };
        Some(GpuTimer {
            set,
            resolve: buffer(wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC),
            readback: buffer(wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST),
            period_ns: ctx.queue.get_timestamp_period() as f64,
            capacity,
            labels: Mutex::default(),
        })
    }

    /// Forget earlier marks (before recording a new run).
    pub fn reset(&self) {
        self.labels.lock().unwrap().clear();
    }

    /// Write a timestamp labelled `label` (the end of the span since the previous mark).
    /// Marks beyond the capacity are ignored.
    pub fn mark(&self, encoder: &mut wgpu::CommandEncoder, label: &'static str) {
        let mut labels = self.labels.lock().unwrap();
        if (labels.len() as u32) < self.capacity {
            encoder.write_timestamp(&self.set, labels.len() as u32);
            labels.push(label);
        }
    }

    /// Record the copy of the timestamps for reading (after the last mark).
    pub fn resolve(&self, encoder: &mut wgpu::CommandEncoder) {
        let n = self.labels.lock().unwrap().len() as u32;
        if n > 0 {
            encoder.resolve_query_set(&self.set, 0..n, &self.resolve, 0);
            encoder.copy_buffer_to_buffer(&self.resolve, 0, &self.readback, 0, 8 * n as u64);
        }
    }

    /// `(label, ms)` of every span between consecutive marks, once the submission that
    /// resolved them finished (blocks).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read_spans(&self, ctx: &Context) -> Result<Vec<(&'static str, f64)>> {
        let labels = self.labels.lock().unwrap().clone();
        if labels.len() < 2 {
            return Ok(Vec::new());
        }
        let slice = self.readback.slice(..8 * labels.len() as u64);
        slice.map_async(wgpu::MapMode::Read, |_| {});
        ctx.poll(wgpu::PollType::Wait {
            submission_index: None,
            timeout: None,
        })?;
        let ticks: Vec<u64> = {
            let view = slice
                .get_mapped_range()
                .map_err(|e| ctx.lost_or(Error::Gpu(e.to_string())))?;
            view.chunks_exact(8)
                .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
                .collect()
        };
        self.readback.unmap();
        Ok(ticks
            .windows(2)
            .zip(&labels[1..])
            .map(|(w, &l)| (l, w[1].wrapping_sub(w[0]) as f64 * self.period_ns / 1e6))
            .collect())
    }

    /// Milliseconds from the first mark to the last.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read_total_ms(&self, ctx: &Context) -> Result<f64> {
        Ok(self.read_spans(ctx)?.iter().map(|(_, ms)| ms).sum())
    }
}
