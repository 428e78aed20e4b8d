//! Times the CUDA forward on the shapes (bf16, K = V = 128): the chunked tensor-core
//! path against the recurrent kernel, CUDA-event-timed medians after warm-up, and how far the
//! two results are apart (rel-L2 of o and the final state).
//!
//! `cargo run --release --features cuda --example cuda_forward -- [runs]` (default 20 runs).

use cudarc::driver::sys::CUevent_flags;
use gdn_wgpu::cuda_backend::{
    self, ChunkPlan, ChunkedPasses, Context, CudaTensor, ForwardPath, SeqBounds, forward_path,
    launch_chunked, launch_chunked_passes,
};
use gdn_wgpu::{
    Backend, DType, Error, ForwardInputs, ForwardOutputs, Options, Problem, RandomSpec, Result,
    relative_l2,
};

const K: usize = 128;
const V: usize = 128;

fn gpu(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Gpu(format!("{what}: {e:?}"))
}

/// Median milliseconds of `runs` CUDA-event-timed calls of `f` after two warm-up calls.
fn time_ms(ctx: &Context, runs: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let cu = ctx.cuda_context();
    let (start, end) = (
        cu.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| gpu("event", e))?,
        cu.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| gpu("event", e))?,
    );
    for _ in 0..2 {
        f()?;
    }
    ctx.synchronize()?;
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        start.record(ctx.stream()).map_err(|e| gpu("record", e))?;
        f()?;
        end.record(ctx.stream()).map_err(|e| gpu("record", e))?;
        end.synchronize().map_err(|e| gpu("event sync", e))?;
        times.push(start.elapsed_ms(&end).map_err(|e| gpu("elapsed", e))? as f64);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

fn upload(
    ctx: &Context,
    inputs: &ForwardInputs<gdn_wgpu::HostTensor>,
) -> Result<ForwardInputs<CudaTensor>> {
    let up = |name: &str, t: &gdn_wgpu::HostTensor| CudaTensor::upload(ctx, name, t);
    Ok(ForwardInputs {
        q: up("q", &inputs.q)?,
        k: up("k", &inputs.k)?,
        v: up("v", &inputs.v)?,
        g: up("g", &inputs.g)?,
        beta: up("beta", &inputs.beta)?,
        initial_state: None,
        a_log: None,
        dt_bias: None,
    })
}

fn shape(ctx: &Context, h: usize, hv: usize, seqs: usize, len: usize, runs: usize) -> Result<()> {
    let tokens = seqs * len;
    let cu = (seqs > 1).then(|| (0..=seqs).map(|i| i * len).collect::<Vec<_>>());
    let problem = Problem::new(1, tokens, h, hv, K, V, cu, Options::default())?;
    let dtype = DType::BF16;
    let mut inputs = RandomSpec::default().generate(&problem);
    for t in [&mut inputs.q, &mut inputs.k, &mut inputs.v] {
        *t = t.clone().with_dtype(dtype);
    }
    let dev = upload(ctx, &inputs)?;
    let seq = SeqBounds::upload(ctx, &problem)?;
    let make_out = || -> Result<(CudaTensor, CudaTensor)> {
        Ok((
            CudaTensor::zeros(ctx, "o", &problem.v_shape(), dtype)?,
            CudaTensor::zeros(ctx, "state", &problem.state_shape(), DType::F32)?,
        ))
    };
    let (o_c, s_c) = make_out()?;
    let (o_r, s_r) = make_out()?;
    let out_c = ForwardOutputs {
        o: &o_c,
        final_state: &s_c,
    };
    let out_r = ForwardOutputs {
        o: &o_r,
        final_state: &s_r,
    };
    let name = if seqs > 1 {
        format!("{h}/{hv} {seqs}×{len}")
    } else {
        format!("{h}/{hv} 1×{len}")
    };
    let path = forward_path(ctx, &problem, dtype)?;
    if path != ForwardPath::Chunked {
        println!("{name}: the chunked path does not run here ({path:?})");
        return Ok(());
    }
    // The state split hi + lo as MMA operand first, then the default (rounded once per chunk,
    // FLA's choice), whose o and state are the ones compared below.
    let split = ChunkPlan::new(ctx, &problem, dtype)?.with_split_state(true);
    let split_ms = time_ms(ctx, runs, || {
        launch_chunked(ctx, &problem, &split, &dev.as_ref(), &out_c)
    })?;
    ctx.synchronize()?;
    let (o_split, s_split) = (o_c.download(ctx)?, s_c.download(ctx)?);
    drop(split);
    let plan = ChunkPlan::new(ctx, &problem, dtype)?;
    let parallel = time_ms(ctx, runs, || {
        let passes = ChunkedPasses::Parallel;
        launch_chunked_passes(ctx, &problem, &plan, &dev.as_ref(), &out_c, passes)
    })?;
    let chunked = time_ms(ctx, runs, || {
        launch_chunked(ctx, &problem, &plan, &dev.as_ref(), &out_c)
    })?;
    let recurrent = time_ms(ctx, 3, || {
        cuda_backend::forward_recurrent_into(ctx, &problem, &seq, &dev.as_ref(), &out_r)
    })?;
    // FLA's chunked-forward count per token per v-head: 2C(3K + 2V) + 6KV (docs §8.3).
    let flop = (tokens * hv) as f64 * (2.0 * 64.0 * (3 * K + 2 * V) as f64 + 6.0 * (K * V) as f64);
    let (oc, or) = (o_c.download(ctx)?, o_r.download(ctx)?);
    let (sc, sr) = (s_c.download(ctx)?, s_r.download(ctx)?);
    let to64 = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<_>>();
    println!(
        "{name}: chunked, state split hi + lo: {split_ms:.3} ms ({:.1} TFLOP/s); \
         vs recurrent rel-L2 o {:.2e}, state {:.2e}",
        flop / split_ms * 1e-9,
        relative_l2(&o_split.data, &to64(&or.data)),
        relative_l2(&s_split.data, &to64(&sr.data)),
    );
    println!(
        "{name}: chunked {chunked:.3} ms (parallel passes {parallel:.3} ms; {:.1} TFLOP/s, V-block {}, workspace {:.0} MiB), \
         recurrent {recurrent:.3} ms ({:.1}× faster); chunked vs recurrent rel-L2 o {:.2e}, state {:.2e}",
        flop / chunked * 1e-9,
        plan.value_block(),
        plan.workspace_bytes() as f64 / (1 << 20) as f64,
        recurrent / chunked,
        relative_l2(&oc.data, &to64(&or.data)),
        relative_l2(&sc.data, &to64(&sr.data)),
    );
    Ok(())
}

fn main() -> Result<()> {
    let runs = match std::env::args().nth(1) {
        Some(a) => a
            .parse()
            .map_err(|_| Error::Gpu(format!("runs: a positive integer, got {a}")))?,
        None => 20,
    };
    let ctx = Context::new()?;
    println!(
        "{}; bf16, K = V = {K}, median of {runs} runs",
        ctx.describe()
    );
    for (h, hv, seqs, len) in [(16, 64, 1, 32768), (2, 8, 1, 32768), (16, 64, 8, 4096)] {
        shape(&ctx, h, hv, seqs, len, runs)?;
    }
    Ok(())
}
