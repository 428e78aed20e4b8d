//! Every input error is a typed `Error` naming the parameter, never a panic: problems, tensors
//! and GPU outputs of the forward, decode calls (which leave the state pool untouched) and the
//! backward's upstream gradients and saved context.

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
    // One row larger than any buffer the device allows: refused before allocation (larger
    // than a binding or a buffer is fine: split into buffers of whole rows and bound in
    // windows, tests/windows.rs).
    let limit = ctx.limits().max_buffer_size;
    let row = (limit / 4) as usize + 1024;
    let e = GpuTensor::empty(ctx, "v", &[1, 1, row], DType::F32).unwrap_err();
    assert!(
        matches!(&e, Error::TooLarge { limit_name, .. } if *limit_name == "max_buffer_size"),
        "{e}"
    );
    assert_names(&e, "v");
    // The context reports no device error after all of this.
    ctx.check().unwrap();
}

/// Decode: bad input is a typed error naming the tensor, and the pool is left untouched.
mod decode {
    use crate::common::decode::{random_pool, spec};
    use crate::common::problem;
    use crate::common::{gpu, upload_inputs};
    use gdn_wgpu::wgpu_backend::decode::{StateLayout, StatePool, StateSlot};
    use gdn_wgpu::wgpu_backend::{Context, DecodeOutputs, DecodePlan, GpuTensor, decode_step};
    use gdn_wgpu::{DType, Error, ForwardInputs, HostTensor, Options, Problem};

    use StateSlot::{Fresh, Resume};

    /// A valid call's pieces; each error test breaks one.
    struct Valid {
        p: Problem,
        inputs: ForwardInputs<GpuTensor>,
        pool: StatePool,
        pool_before: HostTensor,
        o: GpuTensor,
    }

    fn valid(ctx: &Context, options: Options) -> Valid {
        let p = problem(2, 1, 1, 2, 16, 16, None, options);
        let mut inputs = upload_inputs(ctx, &spec(130).generate(&p));
        inputs.initial_state = None;
        let pool_before = random_pool(&p, 3, 130);
        let pool = StatePool::from_tensor(
            GpuTensor::upload(ctx, "pool", &pool_before).unwrap(),
            StateLayout::of(&p),
        )
        .unwrap();
        let o = GpuTensor::empty(ctx, "o", &p.v_shape(), DType::F32).unwrap();
        Valid {
            p,
            inputs,
            pool,
            pool_before,
            o,
        }
    }

    /// Record a call that must fail: check the error kind names `name`, then submit whatever was
    /// recorded and compare the pool bitwise with its content before.
    fn expect_rejected(
        ctx: &Context,
        valid: &Valid,
        result: impl FnOnce(&mut wgpu::CommandEncoder) -> gdn_wgpu::Result<()>,
        name: &str,
    ) -> Error {
        let mut encoder = ctx.create_encoder("rejected");
        let err = result(&mut encoder).expect_err("the call should be rejected");
        let msg = err.to_string();
        assert!(msg.contains(name), "error {msg:?} does not name {name:?}");
        assert!(err.is_input_error(), "{msg:?} should be an input error");
        ctx.submit_and_wait(encoder).unwrap();
        let after = valid.pool.tensor().download_blocking(ctx).unwrap();
        let same = valid
            .pool_before
            .data
            .iter()
            .zip(&after.data)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "the pool changed after a rejected call ({msg})");
        err
    }

    fn call(
        ctx: &Context,
        valid: &Valid,
        pool: &StatePool,
        slots: &[StateSlot],
        outputs: &DecodeOutputs<'_>,
        encoder: &mut wgpu::CommandEncoder,
    ) -> gdn_wgpu::Result<()> {
        decode_step(
            ctx,
            encoder,
            &valid.p,
            &valid.inputs.as_ref(),
            pool,
            slots,
            outputs,
        )
    }

    #[test]
    fn error_slot_out_of_range() {
        let Some(ctx) = gpu() else { return };
        let v = valid(ctx, Options::default());
        let out = DecodeOutputs {
            o: &v.o,
            per_token_states: None,
        };
        for slots in [[Resume(0), Resume(3)], [Fresh(7), Resume(0)]] {
            let e = expect_rejected(
                ctx,
                &v,
                |enc| call(ctx, &v, &v.pool, &slots, &out, enc),
                "slots",
            );
            assert!(
                matches!(e, Error::Value { .. }) && e.to_string().contains("0..3"),
                "{e}"
            );
        }
    }

    #[test]
    fn error_same_slot_twice() {
        let Some(ctx) = gpu() else { return };
        let v = valid(ctx, Options::default());
        let out = DecodeOutputs {
            o: &v.o,
            per_token_states: None,
        };
        for slots in [[Resume(1), Resume(1)], [Fresh(2), Resume(2)]] {
            let e = expect_rejected(
                ctx,
                &v,
                |enc| call(ctx, &v, &v.pool, &slots, &out, enc),
                "slots",
            );
            assert!(e.to_string().contains("sequences 0 and 1"), "{e}");
        }
    }

    #[test]
    fn error_wrong_number_of_slots() {
        let Some(ctx) = gpu() else { return };
        let v = valid(ctx, Options::default());
        let out = DecodeOutputs {
            o: &v.o,
            per_token_states: None,
        };
        expect_rejected(
            ctx,
            &v,
            |enc| call(ctx, &v, &v.pool, &[Resume(0)], &out, enc),
            "slots",
        );
    }

    #[test]
    fn error_pool_shape_mismatch() {
        let Some(ctx) = gpu() else { return };
        let v = valid(ctx, Options::default());
        let out = DecodeOutputs {
            o: &v.o,
            per_token_states: None,
        };
        // HV = 1 instead of 2.
        let other = StatePool::zeros(ctx, 3, 1, 16, 16, StateLayout::KFirst).unwrap();
        let e = expect_rejected(
            ctx,
            &v,
            |enc| call(ctx, &v, &other, &[Resume(0), Resume(1)], &out, enc),
            "pool",
        );
        assert!(matches!(e, Error::Shape { .. }), "{e}");
    }

    #[test]
    fn error_pool_layout_mismatch() {
        let Some(ctx) = gpu() else { return };
        let v = valid(ctx, Options::default());
        let out = DecodeOutputs {
            o: &v.o,
            per_token_states: None,
        };
        // K = V: the shapes agree, only the recorded layout tells them apart.
        let v_first = StatePool::from_tensor(v.pool.tensor().clone(), StateLayout::VFirst).unwrap();
        let e = expect_rejected(
            ctx,
            &v,
            |enc| call(ctx, &v, &v_first, &[Resume(0), Resume(1)], &out, enc),
            "pool",
        );
        assert!(e.to_string().contains("V-first"), "{e}");
    }

    #[test]
    fn error_pool_tensor_not_f32_or_not_4d() {
        let Some(ctx) = gpu() else { return };
        let flat = GpuTensor::empty(ctx, "flat", &[3, 512], DType::F32).unwrap();
        let e = StatePool::from_tensor(flat, StateLayout::KFirst).unwrap_err();
        assert!(
            matches!(e, Error::Shape { .. }) && e.to_string().contains("pool"),
            "{e}"
        );
        let half = GpuTensor::empty(ctx, "half", &[3, 2, 16, 16], DType::F16).unwrap();
        let e = StatePool::from_tensor(half, StateLayout::KFirst).unwrap_err();
        assert!(
            matches!(e, Error::DType { .. }) && e.to_string().contains("pool"),
            "{e}"
        );
    }

    #[test]
    fn error_initial_state_given() {
        let Some(ctx) = gpu() else { return };
        let v = valid(ctx, Options::default());
        let out = DecodeOutputs {
            o: &v.o,
            per_token_states: None,
        };
        let h0 = GpuTensor::empty(ctx, "h0", &v.p.state_shape(), DType::F32).unwrap();
        let inputs = ForwardInputs {
            initial_state: Some(&h0),
            ..v.inputs.as_ref()
        };
        expect_rejected(
            ctx,
            &v,
            |enc| {
                decode_step(
                    ctx,
                    enc,
                    &v.p,
                    &inputs,
                    &v.pool,
                    &[Resume(0), Resume(1)],
                    &out,
                )
            },
            "initial_state",
        );
    }

    #[test]
    fn error_input_shape() {
        let Some(ctx) = gpu() else { return };
        let v = valid(ctx, Options::default());
        let out = DecodeOutputs {
            o: &v.o,
            per_token_states: None,
        };
        let q = GpuTensor::empty(ctx, "q", &[2, 1, 1, 32], DType::F32).unwrap();
        let inputs = ForwardInputs {
            q: &q,
            ..v.inputs.as_ref()
        };
        expect_rejected(
            ctx,
            &v,
            |enc| {
                decode_step(
                    ctx,
                    enc,
                    &v.p,
                    &inputs,
                    &v.pool,
                    &[Resume(0), Resume(1)],
                    &out,
                )
            },
            "q",
        );
    }

    #[test]
    fn error_o_shape() {
        let Some(ctx) = gpu() else { return };
        let v = valid(ctx, Options::default());
        let o = GpuTensor::empty(ctx, "o", &[2, 2, 2, 16], DType::F32).unwrap();
        let out = DecodeOutputs {
            o: &o,
            per_token_states: None,
        };
        expect_rejected(
            ctx,
            &v,
            |enc| call(ctx, &v, &v.pool, &[Resume(0), Resume(1)], &out, enc),
            "o",
        );
    }

    #[test]
    fn error_per_token_states_shape() {
        let Some(ctx) = gpu() else { return };
        let v = valid(ctx, Options::default());
        // One state per sequence instead of one per token and v-head.
        let states =
            GpuTensor::empty(ctx, "per_token_states", &[2, 1, 16, 16], DType::F32).unwrap();
        let out = DecodeOutputs {
            o: &v.o,
            per_token_states: Some(&states),
        };
        expect_rejected(
            ctx,
            &v,
            |enc| call(ctx, &v, &v.pool, &[Resume(0), Resume(1)], &out, enc),
            "per_token_states",
        );
    }

    #[test]
    fn error_set_slots_keeps_the_plan() {
        let Some(ctx) = gpu() else { return };
        let v = valid(ctx, Options::default());
        let out = DecodeOutputs {
            o: &v.o,
            per_token_states: None,
        };
        let mut plan = DecodePlan::new(
            ctx,
            &v.p,
            &v.inputs.as_ref(),
            &v.pool,
            &[Resume(0), Resume(1)],
            &out,
        )
        .unwrap();
        let e = plan.set_slots(ctx, &[Resume(2), Resume(2)]).unwrap_err();
        assert!(e.to_string().contains("slots"), "{e}");
        assert_eq!(plan.slots(), &[Resume(0), Resume(1)]);
    }

    #[test]
    fn error_copy_into_slot_out_of_range() {
        let Some(ctx) = gpu() else { return };
        let v = valid(ctx, Options::default());
        let states = GpuTensor::empty(ctx, "final_state", &v.p.state_shape(), DType::F32).unwrap();
        expect_rejected(
            ctx,
            &v,
            |enc| v.pool.copy_into_slot(enc, &states, 0, 3),
            "slot",
        );
        expect_rejected(
            ctx,
            &v,
            |enc| v.pool.copy_into_slot(enc, &states, 2, 0),
            "states",
        );
    }

    /// A bf16 pool takes bf16 states only: per-token states and slot copies of another dtype
    /// are refused before anything is recorded, and a pool dtype other than f32 or bf16 is a
    /// typed error wherever a pool is made.
    #[test]
    fn error_bf16_pool_dtype_mismatches() {
        let Some(ctx) = gpu() else { return };
        let mut v = valid(ctx, Options::default());
        v.pool_before = v.pool_before.clone().with_dtype(DType::BF16);
        v.pool = StatePool::from_tensor(
            GpuTensor::upload(ctx, "bf16 pool", &v.pool_before).unwrap(),
            StateLayout::of(&v.p),
        )
        .unwrap();
        assert_eq!(v.pool.dtype(), DType::BF16);
        let [a, b] = StateLayout::of(&v.p).inner_shape(16, 16);
        let f32_states =
            GpuTensor::empty(ctx, "per_token_states", &[2, 2, a, b], DType::F32).unwrap();
        let out = DecodeOutputs {
            o: &v.o,
            per_token_states: Some(&f32_states),
        };
        let e = expect_rejected(
            ctx,
            &v,
            |enc| call(ctx, &v, &v.pool, &[Resume(0), Resume(1)], &out, enc),
            "per_token_states",
        );
        assert!(
            matches!(e, Error::DType { .. }) && e.to_string().contains("BF16"),
            "{e}"
        );
        let prefill = GpuTensor::empty(ctx, "final_state", &v.p.state_shape(), DType::F32).unwrap();
        let e = expect_rejected(
            ctx,
            &v,
            |enc| v.pool.copy_into_slot(enc, &prefill, 0, 1),
            "states",
        );
        assert!(matches!(e, Error::DType { .. }), "{e}");
        let e = expect_rejected(
            ctx,
            &v,
            |enc| v.pool.copy_from_slot(enc, 1, &prefill, 0),
            "states",
        );
        assert!(matches!(e, Error::DType { .. }), "{e}");

        let e =
            StatePool::zeros_in(ctx, 2, 2, 16, 16, StateLayout::KFirst, DType::F16).unwrap_err();
        assert!(
            matches!(e, Error::DType { .. }) && e.to_string().contains("pool"),
            "{e}"
        );
        let host = spec(131).generate(&v.p);
        let e = gdn_wgpu::wgpu_backend::decode::decode_host_in(
            ctx,
            &v.p,
            &host.as_ref(),
            1,
            DType::F16,
        )
        .unwrap_err();
        assert!(
            matches!(e, Error::DType { .. }) && e.to_string().contains("pool"),
            "{e}"
        );
    }

    #[test]
    fn error_o_dtype_differs_from_v() {
        let Some(ctx) = gpu() else { return };
        let v = valid(ctx, Options::default());
        let o = GpuTensor::empty(ctx, "o", &v.p.v_shape(), DType::BF16).unwrap();
        let out = DecodeOutputs {
            o: &o,
            per_token_states: None,
        };
        let e = expect_rejected(
            ctx,
            &v,
            |enc| call(ctx, &v, &v.pool, &[Resume(0), Resume(1)], &out, enc),
            "o",
        );
        assert!(matches!(e, Error::DType { .. }), "{e}");
    }
}

/// Backward: malformed upstream gradients and a mismatched saved context are named errors.
mod backward {
    use crate::common::backward::{normal, upstream};
    use crate::common::{dense, gpu};
    use gdn_wgpu::wgpu_backend::{self, GpuTensor};
    use gdn_wgpu::{DType, Error, ForwardInputs, HostTensor, RandomSpec};

    fn spec(seed: u64) -> RandomSpec {
        RandomSpec {
            seed,
            ..RandomSpec::default()
        }
    }

    #[test]
    fn bad_upstream_gradients_are_named() {
        let Some(ctx) = gpu() else { return };
        let problem = dense(1, 8, 1, 2, 16, 16);
        let inputs = spec(130).generate(&problem);
        let wrong = normal(1, &[1, 8, 2, 32], 1.0);
        let err =
            wgpu_backend::backward_host(ctx, &problem, &inputs.as_ref(), &wrong, None).unwrap_err();
        assert!(
            matches!(&err, Error::Shape { name, .. } if name == "do"),
            "{err}"
        );
        let (d_o, _) = upstream(&problem, 130, false);
        let bad_dht = normal(2, &[1, 2, 16, 8], 1.0);
        let err =
            wgpu_backend::backward_host(ctx, &problem, &inputs.as_ref(), &d_o, Some(&bad_dht))
                .unwrap_err();
        assert!(
            matches!(&err, Error::Shape { name, .. } if name == "dht"),
            "{err}"
        );
        let mut nan = d_o.clone();
        nan.data[3] = f32::NAN;
        let err =
            wgpu_backend::backward_host(ctx, &problem, &inputs.as_ref(), &nan, None).unwrap_err();
        assert!(
            matches!(&err, Error::Value { name, .. } if name == "do"),
            "{err}"
        );
        let half = d_o.clone().with_dtype(DType::F16);
        let err =
            wgpu_backend::backward_host(ctx, &problem, &inputs.as_ref(), &half, None).unwrap_err();
        assert!(
            matches!(&err, Error::DType { name, .. } if name == "do"),
            "{err}"
        );
        // A saved context from another problem is refused before any work is recorded.
        let up = |n: &str, t: &HostTensor| GpuTensor::upload(ctx, n, t).unwrap();
        let (q, k, v, g, beta) = (
            up("q", &inputs.q),
            up("k", &inputs.k),
            up("v", &inputs.v),
            up("g", &inputs.g),
            up("beta", &inputs.beta),
        );
        let h0 = up("h0", inputs.initial_state.as_ref().unwrap());
        let gpu_inputs = ForwardInputs {
            q: &q,
            k: &k,
            v: &v,
            g: &g,
            beta: &beta,
            initial_state: Some(&h0),
            a_log: None,
            dt_bias: None,
        };
        let mut encoder = ctx.create_encoder("test");
        let (_, mut saved) =
            wgpu_backend::forward_saved(ctx, &mut encoder, &problem, &gpu_inputs).unwrap();
        saved.problem = dense(1, 8, 1, 2, 16, 32);
        let d_o_gpu = up("do", &d_o);
        let err = wgpu_backend::backward(ctx, &mut encoder, &saved, &d_o_gpu, None).unwrap_err();
        assert!(err.is_input_error(), "{err}");
    }
}
