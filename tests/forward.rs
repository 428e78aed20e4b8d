//! The GPU chunked forward against the f64 oracle (relative L2 ≤ 1e-5 for o and the final
//! state, f32 storage), over the hard cases and every option; then the choice between the
//! chunked and the recurrent algorithm, and both algorithms forced on the shared hard cases.
//! Outputs are NaN-poisoned before the kernels run, so an element a kernel fails to write
//! fails the test.

mod common;

use common::{F32_TOL, check_forward, dense, forward_errors, problem, tol_o_state};
use gdn_wgpu::tolerance::{Case, Op, Quantity};
use gdn_wgpu::wgpu_backend::{Context, GpuTensor};
use gdn_wgpu::{DType, Options, RandomSpec};

fn spec(seed: u64) -> RandomSpec {
    RandomSpec {
        seed,
        ..RandomSpec::default()
    }
}

#[test]
fn t_around_the_chunk_size() {
    for (i, t) in [1, 2, 63, 64, 65, 130].into_iter().enumerate() {
        check_forward(&dense(1, t, 1, 2, 32, 32), &spec(i as u64));
    }
}

#[test]
fn batch_of_several_sequences() {
    check_forward(&dense(3, 65, 1, 1, 16, 32), &spec(10));
}

#[test]
fn with_and_without_initial_state() {
    for (i, h0) in [false, true].into_iter().enumerate() {
        let s = RandomSpec {
            seed: 20 + i as u64,
            initial_state: h0,
            ..RandomSpec::default()
        };
        check_forward(&dense(2, 70, 1, 2, 32, 32), &s);
    }
}

#[test]
fn varlen_with_length_one_sequences() {
    let cu = vec![0, 1, 2, 67, 68, 131, 132];
    check_forward(
        &problem(1, 132, 1, 2, 32, 32, Some(cu.clone()), Options::default()),
        &spec(30),
    );
    let s = RandomSpec {
        seed: 31,
        initial_state: false,
        ..RandomSpec::default()
    };
    check_forward(
        &problem(1, 132, 1, 2, 32, 32, Some(cu), Options::default()),
        &s,
    );
}

#[test]
fn varlen_with_an_empty_sequence_keeps_its_initial_state() {
    // A zero-length sequence has no chunk: its final state must be exactly its initial state.
    check_forward(
        &problem(
            1,
            70,
            1,
            1,
            16,
            16,
            Some(vec![0, 5, 5, 70]),
            Options::default(),
        ),
        &spec(35),
    );
}

#[test]
fn gva_ratios_1_2_4() {
    for (i, hv) in [2, 4, 8].into_iter().enumerate() {
        check_forward(&dense(1, 65, 2, hv, 32, 32), &spec(40 + i as u64));
    }
}

#[test]
fn zero_gate_and_strong_gate_heads() {
    let s = RandomSpec {
        seed: 50,
        zero_gate_heads: 2,
        strong_gate_heads: 1,
        ..RandomSpec::default()
    };
    check_forward(&dense(1, 130, 1, 4, 32, 32), &s);
}

#[test]
fn beta_near_zero_and_near_two() {
    for (i, beta) in [(0.0, 1e-3), (1.95, 2.0)].into_iter().enumerate() {
        let s = RandomSpec {
            seed: 60 + i as u64,
            beta,
            ..RandomSpec::default()
        };
        check_forward(&dense(1, 100, 1, 2, 32, 32), &s);
    }
}

#[test]
fn key_dim_different_from_value_dim() {
    for (i, (k, v)) in [(32, 48), (48, 16), (16, 64)].into_iter().enumerate() {
        check_forward(&dense(1, 65, 1, 2, k, v), &spec(70 + i as u64));
    }
}

#[test]
fn head_dim_128() {
    check_forward(&dense(1, 65, 1, 1, 128, 128), &spec(80));
}

#[test]
fn head_dim_256() {
    check_forward(&dense(1, 65, 1, 1, 256, 256), &spec(81));
}

#[test]
fn state_v_first() {
    let o = Options {
        state_v_first: true,
        ..Options::default()
    };
    check_forward(&problem(1, 70, 1, 2, 32, 48, None, o), &spec(90));
}

#[test]
fn each_option() {
    for (i, o) in common::each_single_option().into_iter().enumerate() {
        let s = RandomSpec {
            seed: 100 + i as u64,
            zero_gate_heads: 1,
            strong_gate_heads: 1,
            ..RandomSpec::default()
        };
        check_forward(&problem(1, 70, 1, 3, 32, 32, None, o), &s);
    }
}

#[test]
fn every_option_together_with_varlen_and_gva() {
    let o = Options {
        scale: Some(0.2),
        l2norm_qk: true,
        beta_sigmoid: true,
        allow_neg_eigval: true,
        gate_in_kernel: true,
        state_v_first: true,
    };
    let s = RandomSpec {
        seed: 110,
        zero_gate_heads: 1,
        strong_gate_heads: 1,
        ..RandomSpec::default()
    };
    check_forward(
        &problem(1, 140, 2, 4, 32, 48, Some(vec![0, 1, 66, 140]), o),
        &s,
    );
}

#[test]
fn every_v_block_width_the_device_fits() {
    let Some(shared) = common::gpu() else { return };
    // A private context, so forcing a width does not affect tests running in parallel.
    let mut ctx = Context::new_blocking().unwrap();
    let widths = shared.tuning().v_blocks.clone();
    assert!(
        widths.contains(&16),
        "V-block 16 must fit every device: {widths:?}"
    );
    for bv in widths {
        ctx.tuning_mut().forced_v_block = Some(bv);
        // V = 48 is not a multiple of 32 or 64: the kernel must mask the columns past V.
        for v in [64, 48] {
            let problem = dense(1, 130, 1, 2, 32, v);
            let e = forward_errors(&ctx, &problem, &spec(120 + bv as u64));
            eprintln!("V_BLOCK {bv}, V {v}: {e:?}");
            let (tol_o, tol_s) = tol_o_state(Case::new(Op::Forward, DType::F32));
            assert!(
                e.o <= tol_o && e.state <= tol_s,
                "V_BLOCK {bv}, V {v}: {e:?}"
            );
        }
    }
}

#[test]
fn repeated_runs_are_bitwise_identical() {
    let Some(ctx) = common::gpu() else { return };
    let problem = dense(1, 100, 1, 2, 32, 32);
    let a = forward_errors(ctx, &problem, &spec(130));
    let b = forward_errors(ctx, &problem, &spec(130));
    assert_eq!(a.o.to_bits(), b.o.to_bits());
    assert_eq!(a.state.to_bits(), b.state.to_bits());
}

/// A workspace reused across calls (two different inputs, back to back in one encoder) gives
/// bitwise the outputs of per-call scratch, and the intermediates of its latest call; a
/// workspace made for another problem or dtype is refused.
#[test]
fn workspace_reuse_matches_per_call_scratch() {
    use gdn_wgpu::ForwardOutputs;
    use gdn_wgpu::wgpu_backend::{
        ForwardAlgorithm, ForwardWorkspace, forward_into_with_algorithm, forward_into_workspace,
    };
    let Some(ctx) = common::gpu() else { return };
    let options = Options {
        l2norm_qk: true,
        gate_in_kernel: true,
        beta_sigmoid: true,
        ..Options::default()
    };
    let problem = problem(1, 140, 1, 2, 32, 32, Some(vec![0, 1, 70, 140]), options);
    let ws = ForwardWorkspace::new(ctx, &problem, DType::F32).unwrap();
    assert!(ws.bytes() > 0);
    let run = |seed: u64, workspace: Option<&ForwardWorkspace>| {
        let inputs = common::upload_inputs(ctx, &spec(seed).generate(&problem));
        let (o, s, saved) =
            common::run_poisoned(
                ctx,
                &problem,
                DType::F32,
                |encoder, outputs| match workspace {
                    Some(w) => forward_into_workspace(
                        ctx,
                        encoder,
                        &problem,
                        &inputs.as_ref(),
                        outputs,
                        w,
                        None,
                    ),
                    None => forward_into_with_algorithm(
                        ctx,
                        encoder,
                        &problem,
                        &inputs.as_ref(),
                        outputs,
                        ForwardAlgorithm::Chunked,
                    )
                    .map(|saved| saved.expect("the chunked forward keeps its intermediates")),
                },
            );
        let a = saved.a.download_blocking(ctx).unwrap().data;
        (o.data, s.data, a)
    };
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for seed in [500, 501] {
        let (o1, s1, a1) = run(seed, None);
        let (o2, s2, a2) = run(seed, Some(&ws));
        assert!(o1.iter().all(|x| x.is_finite()));
        assert_eq!(bits(&o1), bits(&o2), "o, seed {seed}");
        assert_eq!(bits(&s1), bits(&s2), "final state, seed {seed}");
        assert_eq!(bits(&a1), bits(&a2), "A, seed {seed}");
    }

    let other = dense(1, 140, 1, 2, 32, 32);
    let inputs = common::upload_inputs(ctx, &spec(1).generate(&other));
    let o = GpuTensor::empty(ctx, "o", &other.v_shape(), DType::F32).unwrap();
    let s = GpuTensor::empty(ctx, "s", &other.state_shape(), DType::F32).unwrap();
    let mut encoder = ctx.create_encoder("workspace mismatch");
    let err = forward_into_workspace(
        ctx,
        &mut encoder,
        &other,
        &inputs.as_ref(),
        &ForwardOutputs {
            o: &o,
            final_state: &s,
        },
        &ws,
        None,
    )
    .unwrap_err();
    assert!(
        matches!(&err, gdn_wgpu::Error::Value { name, .. } if name == "workspace"),
        "{err}"
    );
}

/// Intra-device sequence parallelism (segments of 1 and 2 chunks, scanned in parallel and
/// combined through their transitions) against the oracle on every path the device has, over
/// the hard cases: varlen with length-1 and empty sequences, T not a multiple of 64, GVA,
/// g = 0 and g ≈ −20 heads, β near 2, h0 on/off, V-first states, K ≠ V.
#[test]
fn sequence_parallel_segments() {
    use gdn_wgpu::wgpu_backend::{ComputePath, ForwardWorkspace, forward_into_workspace};
    let Some(ctx) = common::gpu() else { return };
    let d = Options::default();
    let cases = [
        (
            "varlen with length-1 and empty sequences, GVA 2",
            problem(1, 300, 1, 2, 32, 32, Some(vec![0, 1, 1, 200, 201, 300]), d),
        ),
        (
            "V-first, every option, K != V",
            problem(
                2,
                150,
                1,
                2,
                32,
                48,
                None,
                Options {
                    l2norm_qk: true,
                    beta_sigmoid: true,
                    allow_neg_eigval: true,
                    gate_in_kernel: true,
                    state_v_first: true,
                    scale: Some(0.5),
                },
            ),
        ),
    ];
    for path in ComputePath::ALL {
        for (i, (name, problem)) in cases.iter().enumerate() {
            if ctx
                .path_support()
                .choose(problem, DType::F32, Some(path))
                .is_err()
            {
                eprintln!("{path} not available for {name}: not run");
                continue;
            }
            let case = Case::new(Op::Forward, DType::F32).with_arithmetic(path.arithmetic());
            let (tol_o, tol_s) = tol_o_state(case);
            for segment_chunks in [1, 2] {
                for h0 in [true, false] {
                    let s = RandomSpec {
                        seed: 600 + i as u64,
                        initial_state: h0,
                        zero_gate_heads: 1,
                        strong_gate_heads: 1,
                        beta: (1.5, 2.0),
                    };
                    let inputs = s.generate(problem);
                    let expected = gdn_wgpu::reference::forward(problem, &inputs.as_ref()).unwrap();
                    let up = common::upload_inputs(ctx, &inputs);
                    let ws = ForwardWorkspace::with_segments(
                        ctx,
                        problem,
                        DType::F32,
                        path,
                        segment_chunks,
                    )
                    .unwrap();
                    assert_eq!(ws.segment_chunks(), Some(segment_chunks), "{name}");
                    let (o, st, _) =
                        common::run_poisoned(ctx, problem, DType::F32, |encoder, outputs| {
                            forward_into_workspace(
                                ctx,
                                encoder,
                                problem,
                                &up.as_ref(),
                                outputs,
                                &ws,
                                None,
                            )
                        });
                    let eo = gdn_wgpu::relative_l2(&o.data, &expected.o);
                    let es = gdn_wgpu::relative_l2(&st.data, &expected.final_state);
                    eprintln!(
                        "{path} {name}, {segment_chunks}-chunk segments, h0 {h0}: o {eo:.2e} state {es:.2e}"
                    );
                    assert!(
                        eo <= tol_o && es <= tol_s,
                        "{path} {name} {segment_chunks} h0 {h0}: o {eo:e} state {es:e}"
                    );
                }
            }
        }
    }
}

/// The automatic choice of sequence parallelism: on GPUs only, when the scan's grid is small,
/// segments giving about 512 workgroups (at least 16 chunks), and only for sequences longer
/// than two segments. Pure host logic: runs without a device.
#[test]
fn automatic_sequence_parallelism() {
    use gdn_wgpu::wgpu_backend::forward::auto_segment_chunks;
    let d = Options::default();
    let one = |t| problem(1, t, 2, 8, 128, 128, None, d);
    // 2/8 heads on the coop scan (V-blocks of 32): 8 × 4 = 32 workgroups per sequence.
    assert_eq!(auto_segment_chunks(true, &one(32768), 32), Some(32));
    assert_eq!(auto_segment_chunks(true, &one(8192), 32), Some(16));
    assert_eq!(
        auto_segment_chunks(true, &one(2048), 32),
        None,
        "two segments at most"
    );
    assert_eq!(
        auto_segment_chunks(false, &one(32768), 32),
        None,
        "CPU adapter"
    );
    assert_eq!(
        auto_segment_chunks(true, &one(32768), 128),
        None,
        "grid large enough"
    );
    // 8 sequences of 4096: 256 workgroups, no segments.
    let batch = problem(8, 4096, 2, 8, 128, 128, None, d);
    assert_eq!(auto_segment_chunks(true, &batch, 256), None);
    // Two sequences of 16384 at 16 workgroups each: 32 segments of 16 chunks.
    let two = problem(1, 32768, 2, 4, 128, 128, Some(vec![0, 16384, 32768]), d);
    assert_eq!(auto_segment_chunks(true, &two, 32), Some(16));
}

/// f16 and bf16 storage of q, k, v, o against the oracle on the same rounded inputs: o carries
/// one rounding to the storage dtype; the f32 state carries none unless q, k are normalized in
/// the kernel (their normalized copies are stored in the storage dtype, as FLA does).
#[test]
fn half_precision_storage() {
    let Some(ctx) = common::gpu() else { return };
    let full = Options {
        scale: Some(0.2),
        l2norm_qk: true,
        beta_sigmoid: true,
        allow_neg_eigval: true,
        gate_in_kernel: true,
        state_v_first: true,
    };
    let cases = [
        (
            "plain",
            problem(1, 130, 1, 2, 32, 48, None, Options::default()),
        ),
        ("T=1", problem(1, 1, 1, 1, 16, 16, None, Options::default())),
        (
            "every option, varlen, GVA",
            problem(1, 140, 2, 4, 32, 48, Some(vec![0, 1, 66, 140]), full),
        ),
    ];
    for dtype in [DType::BF16, DType::F16] {
        for (i, (name, problem)) in cases.iter().enumerate() {
            let s = RandomSpec {
                seed: 200 + i as u64,
                zero_gate_heads: 1,
                strong_gate_heads: 1,
                ..RandomSpec::default()
            };
            let Some(e) = common::forward_errors_dtype(ctx, problem, &s, dtype) else {
                continue;
            };
            let case = Case::new(Op::Forward, dtype).with_l2norm(problem.options.l2norm_qk);
            let (tol_o, tol_s) = tol_o_state(case);
            eprintln!("{dtype} {name}: {e:?}");
            assert!(
                e.o <= tol_o,
                "{dtype} {name}: o rel-L2 {:e} > {tol_o:e}",
                e.o
            );
            assert!(
                e.state <= tol_s,
                "{dtype} {name}: state rel-L2 {:e} > {tol_s:e}",
                e.state
            );
        }
    }
}

/// The forward on a caller-supplied device requested with WebGPU's default limits (16 KiB of
/// workgroup memory, 256 invocations, 8 storage buffers, 128 MiB bindings), as a browser gives:
/// every pass must fit, in every storage dtype, up to K = V = 256.
#[test]
fn within_webgpu_default_limits_on_a_caller_device() {
    if common::gpu().is_none() {
        return;
    }
    let adapter = pollster::block_on(gdn_wgpu::wgpu_backend::list_adapters())
        .into_iter()
        .next()
        .unwrap();
    let desc = wgpu::DeviceDescriptor {
        label: Some("default limits"),
        required_features: adapter.features() & wgpu::Features::SHADER_F16,
        required_limits: wgpu::Limits::default(),
        ..Default::default()
    };
    let (device, queue) = pollster::block_on(adapter.request_device(&desc)).unwrap();
    let ctx = Context::from_device(device, queue, Some(adapter.get_info())).unwrap();
    assert_eq!(
        ctx.tuning().v_blocks,
        vec![16],
        "only V-block 16 fits 16 KiB"
    );
    let all = Options {
        scale: None,
        l2norm_qk: true,
        beta_sigmoid: true,
        allow_neg_eigval: false,
        gate_in_kernel: true,
        state_v_first: true,
    };
    for (i, (k, v)) in [(32, 48), (256, 256)].into_iter().enumerate() {
        let problem = problem(1, 70, 1, 2, k, v, Some(vec![0, 1, 70]), all);
        let s = spec(300 + i as u64);
        let e = forward_errors(&ctx, &problem, &s);
        let (tol_o, tol_s) = tol_o_state(Case::new(Op::Forward, DType::F32));
        assert!(e.o <= tol_o && e.state <= tol_s, "f32 K={k} V={v}: {e:?}");
        for dtype in ctx
            .forward_storage_dtypes()
            .into_iter()
            .filter(|&d| d != gdn_wgpu::DType::F32)
        {
            let e = common::forward_errors_dtype(&ctx, &problem, &s, dtype).unwrap();
            // l2norm stores the normalized q, k in the storage dtype: one rounding in both.
            let case = Case::new(Op::Forward, dtype).with_l2norm(problem.options.l2norm_qk);
            let (tol_o, tol_s) = tol_o_state(case);
            eprintln!("{dtype} K={k} V={v}: {e:?} (bounds {tol_o:e}, {tol_s:e})");
            assert!(
                e.o <= tol_o && e.state <= tol_s,
                "{dtype} K={k} V={v}: {e:?}"
            );
        }
    }
    ctx.check().unwrap();
}

/// The cooperative-matrix path (f16 operands, f32 accumulators) against the oracle over the
/// hard cases, every storage dtype. It runs where the adapter reports f16 cooperative
/// matrices (the H200 through Vulkan); `GDN_REQUIRE_COOP=1` makes its absence a failure.
/// Elsewhere forcing it must be a typed error, which this test checks instead.
#[test]
fn coop_matrix_path() {
    use gdn_wgpu::wgpu_backend::ComputePath;
    let Some(ctx) = common::gpu() else { return };
    let d = Options::default();
    let cu = vec![0, 1, 2, 67, 68, 131, 132];
    let cases = [
        ("T=1", dense(1, 1, 1, 2, 128, 64)),
        ("T=63", dense(1, 63, 1, 2, 128, 64)),
        ("T=64", dense(1, 64, 1, 2, 128, 32)),
        ("T=130 B=2", dense(2, 130, 1, 2, 128, 64)),
        ("GVA 4, 64 v-heads", dense(2, 100, 16, 64, 128, 64)),
        (
            "varlen, length-1 sequences, GVA 2",
            problem(1, 132, 2, 4, 128, 64, Some(cu.clone()), d),
        ),
        (
            "every option, varlen, GVA 2",
            problem(1, 132, 1, 2, 128, 32, Some(cu), common::every_option()),
        ),
        (
            "state V-first",
            problem(
                1,
                100,
                1,
                1,
                128,
                64,
                None,
                Options {
                    state_v_first: true,
                    ..d
                },
            ),
        ),
    ];
    if let Some(why) = ctx.path_support().coop_rejects(&cases[0].1, DType::BF16) {
        if std::env::var("GDN_REQUIRE_COOP").is_ok_and(|v| v == "1") {
            panic!("GDN_REQUIRE_COOP=1 but the coop path is unavailable: {why}");
        }
        eprintln!("coop path not available here ({why}): not run; forcing it must fail");
        let p = &cases[0].1;
        let inputs = RandomSpec::default().generate(p);
        let up = common::upload_inputs(ctx, &inputs);
        let o = GpuTensor::empty(ctx, "o", &p.v_shape(), DType::F32).unwrap();
        let s = GpuTensor::empty(ctx, "s", &p.state_shape(), DType::F32).unwrap();
        let mut encoder = ctx.create_encoder("coop");
        let err = gdn_wgpu::wgpu_backend::forward_into_with_path(
            ctx,
            &mut encoder,
            p,
            &up.as_ref(),
            &gdn_wgpu::ForwardOutputs {
                o: &o,
                final_state: &s,
            },
            ComputePath::CoopMatrix,
        )
        .unwrap_err();
        assert!(
            matches!(&err, gdn_wgpu::Error::Unsupported { name, .. } if name == "compute path"),
            "{err}"
        );
        return;
    }
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (i, (name, problem)) in cases.iter().enumerate() {
            let case = Case::new(Op::Forward, dtype)
                .with_arithmetic(ComputePath::CoopMatrix.arithmetic())
                .with_l2norm(problem.options.l2norm_qk);
            let (tol_o, tol_s) = tol_o_state(case);
            let s = RandomSpec {
                seed: 300 + i as u64,
                initial_state: i % 2 == 0,
                zero_gate_heads: 1,
                strong_gate_heads: usize::from(problem.heads_v > 1),
                beta: [(0.0, 1.0), (0.0, 1e-3), (1.95, 2.0)][i % 3],
            };
            let e = common::forward_errors_path(ctx, problem, &s, dtype, ComputePath::CoopMatrix)
                .unwrap();
            eprintln!("coop {dtype} {name}: o {:.3e} state {:.3e}", e.o, e.state);
            assert!(e.o <= tol_o, "coop {dtype} {name}: o rel-L2 {:e}", e.o);
            assert!(
                e.state <= tol_s,
                "coop {dtype} {name}: state rel-L2 {:e}",
                e.state
            );
        }
    }
}

/// The f16-math path (the scalar scan with f16 operands multiplied in f16, f32 accumulation)
/// against the oracle over the hard cases, every storage dtype and every V-block width, at
/// the tolerance policy's bounds. Where the device lacks SHADER_F16, forcing it must be a typed
/// error; that is also checked everywhere on a device requested without SHADER_F16.
#[test]
fn f16_math_path() {
    use gdn_wgpu::wgpu_backend::ComputePath;
    let tolerance = |dtype, l2norm_qk| {
        tol_o_state(
            Case::new(Op::Forward, dtype)
                .with_arithmetic(ComputePath::F16Math.arithmetic())
                .with_l2norm(l2norm_qk),
        )
    };
    let Some(ctx) = common::gpu() else { return };
    let force_fails = |ctx: &Context| {
        let p = dense(1, 1, 1, 1, 16, 16);
        let inputs = RandomSpec::default().generate(&p);
        let up = common::upload_inputs(ctx, &inputs);
        let o = GpuTensor::empty(ctx, "o", &p.v_shape(), DType::F32).unwrap();
        let s = GpuTensor::empty(ctx, "s", &p.state_shape(), DType::F32).unwrap();
        let mut encoder = ctx.create_encoder("f16 math");
        let err = gdn_wgpu::wgpu_backend::forward_into_with_path(
            ctx,
            &mut encoder,
            &p,
            &up.as_ref(),
            &gdn_wgpu::ForwardOutputs {
                o: &o,
                final_state: &s,
            },
            ComputePath::F16Math,
        )
        .unwrap_err();
        assert!(
            matches!(&err, gdn_wgpu::Error::Unsupported { name, what }
                if name == "compute path" && what.contains("SHADER_F16")),
            "{err}"
        );
    };
    // A device without SHADER_F16 (any adapter can give one) refuses the forced path.
    let adapter = pollster::block_on(gdn_wgpu::wgpu_backend::list_adapters())
        .into_iter()
        .next()
        .unwrap();
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("no f16"),
        required_features: wgpu::Features::empty(),
        required_limits: wgpu::Limits::default(),
        ..Default::default()
    }))
    .unwrap();
    let mut no_f16 = Context::from_device(device, queue, Some(adapter.get_info())).unwrap();
    assert!(!no_f16.path_support().f16_math);
    force_fails(&no_f16);
    assert!(no_f16.set_compute_path(Some(ComputePath::F16Math)).is_err());
    if !ctx.path_support().f16_math {
        eprintln!(
            "f16-math path not available here ({}): not run; forcing it must fail",
            ctx.path_support().f16_missing
        );
        force_fails(ctx);
        return;
    }

    let d = Options::default();
    let full = common::every_option();
    let cu = vec![0, 1, 2, 67, 68, 131, 132];
    let cases = [
        ("T=1", dense(1, 1, 1, 2, 32, 32)),
        ("T=64", dense(1, 64, 1, 2, 32, 32)),
        ("T=130 B=2, V=48", dense(2, 130, 1, 2, 32, 48)),
        (
            "varlen, length-1 sequences, GVA 2",
            problem(1, 132, 2, 4, 32, 32, Some(cu.clone()), d),
        ),
        (
            "state V-first",
            problem(
                1,
                100,
                1,
                2,
                32,
                48,
                None,
                Options {
                    state_v_first: true,
                    ..d
                },
            ),
        ),
        (
            "every option, varlen, GVA 2",
            problem(1, 132, 1, 2, 32, 32, Some(cu), full),
        ),
        ("K = V = 128", dense(1, 65, 1, 2, 128, 128)),
        ("K = 256", dense(1, 65, 1, 1, 256, 64)),
    ];
    for dtype in ctx.forward_storage_dtypes() {
        for (i, (name, problem)) in cases.iter().enumerate() {
            let s = RandomSpec {
                seed: 400 + i as u64,
                initial_state: i % 2 == 0,
                zero_gate_heads: 1,
                strong_gate_heads: usize::from(problem.heads_v > 1),
                beta: [(0.0, 1.0), (0.0, 1e-3), (1.95, 2.0)][i % 3],
            };
            let (tol_o, tol_s) = tolerance(dtype, problem.options.l2norm_qk);
            let e =
                common::forward_errors_path(ctx, problem, &s, dtype, ComputePath::F16Math).unwrap();
            eprintln!("f16 {dtype} {name}: o {:.3e} state {:.3e}", e.o, e.state);
            assert!(e.o <= tol_o, "f16 {dtype} {name}: o rel-L2 {:e}", e.o);
            assert!(
                e.state <= tol_s,
                "f16 {dtype} {name}: state rel-L2 {:e}",
                e.state
            );
        }
    }

    // Every V-block width (its own arena size; bf16's o exchange fills the f16 arena at 64),
    // with V = 48 masking the columns past V. A private context, so forcing a width does not
    // affect tests running in parallel.
    let mut wide = Context::new_blocking().unwrap();
    for bv in ctx.tuning().v_blocks.clone() {
        wide.tuning_mut().forced_v_block = Some(bv);
        for (i, v) in [64, 48].into_iter().enumerate() {
            let problem = dense(1, 130, 1, 2, 32, v);
            for dtype in [DType::F32, DType::BF16] {
                let s = spec(420 + bv as u64 + i as u64);
                let (tol_o, tol_s) = tolerance(dtype, false);
                let e =
                    common::forward_errors_path(&wide, &problem, &s, dtype, ComputePath::F16Math)
                        .unwrap();
                eprintln!("f16 V_BLOCK {bv} V {v} {dtype}: {e:?}");
                assert!(
                    e.o <= tol_o && e.state <= tol_s,
                    "f16 V_BLOCK {bv} V {v} {dtype}: {e:?}"
                );
            }
        }
    }
}

/// tests/cli.rs still names its f32 bound as a constant: it must be the policy's.
#[test]
fn the_cli_tests_f32_bound_is_the_policys() {
    let case = Case::new(Op::Forward, DType::F32);
    assert_eq!(F32_TOL, case.tolerance(Quantity::Output));
    assert_eq!(F32_TOL, case.tolerance(Quantity::State));
}

// ---- The forward's algorithm: chunked scan or recurrent kernel --------------------------------

use gdn_wgpu::tolerance::Arithmetic;
use gdn_wgpu::wgpu_backend::decode::StepKernel;
use gdn_wgpu::wgpu_backend::path::choose_algorithm;
use gdn_wgpu::wgpu_backend::{ForwardAlgorithm, forward_algorithm, forward_into_with_algorithm};

/// Both algorithms, each forced per call, on the shared hard cases (T not a multiple of 64,
/// T = 1, varlen with empty and length-1 sequences, GVA, special gates, β near 0 and 2, h0 on
/// and off, every option alone and together) in every storage dtype the device takes, into
/// poisoned outputs, against the oracle at the arithmetic of the algorithm: f32 for the
/// recurrent kernel, the compute path's for the chunked scan.
#[test]
fn both_algorithms_forced_on_the_hard_cases() {
    use common::cases::{check, fail_on, hard_cases, inputs_and_oracle};
    let Some(ctx) = common::gpu() else { return };
    let mut failures = Vec::new();
    for case in hard_cases() {
        let p = &case.problem;
        for dtype in ctx.forward_storage_dtypes() {
            let (inputs, expected) = inputs_and_oracle(&case, dtype);
            let gpu_inputs = common::upload_inputs(ctx, &inputs);
            for algorithm in ForwardAlgorithm::ALL {
                let (o, final_state, saved) = common::run_poisoned(ctx, p, dtype, |enc, out| {
                    forward_into_with_algorithm(ctx, enc, p, &gpu_inputs.as_ref(), out, algorithm)
                });
                // Only the chunked scan keeps what the backward needs.
                assert_eq!(saved.is_some(), algorithm == ForwardAlgorithm::Chunked);
                let arithmetic = match algorithm {
                    ForwardAlgorithm::Recurrent => Arithmetic::F32,
                    ForwardAlgorithm::Chunked => {
                        ctx.forward_path(p, dtype).unwrap().path.arithmetic()
                    }
                };
                let got = gdn_wgpu::ForwardOutputs { o, final_state };
                let what = format!("forward, {algorithm} forced");
                failures.extend(
                    check(
                        &what,
                        &case,
                        Op::Forward,
                        dtype,
                        arithmetic,
                        &got,
                        &expected,
                    )
                    .err(),
                );
            }
        }
    }
    fail_on(failures);
}

/// The automatic choice (no device needed): decode-like calls take the recurrent kernel on
/// every adapter, CPU adapters take it at any length, GPUs take the chunked scan from one
/// chunk on; a problem the recurrent kernel cannot run falls back to the chunked scan with the
/// reason, and forcing the kernel on it is a typed error.
#[test]
fn the_automatic_choice_of_algorithm() {
    use ForwardAlgorithm::{Chunked, Recurrent};
    use wgpu::DeviceType::{Cpu, DiscreteGpu, IntegratedGpu, Other, VirtualGpu};
    let d = Options::default();
    let short = [
        problem(4, 1, 1, 2, 64, 64, None, d),
        problem(2, 63, 1, 2, 64, 64, None, d),
        problem(1, 70, 1, 2, 64, 64, Some(vec![0, 1, 7, 70]), d),
    ];
    let long = [
        problem(1, 64, 1, 2, 64, 64, None, d),
        problem(1, 2048, 2, 4, 128, 128, None, d),
        problem(1, 70, 1, 2, 64, 64, Some(vec![0, 1, 5, 69, 70]), d),
    ];
    let auto = |device, p| choose_algorithm(device, p, None, None).unwrap();
    for device in [
        Some(DiscreteGpu),
        Some(IntegratedGpu),
        Some(VirtualGpu),
        Some(Other),
        Some(Cpu),
        None,
    ] {
        for p in &short {
            let c = auto(device, p);
            assert_eq!(c.algorithm, Recurrent, "{device:?} {p:?}: {}", c.reason);
            assert!(c.reason.contains("shorter than a chunk"), "{}", c.reason);
        }
        for p in &long {
            let c = auto(device, p);
            let want = if device == Some(Cpu) {
                Recurrent
            } else {
                Chunked
            };
            assert_eq!(c.algorithm, want, "{device:?} {p:?}: {}", c.reason);
        }
        for p in short.iter().chain(&long) {
            for forced in [Chunked, Recurrent] {
                let c = choose_algorithm(device, p, None, Some(forced)).unwrap();
                assert_eq!(c.algorithm, forced);
                assert!(c.reason.contains("forced"), "{}", c.reason);
            }
            let why = || Some("no tiling fits".to_string());
            let c = choose_algorithm(device, p, why(), None).unwrap();
            assert_eq!(c.algorithm, Chunked);
            assert!(c.reason.contains("no tiling fits"), "{}", c.reason);
            let e = choose_algorithm(device, p, why(), Some(Recurrent)).unwrap_err();
            assert!(matches!(&e, gdn_wgpu::Error::Unsupported { .. }), "{e:?}");
            assert!(e.to_string().contains("forward algorithm"), "{e}");
            assert!(e.to_string().contains("no tiling fits"), "{e}");
        }
    }
}

/// On the test's adapter: what `forward_algorithm` reports is what the forward runs (the
/// recurrent kernel returns no intermediates), the `Backend` reports f32 arithmetic for it,
/// and the context's tiling for it on a CPU adapter has 32 vec4s per invocation.
#[test]
fn the_reported_algorithm_is_the_one_that_runs() {
    use gdn_wgpu::Backend;
    use gdn_wgpu::tolerance::Op as TolOp;
    let Some(ctx) = common::gpu() else { return };
    let cpu = ctx
        .adapter_info
        .as_ref()
        .is_some_and(|i| i.device_type == wgpu::DeviceType::Cpu);
    for p in [
        problem(4, 1, 2, 4, 128, 128, None, Options::default()),
        problem(1, 130, 1, 2, 64, 64, None, Options::default()),
    ] {
        for dtype in ctx.forward_storage_dtypes() {
            let choice = forward_algorithm(ctx, &p, dtype).unwrap();
            eprintln!(
                "{dtype} T={}: {} ({})",
                p.tokens, choice.algorithm, choice.reason
            );
            if p.tokens == 1 || cpu {
                assert_eq!(
                    choice.algorithm,
                    ForwardAlgorithm::Recurrent,
                    "{}",
                    choice.reason
                );
            }
            let arithmetic = ctx.arithmetic(TolOp::Forward, &p, dtype);
            match choice.algorithm {
                ForwardAlgorithm::Recurrent => assert_eq!(arithmetic, Arithmetic::F32),
                ForwardAlgorithm::Chunked => assert_eq!(
                    arithmetic,
                    ctx.forward_path(&p, dtype).unwrap().path.arithmetic()
                ),
            }
            let mut inputs = spec(90).generate(&p);
            for t in [&mut inputs.q, &mut inputs.k, &mut inputs.v] {
                *t = t.clone().with_dtype(dtype);
            }
            let expected = gdn_wgpu::reference::forward(&p, &inputs.as_ref()).unwrap();
            let gpu_inputs = common::upload_inputs(ctx, &inputs);
            let (o, state, saved) = common::run_poisoned(ctx, &p, dtype, |enc, out| {
                gdn_wgpu::wgpu_backend::forward_into(ctx, enc, &p, &gpu_inputs.as_ref(), out)
            });
            assert_eq!(
                saved.is_none(),
                choice.algorithm == ForwardAlgorithm::Recurrent
            );
            let (tol_o, tol_s) = tol_o_state(
                Case::new(Op::Forward, dtype)
                    .with_arithmetic(arithmetic)
                    .with_l2norm(p.options.l2norm_qk),
            );
            let (eo, es) = (
                gdn_wgpu::relative_l2(&o.data, &expected.o),
                gdn_wgpu::relative_l2(&state.data, &expected.final_state),
            );
            assert!(
                eo <= tol_o && es <= tol_s,
                "{dtype}: o {eo:e}, state {es:e}"
            );
        }
        let tiles = gdn_wgpu::wgpu_backend::forward::recurrent_tiles(ctx, &p, DType::F32).unwrap();
        if cpu {
            assert_eq!(tiles.kernel, StepKernel::Workgroup, "{tiles:?}");
            assert_eq!(tiles.vec4s_per_thread, 32, "{tiles:?}");
        } else {
            assert_eq!(
                tiles,
                gdn_wgpu::wgpu_backend::decode::RecurrentStepTiles::choose(&ctx.limits(), &p)
                    .unwrap()
            );
        }
    }
}

/// More sequences than the recurrent kernel's uniform tables address: the automatic choice
/// takes the chunked scan and says why; forcing the recurrent kernel is `Error::Unsupported`
/// naming "forward algorithm", before anything is recorded.
#[test]
fn a_call_the_recurrent_kernel_cannot_run() {
    let Some(ctx) = common::gpu() else { return };
    let n = gdn_wgpu::wgpu_backend::decode::max_sequences(1) + 1;
    let p = problem(
        1,
        n,
        1,
        1,
        16,
        16,
        Some((0..=n).collect()),
        Options::default(),
    );
    let choice = forward_algorithm(ctx, &p, DType::F32).unwrap();
    assert_eq!(
        choice.algorithm,
        ForwardAlgorithm::Chunked,
        "{}",
        choice.reason
    );
    assert!(choice.reason.contains("sequences"), "{}", choice.reason);
    let inputs = common::upload_inputs(ctx, &spec(91).generate(&p));
    let o = GpuTensor::empty(ctx, "o", &p.v_shape(), DType::F32).unwrap();
    let s = GpuTensor::empty(ctx, "s", &p.state_shape(), DType::F32).unwrap();
    let outputs = gdn_wgpu::ForwardOutputs {
        o: &o,
        final_state: &s,
    };
    let mut encoder = ctx.create_encoder("too many sequences");
    let e = forward_into_with_algorithm(
        ctx,
        &mut encoder,
        &p,
        &inputs.as_ref(),
        &outputs,
        ForwardAlgorithm::Recurrent,
    )
    .unwrap_err();
    assert!(matches!(&e, gdn_wgpu::Error::Unsupported { .. }), "{e:?}");
    assert!(e.to_string().contains("forward algorithm"), "{e}");
    ctx.check().unwrap();
}

/// The coop path's `wy_inverse_coop` against the scalar `wy_inverse` on the same inputs, every
/// storage dtype (it needs only SHADER_F16, so it runs on lavapipe too): A equal to f32
/// rounding, the gated matrices the f32 ones rounded to f16, k16 = f16(k) and qg16 =
/// f16(γ ⊙ q) on every token row. Outputs are NaN-poisoned first. Cases: T not a multiple of
/// 64, GVA 2 (k16 written by the group's first v-head only), varlen with length-1 sequences,
/// β near 2 and g ≈ −20 heads.
#[test]
fn wy_inverse_coop_matches_wy_inverse() {
    use gdn_wgpu::wgpu_backend::forward::{
        WyInverseBuffers, WyInverseCoopBuffers, tables, wy_inverse, wy_inverse_coop,
    };
    use gdn_wgpu::wgpu_backend::params::{Params, upload_u32};
    let Some(ctx) = common::gpu() else { return };
    if !ctx.device.features().contains(wgpu::Features::SHADER_F16) {
        eprintln!("SHADER_F16 missing: wy_inverse_coop not run");
        return;
    }
    let d = Options::default();
    let cases = [
        ("T=130 B=2, GVA 2", dense(2, 130, 2, 4, 128, 32)),
        (
            "varlen, length-1 sequences",
            problem(
                1,
                132,
                1,
                2,
                128,
                32,
                Some(vec![0, 1, 2, 67, 68, 131, 132]),
                d,
            ),
        ),
        ("T=1", dense(1, 1, 1, 1, 128, 32)),
    ];
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (ci, (name, p)) in cases.iter().enumerate() {
            let spec = RandomSpec {
                seed: 900 + ci as u64,
                beta: [(1.95, 2.0), (0.0, 1.0), (0.0, 1e-3)][ci % 3],
                zero_gate_heads: 1,
                strong_gate_heads: usize::from(p.heads_v > 1),
                ..RandomSpec::default()
            };
            let inputs = spec.generate(p);
            let (bt, hv, h, kd) = (p.total_tokens(), p.heads_v, p.heads_qk, p.key_dim);
            let (chunk_table, _) = tables(p);
            let num_chunks = chunk_table.len() / 2;
            // (G, β): the chunk-local gate cumsum prepare_gate would give.
            let mut gate_beta = vec![0.0f32; bt * hv * 2];
            for c in chunk_table.chunks(2) {
                let (start, len) = (c[0] as usize, c[1] as usize);
                for v in 0..hv {
                    let mut g = 0.0;
                    for i in start..start + len {
                        g += inputs.g.data[i * hv + v];
                        gate_beta[(i * hv + v) * 2] = g;
                        gate_beta[(i * hv + v) * 2 + 1] = inputs.beta.data[i * hv + v];
                    }
                }
            }
            let mut k_host = inputs.k.clone();
            let mut q_host = inputs.q.clone();
            let round = |x: f32| match dtype {
                DType::F32 => x,
                DType::F16 => half::f16::from_f32(x).to_f32(),
                DType::BF16 => half::bf16::from_f32(x).to_f32(),
            };
            k_host.data.iter_mut().for_each(|x| *x = round(*x));
            q_host.data.iter_mut().for_each(|x| *x = round(*x));
            let k = GpuTensor::from_values(ctx, "k", &inputs.k.shape, dtype, &k_host.data).unwrap();
            let q = GpuTensor::from_values(ctx, "q", &inputs.q.shape, dtype, &q_host.data).unwrap();
            let gb = GpuTensor::from_values(ctx, "gate_beta", &[bt, hv, 2], DType::F32, &gate_beta)
                .unwrap();
            let chunks = upload_u32(ctx, "chunks", &chunk_table);
            let params = Params::for_problem(p, num_chunks, 1).upload(ctx);
            let poisoned = |name: &str, shape: &[usize], dt: DType| {
                GpuTensor::filled(ctx, name, shape, dt, f32::NAN).unwrap()
            };
            let a = poisoned("a", &[bt, hv, 64], DType::F32);
            let gated = poisoned("gated", &[bt, hv, 128], DType::F32);
            let a2 = poisoned("a2", &[bt, hv, 64], DType::F32);
            let gated16 = poisoned("gated16", &[bt + 64, hv, 128], DType::F16);
            let k16 = poisoned("k16", &[bt + 64, h, kd], DType::F16);
            let qg16 = poisoned("qg16", &[bt + 64, hv, kd], DType::F16);
            let mut encoder = ctx.create_encoder("wy_inverse_coop test");
            let scalar = WyInverseBuffers {
                k: &k,
                q: &q,
                gate_beta: &gb,
                chunks: &chunks,
                a: &a,
                gated: &gated,
            };
            wy_inverse(ctx, &mut encoder, &params, &scalar, num_chunks, hv).unwrap();
            let coop = WyInverseCoopBuffers {
                k: &k,
                q: &q,
                gate_beta: &gb,
                chunks: &chunks,
                a: &a2,
                gated16: &gated16,
                k16: &k16,
                qg16: &qg16,
            };
            wy_inverse_coop(ctx, &mut encoder, &params, &coop, num_chunks, hv).unwrap();
            ctx.submit_and_wait(encoder).unwrap();
            let get = |t: &GpuTensor| t.download_blocking(ctx).unwrap().data;
            let (a, gated, a2, gated16, k16, qg16) = (
                get(&a),
                get(&gated),
                get(&a2),
                get(&gated16),
                get(&k16),
                get(&qg16),
            );
            let what = format!("{dtype} {name}");
            let f16 = |x: f32| half::f16::from_f32(x).to_f32();
            let close = |x: f32, want: f32, rel: f32| (x - want).abs() <= rel * want.abs() + 1e-6;
            for (e, (&x, &want)) in a2.iter().zip(&a).enumerate() {
                assert!(
                    want.is_finite() && close(x, want, 1e-5),
                    "{what}: A[{e}] {x} vs {want}"
                );
            }
            for (e, &want) in gated.iter().enumerate() {
                let x = gated16[e];
                // One f16 rounding of the f32 value (both are 0 above the diagonal).
                assert!(
                    want.is_finite() && close(x, f16(want), 2e-3),
                    "{what}: gated[{e}] {x} vs {want}"
                );
            }
            for i in 0..bt {
                for hh in 0..h {
                    for c in 0..kd {
                        let e = (i * h + hh) * kd + c;
                        assert_eq!(k16[e], f16(k_host.data[e]), "{what}: k16[{e}]");
                    }
                }
                for v in 0..hv {
                    let gam = gate_beta[(i * hv + v) * 2].exp();
                    for c in 0..kd {
                        let e = (i * hv + v) * kd + c;
                        let want = gam * q_host.data[(i * h + v / (hv / h)) * kd + c];
                        assert!(
                            close(qg16[e], f16(want), 2e-3),
                            "{what}: qg16[{e}] {} vs {want}",
                            qg16[e]
                        );
                    }
                }
            }
            eprintln!("wy_inverse_coop {what}: matches wy_inverse");
        }
    }
}
