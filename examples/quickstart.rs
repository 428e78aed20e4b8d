//! A random GDN problem on the best adapter, checked against the f64 oracle, with timings.
//!
//!     cargo run --release --example quickstart
//!     cargo run --release --example quickstart -- --tokens 32768 --heads-qk 16 --heads-v 64 \
//!         --key-dim 128 --value-dim 128 --check-heads 2
//!
//! Without a GPU adapter it says so and runs the CPU backend (the f64 oracle) instead.
//! Exit code 1 when the GPU result is outside the f32 tolerance.

use std::time::Instant;

use clap::Parser;
use gdn_wgpu::reference::{forward_heads, select_heads};
use gdn_wgpu::wgpu_backend::{self, Context, GpuTensor, GpuTimer};
use gdn_wgpu::{DType, ForwardOutputs, Options, Problem, RandomSpec, relative_l2};

#[derive(Parser, Debug)]
struct Args {
    #[arg(long, default_value_t = 1)]
    batch: usize,
    #[arg(long, default_value_t = 1024)]
    tokens: usize,
    #[arg(long, default_value_t = 2)]
    heads_qk: usize,
    #[arg(long, default_value_t = 4)]
    heads_v: usize,
    #[arg(long, default_value_t = 64)]
    key_dim: usize,
    #[arg(long, default_value_t = 64)]
    value_dim: usize,
    /// v-heads checked against the oracle, spread over all heads (0: all of them).
    #[arg(long, default_value_t = 0)]
    check_heads: usize,
    /// Timed repetitions after one warm-up run.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Storage dtype of q, k, v, o.
    #[arg(long, value_enum, default_value_t = Storage::F32)]
    dtype: Storage,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum Storage {
    F32,
    F16,
    Bf16,
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let problem = Problem::new(
        args.batch,
        args.tokens,
        args.heads_qk,
        args.heads_v,
        args.key_dim,
        args.value_dim,
        None,
        Options::default(),
    )?;
    let spec = RandomSpec {
        seed: args.seed,
        zero_gate_heads: 0,
        strong_gate_heads: 0,
        ..RandomSpec::default()
    };
    let dtype = match args.dtype {
        Storage::F32 => DType::F32,
        Storage::F16 => DType::F16,
        Storage::Bf16 => DType::BF16,
    };
    let mut inputs = spec.generate(&problem);
    for t in [&mut inputs.q, &mut inputs.k, &mut inputs.v] {
        *t = t.clone().with_dtype(dtype);
    }
    println!(
        "problem: B={} T={} H={} HV={} K={} V={} ({dtype} storage, with initial state)",
        args.batch, args.tokens, args.heads_qk, args.heads_v, args.key_dim, args.value_dim
    );
    let heads: Vec<usize> = match args.check_heads {
        0 => (0..problem.heads_v).collect(),
        n => (0..n.min(problem.heads_v))
            .map(|i| i * problem.heads_v / n.min(problem.heads_v))
            .collect(),
    };

    let ctx = match Context::new_blocking() {
        Ok(ctx) => ctx,
        Err(e) => {
            println!("no GPU: {e}\nrunning the CPU backend (f64 oracle) instead");
            let start = Instant::now();
            let out = gdn_wgpu::reference::forward(&problem, &inputs.as_ref())?;
            let checksum: f64 = out.o.iter().sum();
            println!(
                "cpu forward: {:.1} ms, checksum of o {checksum:.6e}",
                start.elapsed().as_secs_f64() * 1e3
            );
            return Ok(());
        }
    };
    let info = ctx.adapter_info.clone().expect("context from an adapter");
    let path = ctx.forward_path(&problem, dtype)?;
    println!(
        "adapter: {} ({:?}, {:?}), compute path {} ({}), scalar V-block {}",
        info.name,
        info.backend,
        info.device_type,
        path.path,
        path.reason,
        ctx.tuning().state_scan_v_block(&problem)
    );

    let gpu_inputs = wgpu_backend::upload_inputs(&ctx, &inputs.as_ref())?;
    let o_gpu = GpuTensor::empty(&ctx, "o", &problem.v_shape(), dtype)?;
    let state_gpu = GpuTensor::empty(&ctx, "final_state", &problem.state_shape(), DType::F32)?;
    let outputs = ForwardOutputs {
        o: &o_gpu,
        final_state: &state_gpu,
    };
    let timer = GpuTimer::new(&ctx, 8);
    let (mut wall, mut spans) = (Vec::new(), Vec::new());
    for rep in 0..=args.reps {
        let start = Instant::now();
        let mut encoder = ctx.create_encoder("quickstart");
        match &timer {
            Some(t) => {
                t.reset();
                t.mark(&mut encoder, "start");
                wgpu_backend::forward_into_profiled(
                    &ctx,
                    &mut encoder,
                    &problem,
                    &gpu_inputs.as_ref(),
                    &outputs,
                    t,
                )?;
                t.resolve(&mut encoder);
            }
            None => {
                wgpu_backend::forward_into(
                    &ctx,
                    &mut encoder,
                    &problem,
                    &gpu_inputs.as_ref(),
                    &outputs,
                )?;
            }
        }
        ctx.submit_and_wait(encoder)?;
        // Rep 0 compiles pipelines and warms up; it is not timed.
        if rep > 0 {
            wall.push(start.elapsed().as_secs_f64() * 1e3);
            if let Some(t) = &timer {
                spans.push(t.read_spans(&ctx)?);
            }
        }
    }
    println!(
        "gpu forward: median of {} runs: {:.3} ms wall (encode + submit + wait)",
        args.reps,
        median(wall)
    );
    if !spans.is_empty() {
        let total = median(
            spans
                .iter()
                .map(|s| s.iter().map(|(_, ms)| ms).sum())
                .collect(),
        );
        let per_pass: Vec<String> = (0..spans[0].len())
            .map(|i| {
                format!(
                    "{} {:.3}",
                    spans[0][i].0,
                    median(spans.iter().map(|s| s[i].1).collect())
                )
            })
            .collect();
        println!(
            "  GPU {total:.3} ms = {} (ms, timestamp queries)",
            per_pass.join(" + ")
        );
    }

    let o = o_gpu.download_blocking(&ctx)?;
    let state = state_gpu.download_blocking(&ctx)?;
    let start = Instant::now();
    let expected = forward_heads(&problem, &inputs.as_ref(), &heads)?;
    let cpu_ms = start.elapsed().as_secs_f64() * 1e3;
    let (hv, v, kv) = (
        problem.heads_v,
        problem.value_dim,
        problem.key_dim * problem.value_dim,
    );
    let err_o = relative_l2(
        &select_heads(&o.data, hv, v, &heads),
        &select_heads(&expected.o, hv, v, &heads),
    );
    let err_s = relative_l2(
        &select_heads(&state.data, hv, kv, &heads),
        &select_heads(&expected.final_state, hv, kv, &heads),
    );
    println!("oracle (f64 CPU) on v-heads {heads:?}: {cpu_ms:.0} ms");
    let (tol, tol_state) =
        wgpu_backend::path::tolerance(path.path, dtype, problem.options.l2norm_qk);
    println!(
        "rel-L2 vs oracle (same rounded inputs): o {err_o:.3e} (tolerance {tol:e}), final state {err_s:.3e} (tolerance {tol_state:e})"
    );
    if err_o.is_nan() || err_s.is_nan() || err_o > tol || err_s > tol_state {
        println!("FAIL");
        std::process::exit(1);
    }
    println!("PASS");
    Ok(())
}
