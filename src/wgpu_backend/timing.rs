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

/// A streaming vec4 compute-shader copy: each invocation loads PER vec4s (256 apart, so every
/// load instruction of a warp reads consecutive 16 B) into registers, then stores them.
/// `copy_buffer_to_buffer` is no ceiling: it reached 0.85 TB/s on the H200, where this
/// kernel reaches 3.9.
#[cfg(not(target_arch = "wasm32"))]
const COPY_WGSL: &str = r"
@group(0) @binding(0) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<f32>>;
override PER: u32;

fn load(i: u32, j: u32, n: u32) -> vec4<f32> {
    if (j < PER && i + 256u * j < n) {
        return src[i + 256u * j];
    }
    return vec4<f32>(0.0);
}

fn store(i: u32, j: u32, n: u32, x: vec4<f32>) {
    if (j < PER && i + 256u * j < n) {
        dst[i + 256u * j] = x;
    }
}

@compute @workgroup_size(256)
fn copy(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let n = arrayLength(&src);
    let i = (wid.x + wid.y * nwg.x) * 256u * PER + t;
    let x0 = load(i, 0u, n);
    let x1 = load(i, 1u, n);
    let x2 = load(i, 2u, n);
    let x3 = load(i, 3u, n);
    let x4 = load(i, 4u, n);
    let x5 = load(i, 5u, n);
    let x6 = load(i, 6u, n);
    let x7 = load(i, 7u, n);
    store(i, 0u, n, x0);
    store(i, 1u, n, x1);
    store(i, 2u, n, x2);
    store(i, 3u, n, x3);
    store(i, 4u, n, x4);
    store(i, 5u, n, x5);
    store(i, 6u, n, x6);
    store(i, 7u, n, x7);
}
";

/// The streaming copy of [`copy_gbps`], built once over a source buffer so that its copies
/// can be timed between other work (the bench interleaves one copy of each shape with every
/// decode repetition: a ceiling measured apart, once, read 1.7 instead of 4.1 TB/s in some
/// processes on the H200).
#[cfg(not(target_arch = "wasm32"))]
pub struct CopyCeiling {
    /// (vec4s per invocation, pipeline, bind group, grid) of each copy shape.
    shapes: Vec<(u32, wgpu::ComputePipeline, wgpu::BindGroup, (u32, u32))>,
    timer: GpuTimer,
    bytes: u64,
    /// Milliseconds of every timed copy, per shape.
    times: Vec<Vec<f64>>,
    /// Keeps the scratch destination alive for the bind groups.
    _dst: wgpu::Buffer,
}

#[cfg(not(target_arch = "wasm32"))]
impl CopyCeiling {
    /// Copies of `src`'s first `bytes` (rounded down to a multiple of 16) into a scratch
    /// buffer of the same size, at 1, 4 and 8 vec4s per invocation; `None` without timestamp
    /// queries inside encoders.
    pub fn new(ctx: &Context, src: &wgpu::Buffer, bytes: u64) -> Option<Self> {
        let timer = GpuTimer::new(ctx, 2)?;
        let bytes = (bytes / 16 * 16).max(16);
        let dst = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("copy destination"),
            size: bytes,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let module = ctx
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some("pool copy"),
                source: wgpu::ShaderSource::Wgsl(COPY_WGSL.into()),
            });
        let vec4s = (bytes / 16) as u32;
        let shapes = [1u32, 4, 8]
            .into_iter()
            .map(|per| {
                let pipeline =
                    ctx.device
                        .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                            label: Some("pool copy"),
                            layout: None,
                            module: &module,
                            entry_point: Some("copy"),
                            compilation_options: wgpu::PipelineCompilationOptions {
                                constants: &[("PER", per as f64)],
                                zero_initialize_workgroup_memory: false,
                            },
                            cache: None,
                        });
                let bind_group = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some("pool copy"),
                    layout: &pipeline.get_bind_group_layout(0),
                    entries: &[
                        wgpu::BindGroupEntry {
                            binding: 0,
                            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                                buffer: src,
                                offset: 0,
                                size: std::num::NonZeroU64::new(bytes),
                            }),
                        },
                        wgpu::BindGroupEntry {
                            binding: 1,
                            resource: dst.as_entire_binding(),
                        },
                    ],
                });
                // A 2-D grid: one dimension would pass the 65535-workgroup limit on large
                // pools.
                let groups = vec4s.div_ceil(256 * per);
                let x = groups.clamp(1, 32768);
                (per, pipeline, bind_group, (x, groups.div_ceil(x)))
            })
            .collect();
        Some(CopyCeiling {
            shapes,
            timer,
            bytes,
            times: vec![Vec::new(); 3],
            _dst: dst,
        })
    }

    /// Time one copy of each shape, each in its own submission (waits for each); `keep`:
    /// whether the times count (false for warm-up copies).
    pub fn time_once(&mut self, ctx: &Context, keep: bool) -> Result<()> {
        for (i, (_, pipeline, bind_group, grid)) in self.shapes.iter().enumerate() {
            let mut encoder = ctx.create_encoder("copy ceiling");
            self.timer.reset();
            self.timer.mark(&mut encoder, "start");
            {
                let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("pool copy"),
                    timestamp_writes: None,
                });
                pass.set_pipeline(pipeline);
                pass.set_bind_group(0, bind_group, &[]);
                pass.dispatch_workgroups(grid.0, grid.1, 1);
            }
            self.timer.mark(&mut encoder, "copy");
            self.timer.resolve(&mut encoder);
            ctx.submit_and_wait(encoder)?;
            let ms = self.timer.read_total_ms(ctx)?;
            if keep {
                self.times[i].push(ms);
            }
        }
        Ok(())
    }

    /// The former measurement, for comparison: per shape, GB/s of the median of `reps`
    /// copies recorded back to back in one submission (after two warm-up copies), as
    /// `(vec4s per invocation, GB/s)`; nothing is kept.
    pub fn time_back_to_back(&self, ctx: &Context, reps: usize) -> Result<Vec<(u32, f64)>> {
        let timer = GpuTimer::new(ctx, reps as u32 + 1)
            .ok_or_else(|| Error::Gpu("timestamp queries went away".into()))?;
        let mut out = Vec::new();
        for (per, pipeline, bind_group, grid) in &self.shapes {
            let run = |reps: usize| -> Result<Vec<f64>> {
                let mut encoder = ctx.create_encoder("copy ceiling");
                timer.reset();
                timer.mark(&mut encoder, "start");
                for _ in 0..reps {
                    {
                        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                            label: Some("pool copy"),
                            timestamp_writes: None,
                        });
                        pass.set_pipeline(pipeline);
                        pass.set_bind_group(0, bind_group, &[]);
                        pass.dispatch_workgroups(grid.0, grid.1, 1);
                    }
                    timer.mark(&mut encoder, "copy");
                }
                timer.resolve(&mut encoder);
                ctx.submit_and_wait(encoder)?;
                Ok(timer
                    .read_spans(ctx)?
                    .into_iter()
                    .map(|(_, ms)| ms)
                    .collect())
            };
            run(2)?;
            let mut ms = run(reps.max(3))?;
            ms.sort_by(f64::total_cmp);
            out.push((
                *per,
                2.0 * self.bytes as f64 / (ms[ms.len() / 2] * 1e-3) / 1e9,
            ));
        }
        Ok(out)
    }

    /// `(vec4s per invocation, GB/s of the median copy, GB/s of the fastest, GB/s of the
    /// slowest, copies)` per shape, over the kept copies.
    pub fn shapes_gbps(&self) -> Vec<(u32, f64, f64, f64, usize)> {
        let gbps = |ms: f64| 2.0 * self.bytes as f64 / (ms * 1e-3) / 1e9;
        self.shapes
            .iter()
            .zip(&self.times)
            .filter(|(_, t)| !t.is_empty())
            .map(|((per, ..), t)| {
                let mut t = t.clone();
                t.sort_by(f64::total_cmp);
                (
                    *per,
                    gbps(t[t.len() / 2]),
                    gbps(t[0]),
                    gbps(t[t.len() - 1]),
                    t.len(),
                )
            })
            .collect()
    }

    /// GB/s (read + write, 10⁹ B/s) of the fastest shape's median copy; `None` before any
    /// kept copy.
    pub fn gbps(&self) -> Option<f64> {
        self.shapes_gbps()
            .into_iter()
            .map(|(_, median, ..)| median)
            .filter(|g| g.is_finite())
            .reduce(f64::max)
    }
}

/// GB/s (read + write, 10⁹ B/s) of the fastest of 1, 4 and 8 vec4s per invocation copying
/// `src` (its first `bytes`, a multiple of 16) into a scratch buffer of the same size, each the
/// median of `reps` copies timed by timestamps (one submission per copy, shapes
/// interleaved, after one warm-up round): the bandwidth ceiling of a kernel that reads and
/// writes those bytes once (the decode measures its pool against it). `None` without
/// timestamp queries inside encoders.
#[cfg(not(target_arch = "wasm32"))]
pub fn copy_gbps(
    ctx: &Context,
    src: &wgpu::Buffer,
    bytes: u64,
    reps: usize,
) -> Result<Option<f64>> {
    let Some(mut ceiling) = CopyCeiling::new(ctx, src, bytes) else {
        return Ok(None);
    };
    ceiling.time_once(ctx, false)?;
    for _ in 0..reps.max(3) {
        ceiling.time_once(ctx, true)?;
    }
    Ok(ceiling.gbps())
}
