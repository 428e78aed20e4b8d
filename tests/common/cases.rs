//! The hard cases every backend is checked on (T not a multiple of 64, T = 1, varlen with
//! empty and length-1 sequences, GVA, g = 0 and g ≈ −20 heads, β near 0 and 2, h0 on/off,
//! each option alone and all together), and the comparisons with the f64 oracle under the
//! tolerance policy: shared by tests/cuda.rs and tests/backends.rs (through the `Backend`
//! trait), not copied.

use gdn_wgpu::tolerance::{Arithmetic, Case, Op, Quantity};
use gdn_wgpu::{
    DType, ForwardInputs, ForwardOutputs, HostTensor, Options, Problem, RandomSpec, reference,
    relative_l2, relative_l2_scaled,
};

use super::problem;

/// One hard case: a problem and how its inputs are drawn.
pub struct HardCase {
    /// For messages.
    pub name: String,
    /// The shapes, sequence structure and options.
    pub problem: Problem,
    /// How the inputs are drawn (seed, h0, special gates, β range).
    pub spec: RandomSpec,
}

pub fn spec(seed: u64, h0: bool) -> RandomSpec {
    RandomSpec {
        seed,
        initial_state: h0,
        ..RandomSpec::default()
    }
}

pub fn hard_cases() -> Vec<HardCase> {
    let d = Options::default();
    let case = |name: &str, problem: Problem, spec: RandomSpec| HardCase {
        name: name.into(),
        problem,
        spec,
    };
    let mut cases = vec![
        // T not a multiple of 64, GVA 2, two V-blocks, a g = 0 head and a g ≈ −20 head.
        case(
            "B2 T130 GVA2 special gates h0",
            problem(2, 130, 2, 4, 64, 64, None, d),
            RandomSpec {
                zero_gate_heads: 1,
                strong_gate_heads: 1,
                ..spec(1, true)
            },
        ),
        case(
            "B2 T130 no h0",
            problem(2, 130, 2, 4, 64, 64, None, d),
            spec(2, false),
        ),
        case(
            "T1 GVA2 K128 V128",
            problem(3, 1, 1, 2, 128, 128, None, d),
            spec(3, true),
        ),
        // Varlen with an empty and several length-1 sequences; V = 48 leaves half a V-block.
        case(
            "varlen tiny sequences V48",
            problem(1, 133, 2, 2, 32, 48, Some(vec![0, 1, 2, 2, 67, 68, 133]), d),
            spec(4, true),
        ),
        case(
            "varlen GVA4 no h0",
            problem(1, 100, 1, 4, 64, 32, Some(vec![0, 37, 38, 100]), d),
            RandomSpec {
                zero_gate_heads: 1,
                strong_gate_heads: 1,
                ..spec(5, false)
            },
        ),
        // The largest K (64 state rows per warp), the smallest V.
        case(
            "K256 V16",
            problem(1, 70, 1, 1, 256, 16, None, d),
            spec(6, true),
        ),
        case(
            "beta near 0",
            problem(1, 67, 2, 2, 64, 64, None, d),
            RandomSpec {
                beta: (0.0, 1e-3),
                ..spec(7, true)
            },
        ),
        case(
            "beta near 2",
            problem(1, 67, 2, 2, 64, 64, None, d),
            RandomSpec {
                beta: (1.95, 2.0),
                ..spec(8, true)
            },
        ),
        case(
            "neg eigval beta near 2",
            problem(
                1,
                67,
                2,
                4,
                64,
                64,
                None,
                Options {
                    beta_sigmoid: true,
                    allow_neg_eigval: true,
                    ..d
                },
            ),
            RandomSpec {
                beta: (1.9, 1.999),
                ..spec(9, true)
            },
        ),
        // Several chunks per sequence, two V-blocks of 64, strong and zero gates.
        case(
            "T300 K128 V128 GVA2 special gates h0",
            problem(1, 300, 1, 2, 128, 128, None, d),
            RandomSpec {
                zero_gate_heads: 1,
                strong_gate_heads: 1,
                ..spec(10, true)
            },
        ),
        // Sequences ending on, just after and just before chunk boundaries.
        case(
            "varlen chunk boundaries",
            problem(
                1,
                330,
                2,
                2,
                64,
                64,
                Some(vec![0, 64, 65, 129, 192, 193, 330]),
                d,
            ),
            spec(11, true),
        ),
    ];
    for (i, options) in super::each_single_option().into_iter().enumerate() {
        cases.push(case(
            &format!("option {options:?}"),
            problem(1, 75, 2, 4, 64, 48, Some(vec![0, 1, 40, 75]), options),
            RandomSpec {
                zero_gate_heads: 1,
                strong_gate_heads: 1,
                ..spec(20 + i as u64, true)
            },
        ));
    }
    let all = Options {
        scale: Some(0.37),
        l2norm_qk: true,
        beta_sigmoid: true,
        allow_neg_eigval: true,
        gate_in_kernel: true,
        state_v_first: true,
    };
    cases.push(case(
        "every option, GVA2, varlen",
        problem(1, 90, 2, 4, 32, 64, Some(vec![0, 1, 65, 90]), all),
        RandomSpec {
            zero_gate_heads: 1,
            strong_gate_heads: 1,
            ..spec(40, true)
        },
    ));
    cases.push(case(
        "every option, dense, no h0",
        problem(2, 65, 1, 2, 64, 64, None, all),
        spec(41, false),
    ));
    cases
}

/// A long varlen problem with every option (two sequences, 2,700 tokens, K = V = 32, GVA 2):
/// the case of the windowed and budgeted backward tests, where windows of one chunk number in
/// the dozens.
pub fn long_every_option() -> HardCase {
    let options = super::every_option();
    HardCase {
        name: "T2000 + 700 every option GVA2".into(),
        problem: problem(1, 2700, 1, 2, 32, 32, Some(vec![0, 2000, 2700]), options),
        spec: RandomSpec {
            zero_gate_heads: 1,
            ..spec(78, true)
        },
    }
}

/// The case's inputs with q, k, v stored as `dtype`, and the oracle on those rounded inputs.
pub fn inputs_and_oracle(
    case: &HardCase,
    dtype: DType,
) -> (ForwardInputs<HostTensor>, ForwardOutputs<Vec<f64>>) {
    let mut inputs = case.spec.generate(&case.problem);
    for t in [&mut inputs.q, &mut inputs.k, &mut inputs.v] {
        *t = t.clone().with_dtype(dtype);
    }
    let expected = reference::forward(&case.problem, &inputs.as_ref()).unwrap();
    (inputs, expected)
}

/// Compare o and the state with the oracle within the policy's tolerance for `op` computed
/// with `arithmetic`.
pub fn check(
    what: &str,
    case: &HardCase,
    op: Op,
    dtype: DType,
    arithmetic: Arithmetic,
    got: &ForwardOutputs<HostTensor>,
    expected: &ForwardOutputs<Vec<f64>>,
) -> Result<(), String> {
    let (o, state) = (&got.o, &got.final_state);
    let tol = Case::new(op, dtype)
        .with_arithmetic(arithmetic)
        .with_l2norm(case.problem.options.l2norm_qk);
    let (eo, es) = (
        relative_l2(&o.data, &expected.o),
        relative_l2(&state.data, &expected.final_state),
    );
    let (to, ts) = (
        tol.tolerance(Quantity::Output),
        tol.tolerance(Quantity::State),
    );
    eprintln!(
        "{what} [{}] {dtype} {arithmetic:?}: rel-L2 o {eo:.2e} (≤ {to:.0e}), state {es:.2e} (≤ {ts:.0e})",
        case.name
    );
    if o.dtype != dtype {
        return Err(format!(
            "{what} [{}]: o came back as {}",
            case.name, o.dtype
        ));
    }
    // NaN compares false: a poisoned element left unwritten fails here.
    if !(eo <= to && es <= ts) {
        return Err(format!(
            "{what} [{}] {dtype}: o {eo:e} (tol {to:e}), state {es:e} (tol {ts:e}) for {:?}",
            case.name, case.problem
        ));
    }
    Ok(())
}

pub fn fail_on(failures: Vec<String>) {
    assert!(
        failures.is_empty(),
        "{} failure(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Compare every gradient with the oracle within the policy's tolerance for a backward with
/// f32 arithmetic; the failures.
pub fn check_gradients(
    what: &str,
    case: &HardCase,
    dtype: DType,
    got: &gdn_wgpu::Gradients<HostTensor>,
    expected: &reference::Gradients,
) -> Vec<String> {
    check_gradients_with(what, case, dtype, Arithmetic::F32, got, expected)
}

/// [`check_gradients`] for a backward computed with `arithmetic`.
pub fn check_gradients_with(
    what: &str,
    case: &HardCase,
    dtype: DType,
    arithmetic: Arithmetic,
    got: &gdn_wgpu::Gradients<HostTensor>,
    expected: &reference::Gradients,
) -> Vec<String> {
    let p = &case.problem;
    let tol = Case::new(Op::Backward, dtype)
        .with_arithmetic(arithmetic)
        .with_l2norm(p.options.l2norm_qk);
    // (name, got, expected, scale of the error: the expected value itself, or for the sums
    // over tokens their terms' magnitudes, quantity, dtype)
    type Pair<'a> = (
        &'a str,
        &'a HostTensor,
        &'a [f64],
        &'a [f64],
        Quantity,
        DType,
    );
    let mut pairs: Vec<Pair> = vec![
        (
            "dq",
            &got.dq,
            &expected.dq,
            &expected.dq,
            Quantity::GradQkv,
            dtype,
        ),
        (
            "dk",
            &got.dk,
            &expected.dk,
            &expected.dk,
            Quantity::GradQkv,
            dtype,
        ),
        (
            "dv",
            &got.dv,
            &expected.dv,
            &expected.dv,
            Quantity::GradQkv,
            dtype,
        ),
        (
            "dg",
            &got.dg,
            &expected.dg,
            &expected.dg,
            Quantity::GradGates,
            DType::F32,
        ),
        (
            "dbeta",
            &got.dbeta,
            &expected.dbeta,
            &expected.dbeta,
            Quantity::GradGates,
            DType::F32,
        ),
    ];
    let mut failures = Vec::new();
    let optional = [
        (
            "dh0",
            &got.dh0,
            &expected.dh0,
            &expected.dh0,
            Quantity::GradGates,
        ),
        (
            "dA_log",
            &got.da_log,
            &expected.da_log,
            &expected.da_log_magnitude,
            Quantity::GradSums,
        ),
        (
            "ddt_bias",
            &got.ddt_bias,
            &expected.ddt_bias,
            &expected.ddt_bias_magnitude,
            Quantity::GradSums,
        ),
    ];
    for (name, g, e, scale, quantity) in optional {
        match (g, e, scale) {
            (Some(g), Some(e), Some(scale)) => {
                pairs.push((name, g, e, scale, quantity, DType::F32))
            }
            (None, None, None) => {}
            _ => failures.push(format!(
                "{what} [{}] {dtype}: {name} present {} but expected {}",
                case.name,
                g.is_some(),
                e.is_some()
            )),
        }
    }
    let mut line = format!("{what} [{}] {dtype} {arithmetic:?}:", case.name);
    for (name, g, e, scale, quantity, want_dtype) in pairs {
        // The sums are measured against Σ|terms| (`Quantity::GradSums`).
        let err = relative_l2_scaled(&g.data, e, scale);
        let t = tol.tolerance(quantity);
        line.push_str(&format!(" {name} {err:.1e}"));
        if g.dtype != want_dtype {
            failures.push(format!(
                "{what} [{}]: {name} came back as {}",
                case.name, g.dtype
            ));
        }
        // NaN compares false: a poisoned element left unwritten fails here.
        if err.is_nan() || err > t {
            failures.push(format!(
                "{what} [{}] {dtype}: {name} error {err:e} (tol {t:e}) for {:?}",
                case.name, p
            ));
        }
    }
    eprintln!("{line}");
    failures
}

/// The case's inputs (q, k, v and do in `dtype`), upstream gradients and the oracle's.
pub fn backward_case(
    case: &HardCase,
    dtype: DType,
    with_dht: bool,
) -> (
    ForwardInputs<HostTensor>,
    HostTensor,
    Option<HostTensor>,
    reference::Gradients,
) {
    let (inputs, _) = inputs_and_oracle(case, dtype);
    let (d_o, dht) = super::backward::upstream(&case.problem, case.spec.seed, with_dht);
    let d_o = d_o.with_dtype(dtype);
    let expected =
        reference::backward(&case.problem, &inputs.as_ref(), &d_o, dht.as_ref()).unwrap();
    (inputs, d_o, dht, expected)
}
