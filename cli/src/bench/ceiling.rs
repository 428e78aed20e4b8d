//! The decode's bandwidth ceiling, measured in the same process as the decode case: a
//! streaming vec4 compute-shader copy of a buffer the size of the case's state pool (the same
//! bytes a decode step over every slot reads and writes).
//!
//! `copy_buffer_to_buffer` is no ceiling: it reached 0.85 TB/s on the H200, where this
//! streaming kernel reaches 3.9.

use gdn_wgpu::tensor::DType;
use gdn_wgpu::wgpu_backend::{Context, GpuTensor, GpuTimer};

/// Each invocation loads PER vec4s (256 apart, so every load instruction of a warp reads
/// consecutive 16 B) into registers, then stores them.
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

/// GB/s (read + write, 10⁹ B/s) of the fastest of 1, 4 and 8 vec4s per invocation copying
/// `pool_bytes`, each the median of `reps` copies; `None` without timestamp queries.
pub fn copy_gbps(ctx: &Context, pool_bytes: u64, reps: usize) -> gdn_wgpu::Result<Option<f64>> {
    let reps = reps.max(3);
    let Some(timer) = GpuTimer::new(ctx, reps as u32 + 1) else {
        return Ok(None);
    };
    let floats = (pool_bytes / 4).max(4) as usize;
    let src = GpuTensor::filled(ctx, "copy source", &[floats], DType::F32, 1.0)?;
    let dst = GpuTensor::empty(ctx, "copy destination", &[floats], DType::F32)?;
    let module = ctx
        .device
        .create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("pool copy"),
            source: wgpu::ShaderSource::Wgsl(COPY_WGSL.into()),
        });
    let vec4s = (src.bytes() / 16) as u32;
    let mut best: Option<f64> = None;
    for per in [1u32, 4, 8] {
        let pipeline = ctx
            .device
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
                    resource: src.buffer.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: dst.buffer.as_entire_binding(),
                },
            ],
        });
        // A 2-D grid: one dimension would pass the 65535-workgroup limit on large pools.
        let groups = vec4s.div_ceil(256 * per);
        let x = groups.clamp(1, 32768);
        let grid = (x, groups.div_ceil(x));
        let run = |reps: usize| -> gdn_wgpu::Result<Vec<f64>> {
            let mut encoder = ctx.create_encoder("copy ceiling");
            timer.reset();
            timer.mark(&mut encoder, "start");
            for _ in 0..reps {
                {
                    let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                        label: Some("pool copy"),
                        timestamp_writes: None,
                    });
                    pass.set_pipeline(&pipeline);
                    pass.set_bind_group(0, &bind_group, &[]);
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
        run(2)?; // compiles the pipeline and warms the caches
        let mut ms = run(reps)?;
        ms.sort_by(f64::total_cmp);
        let median = ms[ms.len() / 2];
        if median > 0.0 {
            let gbps = 2.0 * src.bytes() as f64 / (median * 1e-3) / 1e9;
            best = Some(best.map_or(gbps, |b: f64| b.max(gbps)));
        }
    }
    Ok(best)
}
