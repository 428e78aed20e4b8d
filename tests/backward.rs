//! The GPU chunked backward against the f64 BPTT oracle (`reference::backward`): relative L2
//! ≤ 1e-4 for every gradient (f32 storage) over the forward's hard cases and every option,
//! plus directional finite differences of the f64 forward against the GPU gradients.

mod common;

use common::backward::{normal, upstream};
use common::{dense, problem};
use gdn_wgpu::reference::{self, forward_f64};
use gdn_wgpu::tolerance::{Case, Op, Quantity};
use gdn_wgpu::wgpu_backend::tuning::CoopGrads;
use gdn_wgpu::wgpu_backend::{self, ComputePath, Context};
use gdn_wgpu::{
    DType, ForwardInputs, HostTensor, Options, Problem, RandomSpec, relative_l2, relative_l2_scaled,
};

/// The policy's bound for the gradient `name` of a backward with `dtype` storage.
fn grad_tol(dtype: DType, l2norm_qk: bool, name: &str) -> f64 {
    grad_tol_on(ComputePath::Scalar, dtype, l2norm_qk, name)
}

/// [`grad_tol`] for a backward on `path` (coop: f16 operands).
fn grad_tol_on(path: ComputePath, dtype: DType, l2norm_qk: bool, name: &str) -> f64 {
    let quantity = match name {
        "dq" | "dk" | "dv" => Quantity::GradQkv,
        "dA_log" | "ddt_bias" => Quantity::GradSums,
        _ => Quantity::GradGates,
    };
    Case::new(Op::Backward, dtype)
        .with_arithmetic(path.arithmetic())
        .with_l2norm(l2norm_qk)
        .tolerance(quantity)
}

/// Relative L2 of every gradient of the GPU backward against the oracle, by name.
fn backward_errors(
    ctx: &Context,
    problem: &Problem,
    spec: &RandomSpec,
    with_dht: bool,
) -> Vec<(&'static str, f64)> {
    let inputs = spec.generate(problem);
    let (d_o, dht) = upstream(problem, spec.seed, with_dht);
    let expected = reference::backward(problem, &inputs.as_ref(), &d_o, dht.as_ref()).unwrap();
    let (_, got) =
        wgpu_backend::backward_host(ctx, problem, &inputs.as_ref(), &d_o, dht.as_ref()).unwrap();
    let mut errors = vec![
        ("dq", relative_l2(&got.dq.data, &expected.dq)),
        ("dk", relative_l2(&got.dk.data, &expected.dk)),
        ("dv", relative_l2(&got.dv.data, &expected.dv)),
        ("dg", relative_l2(&got.dg.data, &expected.dg)),
        ("dbeta", relative_l2(&got.dbeta.data, &expected.dbeta)),
    ];
    assert_eq!(
        got.dh0.is_some(),
        expected.dh0.is_some(),
        "dh0 present iff initial_state given"
    );
    if let (Some(g), Some(e)) = (&got.dh0, &expected.dh0) {
        errors.push(("dh0", relative_l2(&g.data, e)));
    }
    assert_eq!(got.da_log.is_some(), problem.options.gate_in_kernel);
    errors.extend(sum_errors(&got, &expected));
    errors
}

/// dA_log and ddt_bias (when present) against the oracle, relative to their terms' magnitudes
/// (`Quantity::GradSums`).
fn sum_errors(
    got: &gdn_wgpu::Gradients<HostTensor>,
    expected: &reference::Gradients,
) -> Vec<(&'static str, f64)> {
    let sums = [
        (
            "dA_log",
            &got.da_log,
            &expected.da_log,
            &expected.da_log_magnitude,
        ),
        (
            "ddt_bias",
            &got.ddt_bias,
            &expected.ddt_bias,
            &expected.ddt_bias_magnitude,
        ),
    ];
    let mut errors = Vec::new();
    for (name, g, e, m) in sums {
        if let (Some(g), Some(e), Some(m)) = (g, e, m) {
            assert_eq!(g.dtype, DType::F32, "{name}");
            errors.push((name, relative_l2_scaled(&g.data, e, m)));
        }
    }
    errors
}

fn check_backward(problem: &Problem, spec: &RandomSpec, with_dht: bool) {
    let Some(ctx) = common::gpu() else { return };
    check_backward_on(ctx, problem, spec, with_dht);
}

fn check_backward_on(ctx: &Context, problem: &Problem, spec: &RandomSpec, with_dht: bool) {
    let errors = backward_errors(ctx, problem, spec, with_dht);
    let line: Vec<String> = errors.iter().map(|(n, e)| format!("{n} {e:.2e}")).collect();
    eprintln!(
        "{problem:?} h0 {} dht {with_dht}\n  rel-L2 {}",
        spec.initial_state,
        line.join(", ")
    );
    for (name, e) in errors {
        let tol = grad_tol(DType::F32, problem.options.l2norm_qk, name);
        assert!(
            e <= tol,
            "{name}: rel-L2 {e:e} > {tol:e} for {problem:?} {spec:?} dht {with_dht}"
        );
    }
}

fn spec(seed: u64) -> RandomSpec {
    RandomSpec {
        seed,
        ..RandomSpec::default()
    }
}

#[test]
fn t_around_the_chunk_size() {
    for (i, t) in [1, 2, 63, 64, 65, 130].into_iter().enumerate() {
        check_backward(&dense(1, t, 1, 2, 32, 32), &spec(i as u64), true);
    }
}

#[test]
fn with_and_without_initial_state_and_dht() {
    for (i, (h0, dht)) in [(false, false), (false, true), (true, false), (true, true)]
        .into_iter()
        .enumerate()
    {
        let s = RandomSpec {
            seed: 10 + i as u64,
            initial_state: h0,
            ..RandomSpec::default()
        };
        check_backward(&dense(2, 70, 1, 2, 32, 32), &s, dht);
    }
}

#[test]
fn varlen_with_length_one_and_empty_sequences() {
    let cu = vec![0, 1, 2, 67, 67, 68, 131, 132];
    check_backward(
        &problem(1, 132, 1, 2, 32, 32, Some(cu.clone()), Options::default()),
        &spec(20),
        true,
    );
    let s = RandomSpec {
        seed: 21,
        initial_state: false,
        ..RandomSpec::default()
    };
    check_backward(
        &problem(1, 132, 1, 2, 32, 32, Some(cu), Options::default()),
        &s,
        false,
    );
}

#[test]
fn gva_ratios_2_and_4() {
    for (i, hv) in [4, 8].into_iter().enumerate() {
        check_backward(&dense(1, 65, 2, hv, 32, 32), &spec(30 + i as u64), true);
    }
}

#[test]
fn zero_gate_and_strong_gate_heads() {
    let s = RandomSpec {
        seed: 40,
        zero_gate_heads: 2,
        strong_gate_heads: 2,
        ..RandomSpec::default()
    };
    check_backward(&dense(1, 130, 1, 4, 32, 32), &s, true);
}

#[test]
fn beta_near_zero_and_near_two() {
    for (i, beta) in [(0.0, 1e-3), (1.95, 2.0)].into_iter().enumerate() {
        let s = RandomSpec {
            seed: 50 + i as u64,
            beta,
            ..RandomSpec::default()
        };
        check_backward(&dense(1, 100, 1, 2, 32, 32), &s, true);
    }
}

#[test]
fn key_dim_different_from_value_dim() {
    for (i, (k, v)) in [(32, 48), (48, 16), (16, 64)].into_iter().enumerate() {
        check_backward(&dense(1, 65, 1, 2, k, v), &spec(60 + i as u64), true);
    }
}

#[test]
fn head_dim_128() {
    check_backward(&dense(1, 70, 1, 1, 128, 128), &spec(70), true);
}

#[test]
fn head_dim_256() {
    check_backward(&dense(1, 65, 1, 1, 256, 256), &spec(71), true);
}

/// Every backward pass within WebGPU's default limits (16 KiB of workgroup memory, 8 storage
/// buffers per stage, 128 MiB bindings): a device requested with `Limits::default()`. A pass
/// over a limit fails pipeline or bind-group validation, which panics in wgpu's default
/// error handler.
#[test]
fn within_webgpu_default_limits() {
    if common::gpu().is_none() {
        return;
    }
    let adapter = pollster::block_on(wgpu_backend::list_adapters())
        .into_iter()
        .next()
        .unwrap();
    let desc = wgpu::DeviceDescriptor {
        label: Some("default limits"),
        required_limits: wgpu::Limits::default(),
        ..Default::default()
    };
    let (device, queue) = pollster::block_on(adapter.request_device(&desc)).unwrap();
    let ctx = Context::from_device(device, queue, Some(adapter.get_info())).unwrap();
    assert_eq!(ctx.tuning().workgroup_bytes, 16384);
    let o = Options {
        l2norm_qk: true,
        beta_sigmoid: true,
        gate_in_kernel: true,
        ..Options::default()
    };
    for (i, (k, v)) in [(64, 64), (256, 256)].into_iter().enumerate() {
        let problem = problem(1, 70, 1, 2, k, v, None, o);
        assert_eq!(
            wgpu_backend::backward::scan_v_block(&ctx, &problem).unwrap(),
            16
        );
        check_backward_on(&ctx, &problem, &spec(75 + i as u64), true);
    }
}

#[test]
fn each_option() {
    for (i, o) in common::each_single_option().into_iter().enumerate() {
        let s = RandomSpec {
            seed: 80 + i as u64,
            zero_gate_heads: 1,
            strong_gate_heads: 1,
            ..RandomSpec::default()
        };
        check_backward(&problem(1, 70, 1, 3, 32, 32, None, o), &s, true);
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
    let cu = vec![0, 1, 66, 140];
    for (i, (h0, dht)) in [(true, true), (false, false)].into_iter().enumerate() {
        let s = RandomSpec {
            seed: 90 + i as u64,
            initial_state: h0,
            zero_gate_heads: 1,
            strong_gate_heads: 1,
            ..RandomSpec::default()
        };
        check_backward(&problem(1, 140, 2, 4, 32, 48, Some(cu.clone()), o), &s, dht);
    }
}

#[test]
fn every_v_block_width_the_device_fits() {
    let Some(shared) = common::gpu() else { return };
    // A private context, so forcing a width does not affect tests running in parallel.
    let mut ctx = Context::new_blocking().unwrap();
    let problem = dense(1, 130, 1, 2, 32, 64);
    let widths: Vec<u32> = [16, 32, 64]
        .into_iter()
        .filter(|&bv| wgpu_backend::backward::scan_bytes(bv) <= shared.tuning().workgroup_bytes)
        .collect();
    assert!(
        widths.contains(&16),
        "V-block 16 of the backward scans must fit every device"
    );
    for bv in widths {
        ctx.tuning_mut().forced_v_block = Some(bv);
        assert_eq!(
            wgpu_backend::backward::scan_v_block(&ctx, &problem).unwrap(),
            bv
        );
        eprintln!("V_BLOCK {bv}:");
        check_backward_on(&ctx, &problem, &spec(100 + bv as u64), true);
    }
}

/// f16 and bf16 storage: every gradient against the oracle on the same rounded inputs, the
/// outputs dq, dk, dv in the storage dtype, the others f32.
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
            "K=V=128",
            problem(1, 70, 1, 1, 128, 128, None, Options::default()),
        ),
        (
            "gate in kernel, V-first, varlen, GVA",
            problem(
                1,
                140,
                2,
                4,
                32,
                48,
                Some(vec![0, 1, 66, 140]),
                Options {
                    gate_in_kernel: true,
                    state_v_first: true,
                    beta_sigmoid: true,
                    ..Options::default()
                },
            ),
        ),
        (
            "every option, varlen, GVA",
            problem(1, 140, 2, 4, 32, 48, Some(vec![0, 1, 66, 140]), full),
        ),
    ];
    let available = wgpu_backend::backward::storage_dtypes(ctx);
    // dq, dk, dv carry one rounding to the storage dtype; the f32 gradients none, unless q̂, k̂
    // are kept in it (l2norm): the policy's bounds, measured in src/tolerance.rs.
    for dtype in [DType::BF16, DType::F16] {
        if !available.contains(&dtype) {
            eprintln!("{dtype} storage not available on this device: not run");
            continue;
        }
        for (i, (name, problem)) in cases.iter().enumerate() {
            let s = RandomSpec {
                seed: 300 + i as u64,
                zero_gate_heads: 1,
                strong_gate_heads: 1,
                ..RandomSpec::default()
            };
            let mut inputs = s.generate(problem);
            for t in [&mut inputs.q, &mut inputs.k, &mut inputs.v] {
                *t = t.clone().with_dtype(dtype);
            }
            let (d_o, dht) = upstream(problem, s.seed, true);
            let d_o = d_o.with_dtype(dtype);
            let expected =
                reference::backward(problem, &inputs.as_ref(), &d_o, dht.as_ref()).unwrap();
            let (_, got) =
                wgpu_backend::backward_host(ctx, problem, &inputs.as_ref(), &d_o, dht.as_ref())
                    .unwrap();
            for (n, t) in [("dq", &got.dq), ("dk", &got.dk), ("dv", &got.dv)] {
                assert_eq!(t.dtype, dtype, "{n}");
            }
            for (n, t) in [("dg", &got.dg), ("dbeta", &got.dbeta)] {
                assert_eq!(t.dtype, DType::F32, "{n}");
            }
            let mut errors = vec![
                ("dq", relative_l2(&got.dq.data, &expected.dq)),
                ("dk", relative_l2(&got.dk.data, &expected.dk)),
                ("dv", relative_l2(&got.dv.data, &expected.dv)),
                ("dg", relative_l2(&got.dg.data, &expected.dg)),
                ("dbeta", relative_l2(&got.dbeta.data, &expected.dbeta)),
            ];
            if let (Some(g), Some(e)) = (&got.dh0, &expected.dh0) {
                assert_eq!(g.dtype, DType::F32, "dh0");
                errors.push(("dh0", relative_l2(&g.data, e)));
            }
            errors.extend(sum_errors(&got, &expected));
            let line: Vec<String> = errors.iter().map(|(n, e)| format!("{n} {e:.2e}")).collect();
            let path = wgpu_backend::backward::backward_path(ctx, problem, dtype)
                .unwrap()
                .path;
            eprintln!("{dtype} {name} ({path}): rel-L2 {}", line.join(", "));
            for (n, e) in errors {
                let tol = grad_tol_on(path, dtype, problem.options.l2norm_qk, n);
                assert!(e <= tol, "{dtype} {name}: {n} rel-L2 {e:e} > {tol:e}");
            }
        }
    }
}

#[test]
fn repeated_runs_are_bitwise_identical() {
    let Some(ctx) = common::gpu() else { return };
    let o = Options {
        gate_in_kernel: true,
        ..Options::default()
    };
    let problem = problem(1, 100, 1, 2, 32, 32, None, o);
    let inputs = spec(110).generate(&problem);
    let (d_o, dht) = upstream(&problem, 110, true);
    let run = || {
        wgpu_backend::backward_host(ctx, &problem, &inputs.as_ref(), &d_o, dht.as_ref())
            .unwrap()
            .1
    };
    let (a, b) = (run(), run());
    assert_eq!(a.dq.data, b.dq.data);
    assert_eq!(a.dk.data, b.dk.data);
    assert_eq!(a.dg.data, b.dg.data);
    assert_eq!(a.dbeta.data, b.dbeta.data);
    assert_eq!(a.da_log.unwrap().data, b.da_log.unwrap().data);
}

/// dA_log and ddt_bias where their terms cancel: varlen with every option and h0 (T = 1041
/// with a v-head that never decays, A_log = −30, whose sums are ~1e-10; T = 2100 without),
/// the sums 100–40,000× smaller than Σ|terms| (the seeds were picked for that from the oracle). The sums' rel-L2
/// there is the per-token gradients' error times that cancellation (f32 1.4e-4 and 9.1e-4 at
/// T = 1041, bf16 0.75: past any fixed bound), so the policy measures them against Σ|terms|
/// (`Quantity::GradSums`). Separately, the kernel's own reduction (its sum against the f64
/// sum of the per-token terms it wrote) is held to 1e-6·Σ|terms|: ~2⁻²⁰, a few roundings of
/// its strided partials and tree.
#[test]
fn gate_sums_whose_terms_cancel() {
    let Some(ctx) = common::gpu() else { return };
    let all = common::every_option();
    // (cu_seqlens, seed, v-heads that never decay)
    let cases = [
        (vec![0, 1, 520, 1041], 87, 1),
        (vec![0, 1000, 1041], 2, 1),
        (vec![0, 1, 700, 701, 2100], 8, 0),
    ];
    let available = wgpu_backend::backward::storage_dtypes(ctx);
    let mut failures = Vec::new();
    for (cu, seed, zero_gate_heads) in cases {
        let t = *cu.last().unwrap();
        let problem = problem(1, t, 1, 2, 32, 32, Some(cu), all);
        let s = RandomSpec {
            seed,
            initial_state: true,
            zero_gate_heads,
            ..RandomSpec::default()
        };
        for dtype in [DType::F32, DType::BF16] {
            if !available.contains(&dtype) {
                eprintln!("{dtype} storage not available on this device: not run");
                continue;
            }
            let mut inputs = s.generate(&problem);
            for t in [&mut inputs.q, &mut inputs.k, &mut inputs.v] {
                *t = t.clone().with_dtype(dtype);
            }
            let (d_o, dht) = upstream(&problem, seed, true);
            let d_o = d_o.with_dtype(dtype);
            let expected =
                reference::backward(&problem, &inputs.as_ref(), &d_o, dht.as_ref()).unwrap();
            let (_, got) =
                wgpu_backend::backward_host(ctx, &problem, &inputs.as_ref(), &d_o, dht.as_ref())
                    .unwrap();
            let tol = grad_tol(dtype, true, "dA_log");
            let (da_log, ddt_bias) = (got.da_log.unwrap(), got.ddt_bias.unwrap());
            // The f64 sums of the per-token terms the kernel wrote: dg_raw (ddt_bias) and
            // dg_raw / (∂g/∂g_raw) · g (dA_log).
            let dt_bias = &inputs.dt_bias.unwrap().data;
            let mut own = [vec![0.0f64; 2], vec![0.0f64; 2]];
            for (at, &dg_raw) in got.dg.data.iter().enumerate() {
                let hv = at % 2;
                let x = inputs.g.data[at] as f64 + dt_bias[hv] as f64;
                let (softplus, slope) = if x > 20.0 {
                    (x, 1.0)
                } else {
                    ((1.0 + x.exp()).ln(), 1.0 / (1.0 + (-x).exp()))
                };
                own[0][hv] += dg_raw as f64 / slope * softplus;
                own[1][hv] += dg_raw as f64;
            }
            let sums = [
                (
                    "dA_log",
                    &da_log,
                    &expected.da_log,
                    &expected.da_log_magnitude,
                ),
                (
                    "ddt_bias",
                    &ddt_bias,
                    &expected.ddt_bias,
                    &expected.ddt_bias_magnitude,
                ),
            ];
            for ((name, got, e, m), own) in sums.into_iter().zip(&own) {
                let (e, m) = (e.as_ref().unwrap(), m.as_ref().unwrap());
                let norm = |x: &[f64]| x.iter().map(|v| v * v).sum::<f64>().sqrt();
                let cancel = norm(m) / norm(e);
                let rel = relative_l2(&got.data, e);
                let err = relative_l2_scaled(&got.data, e, m);
                let reduction = relative_l2_scaled(&got.data, own, m);
                eprintln!(
                    "T{t} seed {seed} {dtype} {name}: Σ|terms| / |Σ| {cancel:.0}, rel-L2 \
                     {rel:.2e}, vs Σ|terms| {err:.2e} (≤ {tol:.0e}), kernel reduction {reduction:.1e}"
                );
                assert!(
                    cancel >= 100.0,
                    "{name}: the case no longer cancels ({cancel})"
                );
                if !(err <= tol && reduction <= 1e-6) {
                    failures.push(format!(
                        "T{t} seed {seed} {dtype} {name}: error {err:e} (≤ {tol:e}), \
                         reduction {reduction:e} (≤ 1e-6)"
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Directional derivatives by central differences of the f64 forward, against the GPU
/// gradients: for each input x and a random direction d, (L(x + εd) − L(x − εd)) / 2ε against
/// Σ grad_x ⊙ d, with L = Σ o ⊙ do + Σ final_state ⊙ dht. Independent of the oracle backward.
#[test]
fn finite_differences_of_the_f64_forward_match_the_gpu_gradients() {
    let Some(ctx) = common::gpu() else { return };
    let o = Options {
        l2norm_qk: true,
        beta_sigmoid: true,
        allow_neg_eigval: true,
        gate_in_kernel: true,
        ..Options::default()
    };
    for (i, (o, cu)) in [(Options::default(), None), (o, Some(vec![0, 3, 70]))]
        .into_iter()
        .enumerate()
    {
        let problem = problem(1, 70, 1, 2, 16, 16, cu, o);
        let seed = 120 + i as u64;
        let inputs = spec(seed).generate(&problem);
        let (d_o, dht) = upstream(&problem, seed, true);
        let (_, grads) =
            wgpu_backend::backward_host(ctx, &problem, &inputs.as_ref(), &d_o, dht.as_ref())
                .unwrap();

        let wide = |t: &HostTensor| -> Vec<f64> { t.data.iter().map(|&x| x as f64).collect() };
        let base: ForwardInputs<Vec<f64>> = ForwardInputs {
            q: wide(&inputs.q),
            k: wide(&inputs.k),
            v: wide(&inputs.v),
            g: wide(&inputs.g),
            beta: wide(&inputs.beta),
            initial_state: inputs.initial_state.as_ref().map(wide),
            a_log: inputs.a_log.as_ref().map(wide),
            dt_bias: inputs.dt_bias.as_ref().map(wide),
        };
        let (d_o64, dht64) = (wide(&d_o), wide(dht.as_ref().unwrap()));
        let loss = |x: &ForwardInputs<Vec<f64>>| -> f64 {
            let out = forward_f64(&problem, x).unwrap();
            let a: f64 = out.o.iter().zip(&d_o64).map(|(a, b)| a * b).sum();
            let b: f64 = out.final_state.iter().zip(&dht64).map(|(a, b)| a * b).sum();
            a + b
        };
        type Pick = fn(&mut ForwardInputs<Vec<f64>>) -> &mut Vec<f64>;
        let mut cases: Vec<(&str, Pick, &HostTensor)> = vec![
            ("q", |x| &mut x.q, &grads.dq),
            ("k", |x| &mut x.k, &grads.dk),
            ("v", |x| &mut x.v, &grads.dv),
            ("g", |x| &mut x.g, &grads.dg),
            ("beta", |x| &mut x.beta, &grads.dbeta),
            (
                "initial_state",
                |x| x.initial_state.as_mut().unwrap(),
                grads.dh0.as_ref().unwrap(),
            ),
        ];
        if o.gate_in_kernel {
            cases.push((
                "A_log",
                |x| x.a_log.as_mut().unwrap(),
                grads.da_log.as_ref().unwrap(),
            ));
            cases.push((
                "dt_bias",
                |x| x.dt_bias.as_mut().unwrap(),
                grads.ddt_bias.as_ref().unwrap(),
            ));
        }
        for (j, (name, pick, grad)) in cases.into_iter().enumerate() {
            let n = grad.data.len();
            let dir = normal(seed * 100 + j as u64, &[n], 1.0);
            let eps = 1e-4;
            let shifted = |sign: f64| {
                let mut x = base.clone();
                pick(&mut x)
                    .iter_mut()
                    .zip(&dir.data)
                    .for_each(|(a, &d)| *a += sign * eps * d as f64);
                loss(&x)
            };
            let fd = (shifted(1.0) - shifted(-1.0)) / (2.0 * eps);
            let analytic: f64 = grad
                .data
                .iter()
                .zip(&dir.data)
                .map(|(&a, &d)| a as f64 * d as f64)
                .sum();
            let err = (fd - analytic).abs() / fd.abs().max(1e-3);
            eprintln!(
                "{name}: finite difference {fd:.6e}, GPU gradient·d {analytic:.6e}, rel {err:.1e}"
            );
            assert!(
                err < 1e-3,
                "{name}: directional derivative {fd:e} (f64 FD) vs {analytic:e} (GPU) for {problem:?}"
            );
        }
    }
}

/// Every gradient of the backward with the replay on cooperative matrices (f16 operands, f32
/// accumulators), forced, against the oracle on the same rounded inputs over the hard cases,
/// every storage dtype, one window and several. It runs where the adapter reports f16
/// cooperative matrices (the H200 through Vulkan); `GDN_REQUIRE_COOP=1` makes its absence a
/// failure. Elsewhere forcing it must be a typed error, which this test checks instead.
#[test]
fn coop_matrix_path() {
    check_coop_path(CoopGrads::DEFAULT);
}

/// [`coop_matrix_path`] with every per-chunk pass forced onto cooperative matrices
/// (`GDN_COOP_GRADS=all`: also `qk_grad_coop`, off by default).
#[test]
fn coop_grads_all_forced() {
    check_coop_path(CoopGrads::ALL);
}

/// [`coop_matrix_path`] (by default value_grams, wy_grad, state_grad coop) with two
/// coop passes feeding two scalar ones (`Tuning::coop_grads`, `GDN_COOP_GRADS=value_grams,
/// state_grad`), then the other two (`wy_grad,qk_grad`: `qk_grad_coop` on the scalar
/// `state_grad`'s parts): each kernel's outputs are read by the other kind.
#[test]
fn coop_grads_mixed() {
    check_coop_path(CoopGrads {
        value_grams: true,
        state_grad: true,
        ..CoopGrads::NONE
    });
    check_coop_path(CoopGrads {
        wy_grad: true,
        qk_grad: true,
        ..CoopGrads::NONE
    });
}

/// [`coop_matrix_path`] with the coop scans and every per-chunk pass scalar
/// (`GDN_COOP_GRADS=none`, the override).
#[test]
fn coop_grads_none_forced() {
    check_coop_path(CoopGrads::NONE);
}

fn check_coop_path(coop_grads: CoopGrads) {
    use wgpu_backend::backward::{MemoryBudget, backward_path};
    let Some(shared) = common::gpu() else { return };
    let d = Options::default();
    let cu = vec![0, 1, 2, 67, 67, 68, 131, 132];
    let cases = [
        ("T=1", dense(1, 1, 1, 2, 128, 64)),
        ("T=63", dense(1, 63, 1, 2, 128, 64)),
        ("T=64", dense(1, 64, 1, 2, 128, 32)),
        ("T=130 B=2", dense(2, 130, 1, 2, 128, 64)),
        ("GVA 4", dense(1, 100, 2, 8, 128, 32)),
        (
            "varlen, length-1 and empty sequences, GVA 2",
            problem(1, 132, 2, 4, 128, 64, Some(cu.clone()), d),
        ),
        (
            "every option, varlen, GVA 2",
            problem(1, 132, 1, 2, 128, 32, Some(cu), common::every_option()),
        ),
        (
            "state V-first, K = V",
            problem(
                1,
                100,
                1,
                1,
                128,
                128,
                None,
                Options {
                    state_v_first: true,
                    ..d
                },
            ),
        ),
    ];
    // A private context: forcing a path must not affect tests running in parallel.
    let mut ctx = Context::new_blocking().unwrap();
    if let Some(why) = shared.path_support().coop_rejects(&cases[0].1, DType::BF16) {
        if std::env::var("GDN_REQUIRE_COOP").is_ok_and(|v| v == "1") {
            panic!("GDN_REQUIRE_COOP=1 but the coop path is unavailable: {why}");
        }
        eprintln!("coop path not available here ({why}): not run; forcing it must fail");
        let err = ctx
            .set_backward_path(Some(ComputePath::CoopMatrix))
            .unwrap_err();
        assert!(
            matches!(&err, gdn_wgpu::Error::Unsupported { name, .. } if name == "backward compute path"),
            "{err}"
        );
        return;
    }
    ctx.set_backward_path(Some(ComputePath::CoopMatrix))
        .unwrap();
    // K = 64 is outside the coop replay: forcing it there is a typed error, not a fallback.
    let k64 = dense(1, 70, 1, 2, 64, 64);
    assert!(matches!(
        backward_path(&ctx, &k64, DType::BF16),
        Err(gdn_wgpu::Error::Unsupported { .. })
    ));
    let available = wgpu_backend::backward::storage_dtypes(&ctx);
    // Every case runs before the verdict, so one report shows every failure.
    let mut failures = Vec::new();
    for dtype in [DType::BF16, DType::F16, DType::F32] {
        if !available.contains(&dtype) {
            eprintln!("{dtype} storage not available on this device: not run");
            continue;
        }
        for (i, (name, problem)) in cases.iter().enumerate() {
            assert_eq!(
                backward_path(&ctx, problem, dtype).unwrap().path,
                ComputePath::CoopMatrix
            );
            // Every other case also in windows of a budget below the whole problem's plan.
            ctx.tuning_mut().coop_grads = coop_grads;
            for windowed in [false, true] {
                if windowed && i % 2 == 1 {
                    continue;
                }
                ctx.set_backward_budget(Some(if windowed {
                    MemoryBudget::TimesInputs(1)
                } else {
                    MemoryBudget::Unbounded
                }));
                let s = RandomSpec {
                    seed: 500 + i as u64,
                    initial_state: i % 2 == 0,
                    zero_gate_heads: 1,
                    strong_gate_heads: usize::from(problem.heads_v > 1),
                    beta: [(0.0, 1.0), (0.0, 1e-3), (1.95, 2.0)][i % 3],
                };
                let with_dht = i % 3 != 1;
                let mut inputs = s.generate(problem);
                for t in [&mut inputs.q, &mut inputs.k, &mut inputs.v] {
                    *t = t.clone().with_dtype(dtype);
                }
                let (d_o, dht) = upstream(problem, s.seed, with_dht);
                let d_o = d_o.with_dtype(dtype);
                let expected =
                    reference::backward(problem, &inputs.as_ref(), &d_o, dht.as_ref()).unwrap();
                let (_, got) = wgpu_backend::backward_host(
                    &ctx,
                    problem,
                    &inputs.as_ref(),
                    &d_o,
                    dht.as_ref(),
                )
                .unwrap();
                let mut errors = vec![
                    ("dq", relative_l2(&got.dq.data, &expected.dq)),
                    ("dk", relative_l2(&got.dk.data, &expected.dk)),
                    ("dv", relative_l2(&got.dv.data, &expected.dv)),
                    ("dg", relative_l2(&got.dg.data, &expected.dg)),
                    ("dbeta", relative_l2(&got.dbeta.data, &expected.dbeta)),
                ];
                assert_eq!(got.dh0.is_some(), s.initial_state, "{name}: dh0");
                if let (Some(g), Some(e)) = (&got.dh0, &expected.dh0) {
                    errors.push(("dh0", relative_l2(&g.data, e)));
                }
                errors.extend(sum_errors(&got, &expected));
                let line: Vec<String> =
                    errors.iter().map(|(n, e)| format!("{n} {e:.2e}")).collect();
                eprintln!(
                    "coop {dtype} {name} (windowed {windowed}, {coop_grads:?}): rel-L2 {}",
                    line.join(", ")
                );
                for (n, e) in errors {
                    let tol =
                        grad_tol_on(ComputePath::CoopMatrix, dtype, problem.options.l2norm_qk, n);
                    if e.is_nan() || e > tol {
                        failures.push(format!(
                            "coop {dtype} {name} (windowed {windowed}, {coop_grads:?}): {n} rel-L2 {e:e} > {tol:e}"
                        ));
                    }
                }
            }
        }
    }
    ctx.check().unwrap();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
