//! One long sequence through the forward — past one storage binding, so it runs in token
//! windows (docs/windows.md) — timed, and checked against the f64 oracle on a sample of
//! v-heads. Host memory stays bounded: inputs are drawn and uploaded in slabs of tokens, and
//! only the sampled heads' inputs and outputs are kept on the host.
//!
//!     cargo run --release --example long_context -- --heads 2/8 --tokens 1048576 \
//!         --dtype bf16 --check-heads 2
//!
//! Flags: `--heads H/HV` (2/8), `--tokens T` (1048576), `--dtype f32|f16|bf16` (bf16),
//! `--dim K` (K = V, 128), `--check-heads N` (2; 0 skips the oracle), `--reps N` (3),
//! `--seed S` (0). `GDN_MAX_BINDING_BYTES` lowers the binding limit (smaller windows),
//! `GDN_MAX_BUFFER_BYTES` the largest buffer (tensors past it span several).

use std::time::Instant;

use gdn_wgpu::tolerance::{Case, Op, Quantity};
use gdn_wgpu::wgpu_backend::{self, Context, ForwardWorkspace, GpuTensor};
use gdn_wgpu::{Backend, reference, relative_l2};
use gdn_wgpu::{DType, ForwardInputs, ForwardOutputs, HostTensor, Options, Problem, RandomSpec};

/// Tokens drawn and uploaded at a time.
const SLAB: usize = 1 << 16;

struct Args {
    heads: (usize, usize),
    tokens: usize,
    dtype: DType,
    dim: usize,
    check_heads: usize,
    reps: usize,
    seed: u64,
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
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
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
fn head_rows(t: &HostTensor, heads: usize, head: usize, dim: usize, dtype: DType) -> Vec<f32> {
    let rows = t
        .data
        .chunks_exact(heads * dim)
        .map(|r| &r[head * dim..][..dim]);
    let mut out: Vec<f32> = rows.flatten().copied().collect();
    gdn_wgpu::tensor::round_to_dtype(&mut out, dtype);
    out
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = parse().map_err(|e| format!("{e} (see the header of examples/long_context.rs)"))?;
    let ((h, hv), t, d) = (a.heads, a.tokens, a.dim);
    let problem = Problem::new(1, t, h, hv, d, d, None, Options::default())?;
    let ctx = Context::new_blocking()?;
    println!("{}", ctx.describe());
    let sampled: Vec<usize> = (0..a.check_heads.min(hv))
        .map(|i| i * hv / a.check_heads.min(hv))
        .collect();

    // Inputs, slab by slab: uploaded, and the sampled heads' rows kept for the oracle.
    let empty = |name: &str, shape: &[usize], dtype| GpuTensor::empty(&ctx, name, shape, dtype);
    let (q, k, v) = (
        empty("q", &problem.qk_shape(), a.dtype)?,
        empty("k", &problem.qk_shape(), a.dtype)?,
        empty("v", &problem.v_shape(), a.dtype)?,
    );
    let (g, beta) = (
        empty("g", &problem.gate_shape(), DType::F32)?,
        empty("beta", &problem.gate_shape(), DType::F32)?,
    );
    let mut h0 = None;
    let mut kept: Vec<ForwardInputs<Vec<f32>>> = sampled
        .iter()
        .map(|_| ForwardInputs {
            q: Vec::new(),
            k: Vec::new(),
            v: Vec::new(),
            g: Vec::new(),
            beta: Vec::new(),
            initial_state: None,
            a_log: None,
            dt_bias: None,
        })
        .collect();
    let started = Instant::now();
    for (i, start) in (0..t).step_by(SLAB).enumerate() {
        let len = SLAB.min(t - start);
        let slab = Problem::new(1, len, h, hv, d, d, None, Options::default())?;
        let spec = RandomSpec {
            seed: a.seed * 1_000_003 + i as u64,
            initial_state: i == 0,
            ..RandomSpec::default()
        };
        let x = spec.generate(&slab);
        // Tensors past the largest buffer span several; write_range finds the buffers.
        let write = |t: &GpuTensor, values: &[f32]| {
            t.write_range(&ctx, start * (values.len() / len), values)
        };
        write(&q, &x.q.data)?;
        write(&k, &x.k.data)?;
        write(&v, &x.v.data)?;
        write(&g, &x.g.data)?;
        write(&beta, &x.beta.data)?;
        ctx.queue.submit([]);
        if i == 0 {
            h0 = x.initial_state.clone();
        }
        for (kept, &head) in kept.iter_mut().zip(&sampled) {
            let qk_head = head / (hv / h);
            kept.q.extend(head_rows(&x.q, h, qk_head, d, a.dtype));
            kept.k.extend(head_rows(&x.k, h, qk_head, d, a.dtype));
            kept.v.extend(head_rows(&x.v, hv, head, d, a.dtype));
            kept.g.extend(x.g.data.iter().skip(head).step_by(hv));
            kept.beta.extend(x.beta.data.iter().skip(head).step_by(hv));
        }
    }
    let h0 = h0.expect("the first slab draws h0");
    let h0_gpu = GpuTensor::upload(&ctx, "initial_state", &h0)?;
    ctx.submit_and_wait(ctx.create_encoder("uploads"))?;
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
        v.buffers().len(),
        ctx.max_buffer_bytes()
    );
    let o = empty("o", &problem.v_shape(), a.dtype)?;
    let state = empty("final_state", &problem.state_shape(), DType::F32)?;
    let inputs = ForwardInputs {
        q: &q,
        k: &k,
        v: &v,
        g: &g,
        beta: &beta,
        initial_state: Some(&h0_gpu),
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
    let results: Vec<_> = std::thread::scope(|s| {
        let jobs: Vec<_> = kept
            .into_iter()
            .zip(&sampled)
            .map(|(x, &head)| {
                let h0 = &h0;
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
        // The GPU's o of this head, downloaded slab by slab.
        let mut got_o = Vec::with_capacity(t * d);
        for start in (0..t).step_by(SLAB) {
            let len = SLAB.min(t - start);
            let slab = o.download_range_blocking(&ctx, start * hv * d..(start + len) * hv * d)?;
            got_o.extend(
                slab.data
                    .chunks_exact(hv * d)
                    .flat_map(|r| &r[head * d..][..d]),
            );
        }
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
