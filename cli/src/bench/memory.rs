//! Peak GPU memory of one call, measured by the device's memory allocator where wgpu exposes
//! it (Vulkan and DX12: `wgpu::Device::generate_allocator_report`), else estimated from the
//! buffer sizes (`metrics::peak_memory_estimate`) and labelled so.
//!
//! The measurement: wait until the device is idle (so buffers dropped earlier are freed), read
//! the allocator's allocated bytes, prepare the case with one input set (inputs uploaded,
//! outputs and plans created; the backward's saved forward context computed), flush the
//! uploads' staging copies, record and submit one call, and read the allocator again before
//! waiting. Nothing an op allocates is freed before its submission completes (wgpu keeps every
//! buffer a pending submission uses), so the difference is every buffer the call holds at
//! once: inputs, outputs, scratch, tables, with the allocator's alignment padding.

use serde::Serialize;

use crate::bench::BenchError;
use crate::bench::cases::{self, GpuCase, HostCase};
use crate::bench::metrics::Op;
use gdn_wgpu::Problem;
use gdn_wgpu::error::Error;
use gdn_wgpu::tensor::DType;
use gdn_wgpu::wgpu_backend::Context;

/// Where `peak_memory_bytes` comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MemorySource {
    /// Measured: the allocator's allocated bytes during the call minus those before it.
    Allocator,
    /// The backend has no allocator report (Metal, GL, WebGPU): the sum of the buffer sizes
    /// the launchers are known to allocate, which goes stale when they change.
    Estimate,
    /// The backward on every backend: the buffers the call holds (inputs, saved context,
    /// workspace, gradients), each counted once at its allocated size by the library.
    Library,
}

impl MemorySource {
    /// The name written to `memory_source` in the JSON: `allocator`, `estimate` or
    /// `library`.
    pub fn name(self) -> &'static str {
        match self {
            MemorySource::Allocator => "allocator",
            MemorySource::Estimate => "estimate",
            MemorySource::Library => "library",
        }
    }
}

/// Bytes wgpu's allocator has handed out on this device; `None` where the backend has no
/// allocator report.
pub fn allocated_bytes(ctx: &Context) -> Option<u64> {
    ctx.device
        .generate_allocator_report()
        .map(|r| r.total_allocated_bytes)
}

/// Submit whatever is pending (queued uploads) and wait until the device is idle, so that
/// buffers dropped since, and the uploads' staging copies, are freed.
fn settle(ctx: &Context) -> gdn_wgpu::Result<()> {
    ctx.queue.submit([]);
    ctx.device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| Error::Gpu(e.to_string()))?;
    ctx.check()
}

/// Prepare `prepare(1)`, measure one call of it (see the module doc), and return the case to
/// time: the measured one when `sets` is 1, else a fresh `prepare(sets)`. The peak is `None`
/// where the backend has no allocator report.
pub fn measured_case<'a>(
    ctx: &Context,
    sets: usize,
    prepare: impl Fn(usize) -> Result<Box<dyn GpuCase + 'a>, BenchError>,
) -> Result<(Box<dyn GpuCase + 'a>, Option<u64>), BenchError> {
    settle(ctx)?;
    let before = allocated_bytes(ctx);
    let one = prepare(1)?;
    settle(ctx)?;
    let mut encoder = ctx.create_encoder("gdn bench memory");
    one.record(&mut encoder, 0, None)?;
    let index = ctx.queue.submit([encoder.finish()]);
    let during = allocated_bytes(ctx);
    ctx.device
        .poll(wgpu::PollType::Wait {
            submission_index: Some(index),
            timeout: None,
        })
        .map_err(|e| Error::Gpu(e.to_string()))?;
    ctx.check()?;
    let peak = before.zip(during).map(|(b, d)| d.saturating_sub(b));
    let case = if sets == 1 {
        one
    } else {
        drop(one);
        prepare(sets)?
    };
    Ok((case, peak))
}

/// The peak GPU memory of one call of `op` on `problem` (random inputs, one input set, the
/// device's kernel variants), as `gdn bench` measures it; `None` where the backend has no
/// allocator report.
pub fn measure(
    ctx: &Context,
    op: Op,
    problem: &Problem,
    dtype: DType,
) -> Result<Option<u64>, BenchError> {
    let host = HostCase::new(problem.clone(), dtype, 0);
    let (_, peak) = measured_case(ctx, 1, |sets| {
        cases::prepare(ctx, op, &host, None, DType::F32, sets, 0)
    })?;
    Ok(peak)
}
