//! The backward's memory plan (docs/backward.md, "Memory"): budgets that force many windows
//! give the unbounded plan's gradients within the policy's bounds and match the oracle; a
//! workspace reused between calls gives identical results; a budget below the least plan is
//! a typed error naming both numbers, raised before anything is allocated; a plan's byte count
//! is what its workspace and checkpoints allocate. Gradients are NaN-poisoned first.

mod common;

use common::cases::{HardCase, backward_case, check_gradients, fail_on, hard_cases};
use gdn_wgpu::tolerance::{Case, Op, Quantity};
use gdn_wgpu::wgpu_backend::backward::{self, BackwardPlan, MemoryBudget, input_bytes};
use gdn_wgpu::wgpu_backend::{
    self, BackwardWorkspace, ComputePath, Config, Context, GpuTensor, backward_into_workspace,
    forward_saved_for,
};
use gdn_wgpu::{DType, Error, ForwardInputs, Gradients, HostTensor, Problem, relative_l2_scaled};

/// A context of our own (its budget changes), or `None` without an adapter (a failure with
/// GDN_REQUIRE_GPU=1).
fn context() -> Option<Context> {
    match Context::new_blocking() {
        Ok(c) => Some(c),
        Err(e) => {
            if std::env::var("GDN_REQUIRE_GPU").is_ok_and(|v| v == "1") {
                panic!("GDN_REQUIRE_GPU=1 but no GPU context: {e}");
            }
            eprintln!("SKIPPED (no GPU adapter): {e}");
            None
        }
    }
}

/// The least budget a plan of `p` fits: what the error for a budget of 1 byte names.
fn least_budget(ctx: &Context, p: &Problem, dtype: DType) -> u64 {
    match BackwardPlan::new(ctx, p, dtype, MemoryBudget::Bytes(1)) {
        Err(Error::OverBudget { needed, budget, .. }) => {
            assert_eq!(budget, 1);
            needed
        }
        other => panic!("a budget of 1 byte: {other:?}"),
    }
}

/// Gradients of the right shapes, every element NaN.
fn poisoned(ctx: &Context, p: &Problem, dtype: DType, h0: bool) -> Gradients<GpuTensor> {
    let nan =
        |name, shape: &[usize], dt| GpuTensor::filled(ctx, name, shape, dt, f32::NAN).unwrap();
    let gate = p.options.gate_in_kernel;
    Gradients {
        dq: nan("dq", &p.qk_shape(), dtype),
        dk: nan("dk", &p.qk_shape(), dtype),
        dv: nan("dv", &p.v_shape(), dtype),
        dg: nan("dg", &p.gate_shape(), DType::F32),
        dbeta: nan("dbeta", &p.gate_shape(), DType::F32),
        dh0: h0.then(|| nan("dh0", &p.state_shape(), DType::F32)),
        da_log: gate.then(|| nan("dA_log", &[p.heads_v], DType::F32)),
        ddt_bias: gate.then(|| nan("ddt_bias", &[p.heads_v], DType::F32)),
    }
}

fn download(ctx: &Context, g: &Gradients<GpuTensor>) -> Gradients<HostTensor> {
    let down = |t: &GpuTensor| t.download_blocking(ctx).unwrap();
    Gradients {
        dq: down(&g.dq),
        dk: down(&g.dk),
        dv: down(&g.dv),
        dg: down(&g.dg),
        dbeta: down(&g.dbeta),
        dh0: g.dh0.as_ref().map(down),
        da_log: g.da_log.as_ref().map(down),
        ddt_bias: g.ddt_bias.as_ref().map(down),
    }
}

/// The inputs of one backward on the device.
struct Uploaded {
    inputs: ForwardInputs<GpuTensor>,
    d_o: GpuTensor,
    dht: Option<GpuTensor>,
}

fn upload(
    ctx: &Context,
    inputs: &ForwardInputs<HostTensor>,
    d_o: &HostTensor,
    dht: Option<&HostTensor>,
) -> Uploaded {
    Uploaded {
        inputs: common::upload_inputs(ctx, inputs),
        d_o: GpuTensor::upload(ctx, "do", d_o).unwrap(),
        dht: dht.map(|t| GpuTensor::upload(ctx, "dht", t).unwrap()),
    }
}

/// forward_saved_for in the workspace's windows, then the backward through it into poisoned
/// gradients, in one submission.
fn run(ctx: &Context, p: &Problem, up: &Uploaded, ws: &BackwardWorkspace) -> Gradients<HostTensor> {
    let dtype = up.inputs.q.dtype;
    let grads = poisoned(ctx, p, dtype, up.inputs.initial_state.is_some());
    let mut encoder = ctx.create_encoder("backward memory test");
    let (_, saved) =
        forward_saved_for(ctx, &mut encoder, p, &up.inputs.as_ref(), ws.plan()).unwrap();
    assert_eq!(saved.windows(), ws.plan().windows());
    backward_into_workspace(
        ctx,
        &mut encoder,
        &saved,
        &up.d_o,
        up.dht.as_ref(),
        &backward::gradients_ref(&grads),
        ws,
        None,
    )
    .unwrap();
    ctx.submit_and_wait(encoder).unwrap();
    download(ctx, &grads)
}

/// Each gradient of `got` against `reference` (another GPU plan's) within the policy's bound
/// for it, as if `reference` were the oracle (the sums over tokens relative to the oracle's
/// magnitudes of their terms, `oracle`).
fn agree(
    what: &str,
    case: &HardCase,
    dtype: DType,
    got: &Gradients<HostTensor>,
    reference: &Gradients<HostTensor>,
    oracle: &gdn_wgpu::reference::Gradients,
) -> Vec<String> {
    let tol = Case::new(Op::Backward, dtype).with_l2norm(case.problem.options.l2norm_qk);
    let f64s = |t: &HostTensor| t.data.iter().map(|&x| x as f64).collect::<Vec<_>>();
    // (name, got, reference, scale of the error: None for the reference itself)
    type Pair<'a> = (
        &'a str,
        &'a HostTensor,
        &'a HostTensor,
        Option<&'a [f64]>,
        Quantity,
    );
    let mut pairs: Vec<Pair> = vec![
        ("dq", &got.dq, &reference.dq, None, Quantity::GradQkv),
        ("dk", &got.dk, &reference.dk, None, Quantity::GradQkv),
        ("dv", &got.dv, &reference.dv, None, Quantity::GradQkv),
        ("dg", &got.dg, &reference.dg, None, Quantity::GradGates),
        (
            "dbeta",
            &got.dbeta,
            &reference.dbeta,
            None,
            Quantity::GradGates,
        ),
    ];
    let optional = [
        ("dh0", &got.dh0, &reference.dh0, None, Quantity::GradGates),
        (
            "dA_log",
            &got.da_log,
            &reference.da_log,
            oracle.da_log_magnitude.as_deref(),
            Quantity::GradSums,
        ),
        (
            "ddt_bias",
            &got.ddt_bias,
            &reference.ddt_bias,
            oracle.ddt_bias_magnitude.as_deref(),
            Quantity::GradSums,
        ),
    ];
    for (name, g, r, scale, q) in optional {
        if let (Some(g), Some(r)) = (g, r) {
            pairs.push((name, g, r, scale, q));
        }
    }
    pairs
        .into_iter()
        .filter_map(|(name, g, r, scale, q)| {
            let r = f64s(r);
            let err = relative_l2_scaled(&g.data, &r, scale.unwrap_or(&r));
            let bound = tol.tolerance(q);
            (err.is_nan() || err > bound).then(|| {
                format!(
                    "{what} [{}] {dtype}: {name} differs from the unbounded plan's by {err:.2e} > {bound:.1e}",
                    case.name
                )
            })
        })
        .collect()
}

/// Every hard case at the least budget (windows of one chunk, or as few chunks as the
/// checkpoints allow) and at twice it, against the unbounded plan and the oracle.
#[test]
fn tight_budgets_match_the_unbounded_plan_and_the_oracle() {
    let Some(ctx) = context() else { return };
    let mut failures = Vec::new();
    let mut many_windows = 0;
    for (i, case) in hard_cases().iter().enumerate() {
        let p = &case.problem;
        let dtype = DType::F32;
        let (inputs, d_o, dht, expected) = backward_case(case, dtype, i % 2 == 0);
        let up = upload(&ctx, &inputs, &d_o, dht.as_ref());
        let unbounded = BackwardWorkspace::with_budget(&ctx, p, dtype, MemoryBudget::Unbounded)
            .expect("unbounded plan");
        assert_eq!(unbounded.plan().windows(), 1, "{}", case.name);
        let whole = run(&ctx, p, &up, &unbounded);
        failures.extend(check_gradients("unbounded", case, dtype, &whole, &expected));
        let least = least_budget(&ctx, p, dtype);
        for budget in [least, 2 * least] {
            let ws = BackwardWorkspace::with_budget(&ctx, p, dtype, MemoryBudget::Bytes(budget))
                .unwrap();
            let plan = ws.plan();
            assert!(
                plan.bytes().total() <= budget,
                "{}: {:?}",
                case.name,
                plan.bytes()
            );
            assert!(plan.bytes().total() <= unbounded.plan().bytes().total());
            if plan.windows() >= 3 {
                many_windows += 1;
            }
            let got = run(&ctx, p, &up, &ws);
            let what = format!("budget {budget} ({} windows)", plan.windows());
            failures.extend(check_gradients(&what, case, dtype, &got, &expected));
            failures.extend(agree(&what, case, dtype, &got, &whole, &expected));
        }
    }
    ctx.check().unwrap();
    assert!(
        many_windows >= 8,
        "only {many_windows} plans had 3 or more windows"
    );
    fail_on(failures);
}

/// A long varlen problem with every option, in f32 and bf16, over a sweep of budgets: the windows
/// grow with the budget, every plan fits it, and the gradients stay within the policy's
/// bounds of the oracle.
#[test]
fn budgets_bound_the_plan_and_keep_the_gradients() {
    let Some(ctx) = context() else { return };
    let case = common::cases::long_every_option();
    let p = &case.problem;
    let mut failures = Vec::new();
    for dtype in [DType::F32, DType::BF16] {
        let (inputs, d_o, dht, expected) = backward_case(&case, dtype, true);
        let up = upload(&ctx, &inputs, &d_o, dht.as_ref());
        let least = least_budget(&ctx, p, dtype);
        let mut last_windows = usize::MAX;
        for factor in [1u64, 2, 4, 16] {
            let budget = least * factor;
            let ws = BackwardWorkspace::with_budget(&ctx, p, dtype, MemoryBudget::Bytes(budget))
                .unwrap();
            let plan = ws.plan();
            assert!(plan.bytes().total() <= budget);
            assert!(
                plan.windows() <= last_windows,
                "more windows at a larger budget"
            );
            last_windows = plan.windows();
            // The workspace allocates exactly what the plan counts.
            assert_eq!(ws.bytes(), plan.bytes().workspace);
            let got = run(&ctx, p, &up, &ws);
            let what = format!("budget {factor}× least ({} windows)", plan.windows());
            failures.extend(check_gradients(&what, &case, dtype, &got, &expected));
        }
        assert!(last_windows < 10);
        // Times the inputs: at least the least plan, whatever the multiple.
        let plan = BackwardPlan::new(&ctx, p, dtype, MemoryBudget::TimesInputs(1)).unwrap();
        assert_eq!(plan.budget(), Some(input_bytes(p, dtype).max(least)));
    }
    ctx.check().unwrap();
    fail_on(failures);
}

/// One workspace, three backwards: A, then B (other inputs), then A again, each into fresh
/// poisoned gradients: the two A results are bitwise equal, and B's differ.
#[test]
fn a_reused_workspace_gives_identical_results() {
    let Some(ctx) = context() else { return };
    let cases = hard_cases();
    let case = &cases[0];
    let p = &case.problem;
    let dtype = DType::F32;
    let other = HardCase {
        name: "other seed".into(),
        problem: p.clone(),
        spec: common::cases::spec(77, true),
    };
    let least = least_budget(&ctx, p, dtype);
    for budget in [MemoryBudget::Bytes(least), MemoryBudget::Unbounded] {
        let ws = BackwardWorkspace::with_budget(&ctx, p, dtype, budget).unwrap();
        let (a, a_do, a_dht, _) = backward_case(case, dtype, true);
        let (b, b_do, b_dht, _) = backward_case(&other, dtype, true);
        let up_a = upload(&ctx, &a, &a_do, a_dht.as_ref());
        let up_b = upload(&ctx, &b, &b_do, b_dht.as_ref());
        let first = run(&ctx, p, &up_a, &ws);
        let between = run(&ctx, p, &up_b, &ws);
        let again = run(&ctx, p, &up_a, &ws);
        let bits = |g: &Gradients<HostTensor>| -> Vec<Vec<u32>> {
            let mut all = vec![&g.dq, &g.dk, &g.dv, &g.dg, &g.dbeta];
            all.extend(g.dh0.iter());
            all.iter()
                .map(|t| t.data.iter().map(|x| x.to_bits()).collect())
                .collect()
        };
        assert!(
            bits(&first) == bits(&again),
            "{budget:?}: a reused workspace changed the result"
        );
        assert!(
            bits(&first) != bits(&between),
            "{budget:?}: B gave A's result"
        );
        assert!(first.dq.data.iter().all(|x| x.is_finite()));
    }
    ctx.check().unwrap();
}

/// Bytes wgpu's allocator has handed out (`None` where the backend has no report).
fn allocated(ctx: &Context) -> Option<u64> {
    ctx.device
        .generate_allocator_report()
        .map(|r| r.total_allocated_bytes)
}

/// A budget below the least plan: `Error::OverBudget` naming the bytes needed and the budget,
/// from the plan, the workspace and `forward_saved` (the context's budget), before anything is
/// allocated or recorded.
#[test]
fn a_budget_below_the_least_plan_names_both_and_allocates_nothing() {
    let Some(mut ctx) = context() else { return };
    let cases = hard_cases();
    let case = &cases[0];
    let p = &case.problem;
    let dtype = DType::F32;
    let (inputs, _, _, _) = backward_case(case, dtype, false);
    let up = common::upload_inputs(&ctx, &inputs);
    let least = least_budget(&ctx, p, dtype);
    let budget = least - 1;
    let named = |e: Error| {
        let msg = e.to_string();
        assert!(e.is_input_error(), "{msg}");
        match e {
            Error::OverBudget {
                needed, budget: b, ..
            } => {
                assert_eq!((needed, b), (least, budget), "{msg}");
                assert!(msg.starts_with("backward memory budget"), "{msg}");
                assert!(msg.contains(&least.to_string()), "{msg}");
                assert!(msg.contains(&budget.to_string()), "{msg}");
            }
            other => panic!("expected OverBudget, got {other}"),
        }
    };
    // Settle earlier uploads so the allocator's count is stable.
    ctx.submit_and_wait(ctx.create_encoder("settle")).unwrap();
    let before = allocated(&ctx);
    named(BackwardWorkspace::with_budget(&ctx, p, dtype, MemoryBudget::Bytes(budget)).unwrap_err());
    assert_eq!(allocated(&ctx), before, "the refused workspace allocated");
    ctx.set_backward_budget(Some(MemoryBudget::Bytes(budget)));
    let mut encoder = ctx.create_encoder("refused forward_saved");
    named(wgpu_backend::forward_saved(&ctx, &mut encoder, p, &up.as_ref()).unwrap_err());
    assert_eq!(
        allocated(&ctx),
        before,
        "the refused forward_saved allocated"
    );
    ctx.submit_and_wait(encoder).unwrap();
    ctx.check().unwrap();
    // At the least budget it runs.
    ctx.set_backward_budget(Some(MemoryBudget::Bytes(least)));
    let mut encoder = ctx.create_encoder("forward_saved at the least budget");
    let (_, saved) = wgpu_backend::forward_saved(&ctx, &mut encoder, p, &up.as_ref()).unwrap();
    assert!(saved.windows() > 1);
    ctx.submit_and_wait(encoder).unwrap();
    if before.is_none() {
        eprintln!("note: no allocator report on this backend; allocation not measured");
    }
}

/// A workspace of another problem or dtype, or of other windows than the saved context's, is
/// an `Error::Value` naming `backward workspace`; a plan of another problem given to
/// forward_saved_for names `backward plan`.
#[test]
fn mismatched_workspaces_and_plans_are_typed_errors() {
    let Some(ctx) = context() else { return };
    let cases = hard_cases();
    let case = &cases[0];
    let p = &case.problem;
    let dtype = DType::F32;
    let (inputs, d_o, _, _) = backward_case(case, dtype, false);
    let up = upload(&ctx, &inputs, &d_o, None);
    let least = least_budget(&ctx, p, dtype);
    let tight = BackwardWorkspace::with_budget(&ctx, p, dtype, MemoryBudget::Bytes(least)).unwrap();
    let whole = BackwardWorkspace::with_budget(&ctx, p, dtype, MemoryBudget::Unbounded).unwrap();
    let other_p = common::problem(1, 70, 1, 2, 16, 32, None, Default::default());
    let other =
        BackwardWorkspace::with_budget(&ctx, &other_p, dtype, MemoryBudget::Unbounded).unwrap();
    let mut encoder = ctx.create_encoder("mismatch");
    let (_, saved) =
        forward_saved_for(&ctx, &mut encoder, p, &up.inputs.as_ref(), tight.plan()).unwrap();
    let grads = poisoned(&ctx, p, dtype, false);
    for (ws, expected) in [(&whole, "token windows"), (&other, "made for this problem")] {
        let e = backward_into_workspace(
            &ctx,
            &mut encoder,
            &saved,
            &up.d_o,
            None,
            &backward::gradients_ref(&grads),
            ws,
            None,
        )
        .unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, Error::Value { .. }), "{msg}");
        assert!(msg.starts_with("backward workspace"), "{msg}");
        assert!(msg.contains(expected), "{msg}");
    }
    let e =
        forward_saved_for(&ctx, &mut encoder, p, &up.inputs.as_ref(), other.plan()).unwrap_err();
    assert!(e.to_string().starts_with("backward plan"), "{e}");
    ctx.submit_and_wait(encoder).unwrap();
    ctx.check().unwrap();
}

/// `GDN_BACKWARD_BUDGET` takes bytes (with a suffix), `Nx` and `unbounded`; anything else is
/// an `Error::Value` naming the variable.
#[test]
fn the_budget_variable_parses_or_names_itself() {
    let config = |v: &str| Config::from_lookup(|n| (n == "GDN_BACKWARD_BUDGET").then(|| v.into()));
    for (text, budget) in [
        ("512MiB", MemoryBudget::Bytes(512 << 20)),
        ("3 GiB", MemoryBudget::Bytes(3 << 30)),
        ("1000000", MemoryBudget::Bytes(1_000_000)),
        ("4x", MemoryBudget::TimesInputs(4)),
        ("unbounded", MemoryBudget::Unbounded),
    ] {
        assert_eq!(
            config(text).unwrap().backward_budget,
            Some(budget),
            "{text}"
        );
    }
    for bad in ["", "0", "0x", "-1GiB", "2.5x", "lots", "1PiB"] {
        let e = config(bad).unwrap_err();
        assert!(
            matches!(&e, Error::Value { name, .. } if name == "GDN_BACKWARD_BUDGET"),
            "{bad:?}: {e}"
        );
    }
    assert_eq!(Config::from_lookup(|_| None).unwrap().backward_budget, None);
}

/// A plan of several windows runs `forward_saved`'s forward on the scalar (f32) path, whose
/// checkpointed states are the backward's own replay; one window keeps the context's path.
#[test]
fn windowed_plans_checkpoint_f32_states() {
    let Some(mut ctx) = context() else { return };
    let support = ctx.path_support();
    let Some(other) = [ComputePath::CoopMatrix, ComputePath::F16Math]
        .into_iter()
        .find(|p| match p {
            ComputePath::CoopMatrix => support.coop_f16,
            _ => support.f16_math,
        })
    else {
        eprintln!("note: no compute path but the scalar one on this adapter; nothing to check");
        return;
    };
    ctx.set_compute_path(Some(other)).unwrap();
    let case = common::cases::long_every_option();
    let p = &case.problem;
    let dtype = DType::F32;
    let whole = BackwardPlan::new(&ctx, p, dtype, MemoryBudget::Unbounded).unwrap();
    assert_eq!(whole.windows(), 1);
    assert_eq!(whole.forward_path(), other);
    let least = least_budget(&ctx, p, dtype);
    let tight = BackwardPlan::new(&ctx, p, dtype, MemoryBudget::Bytes(least)).unwrap();
    assert!(tight.windows() > 1);
    assert_eq!(tight.forward_path(), ComputePath::Scalar);
    // And the gradients through it match the oracle.
    let (inputs, d_o, dht, expected) = backward_case(&case, dtype, true);
    let up = upload(&ctx, &inputs, &d_o, dht.as_ref());
    let ws = BackwardWorkspace::from_plan(&ctx, tight).unwrap();
    let got = run(&ctx, p, &up, &ws);
    fail_on(check_gradients(
        &format!("{other} context, windowed"),
        &case,
        dtype,
        &got,
        &expected,
    ));
}
