//! GPU time of a span of recorded work, from timestamp queries written into the encoder.

use crate::error::{Error, Result};
use crate::gpu::Context;

/// Two timestamps around a span of an encoder. Needs `TIMESTAMP_QUERY_INSIDE_ENCODERS`
/// (`GpuTimer::new` returns `None` without it; callers fall back to wall-clock time).
pub struct GpuTimer {
    set: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    readback: wgpu::Buffer,
    period_ns: f64,
}

impl GpuTimer {
    pub fn new(ctx: &Context) -> Option<Self> {
        let need = wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS;
        if !ctx.features().contains(need) {
            return None;
        }
        let set = ctx.device.create_query_set(&wgpu::QuerySetDescriptor { label: Some("gdn timer"), ty: wgpu::QueryType::Timestamp, count: 2 });
        let buffer = |usage| ctx.device.create_buffer(&wgpu::BufferDescriptor { label: Some("gdn timer"), size: 16, usage, mapped_at_creation: false });
        Some(GpuTimer {
            set,
            resolve: buffer(wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC),
            readback: buffer(wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST),
            period_ns: ctx.queue.get_timestamp_period() as f64,
        })
    }

    /// Mark the start of the span.
    pub fn begin(&self, encoder: &mut wgpu::CommandEncoder) {
        encoder.write_timestamp(&self.set, 0);
    }

    /// Mark the end of the span and record the copy of both timestamps for reading.
    pub fn end(&self, encoder: &mut wgpu::CommandEncoder) {
        encoder.write_timestamp(&self.set, 1);
        encoder.resolve_query_set(&self.set, 0..2, &self.resolve, 0);
        encoder.copy_buffer_to_buffer(&self.resolve, 0, &self.readback, 0, 16);
    }

    /// Milliseconds between begin and end, once the encoder's submission finished (blocks).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read_ms(&self, ctx: &Context) -> Result<f64> {
        let slice = self.readback.slice(..);
        slice.map_async(wgpu::MapMode::Read, |_| {});
        ctx.device.poll(wgpu::PollType::Wait { submission_index: None, timeout: None }).map_err(|e| Error::Gpu(e.to_string()))?;
        let ticks: [u64; 2] = {
            let view = slice.get_mapped_range().map_err(|e| Error::Gpu(e.to_string()))?;
            bytemuck::pod_read_unaligned(&view[..16])
        };
        self.readback.unmap();
        Ok(ticks[1].wrapping_sub(ticks[0]) as f64 * self.period_ns / 1e6)
    }
}
