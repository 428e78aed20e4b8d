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
//! dispatch), the host time of a step (encode = encoder + record + finish, then submit;
//! medians, pipelines cached, no waits in the loop), tokens/s of the pipelined loop and the
//! effective state bandwidth B·HV·K·V·4 B·2 (read + write) / GPU time. `--sweep` times every
//! tiling the device fits. The last line starting with `RESULT` is the summary to record.
//! Exit code 1 when the check fails.

use std::ops::Range;
use std::time::Instant;

use clap::Parser;
use gdn_wgpu::gpu::decode::{RecurrentStepTiles, StatePool, StateSlot};
use gdn_wgpu::gpu::{self, Context, DecodeOutputs, DecodePlan, GpuTensor, GpuTimer};
use gdn_wgpu::reference::{forward_heads, select_heads};
use gdn_wgpu::{ForwardInputs, HostTensor, Options, Problem, RandomSpec, relative_l2};

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
}

const TOLERANCE: f64 = 1e-5;

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

fn upload(
    ctx: &Context,
    inputs: &ForwardInputs<HostTensor>,
) -> gdn_wgpu::Result<ForwardInputs<GpuTensor>> {
    let up = |name: &str, t: &HostTensor| GpuTensor::upload(ctx, name, t);
    let up_opt = |name: &str, t: &Option<HostTensor>| t.as_ref().map(|t| up(name, t)).transpose();
    Ok(ForwardInputs {
        q: up("q", &inputs.q)?,
        k: up("k", &inputs.k)?,
        v: up("v", &inputs.v)?,
        g: up("g", &inputs.g)?,
        beta: up("beta", &inputs.beta)?,
        initial_state: up_opt("initial_state", &inputs.initial_state)?,
        a_log: up_opt("A_log", &inputs.a_log)?,
        dt_bias: up_opt("dt_bias", &inputs.dt_bias)?,
    })
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

/// GPU µs of copying the whole pool into a scratch buffer (the same bytes read and written as
/// a decode step over every slot): the bandwidth ceiling to compare against. `None` without
/// timestamps.
fn copy_ceiling(ctx: &Context, pool: &StatePool, reps: usize) -> gdn_wgpu::Result<Option<f64>> {
    let bytes = pool.tensor().bytes();
    let scratch = GpuTensor::empty(
        ctx,
        "copy scratch",
        &pool.tensor().shape,
        gdn_wgpu::DType::F32,
    )?;
    let Some(timer) = GpuTimer::new(ctx, reps as u32 + 1) else {
        return Ok(None);
    };
    let mut encoder = ctx.create_encoder("copy ceiling");
    timer.reset();
    timer.mark(&mut encoder, "start");
    for _ in 0..reps {
        encoder.copy_buffer_to_buffer(&pool.tensor().buffer, 0, &scratch.buffer, 0, bytes);
        timer.mark(&mut encoder, "copy");
    }
    timer.resolve(&mut encoder);
    ctx.submit_and_wait(encoder)?;
    let spans: Vec<f64> = timer
        .read_spans(ctx)?
        .into_iter()
        .map(|(_, ms)| 1e3 * ms)
        .collect();
    Ok(Some(median(spans)))
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
    let total = args.prompt + args.check_steps * tps;
    let whole = Problem::new(b, total, h, hv, kd, vd, None, options)?;
    let step = Problem::new(b, tps, h, hv, kd, vd, None, options)?;
    println!(
        "problem: B={b} H={h} HV={hv} K={kd} V={vd}, prompt {} + {} checked steps × {tps} tokens, {} timed steps, {} state, {options:?}",
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

    let inputs = RandomSpec {
        seed: args.seed,
        initial_state: false,
        ..RandomSpec::default()
    }
    .generate(&whole);
    let pool = StatePool::for_problem(&ctx, &step, b)?;
    let slots: Vec<StateSlot> = (0..b as u32).map(StateSlot::Resume).collect();
    let o = GpuTensor::empty(&ctx, "o", &step.v_shape(), gdn_wgpu::DType::F32)?;

    // Prefill: the chunked forward over the prompts, final states into the pool.
    let mut prefill_ms = 0.0;
    if args.prompt > 0 {
        let ranges: Vec<Range<usize>> =
            (0..b).map(|s| s * total..s * total + args.prompt).collect();
        let (prefix, prefix_inputs) = select_tokens(&whole, &inputs, &ranges)?;
        let gpu_inputs = upload(&ctx, &prefix_inputs)?;
        let start = Instant::now();
        let mut encoder = ctx.create_encoder("prefill");
        let fwd = gpu::forward(&ctx, &mut encoder, &prefix, &gpu_inputs.as_ref())?;
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
    let buffers = upload(&ctx, &first)?;
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
                .write_buffer(&buffer.buffer, 0, bytemuck::cast_slice(&host.data));
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
    let passed = err_o <= TOLERANCE && err_s <= TOLERANCE;
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
                "  v_block {:>3} row_lanes {:>3} rows/thread {:>2} workgroup {:>3} {}: {us:>9.2} µs  {:>6.3} TB/s",
                tiles.v_block,
                tiles.row_lanes,
                tiles.rows_per_thread,
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
    let copy_tb_per_s =
        copy_ceiling(&ctx, &pool, reps.min(50))?.map(|us| state_bytes / (us * 1e-6) / 1e12);

    // Host time of the decode loop: encode and submit per step, no waits inside the loop.
    let (mut encode_us, mut submit_us) = (
        Vec::with_capacity(args.steps),
        Vec::with_capacity(args.steps),
    );
    let loop_start = Instant::now();
    for _ in 0..args.steps {
        let t0 = Instant::now();
        let mut encoder = ctx.create_encoder("decode step");
        plan.record(&mut encoder);
        let commands = encoder.finish();
        let t1 = Instant::now();
        ctx.queue.submit([commands]);
        let t2 = Instant::now();
        encode_us.push((t1 - t0).as_secs_f64() * 1e6);
        submit_us.push((t2 - t1).as_secs_f64() * 1e6);
    }
    ctx.device.poll(wgpu::PollType::Wait {
        submission_index: None,
        timeout: None,
    })?;
    ctx.check()?;
    let loop_s = loop_start.elapsed().as_secs_f64();
    let host_us: Vec<f64> = encode_us
        .iter()
        .zip(&submit_us)
        .map(|(a, b)| a + b)
        .collect();
    let (encode, submit, host) = (median(encode_us), median(submit_us), median(host_us));
    let tokens_per_s = (args.steps * b * tps) as f64 / loop_s;

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
    if let Some(copy) = copy_tb_per_s {
        println!(
            "copy ceiling: {copy:.3} TB/s (copy_buffer_to_buffer of the pool, read + write); decode at {:.0}% of it",
            100.0 * tb_per_s / copy
        );
    }
    println!(
        "host per step: encode {encode:.2} µs + submit {submit:.2} µs = {host:.2} µs (medians, no waits)"
    );
    println!("step with wait (encode + submit + GPU + wake-up): {round_trip:.1} µs (median)");
    println!(
        "pipelined loop: {} steps in {:.2} ms = {tokens_per_s:.0} tokens/s ({:.2} µs per step)",
        args.steps,
        loop_s * 1e3,
        loop_s * 1e6 / args.steps as f64
    );
    println!(
        "RESULT decode B={b} T={tps} H={h} HV={hv} K={kd} V={vd} {} | v_block {} row_lanes {} wg {} | gpu {gpu_us:.2} us/step | {tb_per_s:.3} TB/s (copy {}) | host {host:.2} us (encode {encode:.2} + submit {submit:.2}) | wait {round_trip:.1} us | {tokens_per_s:.0} tok/s | prefill {prefill_ms:.1} ms | rel-L2 o {err_o:.2e} state {err_s:.2e} {}",
        if args.state_v_first {
            "v-first"
        } else {
            "k-first"
        },
        tiles.v_block,
        tiles.row_lanes,
        tiles.workgroup(),
        copy_tb_per_s.map_or("n/a".to_string(), |c| format!("{c:.3}")),
        if passed { "PASS" } else { "FAIL" }
    );
    if !passed {
        std::process::exit(1);
    }
    Ok(())
}
