//! Times the GPU backward (forward + backward, per-pass breakdown) on a random problem and
//! checks sampled heads against the f64 BPTT oracle.
//!
//!     cargo run --release --example backward
//!     cargo run --release --example backward -- --tokens 32768 --heads-qk 16 --heads-v 32 \
//!         --key-dim 128 --value-dim 128 --check-groups 2
//!
//! `--check-groups N` checks the GVA groups of N q/k heads spread over all heads (every
//! gradient of their v-heads, dq and dk of the q/k heads); 0 skips the oracle. Flags
//! `--l2norm-qk --beta-sigmoid --allow-neg-eigval --gate-in-kernel --state-v-first --no-h0
//! --no-dht` select options; `--dtype f32|f16|bf16` the storage of q, k, v, do (and dq, dk, dv;
//! the oracle runs on the same rounded inputs). Exit code 1 when a checked gradient is outside
//! its tolerance: 1e-4 relative L2 (f32, and the f32 gradients of f16/bf16); dq, dk, dv in
//! bf16 3e-3, in f16 5e-4; every gradient with `--l2norm-qk` in bf16 3e-2, in f16 3e-3 (q̂, k̂
//! are kept in the storage dtype; see tests/backward.rs).

use std::time::Instant;

use gdn_wgpu::reference::{backward_heads, select_heads};
use gdn_wgpu::wgpu_backend::{self, Context, GpuTensor, GpuTimer};
use gdn_wgpu::{DType, HostTensor, Options, Problem, RandomSpec, relative_l2};
use rand::{SeedableRng, rngs::SmallRng};
use rand_distr::{Distribution, StandardNormal};

const TOLERANCE: f64 = 1e-4;

/// (tolerance of dq, dk, dv; of the f32 gradients) for a storage dtype and the l2norm option.
fn tolerances(dtype: DType, l2norm: bool) -> (f64, f64) {
    match (dtype, l2norm) {
        (DType::F32, _) => (TOLERANCE, TOLERANCE),
        (DType::BF16, false) => (3e-3, TOLERANCE),
        (DType::BF16, true) => (3e-2, 3e-2),
        (DType::F16, false) => (5e-4, TOLERANCE),
        (DType::F16, true) => (3e-3, 3e-3),
    }
}

struct Args {
    batch: usize,
    tokens: usize,
    heads_qk: usize,
    heads_v: usize,
    key_dim: usize,
    value_dim: usize,
    check_groups: usize,
    reps: usize,
    seed: u64,
    options: Options,
    h0: bool,
    dht: bool,
    dtype: DType,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        batch: 1,
        tokens: 1024,
        heads_qk: 2,
        heads_v: 4,
        key_dim: 64,
        value_dim: 64,
        check_groups: 1,
        reps: 3,
        seed: 0,
        options: Options::default(),
        h0: true,
        dht: true,
        dtype: DType::F32,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || -> Result<usize, String> {
            let v = it.next().ok_or(format!("{flag} needs a value"))?;
            v.parse().map_err(|_| format!("{flag}: not a number: {v}"))
        };
        match flag.as_str() {
            "--batch" => a.batch = value()?,
            "--tokens" => a.tokens = value()?,
            "--heads-qk" => a.heads_qk = value()?,
            "--heads-v" => a.heads_v = value()?,
            "--key-dim" => a.key_dim = value()?,
            "--value-dim" => a.value_dim = value()?,
            "--check-groups" => a.check_groups = value()?,
            "--reps" => a.reps = value()?.max(1),
            "--seed" => a.seed = value()? as u64,
            "--l2norm-qk" => a.options.l2norm_qk = true,
            "--beta-sigmoid" => a.options.beta_sigmoid = true,
            "--allow-neg-eigval" => a.options.allow_neg_eigval = true,
            "--gate-in-kernel" => a.options.gate_in_kernel = true,
            "--state-v-first" => a.options.state_v_first = true,
            "--no-h0" => a.h0 = false,
            "--no-dht" => a.dht = false,
            "--dtype" => {
                a.dtype = match it.next().as_deref() {
                    Some("f32") => DType::F32,
                    Some("f16") => DType::F16,
                    Some("bf16") => DType::BF16,
                    other => return Err(format!("--dtype: f32, f16 or bf16, not {other:?}")),
                }
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(a)
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn normal(seed: u64, shape: &[usize], scale: f32) -> HostTensor {
    let mut rng = SmallRng::seed_from_u64(seed);
    let n = shape.iter().product();
    let data = (0..n)
        .map(|_| {
            let z: f32 = StandardNormal.sample(&mut rng);
            scale * z
        })
        .collect();
    HostTensor::new(shape.to_vec(), data)
}

const MIB: f64 = 1024.0 * 1024.0;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args()?;
    let problem = Problem::new(
        args.batch,
        args.tokens,
        args.heads_qk,
        args.heads_v,
        args.key_dim,
        args.value_dim,
        None,
        args.options,
    )?;
    let spec = RandomSpec {
        seed: args.seed,
        initial_state: args.h0,
        ..RandomSpec::default()
    };
    let mut inputs = spec.generate(&problem);
    for t in [&mut inputs.q, &mut inputs.k, &mut inputs.v] {
        *t = t.clone().with_dtype(args.dtype);
    }
    let d_o = normal(args.seed ^ 0xd0, &problem.v_shape(), 1.0).with_dtype(args.dtype);
    let dht = args
        .dht
        .then(|| normal(args.seed ^ 0xd7, &problem.state_shape(), 0.5));
    let p = &problem;
    println!(
        "problem: B={} T={} H={} HV={} K={} V={} ({}) {:?}, h0 {}, dht {}",
        p.batch,
        p.tokens,
        p.heads_qk,
        p.heads_v,
        p.key_dim,
        p.value_dim,
        args.dtype,
        p.options,
        args.h0,
        args.dht
    );
    let rows = (p.total_tokens() * p.heads_v) as f64;
    let saved = wgpu_backend::backward::saved_bytes(p, args.dtype) as f64;
    let workspace = wgpu_backend::backward::workspace_bytes(p) as f64;
    println!(
        "memory: forward keeps {:.0} B per token per v-head ({:.1} MiB); backward workspace {:.1} MiB ({:.0} B per token per v-head)",
        saved / rows,
        saved / MIB,
        workspace / MIB,
        workspace / rows
    );

    let ctx = Context::new_blocking()?;
    let info = ctx.adapter_info.clone().expect("context from an adapter");
    let v_block = wgpu_backend::backward::scan_v_block(&ctx, p)?;
    let (t_slice, _) = wgpu_backend::backward::dh_scan_tiling(
        v_block,
        p.key_dim as u32,
        ctx.tuning().workgroup_bytes,
    );
    println!(
        "adapter: {} ({:?}, {:?}), {} B workgroup memory; backward scans: V-block {v_block}, \
         dh_scan token slice {t_slice}",
        info.name,
        info.backend,
        info.device_type,
        ctx.tuning().workgroup_bytes,
    );
    let uploaded = wgpu_backend::upload_inputs(&ctx, &inputs.as_ref())?;
    let gpu_inputs = uploaded.as_ref();
    let d_o_gpu = GpuTensor::upload(&ctx, "do", &d_o)?;
    let dht_gpu = dht
        .as_ref()
        .map(|t| GpuTensor::upload(&ctx, "dht", t))
        .transpose()?;

    let timer = GpuTimer::new(&ctx, 16);
    let (mut wall, mut fwd_ms, mut bwd_ms) = (Vec::new(), Vec::new(), Vec::new());
    let mut spans: Vec<Vec<(&'static str, f64)>> = Vec::new();
    let mut last = None;
    for rep in 0..=args.reps {
        let start = Instant::now();
        let mut encoder = ctx.create_encoder("backward example");
        if let Some(t) = &timer {
            t.reset();
            t.mark(&mut encoder, "start");
        }
        let (_, saved) = wgpu_backend::forward_saved(&ctx, &mut encoder, p, &gpu_inputs)?;
        let grads = match &timer {
            Some(t) => {
                t.mark(&mut encoder, "forward");
                wgpu_backend::backward_profiled(
                    &ctx,
                    &mut encoder,
                    &saved,
                    &d_o_gpu,
                    dht_gpu.as_ref(),
                    t,
                )?
            }
            None => wgpu_backend::backward(&ctx, &mut encoder, &saved, &d_o_gpu, dht_gpu.as_ref())?,
        };
        if let Some(t) = &timer {
            t.resolve(&mut encoder);
        }
        ctx.submit_and_wait(encoder)?;
        // Rep 0 compiles pipelines and warms up; it is not timed.
        if rep > 0 {
            wall.push(start.elapsed().as_secs_f64() * 1e3);
            if let Some(t) = &timer {
                let s = t.read_spans(&ctx)?;
                fwd_ms.push(
                    s.iter()
                        .filter(|(l, _)| *l == "forward")
                        .map(|(_, ms)| ms)
                        .sum(),
                );
                bwd_ms.push(
                    s.iter()
                        .filter(|(l, _)| *l != "forward")
                        .map(|(_, ms)| ms)
                        .sum(),
                );
                spans.push(s);
            }
        }
        last = Some(grads);
    }
    let grads = last.expect("at least one run");
    println!(
        "forward + backward: median of {} runs: {:.3} ms wall (alloc + encode + submit + wait)",
        args.reps,
        median(wall)
    );
    if !fwd_ms.is_empty() {
        println!(
            "GPU time: forward {:.3} ms, backward {:.3} ms (median)",
            median(fwd_ms),
            median(bwd_ms)
        );
        let labels: Vec<&str> = spans[0]
            .iter()
            .map(|(l, _)| *l)
            .filter(|l| *l != "forward")
            .collect();
        for label in labels {
            let ms: Vec<f64> = spans
                .iter()
                .map(|s| s.iter().find(|(l, _)| *l == label).map_or(0.0, |x| x.1))
                .collect();
            println!("  {label:<16} {:.3} ms", median(ms));
        }
    } else {
        println!("(no timestamp queries: GPU times unavailable)");
    }

    if args.check_groups == 0 {
        return Ok(());
    }
    let n = args.check_groups.min(p.heads_qk);
    let qk_heads: Vec<usize> = (0..n).map(|i| i * p.heads_qk / n).collect();
    let heads: Vec<usize> = qk_heads
        .iter()
        .flat_map(|&h| h * p.group()..(h + 1) * p.group())
        .collect();
    let start = Instant::now();
    let expected = backward_heads(p, &inputs.as_ref(), &d_o, dht.as_ref(), &heads)?;
    println!(
        "oracle (f64 CPU BPTT) on q/k heads {qk_heads:?} = v-heads {heads:?}: {:.1} s",
        start.elapsed().as_secs_f64()
    );
    let down = |t: &GpuTensor| t.download_blocking(&ctx);
    let (hv, kd, vd) = (p.heads_v, p.key_dim, p.value_dim);
    let state = kd * vd;
    let mut checks = vec![
        (
            "dq",
            select_heads(&down(&grads.dq)?.data, p.heads_qk, kd, &qk_heads),
            select_heads(&expected.dq, p.heads_qk, kd, &qk_heads),
        ),
        (
            "dk",
            select_heads(&down(&grads.dk)?.data, p.heads_qk, kd, &qk_heads),
            select_heads(&expected.dk, p.heads_qk, kd, &qk_heads),
        ),
        (
            "dv",
            select_heads(&down(&grads.dv)?.data, hv, vd, &heads),
            select_heads(&expected.dv, hv, vd, &heads),
        ),
        (
            "dg",
            select_heads(&down(&grads.dg)?.data, hv, 1, &heads),
            select_heads(&expected.dg, hv, 1, &heads),
        ),
        (
            "dbeta",
            select_heads(&down(&grads.dbeta)?.data, hv, 1, &heads),
            select_heads(&expected.dbeta, hv, 1, &heads),
        ),
    ];
    if let (Some(g), Some(e)) = (&grads.dh0, &expected.dh0) {
        checks.push((
            "dh0",
            select_heads(&down(g)?.data, hv, state, &heads),
            select_heads(e, hv, state, &heads),
        ));
    }
    if let (Some(g), Some(e)) = (&grads.da_log, &expected.da_log) {
        checks.push((
            "dA_log",
            select_heads(&down(g)?.data, hv, 1, &heads),
            select_heads(e, hv, 1, &heads),
        ));
    }
    if let (Some(g), Some(e)) = (&grads.ddt_bias, &expected.ddt_bias) {
        checks.push((
            "ddt_bias",
            select_heads(&down(g)?.data, hv, 1, &heads),
            select_heads(e, hv, 1, &heads),
        ));
    }
    let (tol_qkv, tol_f32) = tolerances(args.dtype, p.options.l2norm_qk);
    let mut pass = true;
    let mut line = Vec::new();
    for (name, got, want) in checks {
        let err = relative_l2(&got, &want);
        let tol = if ["dq", "dk", "dv"].contains(&name) {
            tol_qkv
        } else {
            tol_f32
        };
        pass &= err <= tol;
        line.push(format!("{name} {err:.2e} (≤ {tol:.0e})"));
    }
    println!("rel-L2 vs oracle: {}", line.join(", "));
    if !pass {
        println!("FAIL");
        std::process::exit(1);
    }
    println!("PASS");
    Ok(())
}
