//! `gdn bench --backend cuda`: the CUDA kernels timed with CUDA events around the launches on
//! the context's stream, after inputs, outputs and workspaces are made once per case (as a
//! serving or training loop would). GPU ms is the event time, host ms the time to enqueue,
//! wall ms enqueue plus the wait. With `--cuda-graph N` a repetition replays a CUDA graph of N
//! calls and each time is divided by N (FLA's `do_bench_cudagraph` measures the same way), so
//! launch gaps and host enqueue time drop out: what a serving loop that replays graphs sees.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaContext, CudaStream, sys};

use gdn_wgpu::ForwardOutputs;
use gdn_wgpu::cuda_backend::{
    self, ChunkPlan, ChunkedPasses, Context, CudaTensor, ForwardPath, PlanOptions, Segments,
    SeqBounds,
    backward::{BackwardOptions, BackwardPath, BackwardWorkspace, ChainSchedule, ChunkedStage},
};
use gdn_wgpu::error::{Error, Result};
use gdn_wgpu::tensor::DType;

use super::cases::HostCase;
use super::inputs::normal;
use super::metrics::Op;
use super::{Config, Timing};

fn cuda_error(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Gpu(format!("CUDA {what}: {e:?}"))
}

/// The chunked plan's overrides for experiments: `GDN_SEGMENT_CHUNKS` (n ≥ 1: cut every
/// sequence longer than n chunks), `GDN_V_BLOCK` (32, 64 or 128), `GDN_FWD_ROLES` (1: split
/// roles at V-blocks 32 and 64, 0: warp pairs) and `GDN_FWD_WGMMA` (1: the roles' main pass on
/// warpgroup MMAs where the device is sm_90a and the V-block 64, 0: mma.sync) and
/// `GDN_FWD_WGMMA_STAGES` (2 or 3: the wgmma pass's pipeline depth), as
/// docs/configuration.md says; unset: the plan's own choices. The correctness gate runs the
/// plan's own choices.
fn plan_options() -> Result<PlanOptions> {
    let read = |name: &str| -> Result<Option<usize>> {
        match std::env::var(name) {
            Err(_) => Ok(None),
            Ok(s) => s
                .trim()
                .parse::<usize>()
                .map(Some)
                .map_err(|_| Error::Value {
                    name: name.into(),
                    expected: "a positive integer".into(),
                    got: s,
                }),
        }
    };
    Ok(PlanOptions {
        segments: read("GDN_SEGMENT_CHUNKS")?.map_or(Segments::Auto, Segments::Chunks),
        value_block: read("GDN_V_BLOCK")?,
        roles: read("GDN_FWD_ROLES")?.map(|r| r == 1),
        wgmma: read("GDN_FWD_WGMMA")?.map(|r| r == 1),
        wgmma_stages: read("GDN_FWD_WGMMA_STAGES")?,
    })
}

/// The timed chunked backward's overrides: `GDN_BWD_CHAINS` (auto, serial, together, apart),
/// `GDN_BWD_PAIRS` (0/off, 1/on: warp pairs in the chains), `GDN_BWD_SEGMENT_CHUNKS` (auto,
/// off, n: the chains' segments) and `GDN_V_BLOCK`.
fn backward_options() -> Result<BackwardOptions> {
    let chains = match std::env::var("GDN_BWD_CHAINS") {
        Err(_) => ChainSchedule::Auto,
        Ok(s) => match s.trim().to_ascii_lowercase().as_str() {
            "auto" => ChainSchedule::Auto,
            "serial" => ChainSchedule::Serial,
            "together" => ChainSchedule::Together,
            "apart" => ChainSchedule::Apart,
            _ => {
                return Err(Error::Value {
                    name: "GDN_BWD_CHAINS".into(),
                    expected: "auto, serial, together or apart".into(),
                    got: s,
                });
            }
        },
    };
    let warp_pairs = match std::env::var("GDN_BWD_PAIRS") {
        Err(_) => None,
        Ok(s) => match s.trim() {
            "auto" => None,
            "0" | "off" => Some(false),
            "1" | "on" => Some(true),
            _ => {
                return Err(Error::Value {
                    name: "GDN_BWD_PAIRS".into(),
                    expected: "auto, 0, off, 1 or on".into(),
                    got: s,
                });
            }
        },
    };
    let segments = match std::env::var("GDN_BWD_SEGMENT_CHUNKS") {
        Err(_) => Segments::Auto,
        Ok(s) => match s.trim() {
            "auto" => Segments::Auto,
            "0" | "off" => Segments::Off,
            n => n
                .parse::<usize>()
                .map(Segments::Chunks)
                .map_err(|_| Error::Value {
                    name: "GDN_BWD_SEGMENT_CHUNKS".into(),
                    expected: "auto, off (or 0) or a positive integer".into(),
                    got: s.clone(),
                })?,
        },
    };
    Ok(BackwardOptions {
        chains,
        value_block: plan_options()?.value_block,
        warp_pairs,
        segments,
    })
}

/// Median GPU ms of `reps` runs of `launch` between two events on the context's stream.
fn event_median(ctx: &Context, reps: usize, launch: &dyn Fn() -> Result<()>) -> Result<f64> {
    let (start, end) = (ctx.timing_event()?, ctx.timing_event()?);
    let mut ms = Vec::with_capacity(reps);
    for _ in 0..reps.max(1) {
        start
            .record(ctx.stream())
            .map_err(|e| cuda_error("event record", e))?;
        launch()?;
        end.record(ctx.stream())
            .map_err(|e| cuda_error("event record", e))?;
        end.synchronize()
            .map_err(|e| cuda_error("event synchronize", e))?;
        ms.push(
            start
                .elapsed_ms(&end)
                .map_err(|e| cuda_error("event elapsed time", e))? as f64,
        );
    }
    ms.sort_by(f64::total_cmp);
    Ok(ms[ms.len() / 2])
}

/// Warm up, then time `reps` repetitions of `op` on `host` (fewer when they would take longer
/// than `max_seconds`). Also returns what the launches run, in words (the record's variant).
pub fn time(ctx: &Context, op: Op, host: &HostCase, c: &Config) -> Result<(String, Timing)> {
    if c.cuda_graph == 0 {
        return time_on(ctx, op, host, c, None);
    }
    // Capture needs a stream without cudarc's per-buffer event tracking (its event records
    // would enter the graph): a stream of our own, wrapped as a caller's stream.
    let stream = CudaContext::new(ctx.ordinal())
        .and_then(|owner| owner.new_stream())
        .map_err(|e| cuda_error("stream for graph capture", e))?;
    // SAFETY: `stream` belongs to the device's primary context and outlives `graph_ctx` (both
    // are dropped at the end of this function, after every launch has been waited for).
    let graph_ctx = unsafe { Context::from_raw_stream(ctx.ordinal(), stream.cu_stream()) }?;
    time_on(&graph_ctx, op, host, c, Some(&stream))
}

fn time_on(
    ctx: &Context,
    op: Op,
    host: &HostCase,
    c: &Config,
    graph_stream: Option<&Arc<CudaStream>>,
) -> Result<(String, Timing)> {
    let (warmup, reps, max_seconds, seed) = (c.warmup, c.reps, c.max_seconds, c.seed);
    let p = &host.problem;
    let dev = cuda_backend::upload_inputs(ctx, &host.inputs.as_ref())?;
    let inputs = dev.as_ref();
    let seq = SeqBounds::upload(ctx, p)?;
    let o = CudaTensor::zeros(ctx, "o", &p.v_shape(), host.dtype)?;
    let state = CudaTensor::zeros(ctx, "final state", &p.state_shape(), DType::F32)?;
    let outputs = ForwardOutputs {
        o: &o,
        final_state: &state,
    };
    // Each op's launches, enqueued with everything they need made beforehand.
    let mut variant: String;
    let launch: Box<dyn Fn() -> Result<()>> = match op {
        Op::Forward => match cuda_backend::forward_path(ctx, p, host.dtype)? {
            ForwardPath::Chunked => {
                // --segment-window overrides the context's (GDN_SEGMENT_WINDOW).
                let window = c.segment_window.unwrap_or(ctx.segment_window());
                let plan = ChunkPlan::with_window(ctx, p, host.dtype, plan_options()?, window)?;
                // The parallel passes (l2norm, prep) alone, after a warm-up, for the split.
                let parallel = || {
                    cuda_backend::launch_chunked_passes(
                        ctx,
                        p,
                        &plan,
                        &inputs,
                        &outputs,
                        ChunkedPasses::Parallel,
                    )
                };
                parallel()?;
                let parallel_ms = event_median(ctx, reps.min(10), &parallel)?;
                // One whole call, for the window's report of which path each pair took.
                cuda_backend::launch_chunked(ctx, p, &plan, &inputs, &outputs)?;
                let segments = match (plan.segment_chunks(), plan.segment_paths(ctx)?) {
                    (Some(n), Some(paths)) => format!(
                        "segments of {n} chunks, {}, pairs windowed / exact {} / {} (longest warm-up {} chunks)",
                        plan.segment_window()
                            .map_or("exact transitions".into(), |w| w.to_string()),
                        paths.windowed,
                        paths.exact,
                        paths.longest_warmup_chunks
                    ),
                    _ => "whole sequences".into(),
                };
                variant = format!(
                    "cuda chunked tensor-core forward, V-block {}{}, {segments}, parallel passes {parallel_ms:.4} ms",
                    plan.value_block(),
                    if plan.wgmma() {
                        format!(" (split roles, wgmma, {} stages)", plan.wgmma_stages())
                    } else if plan.roles() {
                        " (split roles)".into()
                    } else {
                        String::new()
                    },
                );
                Box::new(move || cuda_backend::launch_chunked(ctx, p, &plan, &inputs, &outputs))
            }
            ForwardPath::Recurrent => {
                variant = "cuda recurrent forward".into();
                Box::new(move || {
                    cuda_backend::forward_recurrent_into(ctx, p, &seq, &inputs, &outputs)
                })
            }
        },
        Op::Decode => {
            variant = "cuda decode kernel (decode.cu) step over an in-place pool".into();
            // The pool starts from h0 and is updated in place, one token per sequence.
            let pool = match &host.inputs.initial_state {
                Some(h0) => CudaTensor::upload(ctx, "pool", h0)?,
                None => CudaTensor::zeros(ctx, "pool", &p.state_shape(), DType::F32)?,
            };
            Box::new(move || cuda_backend::decode_into(ctx, p, &seq, &inputs, &o, &pool, 1))
        }
        Op::Backward => {
            let path = cuda_backend::backward_path(ctx, p, host.dtype)?;
            let workspace =
                BackwardWorkspace::with_options(ctx, p, host.dtype, path, backward_options()?)?;
            variant = match workspace.path() {
                BackwardPath::Exact => {
                    "cuda exact backward (BPTT, checkpoints every 64 tokens)".into()
                }
                BackwardPath::Chunked => format!(
                    "cuda chunked tensor-core backward, V-block {}, chains {}{}{}",
                    workspace.value_block().unwrap_or(0),
                    workspace
                        .chain_schedule()
                        .unwrap_or(ChainSchedule::Auto)
                        .name(),
                    if workspace.warp_pairs() == Some(true) {
                        " with warp pairs"
                    } else {
                        ""
                    },
                    workspace
                        .segment_chunks()
                        .map_or(String::new(), |n| format!(", segments of {n} chunks")),
                ),
            };
            let d_o = normal(&p.v_shape(), 1.0, seed ^ 0xd0).with_dtype(host.dtype);
            let d_o = CudaTensor::upload(ctx, "do", &d_o)?;
            let dht = CudaTensor::upload(ctx, "dht", &normal(&p.state_shape(), 0.5, seed ^ 0xd7))?;
            let grads = cuda_backend::backward::alloc_gradients(ctx, p, &inputs, 0.0)?;
            if workspace.path() == BackwardPath::Chunked && graph_stream.is_none() {
                // The passes apart: each stage's time is the difference of the prefixes.
                let g = cuda_backend::backward::gradients_ref(&grads);
                let mut prefix = Vec::new();
                for stage in [
                    ChunkedStage::Prep,
                    ChunkedStage::States,
                    ChunkedStage::Chains,
                    ChunkedStage::Grad,
                    ChunkedStage::All,
                ] {
                    let run = || {
                        cuda_backend::backward::backward_stages_into(
                            ctx,
                            p,
                            &workspace,
                            &inputs,
                            &d_o,
                            Some(&dht),
                            &g,
                            stage,
                        )
                    };
                    run()?;
                    prefix.push(event_median(ctx, reps.min(5), &run)?);
                }
                let names = ["prep", "states", "dh", "grad", "finish"];
                let mut parts = Vec::new();
                for (i, name) in names.iter().enumerate() {
                    let before = if i == 0 { 0.0 } else { prefix[i - 1] };
                    parts.push(format!("{name} {:.4}", prefix[i] - before));
                }
                variant = format!(
                    "{variant}; passes ms (prefix differences): {}",
                    parts.join(", ")
                );
            }
            Box::new(move || {
                let grads = cuda_backend::backward::gradients_ref(&grads);
                cuda_backend::backward::backward_into(
                    ctx,
                    p,
                    &workspace,
                    &inputs,
                    &d_o,
                    Some(&dht),
                    &grads,
                )
            })
        }
    };

    // One repetition: the eager launches, or one replay of a graph of `calls` launches
    // (captured after an eager call has compiled and loaded every kernel).
    let (replay, calls): (Box<dyn Fn() -> Result<()>>, usize) = match graph_stream {
        None => (launch, 1),
        Some(stream) => {
            let calls = c.cuda_graph;
            launch()?;
            ctx.synchronize()?;
            let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
            stream
                .begin_capture(mode)
                .map_err(|e| cuda_error("begin graph capture", e))?;
            let captured = (0..calls).try_for_each(|_| launch());
            let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0));
            captured?;
            let graph = graph
                .map_err(|e| cuda_error("end graph capture", e))?
                .ok_or_else(|| Error::Gpu("CUDA graph capture recorded nothing".into()))?;
            variant = format!("{variant}; CUDA graph of {calls} calls, times per call");
            let replay = move || graph.launch().map_err(|e| cuda_error("graph launch", e));
            (Box::new(replay), calls)
        }
    };
    let per_call = 1.0 / calls as f64;
    let (start, end) = (ctx.timing_event()?, ctx.timing_event()?);
    let mut t = Timing::default();
    let run = |record: bool, t: &mut Timing| -> Result<f64> {
        let begin = Instant::now();
        start
            .record(ctx.stream())
            .map_err(|e| cuda_error("event record", e))?;
        replay()?;
        end.record(ctx.stream())
            .map_err(|e| cuda_error("event record", e))?;
        let enqueued = Instant::now();
        end.synchronize()
            .map_err(|e| cuda_error("event synchronize", e))?;
        let wall = begin.elapsed().as_secs_f64() * 1e3;
        if record {
            let gpu = start
                .elapsed_ms(&end)
                .map_err(|e| cuda_error("event elapsed time", e))?;
            t.gpu.push(gpu as f64 * per_call);
            t.wall.push(wall * per_call);
            t.host
                .push((enqueued - begin).as_secs_f64() * 1e3 * per_call);
        }
        Ok(wall)
    };
    let (warmed, last_wall) = super::warm_up(warmup, c.warmup_ms, || run(false, &mut t))?;
    t.warmup = warmed;
    let reps = if last_wall > 0.0 {
        reps.min(((max_seconds * 1e3 / last_wall).floor() as usize).max(3))
    } else {
        reps
    };
    for _ in 0..reps {
        run(true, &mut t)?;
    }
    t.reps = reps;
    Ok((variant, t))
}
