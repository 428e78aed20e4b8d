//! The correctness gate: before an op is timed, its kernels run on a small shape with the
//! same heads, K, V, storage dtype and kernel variant (V-block, decode tiling) as the timed
//! shape and are compared with the f64 oracle on sampled heads. A wrong kernel gives an error,
//! never a number. The oracle never runs on the big shapes.
//!
//! Forward and backward run through [`Backend`] (the wgpu context with its kernel variant
//! forced, or any other backend); decode runs a wgpu decode plan at the timed shape's tiling.
//! Each output is judged by [`gdn_wgpu::tolerance`], the policy the tests assert, against the
//! oracle on the same inputs the backend gets: q, k, v (and do) already rounded to the storage
//! dtype ([`gdn_wgpu::HostTensor::with_dtype`]).

use crate::bench::BenchError;
use crate::bench::inputs::{gpu_inputs, host_inputs, normal};
use crate::bench::metrics::Op;
use gdn_wgpu::reference::{self, select_heads};
use gdn_wgpu::tensor::{DType, relative_l2};
use gdn_wgpu::tolerance::{self, Arithmetic, Quantity};
use gdn_wgpu::wgpu_backend::decode::{RecurrentStepTiles, StatePool, StateSlot};
use gdn_wgpu::wgpu_backend::path::COOP_V_BLOCK;
use gdn_wgpu::wgpu_backend::{
    ComputePath, Context, DecodeOutputs, DecodePlan, ForwardAlgorithm, GpuTensor,
};
use gdn_wgpu::{Backend, ForwardInputs, HostTensor, Problem};

/// Tokens per sequence of the check shape: two full chunks and a partial one.
pub const CHECK_TOKENS: usize = 131;
/// Sequences of the decode check.
pub const CHECK_DECODE_BATCH: usize = 4;
const SEED: u64 = 0x5eed_c4ec;

/// The policy's bound for `quantity` of `op` on `problem` with `dtype` storage.
fn bound(op: Op, arithmetic: Arithmetic, problem: &Problem, dtype: DType, q: Quantity) -> f64 {
    let op = match op {
        Op::Forward => tolerance::Op::Forward,
        Op::Backward => tolerance::Op::Backward,
        Op::Decode => tolerance::Op::Decode,
    };
    tolerance::Case::new(op, dtype)
        .with_arithmetic(arithmetic)
        .with_l2norm(problem.options.l2norm_qk)
        .tolerance(q)
}

/// The scan V-block the forward uses on `path` for `problem`.
pub fn forward_v_block(ctx: &Context, problem: &Problem, path: ComputePath) -> u32 {
    match path {
        ComputePath::Scalar | ComputePath::F16Math => ctx.tuning().state_scan_v_block(problem),
        ComputePath::CoopMatrix => COOP_V_BLOCK as u32,
    }
}

/// The forward's kernel variant in words, for records and messages.
pub fn forward_variant_name(path: ComputePath, v_block: u32) -> String {
    match path {
        ComputePath::Scalar => format!("scalar path, state_scan V-block {v_block}"),
        ComputePath::F16Math => {
            format!("f16-math path (f16 operands, f32 accumulation), state_scan V-block {v_block}")
        }
        ComputePath::CoopMatrix => {
            format!("coop path (f16 cooperative matrices), state_scan_coop V-block {v_block}")
        }
    }
}

/// One output of a kernel next to the oracle's.
#[derive(Debug, Clone)]
pub struct Compared {
    /// The output's name (`o`, `final_state`, `dq`, …).
    pub name: String,
    /// The kernel's values, flattened row-major.
    pub got: Vec<f32>,
    /// The oracle's values, in the same order.
    pub want: Vec<f64>,
    /// The largest relative L2 error that passes.
    pub tolerance: f64,
}

/// The outputs of one check run, before they are judged by [`verify`].
#[derive(Debug, Clone)]
pub struct CheckCase {
    /// The op that was checked.
    pub op: Op,
    /// The check shape and kernel variant, for messages.
    pub shape: String,
    /// Every output of the op, each with its oracle values and tolerance.
    pub compared: Vec<Compared>,
}

/// What a passed check measured.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckSummary {
    /// The check shape and kernel variant, for the record.
    pub shape: String,
    /// The largest relative L2 error over the outputs.
    pub worst: f64,
    /// The largest tolerance over the outputs.
    pub tolerance: f64,
}

/// Judge a check: every output within its tolerance (NaN or Inf fails), else
/// [`BenchError::CheckFailed`] naming the first bad output.
pub fn verify(case: &CheckCase) -> Result<CheckSummary, BenchError> {
    let mut worst = 0.0f64;
    let mut tol = 0.0f64;
    for c in &case.compared {
        let err = relative_l2(&c.got, &c.want);
        // NaN compares false: a NaN error fails too.
        if err.is_nan() || err > c.tolerance {
            return Err(BenchError::CheckFailed {
                op: case.op.name(),
                shape: case.shape.clone(),
                output: c.name.clone(),
                error: err,
                tolerance: c.tolerance,
            });
        }
        worst = worst.max(err);
        tol = tol.max(c.tolerance);
    }
    Ok(CheckSummary {
        shape: case.shape.clone(),
        worst,
        tolerance: tol,
    })
}

/// v-heads the oracle checks: the first and the last.
fn sample_heads(heads_v: usize) -> Vec<usize> {
    if heads_v == 1 {
        vec![0]
    } else {
        vec![0, heads_v - 1]
    }
}

fn describe(p: &Problem, variant: &str) -> String {
    let seqs: Vec<String> = p.sequences().iter().map(|s| s.len().to_string()).collect();
    let layout = match (p.cu_seqlens.is_some(), p.batch) {
        (true, _) => "packed with cu_seqlens",
        (false, 1) => "one sequence",
        (false, _) => "dense batch",
    };
    format!(
        "{} sequence(s) of {} tokens ({layout}), H={} HV={} K={} V={} ({variant})",
        p.num_sequences(),
        seqs.join("/"),
        p.heads_qk,
        p.heads_v,
        p.key_dim,
        p.value_dim
    )
}

/// Run `f` with `GDN_V_BLOCK`-style forcing of `v_block`, restoring the previous setting.
pub fn with_v_block<T>(ctx: &mut Context, v_block: u32, f: impl FnOnce(&Context) -> T) -> T {
    let before = ctx.tuning().forced_v_block;
    ctx.tuning_mut().forced_v_block = Some(v_block);
    let out = f(ctx);
    ctx.tuning_mut().forced_v_block = before;
    out
}

/// Run `f` with the forward's algorithm forced to `algorithm`, restoring the previous setting
/// (the check shape is shorter than the timed one, and the automatic choice depends on the
/// sequence lengths).
pub fn with_algorithm<T>(
    ctx: &mut Context,
    algorithm: ForwardAlgorithm,
    f: impl FnOnce(&mut Context) -> T,
) -> T {
    let before = ctx.forced_forward_algorithm();
    ctx.set_forward_algorithm(Some(algorithm));
    let out = f(ctx);
    ctx.set_forward_algorithm(before);
    out
}

/// The wgpu chunked forward on `problem` (small) at state_scan V-block `v_block` (the scalar
/// path's; the coop path has one width), on the compute path the context chooses for it,
/// against the oracle.
pub fn check_forward(
    ctx: &mut Context,
    problem: &Problem,
    dtype: DType,
    v_block: u32,
) -> Result<CheckCase, BenchError> {
    let path = ctx.forward_path(problem, dtype)?.path;
    let variant = format!("chunked, {}", forward_variant_name(path, v_block));
    with_algorithm(ctx, ForwardAlgorithm::Chunked, |ctx| {
        with_v_block(ctx, v_block, |ctx| {
            check_forward_on(ctx, problem, dtype, &variant)
        })
    })
}

/// The wgpu forward through the recurrent kernel on `problem` (small) against the oracle;
/// `variant` names the tiling of the timed shape.
pub fn check_forward_recurrent(
    ctx: &mut Context,
    problem: &Problem,
    dtype: DType,
    variant: &str,
) -> Result<CheckCase, BenchError> {
    with_algorithm(ctx, ForwardAlgorithm::Recurrent, |ctx| {
        check_forward_on(ctx, problem, dtype, variant)
    })
}

/// `backend`'s forward on `problem` (small) against the oracle on sampled heads; `variant`
/// names the kernel variant for messages.
pub fn check_forward_on(
    backend: &dyn Backend,
    problem: &Problem,
    dtype: DType,
    variant: &str,
) -> Result<CheckCase, BenchError> {
    let p = problem;
    let inputs = host_inputs(p, dtype, SEED);
    let heads = sample_heads(p.heads_v);
    let expected = reference::forward_heads(p, &inputs.as_ref(), &heads)?;
    let out = backend.forward(p, &inputs.as_ref())?;
    let (hv, kv) = (p.heads_v, p.key_dim * p.value_dim);
    let arithmetic = backend.arithmetic(tolerance::Op::Forward, p, dtype);
    let tol = |q| bound(Op::Forward, arithmetic, p, dtype, q);
    Ok(CheckCase {
        op: Op::Forward,
        shape: describe(p, variant),
        compared: vec![
            Compared {
                name: "o".into(),
                got: select_heads(&out.o.data, hv, p.value_dim, &heads),
                want: select_heads(&expected.o, hv, p.value_dim, &heads),
                tolerance: tol(Quantity::Output),
            },
            Compared {
                name: "final_state".into(),
                got: select_heads(&out.final_state.data, hv, kv, &heads),
                want: select_heads(&expected.final_state, hv, kv, &heads),
                tolerance: tol(Quantity::State),
            },
        ],
    })
}

/// The wgpu backward (after a forward) on `problem` (small) with the backward scans at V-block
/// `v_block`, against the f64 BPTT oracle on the GVA group of q/k head 0.
pub fn check_backward(
    ctx: &mut Context,
    problem: &Problem,
    dtype: DType,
    v_block: u32,
) -> Result<CheckCase, BenchError> {
    let variant = format!("backward scan V-block {v_block}");
    with_v_block(ctx, v_block, |ctx| {
        check_backward_on(ctx, problem, dtype, &variant)
    })
}

/// `backend`'s forward and backward on `problem` (small) against the f64 BPTT oracle on the
/// GVA group of q/k head 0.
pub fn check_backward_on(
    backend: &dyn Backend,
    problem: &Problem,
    dtype: DType,
    variant: &str,
) -> Result<CheckCase, BenchError> {
    let p = problem;
    let inputs = host_inputs(p, dtype, SEED);
    let d_o = normal(&p.v_shape(), 1.0, SEED ^ 0xd0).with_dtype(dtype);
    let dht = normal(&p.state_shape(), 0.5, SEED ^ 0xd7);
    let heads: Vec<usize> = (0..p.group()).collect();
    let expected = reference::backward_heads(p, &inputs.as_ref(), &d_o, Some(&dht), &heads)?;
    let (_, grads) = backend.forward_backward(p, &inputs.as_ref(), &d_o, Some(&dht))?;
    let (h, hv, kd, vd) = (p.heads_qk, p.heads_v, p.key_dim, p.value_dim);
    // The policy's bounds for the arithmetic the backend's backward uses on this problem.
    let arithmetic = backend.arithmetic(tolerance::Op::Backward, p, dtype);
    let tol = |q| bound(Op::Backward, arithmetic, p, dtype, q);
    let c = |name: &str, got: Vec<f32>, want: Vec<f64>, q: Quantity| Compared {
        name: name.into(),
        got,
        want,
        tolerance: tol(q),
    };
    let mut compared = vec![
        c(
            "dq",
            select_heads(&grads.dq.data, h, kd, &[0]),
            select_heads(&expected.dq, h, kd, &[0]),
            Quantity::GradQkv,
        ),
        c(
            "dk",
            select_heads(&grads.dk.data, h, kd, &[0]),
            select_heads(&expected.dk, h, kd, &[0]),
            Quantity::GradQkv,
        ),
        c(
            "dv",
            select_heads(&grads.dv.data, hv, vd, &heads),
            select_heads(&expected.dv, hv, vd, &heads),
            Quantity::GradQkv,
        ),
        c(
            "dg",
            select_heads(&grads.dg.data, hv, 1, &heads),
            select_heads(&expected.dg, hv, 1, &heads),
            Quantity::GradGates,
        ),
        c(
            "dbeta",
            select_heads(&grads.dbeta.data, hv, 1, &heads),
            select_heads(&expected.dbeta, hv, 1, &heads),
            Quantity::GradGates,
        ),
    ];
    if let (Some(want), Some(got)) = (&expected.dh0, &grads.dh0) {
        compared.push(c(
            "dh0",
            select_heads(&got.data, hv, kd * vd, &heads),
            select_heads(want, hv, kd * vd, &heads),
            Quantity::GradGates,
        ));
    }
    Ok(CheckCase {
        op: Op::Backward,
        shape: describe(p, variant),
        compared,
    })
}

/// One decode step (T = 1 per sequence, resuming every sequence's state from the pool, stored
/// as `pool_dtype`) with the tiling `tiles`, against the oracle forward from the same initial
/// states (rounded to the pool's dtype).
pub fn check_decode(
    ctx: &Context,
    problem: &Problem,
    dtype: DType,
    pool_dtype: DType,
    tiles: RecurrentStepTiles,
) -> Result<CheckCase, BenchError> {
    let p = problem;
    let mut inputs = host_inputs(p, dtype, SEED);
    // The pool holds h0 in its dtype: the oracle starts from the same values.
    inputs.initial_state = inputs.initial_state.map(|h| HostTensor {
        dtype: DType::F32,
        ..h.with_dtype(pool_dtype)
    });
    let heads = sample_heads(p.heads_v);
    let expected = reference::forward_heads(p, &inputs.as_ref(), &heads)?;
    let h0 = inputs
        .initial_state
        .as_ref()
        .expect("bench inputs have an initial state");
    let step = ForwardInputs {
        initial_state: None,
        ..inputs.clone()
    };
    let gpu = gpu_inputs(ctx, &step)?;
    let pool = StatePool::from_tensor(
        GpuTensor::from_values(ctx, "pool", &h0.shape, pool_dtype, &h0.data)?,
        gdn_wgpu::wgpu_backend::StateLayout::of(p),
    )?;
    let o = GpuTensor::filled(ctx, "o", &p.v_shape(), dtype, f32::NAN)?;
    let slots: Vec<StateSlot> = (0..p.num_sequences() as u32)
        .map(StateSlot::Resume)
        .collect();
    let outputs = DecodeOutputs {
        o: &o,
        per_token_states: None,
    };
    let plan = DecodePlan::with_tiles(ctx, p, &gpu.as_ref(), &pool, &slots, &outputs, tiles)?;
    let mut encoder = ctx.create_encoder("bench check decode");
    plan.record(&mut encoder);
    ctx.submit_and_wait(encoder)?;
    let (o, state) = (
        o.download_blocking(ctx)?,
        pool.tensor().download_blocking(ctx)?,
    );
    let variant = format!("{}, {pool_dtype} pool", super::inputs::tiles_name(&tiles));
    // The wgpu decode kernels multiply in f32 on every adapter; a bf16 pool adds its rounding.
    let tol = |q| {
        tolerance::Case::new(tolerance::Op::Decode, dtype)
            .with_l2norm(p.options.l2norm_qk)
            .with_pool(pool_dtype)
            .tolerance(q)
    };
    let got = (o.data.as_slice(), state.data.as_slice());
    Ok(decode_case(p, &variant, &heads, &expected, got, &tol))
}

/// `backend`'s decode (one step: T = 1 per sequence, from the initial states) on `problem`
/// against the oracle forward from the same initial states.
pub fn check_decode_on(
    backend: &dyn Backend,
    problem: &Problem,
    dtype: DType,
    variant: &str,
) -> Result<CheckCase, BenchError> {
    let p = problem;
    let inputs = host_inputs(p, dtype, SEED);
    let heads = sample_heads(p.heads_v);
    let expected = reference::forward_heads(p, &inputs.as_ref(), &heads)?;
    let out = backend.decode(p, &inputs.as_ref(), 1)?;
    let arithmetic = backend.arithmetic(tolerance::Op::Decode, p, dtype);
    let tol = |q| bound(Op::Decode, arithmetic, p, dtype, q);
    let got = (out.o.data.as_slice(), out.final_state.data.as_slice());
    Ok(decode_case(p, variant, &heads, &expected, got, &tol))
}

/// A decode step's o and states next to the oracle's, on the sampled `heads`.
fn decode_case(
    p: &Problem,
    variant: &str,
    heads: &[usize],
    expected: &gdn_wgpu::ForwardOutputs<Vec<f64>>,
    (o, state): (&[f32], &[f32]),
    tol: &dyn Fn(Quantity) -> f64,
) -> CheckCase {
    let (hv, kv) = (p.heads_v, p.key_dim * p.value_dim);
    CheckCase {
        op: Op::Decode,
        shape: describe(p, variant),
        compared: vec![
            Compared {
                name: "o".into(),
                got: select_heads(o, hv, p.value_dim, heads),
                want: select_heads(&expected.o, hv, p.value_dim, heads),
                tolerance: tol(Quantity::Output),
            },
            Compared {
                name: "state".into(),
                got: select_heads(state, hv, kv, heads),
                want: select_heads(&expected.final_state, hv, kv, heads),
                tolerance: tol(Quantity::State),
            },
        ],
    }
}
