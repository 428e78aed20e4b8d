//! Decoding with a state pool: each sequence's state stays on the GPU between steps, a
//! `DecodePlan` is built once, and every step writes the next token's inputs into the plan's
//! tensors, records the plan and reads o. The result agrees with the f64 oracle run over the
//! whole sequences (tolerance from the crate's policy).
//!
//!     cargo run --release --example decode                  # B = 4, 8 steps, vs the oracle
//!     cargo run --release --example decode -- --pool bf16   # the same on a bf16 state pool
//!
//! Serving-loop timing (`--bench`): after the same oracle check on the timed heads, dims,
//! dtypes and tiling (B = 4, 8 steps) and `--warm-ms` (300) of back-to-back steps to bring
//! the GPU to its loaded clocks, it steps B sequences one token at a time the way a server
//! does — one command buffer per step, submitted without waiting, at most 2 steps in flight —
//! and prints one JSON line:
//! - `gpu_us`: GPU time per step from timestamps written before and after each step's pass
//!   (median, min), `gpu_batched_us`: `steps` passes in one encoder / steps, and
//!   `gpu_pipelined_us`: the pipelined loop below (one command buffer per step) timed from
//!   one timestamp before its first step to one after its last, / steps (gaps between
//!   submissions included, no timestamps between the steps); `empty_pipelined_us` the same
//!   with the empty pass;
//! - `state_gbps`: the pool read and written once per step / `gpu_us`;
//! - `copy_gbps`: a vec4 compute-shader copy of the very pool buffer, timed in the same
//!   process (`timing::copy_gbps`), and `of_copy = state_gbps / copy_gbps`;
//! - `empty_us`, `empty_batched_us`: the same two for an empty dispatch (one invocation, no
//!   bindings) in place of the step's pass — the fixed cost of a pass by these timestamps;
//!   `marks_us`: two timestamps with nothing between them; `copy_us`: the copy's time;
//! - `host_us`: host time per step of encoder creation + `DecodePlan::record` + finish +
//!   submit (median, p90), measured in a pipelined loop without timestamps, and its parts
//!   (`host_encoder_us`, `host_record_us`, `host_finish_us`, `host_submit_us`, medians);
//!   `host_empty_us` the same loop with the empty pass (`host_empty_finish_us`,
//!   `host_empty_submit_us` its finish and submit); `host_writes_us` the same plus the
//!   five `queue.write_buffer`s that refill q, k, v, g, β; `period_us`: wall time of that
//!   loop per step (the token rate of a host-bound loop).
//!
//! ```text
//! decode --bench --batch 256 --heads 16/32 --dim 128 [--dtype f32|bf16|f16]
//!        [--pool f32|bf16] [--tiles sg32|64x32|…] [--v-first] [--steps 200] [--warm-ms 300]
//!        [--host-only] [--depth 2] [--spin] [--pin gpu|0-13,15]
//! ```
//!
//! Host-step diagnosis: `--host-only` runs only the host loops (three rounds of the plan's and
//! the empty pass's) and prints per round the median of every part of a step (`enc`, `rec`,
//! `fin`, `sub`), the wait for the step `--depth` back (`wait`), p90, the loop period and the
//! mean parts of the slowest quarter of the steps (`slow4`), with the CPU the thread ran on
//! and its context switches. `--depth N` keeps N steps in flight (2), `--spin` waits by
//! polling without sleeping, `--pin` pins the host thread (`gpu`: the CPUs sysfs lists as
//! local to the adapter; or a CPU list).
//!
//! Accuracy over many steps (`--accuracy N`): B = 2 sequences, HV = 4, K = V = `--dim` (32 by
//! default) decoded token by token for N steps through an f32 and a bf16 pool (both starting
//! from the same bf16-representable h0), printing the relative L2 error of o (all tokens so
//! far) and of the states against the f64 oracle at steps 1, 16, 256, 1024 and N.

use std::time::Instant;

use gdn_wgpu::tolerance::{Case, Op, Quantity};
use gdn_wgpu::wgpu_backend::decode::{RecurrentStepTiles, StatePool, StateSlot, decode_host_in};
use gdn_wgpu::wgpu_backend::{
    self, Context, DecodeOutputs, DecodePlan, GpuTensor, GpuTimer, StateLayout, timing,
};
use gdn_wgpu::{DType, ForwardInputs, HostTensor, Options, Problem, RandomSpec};
use gdn_wgpu::{reference, relative_l2};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

#[derive(Debug, Clone)]
struct Args {
    bench: bool,
    accuracy: Option<usize>,
    batch: usize,
    heads: (usize, usize),
    dim: Option<usize>,
    dtype: DType,
    pool: DType,
    tiles: Option<String>,
    v_first: bool,
    steps: usize,
    warm_ms: f64,
    host_only: bool,
    depth: usize,
    spin: bool,
    pin: Option<String>,
}

fn dtype(s: &str) -> Res<DType> {
    match s {
        "f32" => Ok(DType::F32),
        "bf16" => Ok(DType::BF16),
        "f16" => Ok(DType::F16),
        _ => Err(format!("unknown dtype {s:?} (f32, bf16, f16)").into()),
    }
}

fn parse() -> Res<Args> {
    let mut a = Args {
        bench: false,
        accuracy: None,
        batch: 256,
        heads: (16, 32),
        dim: None,
        dtype: DType::F32,
        pool: DType::F32,
        tiles: None,
        v_first: false,
        steps: 200,
        warm_ms: 300.0,
        host_only: false,
        depth: 2,
        spin: false,
        pin: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--bench" => a.bench = true,
            "--v-first" => a.v_first = true,
            "--host-only" => a.host_only = true,
            "--spin" => a.spin = true,
            "--pin" => a.pin = Some(value()?),
            "--depth" => a.depth = value()?.parse()?,
            "--accuracy" => a.accuracy = Some(value()?.parse()?),
            "--batch" => a.batch = value()?.parse()?,
            "--dim" => a.dim = Some(value()?.parse()?),
            "--steps" => a.steps = value()?.parse()?,
            "--warm-ms" => a.warm_ms = value()?.parse()?,
            "--dtype" => a.dtype = dtype(&value()?)?,
            "--pool" => a.pool = dtype(&value()?)?,
            "--tiles" => a.tiles = Some(value()?),
            "--heads" => {
                let v = value()?;
                let (h, hv) = v.split_once('/').ok_or("--heads H/HV")?;
                a.heads = (h.parse()?, hv.parse()?);
            }
            _ => return Err(format!("unknown flag {flag}").into()),
        }
    }
    Ok(a)
}

fn main() -> Res<()> {
    let args = parse()?;
    let ctx = Context::new_blocking()?;
    if let Some(pin) = &args.pin {
        let cpus = pin_thread(&ctx, pin)?;
        eprintln!("pinned to CPUs {cpus:?}");
    }
    if let Some(steps) = args.accuracy {
        return accuracy(&ctx, &args, steps);
    }
    let (h, hv, dim) = if args.bench {
        (args.heads.0, args.heads.1, args.dim.unwrap_or(128))
    } else {
        (2, 4, args.dim.unwrap_or(64))
    };
    let options = Options {
        state_v_first: args.v_first,
        ..Options::default()
    };
    let pass = check(&ctx, &args, h, hv, dim, options)?;
    if !pass {
        std::process::exit(1);
    }
    if args.bench {
        bench(&ctx, &args, h, hv, dim, options)?;
    }
    Ok(())
}

/// The tiling `--tiles` names for `p` (the plan's default without it).
fn tiles_for(ctx: &Context, args: &Args, p: &Problem) -> Res<RecurrentStepTiles> {
    Ok(match &args.tiles {
        Some(name) => RecurrentStepTiles::named(ctx, p, name, "--tiles")?,
        None => RecurrentStepTiles::choose_for(ctx, p)?,
    })
}

/// B = 4 sequences decoded for T = 8 steps, one token each, through a plan; o and the pool
/// against the oracle over the whole sequences.
fn check(
    ctx: &Context,
    args: &Args,
    h: usize,
    hv: usize,
    dim: usize,
    options: Options,
) -> Res<bool> {
    let (b, t) = (4, 8);
    let whole = Problem::new(b, t, h, hv, dim, dim, None, options)?;
    let step = Problem::new(b, 1, h, hv, dim, dim, None, options)?;
    let mut inputs = RandomSpec::default().generate(&whole);
    for x in [&mut inputs.q, &mut inputs.k, &mut inputs.v] {
        *x = x.clone().with_dtype(args.dtype);
    }
    // The pool holds h0 in its dtype; the oracle starts from the same values.
    let h0 = inputs.initial_state.take().expect("RandomSpec gives h0");
    let pool_h0 = h0.with_dtype(args.pool);
    inputs.initial_state = Some(HostTensor {
        dtype: DType::F32,
        ..pool_h0.clone()
    });

    // Slot s of the pool holds sequence s's state, starting from its initial state.
    let pool = StatePool::from_tensor(
        GpuTensor::upload(ctx, "pool", &pool_h0)?,
        StateLayout::of(&step),
    )?;
    let slots: Vec<StateSlot> = (0..b as u32).map(StateSlot::Resume).collect();

    // Token i of every sequence, as the inputs of one step.
    let token = |i: usize| {
        let take = |x: &HostTensor, shape: &[usize]| {
            let row = x.len() / (b * t);
            let data = (0..b).flat_map(|s| &x.data[(s * t + i) * row..][..row]);
            HostTensor {
                dtype: x.dtype,
                ..HostTensor::new(shape.to_vec(), data.copied().collect())
            }
        };
        ForwardInputs {
            q: take(&inputs.q, &step.qk_shape()),
            k: take(&inputs.k, &step.qk_shape()),
            v: take(&inputs.v, &step.v_shape()),
            g: take(&inputs.g, &step.gate_shape()),
            beta: take(&inputs.beta, &step.gate_shape()),
            initial_state: None,
            a_log: None,
            dt_bias: None,
        }
    };
    let tiles = tiles_for(ctx, args, &step)?;
    let mut decoded = vec![0.0f32; b * t * whole.heads_v * whole.value_dim];
    let row = whole.heads_v * whole.value_dim;
    for i in 0..t {
        // Fresh tensors per step keep this check simple; a server refills the plan's tensors
        // (the --bench loop's `host_writes_us`).
        let buffers = wgpu_backend::upload_inputs(ctx, &token(i).as_ref())?;
        let o = GpuTensor::empty(ctx, "o", &step.v_shape(), args.dtype)?;
        let outputs = DecodeOutputs {
            o: &o,
            per_token_states: None,
        };
        // Pipelines, bind groups and tiling are chosen once per plan.
        let plan = DecodePlan::with_tiles(
            ctx,
            &step,
            &buffers.as_ref(),
            &pool,
            &slots,
            &outputs,
            tiles,
        )?;
        let mut encoder = ctx.create_encoder("decode step");
        plan.record(&mut encoder);
        ctx.submit_and_wait(encoder)?;
        let step_o = o.download_blocking(ctx)?;
        for s in 0..b {
            decoded[(s * t + i) * row..][..row].copy_from_slice(&step_o.data[s * row..][..row]);
        }
    }

    let want = reference::forward(&whole, &inputs.as_ref())?;
    let states = pool.tensor().download_blocking(ctx)?;
    let case = Case::new(Op::Decode, args.dtype);
    let mut pass = true;
    // A bf16 pool rounds the state once per step (≤ 2⁻⁹ relative each): allow T of them.
    let rounding = if args.pool == DType::BF16 {
        2e-3 * t as f64
    } else {
        0.0
    };
    for (name, got, want, quantity) in [
        ("o", &decoded, &want.o, Quantity::Output),
        ("state", &states.data, &want.final_state, Quantity::State),
    ] {
        let (err, tol) = (relative_l2(got, want), case.tolerance(quantity) + rounding);
        println!(
            "{name}: rel-L2 {err:.2e} against the oracle (tolerance {tol:.1e}; tiling {}, pool {})",
            tiles.name(),
            args.pool
        );
        pass &= err <= tol; // NaN fails too
    }
    println!("{}", if pass { "PASS" } else { "FAIL" });
    Ok(pass)
}

/// Host values in a storage dtype's bytes.
fn encode(values: &[f32], dtype: DType) -> Vec<u8> {
    match dtype {
        DType::F32 => bytemuck::cast_slice(values).to_vec(),
        DType::BF16 => values
            .iter()
            .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
            .collect(),
        DType::F16 => values
            .iter()
            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
            .collect(),
    }
}

/// Pins this thread to `which`: `gpu` (the CPUs local to the adapter's PCI device, as sysfs
/// lists them, within the ones this process may use) or a list of CPU numbers (`3`, `0,2`).
#[cfg(target_os = "linux")]
fn pin_thread(ctx: &Context, which: &str) -> Res<Vec<usize>> {
    // SAFETY: cpu_set_t is plain data; the calls get its correct size.
    let mut allowed: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    if unsafe { libc::sched_getaffinity(0, size, &mut allowed) } != 0 {
        return Err("sched_getaffinity failed".into());
    }
    let wanted: Vec<usize> = if which == "gpu" {
        let bus = ctx
            .adapter_info
            .as_ref()
            .map(|i| i.device_pci_bus_id.clone())
            .unwrap_or_default();
        let list = std::fs::read_to_string(format!("/sys/bus/pci/devices/{bus}/local_cpulist"))
            .map_err(|e| format!("the adapter's local CPUs (PCI bus id {bus:?}): {e}"))?;
        cpu_list(list.trim())?
    } else {
        cpu_list(which)?
    };
    let cpus: Vec<usize> = wanted
        .into_iter()
        .filter(|&c| c < libc::CPU_SETSIZE as usize && unsafe { libc::CPU_ISSET(c, &allowed) })
        .collect();
    if cpus.is_empty() {
        return Err(format!("--pin {which}: none of those CPUs is allowed to this process").into());
    }
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in &cpus {
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    if unsafe { libc::sched_setaffinity(0, size, &set) } != 0 {
        return Err("sched_setaffinity failed".into());
    }
    Ok(cpus)
}

#[cfg(not(target_os = "linux"))]
fn pin_thread(_: &Context, _: &str) -> Res<Vec<usize>> {
    Err("--pin: Linux only".into())
}

/// `0-3,8,10-11` → [0, 1, 2, 3, 8, 10, 11].
#[cfg(target_os = "linux")]
fn cpu_list(s: &str) -> Res<Vec<usize>> {
    let mut out = Vec::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => out.extend(a.trim().parse::<usize>()?..=b.trim().parse::<usize>()?),
            None => out.push(part.trim().parse()?),
        }
    }
    Ok(out)
}

/// The CPU this thread last ran on and its (voluntary, involuntary) context switches so far
/// (Linux; -1 elsewhere).
fn thread_cpu() -> (i64, String) {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap_or_default();
    let cpu = stat
        .rsplit(')')
        .next()
        .and_then(|rest| rest.split_whitespace().nth(36))
        .and_then(|f| f.parse().ok())
        .unwrap_or(-1);
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap_or("-1")
            .to_string()
    };
    (
        cpu,
        format!(
            "[{},{}]",
            field("voluntary_ctxt_switches"),
            field("nonvoluntary_ctxt_switches")
        ),
    )
}

fn median(mut x: Vec<f64>) -> f64 {
    x.sort_by(f64::total_cmp);
    x[x.len() / 2]
}

fn quantile(mut x: Vec<f64>, q: f64) -> f64 {
    x.sort_by(f64::total_cmp);
    x[((x.len() - 1) as f64 * q).round() as usize]
}

/// The serving loop, timed (see the header).
fn bench(ctx: &Context, args: &Args, h: usize, hv: usize, dim: usize, options: Options) -> Res<()> {
    let b = args.batch;
    let steps = args.steps.max(10);
    let p = Problem::new(b, 1, h, hv, dim, dim, None, options)?;
    let spec = RandomSpec {
        initial_state: false,
        ..RandomSpec::default()
    };
    let mut host = spec.generate(&p);
    for x in [&mut host.q, &mut host.k, &mut host.v] {
        *x = x.clone().with_dtype(args.dtype);
    }
    let inputs = wgpu_backend::upload_inputs(ctx, &host.as_ref())?;
    // The bytes a server writes per step, encoded beforehand (as its sampler would).
    let refills: Vec<(&wgpu::Buffer, Vec<u8>)> = [
        (&inputs.q, &host.q),
        (&inputs.k, &host.k),
        (&inputs.v, &host.v),
        (&inputs.g, &host.g),
        (&inputs.beta, &host.beta),
    ]
    .into_iter()
    .map(|(gpu, x)| (&gpu.buffer, encode(&x.data, x.dtype)))
    .collect();
    // A zeroed pool: the kernel's traffic and arithmetic do not depend on the values.
    let pool = StatePool::for_problem_in(ctx, &p, b, args.pool)?;
    let o = GpuTensor::empty(ctx, "o", &p.v_shape(), args.dtype)?;
    let slots: Vec<StateSlot> = (0..b as u32).map(StateSlot::Resume).collect();
    let outputs = DecodeOutputs {
        o: &o,
        per_token_states: None,
    };
    let tiles = tiles_for(ctx, args, &p)?;
    let plan = DecodePlan::with_tiles(ctx, &p, &inputs.as_ref(), &pool, &slots, &outputs, tiles)?;
    let wait = |index: wgpu::SubmissionIndex| -> Res<()> {
        if args.spin {
            // Poll without sleeping until the step is done (the thread stays on its core).
            loop {
                match ctx.device.poll(wgpu::PollType::Wait {
                    submission_index: Some(index.clone()),
                    timeout: Some(std::time::Duration::ZERO),
                }) {
                    Ok(_) => return Ok(()),
                    Err(wgpu::PollError::Timeout) => std::hint::spin_loop(),
                    Err(e) => return Err(e.into()),
                }
            }
        }
        ctx.device.poll(wgpu::PollType::Wait {
            submission_index: Some(index),
            timeout: None,
        })?;
        Ok(())
    };
    // An empty dispatch (one invocation, no bindings) in its own pass: the fixed cost of a
    // step's pass by the same timestamps, without any of the kernel's work.
    let empty_pipeline = {
        let module = ctx
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some("empty"),
                source: wgpu::ShaderSource::Wgsl(
                    "@compute @workgroup_size(1) fn empty() {}".into(),
                ),
            });
        ctx.device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some("empty"),
                layout: None,
                module: &module,
                entry_point: Some("empty"),
                compilation_options: Default::default(),
                cache: None,
            })
    };
    let record_empty = |encoder: &mut wgpu::CommandEncoder| {
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("empty"),
            timestamp_writes: None,
        });
        pass.set_pipeline(&empty_pipeline);
        pass.dispatch_workgroups(1, 1, 1);
    };
    let record_step = |encoder: &mut wgpu::CommandEncoder| plan.record(encoder);
    // The pipelined loop: step i waits for step i − 2 after submitting (≤ 2 in flight).
    // `host` gets per step (total, encoder creation, record, finish, submit) in µs.
    // `span`: one timestamp before the first step and one after the last (the loop's GPU
    // time, gaps between submissions included).
    let run_loop = |n: usize,
                    timer: Option<&GpuTimer>,
                    span: Option<&GpuTimer>,
                    writes: bool,
                    record: &dyn Fn(&mut wgpu::CommandEncoder),
                    host: &mut Vec<[f64; 6]>|
     -> Res<f64> {
        let mut in_flight = std::collections::VecDeque::new();
        let start = Instant::now();
        for i in 0..n {
            let t0 = Instant::now();
            if writes {
                for (buffer, bytes) in &refills {
                    ctx.queue.write_buffer(buffer, 0, bytes);
                }
            }
            let t1 = Instant::now();
            let mut encoder = ctx.create_encoder("decode step");
            let t2 = Instant::now();
            if let Some(t) = timer {
                t.mark(&mut encoder, "gap");
            }
            if let (Some(t), 0) = (span, i) {
                t.mark(&mut encoder, "start");
            }
            record(&mut encoder);
            if let Some(t) = timer {
                t.mark(&mut encoder, "step");
            }
            if let Some(t) = span.filter(|_| i + 1 == n) {
                t.mark(&mut encoder, "loop");
            }
            let t3 = Instant::now();
            let commands = encoder.finish();
            let t4 = Instant::now();
            in_flight.push_back(ctx.queue.submit([commands]));
            let t5 = Instant::now();
            let us = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e6;
            if in_flight.len() > args.depth {
                wait(in_flight.pop_front().expect("more than depth in flight"))?;
            }
            let t6 = Instant::now();
            host.push([
                us(t0, t5),
                us(t1, t2),
                us(t2, t3),
                us(t3, t4),
                us(t4, t5),
                us(t5, t6),
            ]);
        }
        for index in in_flight {
            wait(index)?;
        }
        Ok(start.elapsed().as_secs_f64() * 1e6 / n as f64)
    };
    run_loop(30, None, None, false, &record_step, &mut Vec::new())?; // pipelines compiled, caches warm
    run_loop(30, None, None, false, &record_empty, &mut Vec::new())?;
    // Keep the GPU busy for `--warm-ms` first (64 steps per submit), so every setting is timed
    // at the clocks of a loaded GPU rather than wherever an idle one left them.
    let warm = Instant::now();
    while warm.elapsed().as_secs_f64() * 1e3 < args.warm_ms {
        let mut encoder = ctx.create_encoder("warm-up");
        for _ in 0..64 {
            plan.record(&mut encoder);
        }
        ctx.submit_and_wait(encoder)?;
    }

    if args.host_only {
        // Host time only, three loops of each kind, with the CPU the thread ran on and its
        // context switches (where the process's host cost comes from).
        let column = |x: &[[f64; 6]], i: usize| x.iter().map(|r| r[i]).collect::<Vec<f64>>();
        let (cpu0, switches0) = thread_cpu();
        let mut line = String::new();
        for round in 0..3 {
            let mut host = Vec::new();
            let period = run_loop(steps, None, None, false, &record_step, &mut host)?;
            let mut empty = Vec::new();
            run_loop(steps, None, None, false, &record_empty, &mut empty)?;
            // The slowest quarter of the steps: the mean of each part (encoder, record,
            // finish, submit), to see which part makes a step slow.
            let mut sorted = host.clone();
            sorted.sort_by(|x, y| y[0].total_cmp(&x[0]));
            let slow = &sorted[..sorted.len().div_ceil(4)];
            let mean = |i: usize| slow.iter().map(|r| r[i]).sum::<f64>() / slow.len() as f64;
            line += &format!(
                "\"r{round}\":{{\"host\":{:.2},\"enc\":{:.2},\"rec\":{:.2},\"fin\":{:.2},\"sub\":{:.2},\"wait\":{:.2},\"p90\":{:.2},\"empty\":{:.2},\"period\":{:.2},\"slow4\":[{:.1},{:.1},{:.1},{:.1},{:.1}]}},",
                median(column(&host, 0)),
                median(column(&host, 1)),
                median(column(&host, 2)),
                median(column(&host, 3)),
                median(column(&host, 4)),
                median(column(&host, 5)),
                quantile(column(&host, 0), 0.9),
                median(column(&empty, 0)),
                period,
                mean(0),
                mean(1),
                mean(2),
                mean(3),
                mean(4),
            );
        }
        let (cpu1, switches1) = thread_cpu();
        println!(
            "{{\"batch\":{b},\"tiles\":\"{}\",{line}\"cpu\":[{cpu0},{cpu1}],\"switches\":[{switches0},{switches1}]}}",
            tiles.name()
        );
        return Ok(());
    }
    // GPU time per step, from timestamps around each step's pass (median, min), and of
    // `steps` passes back to back in one encoder.
    let gpu_times = |record: &dyn Fn(&mut wgpu::CommandEncoder)| -> Res<Option<(f64, f64, f64)>> {
        let Some(timer) = GpuTimer::new(ctx, 2 * steps as u32) else {
            return Ok(None);
        };
        timer.reset();
        run_loop(steps, Some(&timer), None, false, record, &mut Vec::new())?;
        let mut encoder = ctx.create_encoder("resolve");
        timer.resolve(&mut encoder);
        ctx.submit_and_wait(encoder)?;
        let per_step: Vec<f64> = timer
            .read_spans(ctx)?
            .into_iter()
            .filter(|(l, _)| *l == "step")
            .map(|(_, ms)| ms * 1e3)
            .collect();
        let min = per_step.iter().copied().fold(f64::INFINITY, f64::min);
        let batch = GpuTimer::new(ctx, 2).expect("timestamps exist");
        batch.reset();
        let mut encoder = ctx.create_encoder("decode batch");
        batch.mark(&mut encoder, "start");
        for _ in 0..steps {
            record(&mut encoder);
        }
        batch.mark(&mut encoder, "steps");
        batch.resolve(&mut encoder);
        ctx.submit_and_wait(encoder)?;
        let batched = batch.read_total_ms(ctx)? * 1e3 / steps as f64;
        Ok(Some((median(per_step), min, batched)))
    };
    // GPU time per step of the pipelined loop itself (one command buffer per step, ≤ 2 in
    // flight): the span from before its first step to after its last, / steps, with no
    // timestamps between the steps.
    let pipelined = |record: &dyn Fn(&mut wgpu::CommandEncoder)| -> Res<Option<f64>> {
        let Some(span) = GpuTimer::new(ctx, 2) else {
            return Ok(None);
        };
        span.reset();
        run_loop(steps, None, Some(&span), false, record, &mut Vec::new())?;
        let mut encoder = ctx.create_encoder("resolve");
        span.resolve(&mut encoder);
        ctx.submit_and_wait(encoder)?;
        Ok(Some(span.read_total_ms(ctx)? * 1e3 / steps as f64))
    };
    let gpu_pipelined = pipelined(&record_step)?;
    let empty_pipelined = pipelined(&record_empty)?;
    let gpu = gpu_times(&record_step)?;
    let (gpu_med, gpu_min, gpu_batched) = match gpu {
        Some((m, n, b)) => (Some(m), Some(n), Some(b)),
        None => (None, None, None),
    };
    let empty = gpu_times(&record_empty)?;
    // Two timestamps with nothing between them (the bench's "tail" span).
    let marks_us = match GpuTimer::new(ctx, 2 * steps as u32) {
        Some(timer) => {
            timer.reset();
            run_loop(steps, Some(&timer), None, false, &|_| {}, &mut Vec::new())?;
            let mut encoder = ctx.create_encoder("resolve");
            timer.resolve(&mut encoder);
            ctx.submit_and_wait(encoder)?;
            let spans: Vec<f64> = timer
                .read_spans(ctx)?
                .into_iter()
                .filter(|(l, _)| *l == "step")
                .map(|(_, ms)| ms * 1e3)
                .collect();
            Some(median(spans))
        }
        None => None,
    };

    // Host time per step, without timestamps; then with the input refills; then an empty
    // pass in place of the plan's (the cost of any one-pass step).
    let mut host = Vec::new();
    let period = run_loop(steps, None, None, false, &record_step, &mut host)?;
    let mut writes = Vec::new();
    run_loop(steps, None, None, true, &record_step, &mut writes)?;
    let mut host_empty = Vec::new();
    run_loop(steps, None, None, false, &record_empty, &mut host_empty)?;
    let column = |x: &[[f64; 6]], i: usize| x.iter().map(|r| r[i]).collect::<Vec<f64>>();
    let host_us = column(&host, 0);
    let writes_us = column(&writes, 0);

    let pool_bytes = pool.tensor().bytes();
    let copy = timing::copy_gbps(ctx, &pool.tensor().buffer, pool_bytes, 50)?;
    let state_gbps = gpu_med.map(|us| 2.0 * pool_bytes as f64 / (us * 1e-6) / 1e9);
    let of_copy = match (state_gbps, copy) {
        (Some(s), Some(c)) => Some(s / c),
        _ => None,
    };
    let num = |x: Option<f64>| x.map_or("null".to_string(), |v| format!("{v:.4}"));
    let copy_us = copy.map(|gbps| 2.0 * pool_bytes as f64 / (gbps * 1e9) * 1e6);
    let adapter = ctx
        .adapter_info
        .as_ref()
        .map_or(String::new(), |i| i.name.clone());
    println!(
        "{{\"adapter\":\"{adapter}\",\"batch\":{b},\"heads\":\"{h}/{hv}\",\"dim\":{dim},\"v_first\":{},\
         \"dtype\":\"{}\",\"pool\":\"{}\",\"tiles\":\"{}\",\"steps\":{steps},\"gpu_us\":{},\
         \"gpu_min_us\":{},\"gpu_batched_us\":{},\"gpu_pipelined_us\":{},\"empty_pipelined_us\":{},\"empty_us\":{},\"empty_batched_us\":{},\
         \"marks_us\":{},\"copy_us\":{},\"state_gbps\":{},\"copy_gbps\":{},\"of_copy\":{},\
         \"host_us\":{:.2},\"host_p90_us\":{:.2},\"host_encoder_us\":{:.2},\"host_record_us\":{:.2},\
         \"host_finish_us\":{:.2},\"host_submit_us\":{:.2},\"host_empty_us\":{:.2},\
         \"host_empty_finish_us\":{:.2},\"host_empty_submit_us\":{:.2},\
         \"host_writes_us\":{:.2},\"period_us\":{:.2}}}",
        args.v_first,
        args.dtype,
        args.pool,
        tiles.name(),
        num(gpu_med),
        num(gpu_min),
        num(gpu_batched),
        num(gpu_pipelined),
        num(empty_pipelined),
        num(empty.map(|e| e.0)),
        num(empty.map(|e| e.2)),
        num(marks_us),
        num(copy_us),
        num(state_gbps),
        num(copy),
        num(of_copy),
        median(host_us.clone()),
        quantile(host_us, 0.9),
        median(column(&host, 1)),
        median(column(&host, 2)),
        median(column(&host, 3)),
        median(column(&host, 4)),
        median(column(&host_empty, 0)),
        median(column(&host_empty, 3)),
        median(column(&host_empty, 4)),
        median(writes_us),
        period,
    );
    Ok(())
}

/// Token-by-token decode of N steps through f32 and bf16 pools against the oracle.
fn accuracy(ctx: &Context, args: &Args, steps: usize) -> Res<()> {
    let dim = args.dim.unwrap_or(32);
    let options = Options {
        state_v_first: args.v_first,
        ..Options::default()
    };
    let whole = Problem::new(2, steps, 2, 4, dim, dim, None, options)?;
    // v-head 0 never decays (g = 0, DeltaNet): its roundings are forgotten only along k.
    let mut inputs = RandomSpec {
        zero_gate_heads: 1,
        ..RandomSpec::default()
    }
    .generate(&whole);
    for x in [&mut inputs.q, &mut inputs.k, &mut inputs.v] {
        *x = x.clone().with_dtype(args.dtype);
    }
    // Both pools start from bf16-representable values, so only the per-step roundings differ.
    inputs.initial_state = inputs.initial_state.map(|h| HostTensor {
        dtype: DType::F32,
        ..h.with_dtype(DType::BF16)
    });
    let mut checkpoints: Vec<usize> = [1, 16, 256, 1024]
        .into_iter()
        .filter(|&c| c < steps)
        .collect();
    checkpoints.push(steps);
    println!("steps,pool,o_rel_l2,state_rel_l2,o_rel_l2_head0,state_rel_l2_head0");
    // Entries of v-head 0: o rows [token, 4, dim], states [sequence, 4, dim, dim].
    let head0 = |x: &[f32], per: usize| -> Vec<f32> {
        x.chunks(4 * per).flat_map(|c| c[..per].to_vec()).collect()
    };
    let head0_64 = |x: &[f64], per: usize| -> Vec<f64> {
        x.chunks(4 * per).flat_map(|c| c[..per].to_vec()).collect()
    };
    for c in checkpoints {
        let p = Problem::new(2, c, 2, 4, dim, dim, None, options)?;
        let prefix = |x: &HostTensor| {
            let row = x.len() / (2 * steps);
            let data: Vec<f32> = (0..2)
                .flat_map(|s| x.data[s * steps * row..(s * steps + c) * row].to_vec())
                .collect();
            let mut shape = x.shape.clone();
            shape[1] = c;
            HostTensor {
                dtype: x.dtype,
                ..HostTensor::new(shape, data)
            }
        };
        let sub = ForwardInputs {
            q: prefix(&inputs.q),
            k: prefix(&inputs.k),
            v: prefix(&inputs.v),
            g: prefix(&inputs.g),
            beta: prefix(&inputs.beta),
            initial_state: inputs.initial_state.clone(),
            a_log: None,
            dt_bias: None,
        };
        let want = reference::forward(&p, &sub.as_ref())?;
        for pool in [DType::F32, DType::BF16] {
            let got = decode_host_in(ctx, &p, &sub.as_ref(), 1, pool)?;
            let (o0, s0) = (
                relative_l2(&head0(&got.o.data, dim), &head0_64(&want.o, dim)),
                relative_l2(
                    &head0(&got.final_state.data, dim * dim),
                    &head0_64(&want.final_state, dim * dim),
                ),
            );
            println!(
                "{c},{pool},{:.3e},{:.3e},{o0:.3e},{s0:.3e}",
                relative_l2(&got.o.data, &want.o),
                relative_l2(&got.final_state.data, &want.final_state)
            );
        }
    }
    Ok(())
}
