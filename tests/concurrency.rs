//! One `Context` shared by several threads gives the same results as serial use, and a long
//! soak of mixed forward / backward / decode calls keeps host and GPU memory flat.
//!
//! The soak is `#[ignore]`d (10,000 calls take minutes on lavapipe); run it on a real GPU:
//! `GDN_REQUIRE_GPU=1 cargo test --release --test concurrency -- --ignored --nocapture`
//! (`GDN_SOAK_CALLS` changes the number of calls).

mod common;

use common::backward::upstream;
use common::{gpu, problem};
use gdn_wgpu::wgpu_backend::Context;
use gdn_wgpu::{Backend, DType, ForwardInputs, HostTensor, Options, Problem, RandomSpec};

/// The kinds of call the workloads mix.
#[derive(Debug, Clone, Copy)]
enum Call {
    Forward,
    Backward,
    Decode { tokens_per_step: usize },
}

/// One call of a workload: what runs, on which problem and inputs.
struct Job {
    call: Call,
    problem: Problem,
    inputs: ForwardInputs<HostTensor>,
    d_o: HostTensor,
    dht: Option<HostTensor>,
}

/// A mix of shapes (GVA, varlen with a length-1 sequence, V-first states, in-kernel gates and
/// l2norm, bf16 storage) and calls; job `i` is `jobs[i % len]`.
fn jobs(ctx: &Context) -> Vec<Job> {
    let d = Options::default();
    let every = Options {
        l2norm_qk: true,
        beta_sigmoid: true,
        gate_in_kernel: true,
        state_v_first: true,
        ..d
    };
    let bf16 = ctx
        .storage_dtypes(gdn_wgpu::tolerance::Op::Forward)
        .contains(&DType::BF16);
    let shapes = [
        (
            Call::Forward,
            problem(1, 130, 2, 4, 32, 32, Some(vec![0, 1, 60, 130]), d),
            false,
        ),
        (
            Call::Backward,
            problem(2, 70, 1, 2, 32, 16, None, every),
            false,
        ),
        (
            Call::Decode { tokens_per_step: 2 },
            problem(3, 5, 1, 2, 32, 32, None, d),
            false,
        ),
        (
            Call::Forward,
            problem(1, 90, 1, 2, 64, 48, None, every),
            bf16,
        ),
        (
            Call::Backward,
            problem(1, 66, 2, 2, 16, 32, Some(vec![0, 65, 66]), d),
            false,
        ),
        (
            Call::Decode { tokens_per_step: 1 },
            problem(1, 4, 2, 4, 16, 16, Some(vec![0, 1, 4]), every),
            false,
        ),
    ];
    shapes
        .into_iter()
        .enumerate()
        .map(|(i, (call, problem, half))| {
            let mut inputs = RandomSpec {
                seed: 50 + i as u64,
                ..RandomSpec::default()
            }
            .generate(&problem);
            if half {
                for t in [&mut inputs.q, &mut inputs.k, &mut inputs.v] {
                    *t = t.clone().with_dtype(DType::BF16);
                }
            }
            let (d_o, dht) = upstream(&problem, 50 + i as u64, true);
            let d_o = d_o.with_dtype(inputs.v.dtype);
            Job {
                call,
                problem,
                inputs,
                d_o,
                dht,
            }
        })
        .collect()
}

/// Run one job; every output's bits, in a fixed order.
fn run(ctx: &Context, job: &Job) -> Vec<u32> {
    let bits = |t: &HostTensor| t.data.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    let (p, inputs) = (&job.problem, &job.inputs.as_ref());
    match job.call {
        Call::Forward => {
            let out = ctx.forward(p, inputs).unwrap();
            [bits(&out.o), bits(&out.final_state)].concat()
        }
        Call::Decode { tokens_per_step } => {
            let out = ctx.decode(p, inputs, tokens_per_step).unwrap();
            [bits(&out.o), bits(&out.final_state)].concat()
        }
        Call::Backward => {
            let (out, g) = ctx
                .forward_backward(p, inputs, &job.d_o, job.dht.as_ref())
                .unwrap();
            let optional = [&g.dh0, &g.da_log, &g.ddt_bias];
            let mut all = [
                bits(&out.o),
                bits(&out.final_state),
                bits(&g.dq),
                bits(&g.dk),
                bits(&g.dv),
                bits(&g.dg),
                bits(&g.dbeta),
            ]
            .concat();
            for t in optional.into_iter().flatten() {
                all.extend(bits(t));
            }
            all
        }
    }
}

/// Four threads call one context at once, each its own interleaving of the mix; every result
/// equals the serial run's bit for bit (reductions are in a fixed order).
#[test]
fn four_threads_on_one_context_match_serial_use() {
    let Some(ctx) = gpu() else { return };
    let jobs = jobs(ctx);
    let rounds = 2 * jobs.len();
    let serial: Vec<Vec<u32>> = jobs.iter().map(|j| run(ctx, j)).collect();
    let mismatches: Vec<String> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let (jobs, serial) = (&jobs, &serial);
                s.spawn(move || {
                    let mut bad = Vec::new();
                    for r in 0..rounds {
                        // Each thread starts elsewhere in the mix, so different calls overlap.
                        let i = (r + 3 * t) % jobs.len();
                        if run(ctx, &jobs[i]) != serial[i] {
                            bad.push(format!(
                                "thread {t}, round {r}: {:?} on {:?} differs from the serial run",
                                jobs[i].call, jobs[i].problem
                            ));
                        }
                    }
                    bad
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    ctx.check().unwrap();
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

/// Resident host memory in bytes (VmRSS of /proc/self/status), where the OS tells.
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// GPU memory the allocator has handed out, where the backend reports it.
fn gpu_allocated_bytes(ctx: &Context) -> Option<u64> {
    // Freed buffers are returned once the device has seen their last use.
    let _ = ctx.device.poll(wgpu::PollType::Wait {
        submission_index: None,
        timeout: None,
    });
    ctx.device
        .generate_allocator_report()
        .map(|r| r.total_allocated_bytes)
}

/// 10,000 mixed calls on one context: after a warm-up (pipelines compiled, allocator blocks
/// reserved) host memory grows by at most 64 MiB and GPU allocations by at most 16 MiB, and
/// every call still returns the bits of its first run.
#[test]
#[ignore = "soak: 10,000 calls (minutes on lavapipe); run on a GPU with --ignored"]
fn soak_mixed_calls_keep_memory_flat() {
    let Some(ctx) = gpu() else { return };
    let calls: usize = std::env::var("GDN_SOAK_CALLS")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(10_000);
    let jobs = jobs(ctx);
    // GDN_SOAK_ONLY=i repeats job i alone (to find which call grows memory).
    let only: Option<usize> = std::env::var("GDN_SOAK_ONLY")
        .ok()
        .and_then(|c| c.parse().ok());
    let first: Vec<Vec<u32>> = jobs.iter().map(|j| run(ctx, j)).collect();
    let warm_up = 10 * jobs.len();
    for i in 0..warm_up {
        run(ctx, &jobs[i % jobs.len()]);
    }
    let start = std::time::Instant::now();
    let (rss0, gpu0) = (resident_bytes(), gpu_allocated_bytes(ctx));
    let mib = |b: Option<u64>| b.map_or("n/a".into(), |b| format!("{:.1}", b as f64 / 1048576.0));
    let pipelines0 = ctx.compiled_pipelines();
    eprintln!("calls  host MiB  GPU MiB allocated  pipelines  s");
    eprintln!(
        "{:>5}  {:>8}  {:>17}  {pipelines0:>9}  {:.1}",
        0,
        mib(rss0),
        mib(gpu0),
        0.0
    );
    let mut wrong = 0;
    for i in 0..calls {
        let j = only.unwrap_or(i % jobs.len());
        if run(ctx, &jobs[j]) != first[j] {
            wrong += 1;
        }
        if (i + 1) % (calls / 10).max(1) == 0 || i + 1 == calls {
            let (rss, gpu) = (resident_bytes(), gpu_allocated_bytes(ctx));
            eprintln!(
                "{:>5}  {:>8}  {:>17}  {:>9}  {:.1}",
                i + 1,
                mib(rss),
                mib(gpu),
                ctx.compiled_pipelines(),
                start.elapsed().as_secs_f64()
            );
        }
    }
    ctx.check().unwrap();
    assert_eq!(
        wrong, 0,
        "{wrong} of {calls} calls returned other bits than their first run"
    );
    let grown = |now: Option<u64>, then: Option<u64>| match (now, then) {
        (Some(a), Some(b)) => a.saturating_sub(b),
        _ => 0,
    };
    let host = grown(resident_bytes(), rss0);
    let device = grown(gpu_allocated_bytes(ctx), gpu0);
    assert_eq!(
        ctx.compiled_pipelines(),
        pipelines0,
        "the pipeline cache grew"
    );
    assert!(
        host <= 64 << 20,
        "host memory grew by {host} bytes over {calls} calls"
    );
    assert!(
        device <= 16 << 20,
        "GPU allocations grew by {device} bytes over {calls} calls"
    );
}
