//! One long sequence through the forward — past one storage binding, so it runs in token
//! windows (docs/windows.md) — or, with `--backward`, through `forward_saved` and the backward
//! in the windows of its memory plan (docs/backward.md, "Memory"); timed, and checked against
//! the f64 oracle on sampled v-heads. Host memory stays bounded: inputs are drawn (in parallel)
//! and uploaded in slabs of tokens, and only the sampled heads' rows are kept on the host.
//!
//!     cargo run --release --example long_context -- --heads 2/8 --tokens 1048576 \
//!         --dtype bf16 --check-heads 2
//!     cargo run --release --example long_context -- --backward --heads 16/64 \
//!         --tokens 262144 --dtype bf16 --check-heads 1
//!
//! Flags: `--heads H/HV` (2/8), `--tokens T` (1048576), `--dtype f32|f16|bf16` (bf16),
//! `--dim K` (K = V, 128), `--check-heads N` (2; 0 skips the oracle), `--reps N` (3),
//! `--seed S` (0). Backward: `--backward`; `--check-qk` checks the GVA group of q-head 0 so
//! that dq, dk are compared too (H/HV times the oracle's work; else the sampled v-heads' dv,
//! dg, dβ, dh0); `--also-scalar` runs it again with the context's path forced to scalar (a
//! plan of several windows runs the forward on the scalar path anyway). The oracle of one v-head runs as V/16 independent column slices (the state's
//! columns evolve independently), in parallel. `GDN_MAX_BINDING_BYTES` lowers the binding
//! limit, `GDN_MAX_BUFFER_BYTES` the largest buffer (tensors past it span several);
//! `GDN_BACKWARD_BUDGET` sets the backward's budget.

use std::time::Instant;

use gdn_wgpu::tolerance::{Case, Op, Quantity};
use gdn_wgpu::wgpu_backend::backward::{self, BackwardPlan, BackwardWorkspace, MemoryBudget};
use gdn_wgpu::wgpu_backend::{self, ComputePath, Context, ForwardWorkspace, GpuTensor};
use gdn_wgpu::{Backend, reference, relative_l2};
use gdn_wgpu::{DType, ForwardInputs, ForwardOutputs, HostTensor, Options, Problem, RandomSpec};
use rand::{SeedableRng, rngs::SmallRng};
use rand_distr::{Distribution, StandardNormal};

/// Tokens drawn and uploaded at a time.
const SLAB: usize = 1 << 16;
/// Value columns per oracle job.
const SLICE: usize = 16;

struct Args {
    heads: (usize, usize),
    tokens: usize,
    dtype: DType,
    dim: usize,
    check_heads: usize,
    reps: usize,
    seed: u64,
    backward: bool,
    check_qk: bool,
    also_scalar: bool,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        heads: (2, 8),
        tokens: 1 << 20,
        dtype: DType::BF16,
        dim: 128,
        check_heads: 2,
        reps: 3,
        seed: 0,
        backward: false,
        check_qk: false,
        also_scalar: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--backward" => {
                a.backward = true;
                continue;
            }
            "--check-qk" => {
                a.check_qk = true;
                continue;
            }
            "--also-scalar" => {
                a.also_scalar = true;
                continue;
            }
            _ => {}
        }
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let num = |v: &str| v.parse::<usize>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--heads" => {
                let (h, hv) = value.split_once('/').ok_or("--heads H/HV")?;
                a.heads = (num(h)?, num(hv)?);
            }
            "--tokens" => a.tokens = num(&value)?,
            "--dim" => a.dim = num(&value)?,
            "--check-heads" => a.check_heads = num(&value)?,
            "--reps" => a.reps = num(&value)?.max(1),
            "--seed" => a.seed = num(&value)? as u64,
            "--dtype" => {
                a.dtype = match value.as_str() {
                    "f32" => DType::F32,
                    "f16" => DType::F16,
                    "bf16" => DType::BF16,
                    other => return Err(format!("--dtype {other}: f32, f16 or bf16")),
                }
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(a)
}

/// Head `head` of a `[tokens, heads, dim]` slab, rounded to `dtype` as the GPU sees it.
fn head_rows(t: &[f32], heads: usize, head: usize, dim: usize, dtype: DType) -> Vec<f32> {
    let rows = t.chunks_exact(heads * dim).map(|r| &r[head * dim..][..dim]);
    let mut out: Vec<f32> = rows.flatten().copied().collect();
    gdn_wgpu::tensor::round_to_dtype(&mut out, dtype);
    out
}

/// One sampled v-head's inputs (rounded to the storage dtype), and its `do` rows.
#[derive(Default)]
struct Kept {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
    d_o: Vec<f32>,
}

/// The inputs on the device, h0 on the host, and the sampled heads' rows.
struct Drawn {
    q: GpuTensor,
    k: GpuTensor,
    v: GpuTensor,
    g: GpuTensor,
    beta: GpuTensor,
    d_o: Option<GpuTensor>,
    h0: HostTensor,
    h0_gpu: GpuTensor,
    kept: Vec<Kept>,
}

/// Draw the inputs slab by slab, 16 slabs at a time in parallel (and `do` ~ N(0,1) when
/// `with_do`), upload them, and keep the rows of `sampled` v-heads.
fn draw(
    ctx: &Context,
    a: &Args,
    problem: &Problem,
    sampled: &[usize],
    with_do: bool,
) -> Result<Drawn, Box<dyn std::error::Error>> {
    let ((h, hv), t, d) = (a.heads, a.tokens, a.dim);
    let empty = |name: &str, shape: &[usize], dtype| GpuTensor::empty(ctx, name, shape, dtype);
    let (q, k, v) = (
        empty("q", &problem.qk_shape(), a.dtype)?,
        empty("k", &problem.qk_shape(), a.dtype)?,
        empty("v", &problem.v_shape(), a.dtype)?,
    );
    let (g, beta) = (
        empty("g", &problem.gate_shape(), DType::F32)?,
        empty("beta", &problem.gate_shape(), DType::F32)?,
    );
    let d_o = with_do
        .then(|| empty("do", &problem.v_shape(), a.dtype))
        .transpose()?;
    let mut h0 = None;
    let mut kept: Vec<Kept> = sampled.iter().map(|_| Kept::default()).collect();
    let starts: Vec<usize> = (0..t).step_by(SLAB).collect();
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
    for batch in starts.chunks(threads) {
        let slabs: Vec<_> = std::thread::scope(|s| {
            let jobs: Vec<_> = batch
                .iter()
                .map(|&start| {
                    s.spawn(move || {
                        let i = start / SLAB;
                        let len = SLAB.min(t - start);
                        let slab = Problem::new(1, len, h, hv, d, d, None, Options::default())
                            .expect("a valid slab");
                        let spec = RandomSpec {
                            seed: a.seed * 1_000_003 + i as u64,
                            initial_state: i == 0,
                            ..RandomSpec::default()
                        };
                        let x = spec.generate(&slab);
                        let d_o: Option<Vec<f32>> = with_do.then(|| {
                            let mut rng = SmallRng::seed_from_u64(a.seed ^ (0xd0 + i as u64));
                            (0..len * hv * d)
                                .map(|_| StandardNormal.sample(&mut rng))
                                .collect()
                        });
                        (start, len, x, d_o)
                    })
                })
                .collect();
            jobs.into_iter()
                .map(|j| j.join().expect("input thread"))
                .collect()
        });
        for (start, len, x, slab_do) in slabs {
            // Tensors past the largest buffer span several; write_range finds the buffers.
            let write = |t: &GpuTensor, values: &[f32]| {
                t.write_range(ctx, start * (values.len() / len), values)
            };
            write(&q, &x.q.data)?;
            write(&k, &x.k.data)?;
            write(&v, &x.v.data)?;
            write(&g, &x.g.data)?;
            write(&beta, &x.beta.data)?;
            if let (Some(t), Some(values)) = (&d_o, &slab_do) {
                write(t, values)?;
            }
            ctx.queue.submit([]);
            if start == 0 {
                h0 = x.initial_state.clone();
            }
            for (kept, &head) in kept.iter_mut().zip(sampled) {
                let qk_head = head / (hv / h);
                kept.q.extend(head_rows(&x.q.data, h, qk_head, d, a.dtype));
                kept.k.extend(head_rows(&x.k.data, h, qk_head, d, a.dtype));
                kept.v.extend(head_rows(&x.v.data, hv, head, d, a.dtype));
                kept.g.extend(x.g.data.iter().skip(head).step_by(hv));
                kept.beta.extend(x.beta.data.iter().skip(head).step_by(hv));
                if let Some(values) = &slab_do {
                    kept.d_o.extend(head_rows(values, hv, head, d, a.dtype));
                }
            }
        }
    }
    let h0 = h0.ok_or("the first slab draws h0")?;
    let h0_gpu = GpuTensor::upload(ctx, "initial_state", &h0)?;
    ctx.submit_and_wait(ctx.create_encoder("uploads"))?;
    Ok(Drawn {
        q,
        k,
        v,
        g,
        beta,
        d_o,
        h0,
        h0_gpu,
        kept,
    })
}

/// Rows `head` of a `[T, heads, dim]` device tensor, downloaded slab by slab.
fn download_head(
    ctx: &Context,
    t: &GpuTensor,
    tokens: usize,
    heads: usize,
    head: usize,
    dim: usize,
) -> Result<Vec<f32>, Box<dyn std::error::Error>> {
    let mut out = Vec::with_capacity(tokens * dim);
    for start in (0..tokens).step_by(SLAB) {
        let len = SLAB.min(tokens - start);
        let slab =
            t.download_range_blocking(ctx, start * heads * dim..(start + len) * heads * dim)?;
        out.extend(
            slab.data
                .chunks_exact(heads * dim)
                .flat_map(|r| &r[head * dim..][..dim]),
        );
    }
    Ok(out)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = parse().map_err(|e| format!("{e} (see the header of examples/long_context.rs)"))?;
    let ctx = Context::new_blocking()?;
    println!("{}", ctx.describe());
    if a.backward {
        return backward_mode(ctx, &a);
    }
    let ((h, hv), t, d) = (a.heads, a.tokens, a.dim);
    let problem = Problem::new(1, t, h, hv, d, d, None, Options::default())?;
    let sampled: Vec<usize> = (0..a.check_heads.min(hv))
        .map(|i| i * hv / a.check_heads.min(hv))
        .collect();
    let started = Instant::now();
    let x = draw(&ctx, &a, &problem, &sampled, false)?;
    println!(
        "inputs drawn and uploaded in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // The forward, in windows when a tensor or its scratch exceeds one binding.
    let ws = ForwardWorkspace::new(&ctx, &problem, a.dtype)?;
    println!(
        "{h}/{hv} heads, T = {t}, {} storage, K = V = {d}: path {}, {} window(s), scratch {:.2} GiB \
         (binding limit {} B; v in {} buffer(s) of at most {} B)",
        a.dtype,
        ws.path(),
        ws.windows(),
        ws.bytes() as f64 / (1u64 << 30) as f64,
        ctx.max_binding_bytes(),
        x.v.buffers().len(),
        ctx.max_buffer_bytes()
    );
    let empty = |name: &str, shape: &[usize], dtype| GpuTensor::empty(&ctx, name, shape, dtype);
    let o = empty("o", &problem.v_shape(), a.dtype)?;
    let state = empty("final_state", &problem.state_shape(), DType::F32)?;
    let inputs = ForwardInputs {
        q: &x.q,
        k: &x.k,
        v: &x.v,
        g: &x.g,
        beta: &x.beta,
        initial_state: Some(&x.h0_gpu),
        a_log: None,
        dt_bias: None,
    };
    let outputs = ForwardOutputs {
        o: &o,
        final_state: &state,
    };
    let timer = wgpu_backend::GpuTimer::new(&ctx, 2);
    for rep in 0..=a.reps {
        let mut encoder = ctx.create_encoder("long forward");
        let start = Instant::now();
        if let Some(t) = &timer {
            t.reset();
            t.mark(&mut encoder, "start");
        }
        wgpu_backend::forward_into_workspace(
            &ctx,
            &mut encoder,
            &problem,
            &inputs,
            &outputs,
            &ws,
            None,
        )?;
        if let Some(t) = &timer {
            t.mark(&mut encoder, "forward");
            t.resolve(&mut encoder);
        }
        ctx.submit_and_wait(encoder)?;
        let wall = start.elapsed().as_secs_f64() * 1e3;
        let gpu = match &timer {
            Some(t) => t.read_total_ms(&ctx)?,
            None => f64::NAN,
        };
        let what = if rep == 0 {
            "first (compiles)"
        } else {
            "timed"
        };
        println!(
            "forward {what}: GPU {gpu:.2} ms ({:.2} ns per token), wall {wall:.2} ms",
            gpu * 1e6 / t as f64
        );
    }

    // The oracle on each sampled v-head: its q/k head, v, g, β and h0 as a 1/1 problem.
    let case = Case::new(Op::Forward, a.dtype)
        .with_arithmetic(ws.path().arithmetic())
        .with_l2norm(false);
    let (tol_o, tol_s) = (
        case.tolerance(Quantity::Output),
        case.tolerance(Quantity::State),
    );
    let one = Problem::new(1, t, 1, 1, d, d, None, Options::default())?;
    let state_len = d * d;
    let h0 = &x.h0;
    let results: Vec<_> = std::thread::scope(|s| {
        let jobs: Vec<_> = x
            .kept
            .into_iter()
            .zip(&sampled)
            .map(|(x, &head)| {
                let one = &one;
                s.spawn(move || {
                    let t = |shape: &[usize], data: Vec<f32>| HostTensor::new(shape.to_vec(), data);
                    let inputs = ForwardInputs {
                        q: t(&one.qk_shape(), x.q),
                        k: t(&one.qk_shape(), x.k),
                        v: t(&one.v_shape(), x.v),
                        g: t(&one.gate_shape(), x.g),
                        beta: t(&one.gate_shape(), x.beta),
                        initial_state: Some(t(
                            &one.state_shape(),
                            h0.data[head * state_len..][..state_len].to_vec(),
                        )),
                        a_log: None,
                        dt_bias: None,
                    };
                    reference::forward(one, &inputs.as_ref())
                })
            })
            .collect();
        jobs.into_iter()
            .map(|j| j.join().expect("oracle thread"))
            .collect()
    });
    let mut pass = true;
    for (result, &head) in results.into_iter().zip(&sampled) {
        let want = result?;
        let got_o = download_head(&ctx, &o, t, hv, head, d)?;
        let got_s =
            state.download_range_blocking(&ctx, head * state_len..(head + 1) * state_len)?;
        let (eo, es) = (
            relative_l2(&got_o, &want.o),
            relative_l2(&got_s.data, &want.final_state),
        );
        let ok = eo <= tol_o && es <= tol_s;
        pass &= ok;
        println!(
            "v-head {head}: rel-L2 o {eo:.2e} (≤ {tol_o:.0e}), final state {es:.2e} (≤ {tol_s:.0e}) {}",
            if ok { "ok" } else { "FAIL" }
        );
    }
    println!("{}", if pass { "PASS" } else { "FAIL" });
    if !pass {
        std::process::exit(1);
    }
    Ok(())
}

/// The oracle's gradients of one v-head (f64), from V/16 column slices run in parallel: the
/// state's columns evolve independently, so dv and dh0 are the slices side by side and dq,
/// dk, dg, dβ their sums.
struct HeadGrads {
    dq: Vec<f64>,
    dk: Vec<f64>,
    dv: Vec<f64>,
    dg: Vec<f64>,
    dbeta: Vec<f64>,
    dh0: Vec<f64>,
}

fn oracle_heads(
    kept: &[Kept],
    heads: &[usize],
    h0: &HostTensor,
    tokens: usize,
    d: usize,
) -> Result<Vec<HeadGrads>, Box<dyn std::error::Error>> {
    let slices = d / SLICE;
    let one = Problem::new(1, tokens, 1, 1, d, SLICE, None, Options::default())?;
    let jobs: Vec<(usize, usize)> = (0..heads.len())
        .flat_map(|i| (0..slices).map(move |s| (i, s)))
        .collect();
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
    let mut results = Vec::with_capacity(jobs.len());
    for batch in jobs.chunks(threads) {
        let done: Vec<_> = std::thread::scope(|s| {
            let spawned: Vec<_> = batch
                .iter()
                .map(|&(i, sl)| {
                    let (x, head, one) = (&kept[i], heads[i], &one);
                    s.spawn(move || {
                        let cols = |rows: &[f32]| -> Vec<f32> {
                            rows.chunks_exact(d)
                                .flat_map(|r| &r[sl * SLICE..][..SLICE])
                                .copied()
                                .collect()
                        };
                        let t =
                            |shape: &[usize], data: Vec<f32>| HostTensor::new(shape.to_vec(), data);
                        let state = &h0.data[head * d * d..][..d * d];
                        let inputs = ForwardInputs {
                            q: t(&one.qk_shape(), x.q.clone()),
                            k: t(&one.qk_shape(), x.k.clone()),
                            v: t(&one.v_shape(), cols(&x.v)),
                            g: t(&one.gate_shape(), x.g.clone()),
                            beta: t(&one.gate_shape(), x.beta.clone()),
                            initial_state: Some(t(&one.state_shape(), cols(state))),
                            a_log: None,
                            dt_bias: None,
                        };
                        let d_o = t(&one.v_shape(), cols(&x.d_o));
                        reference::backward(one, &inputs.as_ref(), &d_o, None)
                    })
                })
                .collect();
            spawned
                .into_iter()
                .map(|j| j.join().expect("oracle thread"))
                .collect()
        });
        results.extend(done);
    }
    let mut out: Vec<HeadGrads> = heads
        .iter()
        .map(|_| HeadGrads {
            dq: vec![0.0; tokens * d],
            dk: vec![0.0; tokens * d],
            dv: vec![0.0; tokens * d],
            dg: vec![0.0; tokens],
            dbeta: vec![0.0; tokens],
            dh0: vec![0.0; d * d],
        })
        .collect();
    for (&(i, sl), r) in jobs.iter().zip(results) {
        let r = r?;
        let o = &mut out[i];
        let add = |acc: &mut [f64], x: &[f64]| acc.iter_mut().zip(x).for_each(|(a, b)| *a += b);
        add(&mut o.dq, &r.dq);
        add(&mut o.dk, &r.dk);
        add(&mut o.dg, &r.dg);
        add(&mut o.dbeta, &r.dbeta);
        for (row, src) in o.dv.chunks_exact_mut(d).zip(r.dv.chunks_exact(SLICE)) {
            row[sl * SLICE..][..SLICE].copy_from_slice(src);
        }
        let dh0 = r.dh0.ok_or("the oracle's dh0")?;
        for (row, src) in o.dh0.chunks_exact_mut(d).zip(dh0.chunks_exact(SLICE)) {
            row[sl * SLICE..][..SLICE].copy_from_slice(src);
        }
    }
    Ok(out)
}

/// `forward_saved_for` and the backward through a workspace of the context's plan, timed; the
/// sampled v-heads' gradients against the oracle.
fn backward_mode(mut ctx: Context, a: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let ((h, hv), t, d) = (a.heads, a.tokens, a.dim);
    let problem = Problem::new(1, t, h, hv, d, d, None, Options::default())?;
    let group = hv / h;
    let sampled: Vec<usize> = if a.check_qk {
        (0..group).collect()
    } else {
        (0..a.check_heads.min(hv))
            .map(|i| i * hv / a.check_heads.min(hv))
            .collect()
    };
    let started = Instant::now();
    let x = draw(&ctx, a, &problem, &sampled, true)?;
    println!(
        "inputs and do drawn and uploaded in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let d_o = x.d_o.as_ref().ok_or("do")?;
    let inputs = ForwardInputs {
        q: &x.q,
        k: &x.k,
        v: &x.v,
        g: &x.g,
        beta: &x.beta,
        initial_state: Some(&x.h0_gpu),
        a_log: None,
        dt_bias: None,
    };
    let mut runs: Vec<(String, backward::BackwardMemory, Vec<DownloadedHead>)> = Vec::new();
    let paths: Vec<Option<ComputePath>> = if a.also_scalar {
        vec![None, Some(ComputePath::Scalar)]
    } else {
        vec![None]
    };
    for forced in paths {
        ctx.set_compute_path(forced)?;
        let budget = ctx
            .config()
            .backward_budget
            .unwrap_or(MemoryBudget::DEFAULT);
        let plan = BackwardPlan::new(&ctx, &problem, a.dtype, budget)?;
        let label = format!("forward path {}", plan.forward_path());
        println!(
            "{h}/{hv} heads, T = {t}, {} storage, K = V = {d}, {label}: budget {:?} ({:.2} GiB; \
             inputs {:.2} GiB), {} window(s), workspace {:.2} GiB + checkpoints {:.3} GiB \
             (binding limit {} B)",
            a.dtype,
            budget,
            plan.budget().unwrap_or(0) as f64 / (1u64 << 30) as f64,
            backward::input_bytes(&problem, a.dtype) as f64 / (1u64 << 30) as f64,
            plan.windows(),
            plan.bytes().workspace as f64 / (1u64 << 30) as f64,
            plan.bytes().checkpoints as f64 / (1u64 << 30) as f64,
            ctx.max_binding_bytes()
        );
        let ws = BackwardWorkspace::from_plan(&ctx, plan)?;
        let timer = wgpu_backend::GpuTimer::new(&ctx, 2);
        let gpu_ms = |encoder: &mut wgpu::CommandEncoder, start: bool| {
            if let Some(tm) = &timer {
                if start {
                    tm.reset();
                    tm.mark(encoder, "start");
                } else {
                    tm.mark(encoder, "end");
                    tm.resolve(encoder);
                }
            }
        };
        let mut encoder = ctx.create_encoder("forward_saved");
        gpu_ms(&mut encoder, true);
        let (fwd, saved) =
            wgpu_backend::forward_saved_for(&ctx, &mut encoder, &problem, &inputs, ws.plan())?;
        gpu_ms(&mut encoder, false);
        let wall = Instant::now();
        ctx.submit_and_wait(encoder)?;
        let fms = match &timer {
            Some(tm) => tm.read_total_ms(&ctx)?,
            None => f64::NAN,
        };
        println!(
            "forward_saved (first, compiles): GPU {fms:.2} ms, wall {:.1} ms",
            wall.elapsed().as_secs_f64() * 1e3
        );
        drop(fwd);
        let grads = backward::alloc_gradients(&ctx, &saved)?;
        for rep in 0..=a.reps {
            let mut encoder = ctx.create_encoder("backward");
            let start = Instant::now();
            gpu_ms(&mut encoder, true);
            wgpu_backend::backward_into_workspace(
                &ctx,
                &mut encoder,
                &saved,
                d_o,
                None,
                &backward::gradients_ref(&grads),
                &ws,
                None,
            )?;
            gpu_ms(&mut encoder, false);
            ctx.submit_and_wait(encoder)?;
            let wall = start.elapsed().as_secs_f64() * 1e3;
            let gpu = match &timer {
                Some(tm) => tm.read_total_ms(&ctx)?,
                None => f64::NAN,
            };
            let what = if rep == 0 {
                "first (compiles)"
            } else {
                "timed"
            };
            println!(
                "backward {what}: GPU {gpu:.2} ms ({:.2} ns per token), wall {wall:.2} ms",
                gpu * 1e6 / t as f64
            );
        }
        let memory =
            backward::backward_memory(&saved, d_o, None, &backward::gradients_ref(&grads), &ws);
        println!(
            "backward memory (library count): {:.2} GiB = inputs {:.2} + saved {:.3} + \
             workspace {:.2} + gradients {:.2} GiB",
            memory.total() as f64 / (1u64 << 30) as f64,
            memory.inputs as f64 / (1u64 << 30) as f64,
            memory.saved as f64 / (1u64 << 30) as f64,
            memory.workspace as f64 / (1u64 << 30) as f64,
            memory.gradients as f64 / (1u64 << 30) as f64,
        );
        let mut heads = Vec::new();
        for &head in &sampled {
            let gates = |tn: &GpuTensor| -> Result<Vec<f32>, Box<dyn std::error::Error>> {
                download_head(&ctx, tn, t, hv, head, 1)
            };
            let state_len = d * d;
            heads.push(DownloadedHead {
                dv: download_head(&ctx, &grads.dv, t, hv, head, d)?,
                dg: gates(&grads.dg)?,
                dbeta: gates(&grads.dbeta)?,
                dh0: grads
                    .dh0
                    .as_ref()
                    .ok_or("dh0")?
                    .download_range_blocking(&ctx, head * state_len..(head + 1) * state_len)?
                    .data,
                dq: if a.check_qk && head == 0 {
                    Some((
                        download_head(&ctx, &grads.dq, t, h, 0, d)?,
                        download_head(&ctx, &grads.dk, t, h, 0, d)?,
                    ))
                } else {
                    None
                },
            });
        }
        runs.push((label, memory, heads));
    }
    if a.check_heads == 0 && !a.check_qk {
        return Ok(());
    }

    let started = Instant::now();
    let oracle = oracle_heads(&x.kept, &sampled, &x.h0, t, d)?;
    println!(
        "oracle ({} v-head(s), {} column slices each) in {:.1} s",
        sampled.len(),
        d / SLICE,
        started.elapsed().as_secs_f64()
    );
    let case = Case::new(Op::Backward, a.dtype).with_l2norm(false);
    let (tol_qkv, tol_gates) = (
        case.tolerance(Quantity::GradQkv),
        case.tolerance(Quantity::GradGates),
    );
    let mut pass = true;
    for (label, _, heads) in &runs {
        for (got, (&head, want)) in heads.iter().zip(sampled.iter().zip(&oracle)) {
            let e = |g: &[f32], w: &[f64]| relative_l2(g, w);
            let mut errs = vec![
                ("dv", e(&got.dv, &want.dv), tol_qkv),
                ("dg", e(&got.dg, &want.dg), tol_gates),
                ("dbeta", e(&got.dbeta, &want.dbeta), tol_gates),
                ("dh0", e(&got.dh0, &want.dh0), tol_gates),
            ];
            if let Some((dq, dk)) = &got.dq {
                // q-head 0's gradients: the sum over its GVA group (every sampled head).
                let sum = |f: fn(&HeadGrads) -> &Vec<f64>| -> Vec<f64> {
                    let mut acc = vec![0.0; t * d];
                    for w in &oracle {
                        acc.iter_mut().zip(f(w)).for_each(|(a, b)| *a += b);
                    }
                    acc
                };
                errs.push(("dq", e(dq, &sum(|w| &w.dq)), tol_qkv));
                errs.push(("dk", e(dk, &sum(|w| &w.dk)), tol_qkv));
            }
            let ok = errs.iter().all(|(_, err, tol)| err <= tol);
            pass &= ok;
            let line: Vec<String> = errs
                .iter()
                .map(|(n, err, tol)| format!("{n} {err:.2e} (≤ {tol:.0e})"))
                .collect();
            println!(
                "{label}, v-head {head}: rel-L2 {} {}",
                line.join(", "),
                if ok { "ok" } else { "FAIL" }
            );
        }
    }
    println!("{}", if pass { "PASS" } else { "FAIL" });
    if !pass {
        std::process::exit(1);
    }
    Ok(())
}

/// One sampled v-head's GPU gradients (dq, dk of q-head 0 with `--check-qk`).
struct DownloadedHead {
    dv: Vec<f32>,
    dg: Vec<f32>,
    dbeta: Vec<f32>,
    dh0: Vec<f32>,
    dq: Option<(Vec<f32>, Vec<f32>)>,
}
