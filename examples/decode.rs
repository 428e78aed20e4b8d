//! Serving one GDN layer: prefill a prompt with the chunked forward, copy the final states
//! into a state pool, then decode step by step with the recurrent kernel — checked against
//! the f64 oracle on sampled sequences, then timed. Random inputs stand in for the layer's
//! projections (this crate has no GEMMs), so the timed loop is the GDN core of a decode step.
//!
//!     cargo run --release --example decode
//!     # bandwidth (issue #4 target ≥ 3.5 TB/s of state traffic on the H200):
//!     cargo run --release --example decode -- --batch 256 --heads-qk 16 --heads-v 32 \
//!         --key-dim 128 --value-dim 128 --prompt 16 --sweep
//!     # latency of one sequence (target ≤ 20 µs host time per step):
//!     cargo run --release --example decode -- --batch 1 --heads-qk 16 --heads-v 32 \
//!         --key-dim 128 --value-dim 128 --steps 2000 --sweep
//!
//! Prints the tiling, rel-L2 against the oracle, GPU time per step (timestamps around each
//! dispatch), the effective state bandwidth B·HV·K·V·4 B·2 (read + write) / GPU time beside a
//! ceiling (a vec4 compute-shader copy of the pool: the same bytes read and written), the host
//! time of a step (encode = encoder + record + finish, then submit; medians, pipelines cached)
//! and tokens/s of the pipelined loop. The host loop keeps at most `--in-flight` steps queued,
//! as a server does (it samples each token before the next step): with an unbounded run-ahead
//! no finished command encoder is ever free for wgpu to reuse, so every step creates a new
//! Vulkan command pool — that, not the decode plan, was the 131 µs "encode" at B = 256, and the
//! unbounded loop is still timed and printed to show it. `--sweep` times every tiling the
//! device fits. `--dtype bf16|f16` stores q, k, v, o in 16 bits (the state stays f32). The
//! last line starting with `RESULT` is the summary to record. Exit code 1 when the check fails.

use std::ops::Range;
use std::time::Instant;

use clap::Parser;
use gdn_wgpu::reference::{forward_heads, select_heads};
use gdn_wgpu::wgpu_backend::decode::{RecurrentStepTiles, StatePool, StateSlot};
use gdn_wgpu::wgpu_backend::{self, Context, DecodeOutputs, DecodePlan, GpuTensor, GpuTimer};
use gdn_wgpu::{DType, ForwardInputs, HostTensor, Options, Problem, RandomSpec, relative_l2};

#[derive(Parser, Debug)]
struct Args {
    #[arg(long, default_value_t = 4)]
    batch: usize,
    #[arg(long, default_value_t = 2)]
    heads_qk: usize,
    #[arg(long, default_value_t = 4)]
    heads_v: usize,
    #[arg(long, default_value_t = 64)]
    key_dim: usize,
    #[arg(long, default_value_t = 64)]
    value_dim: usize,
    /// Prompt tokens per sequence, prefilled by the chunked forward.
    #[arg(long, default_value_t = 70)]
    prompt: usize,
    /// Tokens per sequence per step (1 = decode; more = verifying speculative drafts).
    #[arg(long, default_value_t = 1)]
    tokens_per_step: usize,
    /// Decode steps checked against the oracle (inputs rewritten every step).
    #[arg(long, default_value_t = 4)]
    check_steps: usize,
    /// Timed decode steps.
    #[arg(long, default_value_t = 200)]
    steps: usize,
    /// Sequences checked against the oracle, spread over the batch.
    #[arg(long, default_value_t = 2)]
    check_sequences: usize,
    /// v-heads checked against the oracle, spread over all heads (0: all).
    #[arg(long, default_value_t = 2)]
    check_heads: usize,
    /// Time every tiling the device fits, then use the fastest.
    #[arg(long)]
    sweep: bool,
    #[arg(long)]
    state_v_first: bool,
    #[arg(long)]
    l2norm_qk: bool,
    #[arg(long)]
    beta_sigmoid: bool,
    #[arg(long)]
    gate_in_kernel: bool,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Storage dtype of q, k, v, o (the state is f32).
    #[arg(long, value_enum, default_value_t = Storage::F32)]
    dtype: Storage,
    /// Steps queued ahead of the GPU in the timed host loop (a server waits for each token).
    #[arg(long, default_value_t = 2)]
    in_flight: usize,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum Storage {
    F32,
    F16,
    Bf16,
}

/// rel-L2 tolerance of o: one rounding to the storage dtype (the oracle runs on the same
/// rounded inputs). The f32 state is held to 1e-5 whatever the dtype.
fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-5,
        DType::F16 => 5e-4,
        DType::BF16 => 3e-3,
    }
}
const STATE_TOLERANCE: f64 = 1e-5;

/// The bytes of `values` stored as `dtype` (for `queue.write_buffer` into a tensor).
fn encode(values: &[f32], dtype: DType) -> Vec<u8> {
    match dtype {
        DType::F32 => bytemuck::cast_slice(values).to_vec(),
        DType::F16 => values
            .iter()
            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
            .collect(),
        DType::BF16 => values
            .iter()
            .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
            .collect(),
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// `count` indices spread evenly over `0..len`.
fn spread(count: usize, len: usize) -> Vec<usize> {
    let count = if count == 0 { len } else { count.min(len) };
    (0..count).map(|i| i * len / count).collect()
}

/// The inputs of the tokens `ranges` of a dense problem, as a dense `[ranges.len(), L]` one.
fn select_tokens(
    p: &Problem,
    inputs: &ForwardInputs<HostTensor>,
    ranges: &[Range<usize>],
) -> gdn_wgpu::Result<(Problem, ForwardInputs<HostTensor>)> {
    let sub = Problem::new(
        ranges.len(),
        ranges[0].len(),
        p.heads_qk,
        p.heads_v,
        p.key_dim,
        p.value_dim,
        None,
        p.options,
    )?;
    let take = |t: &HostTensor, shape: &[usize]| {
        let row = t.len() / p.total_tokens();
        HostTensor::new(
            shape.to_vec(),
            ranges
                .iter()
                .flat_map(|r| t.data[r.start * row..r.end * row].iter().copied())
                .collect(),
        )
        .with_dtype(t.dtype)
    };
    let selected = ForwardInputs {
        q: take(&inputs.q, &sub.qk_shape()),
        k: take(&inputs.k, &sub.qk_shape()),
        v: take(&inputs.v, &sub.v_shape()),
        g: take(&inputs.g, &sub.gate_shape()),
        beta: take(&inputs.beta, &sub.gate_shape()),
        initial_state: None,
        a_log: inputs.a_log.clone(),
        dt_bias: inputs.dt_bias.clone(),
    };
    Ok((sub, selected))
}

/// GPU milliseconds of each of `reps` back-to-back steps recorded in one encoder (timestamps
/// between the passes), or the wall-clock average when the adapter has no timestamps.
fn gpu_ms_per_step(ctx: &Context, plan: &DecodePlan, reps: usize) -> gdn_wgpu::Result<Vec<f64>> {
    let mut encoder = ctx.create_encoder("timed steps");
    match GpuTimer::new(ctx, reps as u32 + 1) {
        Some(timer) => {
            timer.reset();
            timer.mark(&mut encoder, "start");
            for _ in 0..reps {
                plan.record(&mut encoder);
                timer.mark(&mut encoder, "step");
            }
            timer.resolve(&mut encoder);
            ctx.submit_and_wait(encoder)?;
            Ok(timer
                .read_spans(ctx)?
                .into_iter()
                .map(|(_, ms)| ms)
                .collect())
        }
        None => {
            for _ in 0..reps {
                plan.record(&mut encoder);
            }
            let start = Instant::now();
            ctx.submit_and_wait(encoder)?;
            Ok(vec![start.elapsed().as_secs_f64() * 1e3 / reps as f64])
        }
    }
}

/// A streaming copy: each invocation loads PER vec4s (256 apart, so every load instruction of
/// a warp reads consecutive 16 B) into registers, then stores them.
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

/// GPU µs of copying the whole pool into a scratch buffer with a vec4 compute shader (the same
/// bytes read and written as a decode step over every slot), for 1, 4 and 8 vec4s per
/// invocation: (vec4s per invocation, µs) of each, medians. `None` without timestamps.
/// (copy_buffer_to_buffer is no ceiling: it reached 0.85 TB/s on the H200, where a WGSL
/// streaming kernel reaches 3.9.)
fn copy_ceiling(
    ctx: &Context,
    pool: &StatePool,
    reps: usize,
) -> gdn_wgpu::Result<Option<Vec<(u32, f64)>>> {
    let Some(timer) = GpuTimer::new(ctx, reps as u32 + 1) else {
        return Ok(None);
    };
    let scratch = GpuTensor::empty(ctx, "copy scratch", &pool.tensor().shape, DType::F32)?;
    let module = ctx
        .device
        .create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("pool copy"),
            source: wgpu::ShaderSource::Wgsl(COPY_WGSL.into()),
        });
    let vec4s = (pool.tensor().bytes() / 16) as u32;
    let mut out = Vec::new();
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
                    resource: pool.tensor().buffer.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: scratch.buffer.as_entire_binding(),
                },
            ],
        });
        let groups = vec4s.div_ceil(256 * per);
        let x = groups.min(32768);
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
                .map(|(_, ms)| 1e3 * ms)
                .collect())
        };
        run(2)?; // warm-up
        out.push((per, median(run(reps)?)));
    }
    Ok(Some(out))
}

/// Host µs per step of `steps` decode steps (encode = encoder + record + finish, then
/// submit), waiting for step i − `in_flight` before encoding step i when `in_flight` is given
/// (the wait is not counted), and the loop's wall seconds.
fn host_loop(
    ctx: &Context,
    plan: &DecodePlan,
    steps: usize,
    in_flight: Option<usize>,
) -> gdn_wgpu::Result<(Vec<f64>, Vec<f64>, f64)> {
    let (mut encode_us, mut submit_us) = (Vec::with_capacity(steps), Vec::with_capacity(steps));
    let mut queued = std::collections::VecDeque::new();
    let loop_start = Instant::now();
    for _ in 0..steps {
        if let Some(depth) = in_flight {
            while queued.len() >= depth.max(1) {
                let index = queued.pop_front().unwrap();
                ctx.device
                    .poll(wgpu::PollType::Wait {
                        submission_index: Some(index),
                        timeout: None,
                    })
                    .map_err(|e| gdn_wgpu::Error::Gpu(e.to_string()))?;
            }
        }
        let t0 = Instant::now();
        let mut encoder = ctx.create_encoder("decode step");
        plan.record(&mut encoder);
        let commands = encoder.finish();
        let t1 = Instant::now();
        queued.push_back(ctx.queue.submit([commands]));
        let t2 = Instant::now();
        encode_us.push((t1 - t0).as_secs_f64() * 1e6);
        submit_us.push((t2 - t1).as_secs_f64() * 1e6);
    }
    ctx.device
        .poll(wgpu::PollType::Wait {
            submission_index: None,
            timeout: None,
        })
        .map_err(|e| gdn_wgpu::Error::Gpu(e.to_string()))?;
    ctx.check()?;
    Ok((encode_us, submit_us, loop_start.elapsed().as_secs_f64()))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let options = Options {
        l2norm_qk: args.l2norm_qk,
        beta_sigmoid: args.beta_sigmoid,
        gate_in_kernel: args.gate_in_kernel,
        state_v_first: args.state_v_first,
        ..Options::default()
    };
    let (b, h, hv, kd, vd, tps) = (
        args.batch,
        args.heads_qk,
        args.heads_v,
        args.key_dim,
        args.value_dim,
        args.tokens_per_step,
    );
    let dtype = match args.dtype {
        Storage::F32 => DType::F32,
        Storage::F16 => DType::F16,
        Storage::Bf16 => DType::BF16,
    };
    let total = args.prompt + args.check_steps * tps;
    let whole = Problem::new(b, total, h, hv, kd, vd, None, options)?;
    let step = Problem::new(b, tps, h, hv, kd, vd, None, options)?;
    println!(
        "problem: B={b} H={h} HV={hv} K={kd} V={vd}, prompt {} + {} checked steps × {tps} tokens, {} timed steps, {} state, {dtype} q/k/v/o, {options:?}",
        args.prompt,
        args.check_steps,
        args.steps,
        if args.state_v_first {
            "V-first"
        } else {
            "K-first"
        }
    );
    let ctx = Context::new_blocking()?;
    let info = ctx.adapter_info.clone().expect("context from an adapter");
    println!(
        "adapter: {} ({:?}, {:?}), driver {}",
        info.name, info.backend, info.device_type, info.driver_info
    );

    let mut inputs = RandomSpec {
        seed: args.seed,
        initial_state: false,
        ..RandomSpec::default()
    }
    .generate(&whole);
    for t in [&mut inputs.q, &mut inputs.k, &mut inputs.v] {
        *t = t.clone().with_dtype(dtype);
    }
    let pool = StatePool::for_problem(&ctx, &step, b)?;
    let slots: Vec<StateSlot> = (0..b as u32).map(StateSlot::Resume).collect();
    let o = GpuTensor::empty(&ctx, "o", &step.v_shape(), dtype)?;

    // Prefill: the chunked forward over the prompts, final states into the pool.
    let mut prefill_ms = 0.0;
    if args.prompt > 0 {
        let ranges: Vec<Range<usize>> =
            (0..b).map(|s| s * total..s * total + args.prompt).collect();
        let (prefix, prefix_inputs) = select_tokens(&whole, &inputs, &ranges)?;
        let gpu_inputs = wgpu_backend::upload_inputs(&ctx, &prefix_inputs.as_ref())?;
        let start = Instant::now();
        let mut encoder = ctx.create_encoder("prefill");
        let fwd = wgpu_backend::forward(&ctx, &mut encoder, &prefix, &gpu_inputs.as_ref())?;
        for s in 0..b {
            pool.copy_into_slot(&mut encoder, &fwd.final_state, s, s)?;
        }
        ctx.submit_and_wait(encoder)?;
        prefill_ms = start.elapsed().as_secs_f64() * 1e3;
        println!(
            "prefill: {} tokens in {prefill_ms:.2} ms (wall, incl. first-use pipeline compiles)",
            b * args.prompt
        );
    }

    // Decode steps with fresh inputs each step (queue.write_buffer into the plan's tensors).
    let column = |t: usize| -> Vec<Range<usize>> {
        (0..b)
            .map(|s| s * total + args.prompt + t * tps..s * total + args.prompt + (t + 1) * tps)
            .collect()
    };
    let (_, first) = select_tokens(&whole, &inputs, &column(0))?;
    let buffers = wgpu_backend::upload_inputs(&ctx, &first.as_ref())?;
    let outputs = DecodeOutputs {
        o: &o,
        per_token_states: None,
    };
    let mut plan = DecodePlan::new(&ctx, &step, &buffers.as_ref(), &pool, &slots, &outputs)?;
    println!(
        "default tiling: {:?}, workgroup {} invocations, {} B workgroup memory",
        plan.tiles(),
        plan.tiles().workgroup(),
        plan.tiles().workgroup_bytes()
    );
    let mut decoded_o = vec![0.0f32; whole.total_tokens() * hv * vd];
    let row = hv * vd;
    for t in 0..args.check_steps {
        let (_, step_inputs) = select_tokens(&whole, &inputs, &column(t))?;
        for (buffer, host) in [
            (&buffers.q, &step_inputs.q),
            (&buffers.k, &step_inputs.k),
            (&buffers.v, &step_inputs.v),
            (&buffers.g, &step_inputs.g),
            (&buffers.beta, &step_inputs.beta),
        ] {
            ctx.queue
                .write_buffer(&buffer.buffer, 0, &encode(&host.data, host.dtype));
        }
        let mut encoder = ctx.create_encoder("checked step");
        plan.record(&mut encoder);
        ctx.submit_and_wait(encoder)?;
        let step_o = o.download_blocking(&ctx)?;
        for (s, r) in column(t).into_iter().enumerate() {
            decoded_o[r.start * row..r.end * row]
                .copy_from_slice(&step_o.data[s * tps * row..(s + 1) * tps * row]);
        }
    }

    // The oracle over whole sequences, on sampled sequences and heads.
    let heads = spread(args.check_heads, hv);
    let pool_host = pool.tensor().download_blocking(&ctx)?;
    let (mut got_o, mut want_o, mut got_s, mut want_s) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let state_len = hv * kd * vd;
    for s in spread(args.check_sequences, b) {
        let (one, one_inputs) = select_tokens(
            &whole,
            &inputs,
            std::slice::from_ref(&(s * total..(s + 1) * total)),
        )?;
        let expected = forward_heads(&one, &one_inputs.as_ref(), &heads)?;
        let decoded = args.prompt * row..total * row;
        let from = s * total * row;
        got_o.extend(select_heads(
            &decoded_o[from + decoded.start..from + decoded.end],
            hv,
            vd,
            &heads,
        ));
        want_o.extend(select_heads(&expected.o[decoded], hv, vd, &heads));
        got_s.extend(select_heads(
            &pool_host.data[s * state_len..(s + 1) * state_len],
            hv,
            kd * vd,
            &heads,
        ));
        want_s.extend(select_heads(&expected.final_state, hv, kd * vd, &heads));
    }
    let (err_o, err_s) = (relative_l2(&got_o, &want_o), relative_l2(&got_s, &want_s));
    let passed = err_o <= tolerance(dtype) && err_s <= STATE_TOLERANCE;
    println!(
        "check vs f64 oracle ({} sequences × {} heads, prefill + {} steps): rel-L2 o {err_o:.3e}, final state {err_s:.3e} -> {}",
        spread(args.check_sequences, b).len(),
        heads.len(),
        args.check_steps,
        if passed { "PASS" } else { "FAIL" }
    );

    // Timing: the inputs stay as they are (the states keep evolving), pipelines are cached.
    let state_bytes = (b * hv * kd * vd * 4 * 2) as f64;
    let reps = args.steps.clamp(1, 512);
    let mut tilings = vec![plan.tiles()];
    if args.sweep {
        tilings = RecurrentStepTiles::candidates(&ctx.limits(), &step);
        println!(
            "sweep: {} tilings (GPU µs per step, median of {reps} back-to-back steps)",
            tilings.len()
        );
    }
    let mut best: Option<(f64, RecurrentStepTiles)> = None;
    for tiles in tilings {
        let candidate = DecodePlan::with_tiles(
            &ctx,
            &step,
            &buffers.as_ref(),
            &pool,
            &slots,
            &outputs,
            tiles,
        )?;
        gpu_ms_per_step(&ctx, &candidate, 3)?; // warm-up
        let us = 1e3 * median(gpu_ms_per_step(&ctx, &candidate, reps)?);
        if args.sweep {
            println!(
                "  v_block {:>3} vec4s/thread {:>2} row_vecs {:>2} row_lanes {:>3} workgroup {:>3} {}: {us:>9.2} µs  {:>6.3} TB/s",
                tiles.v_block,
                tiles.vec4s_per_thread,
                tiles.row_vecs,
                tiles.row_lanes,
                tiles.workgroup(),
                if tiles == plan.tiles() {
                    "(default)"
                } else {
                    "         "
                },
                state_bytes / (us * 1e-6) / 1e12
            );
        }
        if best.is_none_or(|(b, _)| us < b) {
            best = Some((us, tiles));
        }
    }
    let (gpu_us, tiles) = best.unwrap();
    plan = DecodePlan::with_tiles(
        &ctx,
        &step,
        &buffers.as_ref(),
        &pool,
        &slots,
        &outputs,
        tiles,
    )?;
    let tb_per_s = state_bytes / (gpu_us * 1e-6) / 1e12;
    let copies = copy_ceiling(&ctx, &pool, reps.min(50))?;
    let copy_tb_per_s = copies.as_ref().map(|c| {
        c.iter()
            .map(|&(_, us)| state_bytes / (us * 1e-6) / 1e12)
            .fold(0.0, f64::max)
    });

    // Host time of the decode loop: encode and submit per step, at most `in_flight` steps
    // queued (the waits are not counted); then the same with no bound, for comparison.
    let (encode_us, submit_us, loop_s) = host_loop(&ctx, &plan, args.steps, Some(args.in_flight))?;
    let host_us: Vec<f64> = encode_us
        .iter()
        .zip(&submit_us)
        .map(|(a, b)| a + b)
        .collect();
    let (encode, submit, host) = (median(encode_us), median(submit_us), median(host_us));
    let tokens_per_s = (args.steps * b * tps) as f64 / loop_s;
    let (run_ahead_encode, run_ahead_submit, run_ahead_s) =
        host_loop(&ctx, &plan, args.steps, None)?;
    let (run_ahead_encode, run_ahead_submit) = (median(run_ahead_encode), median(run_ahead_submit));

    // Latency of one step: encode + submit + wait for completion.
    let mut round_trip_us = Vec::new();
    for _ in 0..args.steps.min(200) {
        let t0 = Instant::now();
        let mut encoder = ctx.create_encoder("decode step");
        plan.record(&mut encoder);
        ctx.submit_and_wait(encoder)?;
        round_trip_us.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    let round_trip = median(round_trip_us);

    println!("tiling: {tiles:?} (workgroup {})", tiles.workgroup());
    println!(
        "GPU time per step: {gpu_us:.2} µs (median; state {:.1} MiB read + written)",
        state_bytes / 2.0 / (1 << 20) as f64
    );
    println!("effective state traffic: {tb_per_s:.3} TB/s (B·HV·K·V·4 B·2 / GPU time)");
    if let (Some(copies), Some(copy)) = (&copies, copy_tb_per_s) {
        let each: Vec<String> = copies
            .iter()
            .map(|&(per, us)| format!("{per} vec4/inv {us:.1} µs"))
            .collect();
        println!(
            "copy ceiling: {copy:.3} TB/s (vec4 compute-shader copy of the pool, read + write; {}); decode at {:.0}% of it",
            each.join(", "),
            100.0 * tb_per_s / copy
        );
    }
    println!(
        "host per step: encode {encode:.2} µs + submit {submit:.2} µs = {host:.2} µs (medians, ≤ {} steps in flight)",
        args.in_flight
    );
    println!(
        "host per step, unbounded run-ahead: encode {run_ahead_encode:.2} µs + submit {run_ahead_submit:.2} µs ({:.2} µs per step overall; once the GPU falls behind, wgpu has no finished encoder to reuse and creates a command pool per step)",
        run_ahead_s * 1e6 / args.steps as f64
    );
    println!("step with wait (encode + submit + GPU + wake-up): {round_trip:.1} µs (median)");
    println!(
        "pipelined loop (≤ {} in flight): {} steps in {:.2} ms = {tokens_per_s:.0} tokens/s ({:.2} µs per step)",
        args.in_flight,
        args.steps,
        loop_s * 1e3,
        loop_s * 1e6 / args.steps as f64
    );
    println!(
        "RESULT decode B={b} T={tps} H={h} HV={hv} K={kd} V={vd} {} {dtype} | v_block {} vec4s {} wg {} | gpu {gpu_us:.2} us/step | {tb_per_s:.3} TB/s (copy {}) | host {host:.2} us (encode {encode:.2} + submit {submit:.2}) | wait {round_trip:.1} us | {tokens_per_s:.0} tok/s | prefill {prefill_ms:.1} ms | rel-L2 o {err_o:.2e} state {err_s:.2e} {}",
        if args.state_v_first {
            "v-first"
        } else {
            "k-first"
        },
        tiles.v_block,
        tiles.vec4s_per_thread,
        tiles.workgroup(),
        copy_tb_per_s.map_or("n/a".to_string(), |c| format!("{c:.3}")),
        if passed { "PASS" } else { "FAIL" }
    );
    if !passed {
        std::process::exit(1);
    }
    Ok(())
}
