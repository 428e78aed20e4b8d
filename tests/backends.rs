//! Every backend through the one `Backend` interface, on the shared hard cases
//! (tests/common/cases.rs, the list tests/cuda.rs checks the CUDA kernels on): forward, decode
//! and every gradient of the backward against the f64 oracle, each storage dtype the backend
//! takes, tolerances from the policy at the arithmetic the backend reports for the op. Here:
//! the wgpu backend (lavapipe in CI); the CUDA backend runs the same cases in tests/cuda.rs.

mod common;

use common::cases::{
    backward_case, check, check_gradients_with, fail_on, hard_cases, inputs_and_oracle,
};
use gdn_wgpu::tolerance::Op;
use gdn_wgpu::{Backend, DType};

/// Forward, decode (two tokens per step: a window boundary inside every sequence longer than
/// one token) and the backward of every hard case, every dtype the backend takes.
fn run_the_hard_cases(backend: &dyn Backend) {
    let mut failures = Vec::new();
    let name = backend.name();
    for case in hard_cases() {
        let p = &case.problem;
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let (inputs, expected) = inputs_and_oracle(&case, dtype);
            if backend.storage_dtypes(Op::Forward).contains(&dtype) {
                let out = backend.forward(p, &inputs.as_ref()).unwrap();
                let arithmetic = backend.arithmetic(Op::Forward, p, dtype);
                let what = format!("{name} forward");
                failures.extend(
                    check(
                        &what,
                        &case,
                        Op::Forward,
                        dtype,
                        arithmetic,
                        &out,
                        &expected,
                    )
                    .err(),
                );
            }
            if backend.storage_dtypes(Op::Decode).contains(&dtype) {
                let out = backend.decode(p, &inputs.as_ref(), 2).unwrap();
                let arithmetic = backend.arithmetic(Op::Decode, p, dtype);
                let what = format!("{name} decode");
                failures.extend(
                    check(&what, &case, Op::Decode, dtype, arithmetic, &out, &expected).err(),
                );
            }
            if backend.storage_dtypes(Op::Backward).contains(&dtype) {
                let (inputs, d_o, dht, want) = backward_case(&case, dtype, true);
                let (_, grads) = backend
                    .forward_backward(p, &inputs.as_ref(), &d_o, dht.as_ref())
                    .unwrap();
                let what = format!("{name} backward");
                let arithmetic = backend.arithmetic(Op::Backward, p, dtype);
                failures.extend(check_gradients_with(
                    &what, &case, dtype, arithmetic, &grads, &want,
                ));
            }
        }
    }
    fail_on(failures);
}

#[test]
fn the_wgpu_backend_on_the_hard_cases() {
    let Some(ctx) = common::gpu() else { return };
    run_the_hard_cases(ctx);
}
