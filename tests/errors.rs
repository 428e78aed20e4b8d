//! Every input error is a typed `Error` naming the parameter, never a panic.

mod common;

use gdn_wgpu::wgpu_backend::{self, GpuTensor};
use gdn_wgpu::{
    DType, Error, ForwardInputs, ForwardOutputs, HostTensor, Options, Problem, RandomSpec,
    check_host_values,
};

#[allow(clippy::too_many_arguments)]
fn problem_err(
    b: usize,
    t: usize,
    h: usize,
    hv: usize,
    k: usize,
    v: usize,
    cu: Option<Vec<usize>>,
    o: Options,
) -> Error {
    Problem::new(b, t, h, hv, k, v, cu, o).expect_err("problem should be rejected")
}

/// Asserts the error is the expected kind and its message names `name`.
fn assert_names(err: &Error, name: &str) {
    let msg = err.to_string();
    assert!(msg.contains(name), "error {msg:?} does not name {name:?}");
    assert!(err.is_input_error(), "{msg:?} should be an input error");
}

#[test]
fn problem_sizes() {
    let d = Options::default();
    assert!(matches!(
        problem_err(0, 8, 1, 1, 16, 16, None, d),
        Error::Value { .. }
    ));
    assert_names(&problem_err(0, 8, 1, 1, 16, 16, None, d), "batch");
    assert_names(&problem_err(1, 0, 1, 1, 16, 16, None, d), "tokens");
    assert_names(&problem_err(1, 8, 0, 1, 16, 16, None, d), "heads_qk");
    assert_names(&problem_err(1, 8, 2, 3, 16, 16, None, d), "heads_v");
    assert_names(&problem_err(1, 8, 1, 1, 24, 16, None, d), "key_dim");
    assert_names(&problem_err(1, 8, 1, 1, 272, 16, None, d), "key_dim");
    assert_names(&problem_err(1, 8, 1, 1, 16, 0, None, d), "value_dim");
}

#[test]
fn options() {
    let nan_scale = Options {
        scale: Some(f32::NAN),
        ..Options::default()
    };
    assert_names(&problem_err(1, 8, 1, 1, 16, 16, None, nan_scale), "scale");
    let neg = Options {
        allow_neg_eigval: true,
        ..Options::default()
    };
    assert_names(
        &problem_err(1, 8, 1, 1, 16, 16, None, neg),
        "allow_neg_eigval",
    );
}

#[test]
fn cu_seqlens() {
    let d = Options::default();
    assert_names(
        &problem_err(2, 8, 1, 1, 16, 16, Some(vec![0, 8]), d),
        "cu_seqlens",
    );
    assert_names(
        &problem_err(1, 8, 1, 1, 16, 16, Some(vec![8]), d),
        "cu_seqlens",
    );
    assert_names(
        &problem_err(1, 8, 1, 1, 16, 16, Some(vec![1, 8]), d),
        "cu_seqlens",
    );
    assert_names(
        &problem_err(1, 8, 1, 1, 16, 16, Some(vec![0, 5, 3, 8]), d),
        "cu_seqlens",
    );
    assert_names(
        &problem_err(1, 8, 1, 1, 16, 16, Some(vec![0, 4, 7]), d),
        "cu_seqlens",
    );
}

fn small() -> (Problem, ForwardInputs<HostTensor>) {
    let p = Problem::new(1, 10, 1, 2, 16, 16, None, Options::default()).unwrap();
    let inputs = RandomSpec::default().generate(&p);
    (p, inputs)
}

fn check(p: &Problem, inputs: &ForwardInputs<HostTensor>) -> Error {
    p.check_inputs(&inputs.as_ref(), &[DType::F32])
        .expect_err("inputs should be rejected")
}

#[test]
fn tensor_shapes() {
    let (p, base) = small();
    let bad = HostTensor::new([1, 10, 1, 15], vec![0.0; 150]);
    for name in ["q", "k", "v", "g", "beta", "initial_state"] {
        let mut inputs = base.clone();
        match name {
            "q" => inputs.q = bad.clone(),
            "k" => inputs.k = bad.clone(),
            "v" => inputs.v = bad.clone(),
            "g" => inputs.g = bad.clone(),
            "beta" => inputs.beta = bad.clone(),
            _ => inputs.initial_state = Some(bad.clone()),
        }
        let e = check(&p, &inputs);
        assert!(matches!(e, Error::Shape { .. }), "{name}: {e}");
        assert_names(&e, name);
        assert!(e.to_string().contains("[1, 10, 1, 15]"), "{e}");
    }
}

#[test]
fn tensor_dtypes() {
    let (p, base) = small();
    let mut inputs = base.clone();
    inputs.k = inputs.k.with_dtype(DType::F16);
    assert_names(&check(&p, &inputs), "k");
    let mut inputs = base.clone();
    inputs.g = inputs.g.with_dtype(DType::BF16);
    assert_names(&check(&p, &inputs), "g");
    // F16 storage is valid, but this backend has no F16 kernels yet.
    let mut inputs = base.clone();
    for t in [&mut inputs.q, &mut inputs.k, &mut inputs.v] {
        *t = t.clone().with_dtype(DType::F16);
    }
    let e = check(&p, &inputs);
    assert!(matches!(e, Error::Unsupported { .. }), "{e}");
}

#[test]
fn gate_parameters() {
    let (p, base) = small();
    let gated = Problem::new(
        1,
        10,
        1,
        2,
        16,
        16,
        None,
        Options {
            gate_in_kernel: true,
            ..Options::default()
        },
    )
    .unwrap();
    let e = check(&gated, &base);
    assert!(matches!(e, Error::Missing { .. }), "{e}");
    assert_names(&e, "A_log");
    let mut inputs = base.clone();
    inputs.a_log = Some(HostTensor::new([2], vec![0.0; 2]));
    assert_names(&check(&gated, &inputs), "dt_bias");
    assert_names(&check(&p, &inputs), "A_log");
    inputs.dt_bias = Some(HostTensor::new([3], vec![0.0; 3]));
    assert_names(&check(&gated, &inputs), "dt_bias");
}

#[test]
fn host_values() {
    let (p, base) = small();
    let mut inputs = base.clone();
    inputs.v.data[3] = f32::NAN;
    assert_names(&check_host_values(&p, &inputs.as_ref()).unwrap_err(), "v");
    let mut inputs = base.clone();
    inputs.g.data[0] = 0.5;
    assert_names(&check_host_values(&p, &inputs.as_ref()).unwrap_err(), "g");
}

#[test]
fn gpu_outputs_and_sizes() {
    let Some(ctx) = common::gpu() else { return };
    let (p, base) = small();
    let inputs = common::upload_inputs(ctx, &base);
    let o_bad = GpuTensor::empty(ctx, "o", &[1, 10, 2, 32], DType::F32).unwrap();
    let state = GpuTensor::empty(ctx, "final_state", &p.state_shape(), DType::F32).unwrap();
    let mut enc = ctx.create_encoder("errors");
    let e = wgpu_backend::forward_into(
        ctx,
        &mut enc,
        &p,
        &inputs.as_ref(),
        &ForwardOutputs {
            o: &o_bad,
            final_state: &state,
        },
    )
    .unwrap_err();
    assert_names(&e, "o");
    let o = GpuTensor::empty(ctx, "o", &p.v_shape(), DType::F32).unwrap();
    let state_f16 = GpuTensor::empty(ctx, "final_state", &p.state_shape(), DType::F16).unwrap();
    let e = wgpu_backend::forward_into(
        ctx,
        &mut enc,
        &p,
        &inputs.as_ref(),
        &ForwardOutputs {
            o: &o,
            final_state: &state_f16,
        },
    )
    .unwrap_err();
    assert_names(&e, "final_state");
    // Larger than any binding the device allows: refused before allocation.
    let limit = ctx.limits().max_storage_buffer_binding_size as usize;
    let e = GpuTensor::empty(ctx, "v", &[limit / 4 + 1024], DType::F32).unwrap_err();
    assert!(matches!(e, Error::TooLarge { .. }), "{e}");
    assert_names(&e, "v");
    // The context reports no device error after all of this.
    ctx.check().unwrap();
}
