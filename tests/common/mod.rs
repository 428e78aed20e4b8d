//! Shared test helpers: the GPU context (fails with GDN_REQUIRE_GPU=1 when there is none),
//! random problems, poisoned outputs and relative-L2 checks against the f64 oracle.
#![allow(dead_code)]

pub mod backward;
pub mod cases;
pub mod decode;

use std::sync::OnceLock;

use gdn_wgpu::tolerance::{Case, Op, Quantity};
use gdn_wgpu::wgpu_backend::{self, Context, GpuTensor};
use gdn_wgpu::{
    DType, ForwardInputs, ForwardOutputs, HostTensor, Options, Problem, RandomSpec, reference,
    relative_l2,
};

/// Every option on at once (scale 0.3, l2norm, β-sigmoid, negative eigenvalues, the gate
/// activation, V-first states): the tests' "every option" case.
pub fn every_option() -> Options {
    Options {
        scale: Some(0.3),
        l2norm_qk: true,
        beta_sigmoid: true,
        allow_neg_eigval: true,
        gate_in_kernel: true,
        state_v_first: true,
    }
}

/// `Problem::new(..).unwrap()`: the test files' one shorthand for a valid problem.
#[allow(clippy::too_many_arguments)]
pub fn problem(
    b: usize,
    t: usize,
    h: usize,
    hv: usize,
    k: usize,
    v: usize,
    cu: Option<Vec<usize>>,
    options: Options,
) -> Problem {
    Problem::new(b, t, h, hv, k, v, cu, options).unwrap()
}

/// The policy's f32-storage bound for o and the final state, as a constant for tests/cli.rs
/// (the policy is not `const`); tests/forward.rs asserts it equals the policy.
pub const F32_TOL: f64 = 1e-5;

/// The policy's (o, state) bounds of a forward or decode case.
pub fn tol_o_state(case: Case) -> (f64, f64) {
    (
        case.tolerance(Quantity::Output),
        case.tolerance(Quantity::State),
    )
}

/// The shared context, or `None` (with a loud message) when there is no adapter and
/// `GDN_REQUIRE_GPU` is unset. With `GDN_REQUIRE_GPU=1` a missing adapter fails the test.
pub fn gpu() -> Option<&'static Context> {
    static CTX: OnceLock<Result<Context, String>> = OnceLock::new();
    let ctx = CTX.get_or_init(|| Context::new_blocking().map_err(|e| e.to_string()));
    match ctx {
        Ok(c) => Some(c),
        Err(e) => {
            if std::env::var("GDN_REQUIRE_GPU").is_ok_and(|v| v == "1") {
                panic!("GDN_REQUIRE_GPU=1 but no GPU context: {e}");
            }
            eprintln!("SKIPPED (no GPU adapter; set GDN_REQUIRE_GPU=1 to fail instead): {e}");
            None
        }
    }
}

pub fn upload_inputs(
    ctx: &Context,
    inputs: &ForwardInputs<HostTensor>,
) -> ForwardInputs<GpuTensor> {
    wgpu_backend::upload_inputs(ctx, &inputs.as_ref()).unwrap()
}

/// Errors of one GPU forward against the oracle.
#[derive(Debug)]
pub struct Errors {
    pub o: f64,
    pub state: f64,
}

/// Record a forward with `record` into NaN-poisoned outputs (o in `dtype`, the final state
/// f32), submit, wait, and download both; also returns what `record` returned.
pub fn run_poisoned<R>(
    ctx: &Context,
    problem: &Problem,
    dtype: DType,
    record: impl FnOnce(&mut wgpu::CommandEncoder, &ForwardOutputs<&GpuTensor>) -> gdn_wgpu::Result<R>,
) -> (HostTensor, HostTensor, R) {
    let o = GpuTensor::filled(ctx, "o", &problem.v_shape(), dtype, f32::NAN).unwrap();
    let state = GpuTensor::filled(
        ctx,
        "final_state",
        &problem.state_shape(),
        DType::F32,
        f32::NAN,
    )
    .unwrap();
    let mut encoder = ctx.create_encoder("test forward");
    let out = record(
        &mut encoder,
        &ForwardOutputs {
            o: &o,
            final_state: &state,
        },
    )
    .unwrap();
    ctx.submit_and_wait(encoder).unwrap();
    (
        o.download_blocking(ctx).unwrap(),
        state.download_blocking(ctx).unwrap(),
        out,
    )
}

/// Run the chunked GPU forward into NaN-poisoned outputs and compare with the oracle (the
/// automatic choice would take the recurrent kernel on CPU adapters such as lavapipe).
pub fn forward_errors(ctx: &Context, problem: &Problem, spec: &RandomSpec) -> Errors {
    let inputs = spec.generate(problem);
    let expected = reference::forward(problem, &inputs.as_ref()).unwrap();
    let gpu_inputs = upload_inputs(ctx, &inputs);
    let (o, state, _) = run_poisoned(ctx, problem, DType::F32, |encoder, outputs| {
        wgpu_backend::forward_into_with_algorithm(
            ctx,
            encoder,
            problem,
            &gpu_inputs.as_ref(),
            outputs,
            wgpu_backend::ForwardAlgorithm::Chunked,
        )
    });
    Errors {
        o: relative_l2(&o.data, &expected.o),
        state: relative_l2(&state.data, &expected.final_state),
    }
}

/// Assert the chunked GPU forward matches the oracle within the policy's f32 bounds.
pub fn check_forward(problem: &Problem, spec: &RandomSpec) {
    let Some(ctx) = gpu() else { return };
    let e = forward_errors(ctx, problem, spec);
    eprintln!("{problem:?}\n  rel-L2 o {:.3e}, state {:.3e}", e.o, e.state);
    let (tol_o, tol_s) = tol_o_state(Case::new(Op::Forward, DType::F32));
    assert!(
        e.o <= tol_o,
        "o: rel-L2 {:e} > {tol_o:e} for {problem:?} {spec:?}",
        e.o
    );
    assert!(
        e.state <= tol_s,
        "final state: rel-L2 {:e} > {tol_s:e} for {problem:?} {spec:?}",
        e.state
    );
}

/// A dense problem with default options.
pub fn dense(b: usize, t: usize, h: usize, hv: usize, k: usize, v: usize) -> Problem {
    Problem::new(b, t, h, hv, k, v, None, Options::default()).unwrap()
}

/// Run the forward with q, k, v (and so o) stored as `dtype`, against the oracle on the same
/// rounded inputs, on the scalar path. Returns `None` when the device lacks the dtype (f16
/// without SHADER_F16).
pub fn forward_errors_dtype(
    ctx: &Context,
    problem: &Problem,
    spec: &RandomSpec,
    dtype: DType,
) -> Option<Errors> {
    forward_errors_path(ctx, problem, spec, dtype, wgpu_backend::ComputePath::Scalar)
}

/// [`forward_errors_dtype`] on a given compute path (which must be available).
pub fn forward_errors_path(
    ctx: &Context,
    problem: &Problem,
    spec: &RandomSpec,
    dtype: DType,
    path: wgpu_backend::ComputePath,
) -> Option<Errors> {
    if !ctx.forward_storage_dtypes().contains(&dtype) {
        eprintln!("{dtype} storage not available on this device: not run");
        return None;
    }
    let mut inputs = spec.generate(problem);
    for t in [&mut inputs.q, &mut inputs.k, &mut inputs.v] {
        *t = t.clone().with_dtype(dtype);
    }
    let expected = reference::forward(problem, &inputs.as_ref()).unwrap();
    let gpu_inputs = upload_inputs(ctx, &inputs);
    let (o, state, _) = run_poisoned(ctx, problem, dtype, |encoder, outputs| {
        wgpu_backend::forward_into_with_path(
            ctx,
            encoder,
            problem,
            &gpu_inputs.as_ref(),
            outputs,
            path,
        )
    });
    assert_eq!(o.dtype, dtype);
    Some(Errors {
        o: relative_l2(&o.data, &expected.o),
        state: relative_l2(&state.data, &expected.final_state),
    })
}

/// Every option of the forward on its own (each kernel family is tested with each).
pub fn each_single_option() -> Vec<Options> {
    let d = Options::default();
    vec![
        Options {
            scale: Some(0.37),
            ..d
        },
        Options {
            l2norm_qk: true,
            ..d
        },
        Options {
            beta_sigmoid: true,
            ..d
        },
        Options {
            beta_sigmoid: true,
            allow_neg_eigval: true,
            ..d
        },
        Options {
            gate_in_kernel: true,
            ..d
        },
        Options {
            state_v_first: true,
            ..d
        },
    ]
}
