//! The f64 oracle backward against central finite differences of the f64 forward, over every
//! forward option. Pure CPU.
//!
//! The loss is `L = Σ o ⊙ d_o + Σ final_state ⊙ dht`; `reference::backward` must match
//! `(L(x + h) − L(x − h)) / 2h` (h = 1e-6, all in f64) on a random sample of entries of every
//! input, to `TOL · (1 + |fd|)`.

use gdn_wgpu::reference::{self, Gradients, forward_f64};
use gdn_wgpu::{Error, ForwardInputs, HostTensor, Options, Problem, RandomSpec};
use rand::{Rng, SeedableRng, rngs::SmallRng};
use rand_distr::{Distribution, StandardNormal};

/// Finite-difference step (f64).
const STEP: f64 = 1e-6;
/// Allowed |analytic − fd| per unit of `1 + |fd|`. FD's own error here is ~1e-9.
const TOL: f64 = 1e-6;
/// Entries checked per input (all of them when the input is smaller).
const SAMPLES: usize = 30;

/// A problem, its inputs and the loss weights.
struct Case {
    problem: Problem,
    inputs: ForwardInputs<HostTensor>,
    d_o: HostTensor,
    dht: Option<HostTensor>,
}

fn normal(rng: &mut SmallRng, shape: &[usize]) -> HostTensor {
    let n = shape.iter().product();
    HostTensor::new(shape, (0..n).map(|_| StandardNormal.sample(rng)).collect())
}

fn case(problem: Problem, spec: RandomSpec, with_dht: bool) -> Case {
    let inputs = spec.generate(&problem);
    let mut rng = SmallRng::seed_from_u64(spec.seed + 1000);
    let d_o = normal(&mut rng, &problem.v_shape());
    let dht = with_dht.then(|| normal(&mut rng, &problem.state_shape()));
    Case {
        problem,
        inputs,
        d_o,
        dht,
    }
}

fn spec(seed: u64, initial_state: bool) -> RandomSpec {
    RandomSpec {
        seed,
        initial_state,
        ..RandomSpec::default()
    }
}

fn problem(
    b: usize,
    t: usize,
    h: usize,
    hv: usize,
    cu: Option<Vec<usize>>,
    options: Options,
) -> Problem {
    Problem::new(b, t, h, hv, 16, 16, cu, options).unwrap()
}

fn wide(t: &HostTensor) -> Vec<f64> {
    t.data.iter().map(|&x| x as f64).collect()
}

fn widen(x: &ForwardInputs<HostTensor>) -> ForwardInputs<Vec<f64>> {
    ForwardInputs {
        q: wide(&x.q),
        k: wide(&x.k),
        v: wide(&x.v),
        g: wide(&x.g),
        beta: wide(&x.beta),
        initial_state: x.initial_state.as_ref().map(wide),
        a_log: x.a_log.as_ref().map(wide),
        dt_bias: x.dt_bias.as_ref().map(wide),
    }
}

fn loss(p: &Problem, x: &ForwardInputs<Vec<f64>>, d_o: &[f64], dht: Option<&[f64]>) -> f64 {
    let out = forward_f64(p, x).unwrap();
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    dot(&out.o, d_o) + dht.map_or(0.0, |d| dot(&out.final_state, d))
}

/// The input called `name`, as a mutable flat vector.
fn input<'a>(x: &'a mut ForwardInputs<Vec<f64>>, name: &str) -> &'a mut Vec<f64> {
    match name {
        "q" => &mut x.q,
        "k" => &mut x.k,
        "v" => &mut x.v,
        "g" => &mut x.g,
        "beta" => &mut x.beta,
        "initial_state" => x.initial_state.as_mut().unwrap(),
        "A_log" => x.a_log.as_mut().unwrap(),
        "dt_bias" => x.dt_bias.as_mut().unwrap(),
        _ => unreachable!("{name}"),
    }
}

/// Run the backward on `c` and compare every gradient with finite differences. Returns the
/// gradients for further checks.
fn check(c: &Case) -> Gradients {
    let p = &c.problem;
    let grads = reference::backward(p, &c.inputs.as_ref(), &c.d_o, c.dht.as_ref()).unwrap();
    let gate = p.options.gate_in_kernel;
    let h0 = c.inputs.initial_state.is_some();
    assert_eq!(
        grads.dh0.is_some(),
        h0,
        "dh0 present iff an initial state is given"
    );
    assert_eq!(
        grads.da_log.is_some(),
        gate,
        "dA_log present iff gate_in_kernel"
    );
    assert_eq!(
        grads.ddt_bias.is_some(),
        gate,
        "ddt_bias present iff gate_in_kernel"
    );

    let x0 = widen(&c.inputs);
    let d_o = wide(&c.d_o);
    let dht = c.dht.as_ref().map(wide);
    let mut named: Vec<(&str, &Vec<f64>)> = vec![
        ("q", &grads.dq),
        ("k", &grads.dk),
        ("v", &grads.dv),
        ("g", &grads.dg),
        ("beta", &grads.dbeta),
    ];
    if let Some(d) = &grads.dh0 {
        named.push(("initial_state", d));
    }
    if let (Some(da), Some(ddt)) = (&grads.da_log, &grads.ddt_bias) {
        named.push(("A_log", da));
        named.push(("dt_bias", ddt));
    }

    let mut rng = SmallRng::seed_from_u64(7);
    for (name, analytic) in named {
        let mut x = x0.clone();
        let len = input(&mut x, name).len();
        assert_eq!(analytic.len(), len, "d{name}: length");
        let indices: Vec<usize> = if len <= SAMPLES {
            (0..len).collect()
        } else {
            (0..SAMPLES).map(|_| rng.random_range(0..len)).collect()
        };
        let mut worst = (0.0f64, 0usize, 0.0f64);
        for i in indices {
            let orig = input(&mut x, name)[i];
            input(&mut x, name)[i] = orig + STEP;
            let plus = loss(p, &x, &d_o, dht.as_deref());
            input(&mut x, name)[i] = orig - STEP;
            let minus = loss(p, &x, &d_o, dht.as_deref());
            input(&mut x, name)[i] = orig;
            let fd = (plus - minus) / (2.0 * STEP);
            let err = (analytic[i] - fd).abs() / (1.0 + fd.abs());
            if err.is_nan() || err > worst.0 {
                worst = (err, i, fd);
            }
        }
        let (err, i, fd) = worst;
        assert!(
            err <= TOL,
            "d{name}[{i}]: analytic {} vs finite difference {fd} (error {err:e} > {TOL:e}) for {p:?}",
            analytic[i]
        );
    }
    grads
}

fn flags(f: impl FnOnce(&mut Options)) -> Options {
    let mut o = Options::default();
    f(&mut o);
    o
}

#[test]
fn f64_forward_matches_the_oracle() {
    let all = flags(|o| {
        o.l2norm_qk = true;
        o.beta_sigmoid = true;
        o.allow_neg_eigval = true;
        o.gate_in_kernel = true;
        o.state_v_first = true;
    });
    for (i, options) in [Options::default(), all].into_iter().enumerate() {
        let p = problem(1, 7, 1, 2, Some(vec![0, 1, 1, 7]), options);
        let inputs = spec(i as u64, true).generate(&p);
        let want = reference::forward(&p, &inputs.as_ref()).unwrap();
        let got = forward_f64(&p, &widen(&inputs)).unwrap();
        assert_eq!(got.o, want.o);
        assert_eq!(got.final_state, want.final_state);
    }
}

#[test]
fn plain_batch_with_h0_and_dht() {
    let g = check(&case(
        problem(2, 5, 1, 1, None, Options::default()),
        spec(1, true),
        true,
    ));
    for (name, d) in [
        ("dq", &g.dq),
        ("dk", &g.dk),
        ("dv", &g.dv),
        ("dg", &g.dg),
        ("dbeta", &g.dbeta),
        ("dh0", g.dh0.as_ref().unwrap()),
    ] {
        assert!(d.iter().all(|x| x.is_finite()), "{name}: not finite");
        let nonzero = d.iter().filter(|x| x.abs() > 1e-8).count();
        assert!(
            nonzero * 2 > d.len(),
            "{name}: only {nonzero} of {} entries nonzero",
            d.len()
        );
    }
}

#[test]
fn without_h0_or_dht() {
    let p = problem(2, 4, 1, 1, None, Options::default());
    check(&case(p.clone(), spec(2, false), false));
    check(&case(p.clone(), spec(3, true), false));
    check(&case(p, spec(4, false), true));
}

#[test]
fn l2norm_qk() {
    let p = problem(1, 6, 1, 1, None, flags(|o| o.l2norm_qk = true));
    check(&case(p, spec(5, true), true));
}

#[test]
fn beta_sigmoid() {
    let p = problem(1, 6, 1, 1, None, flags(|o| o.beta_sigmoid = true));
    check(&case(p, spec(6, true), true));
}

#[test]
fn allow_neg_eigval() {
    let p = problem(
        1,
        6,
        1,
        1,
        None,
        flags(|o| {
            o.beta_sigmoid = true;
            o.allow_neg_eigval = true;
        }),
    );
    let s = RandomSpec {
        beta: (0.2, 1.9),
        ..spec(7, true)
    };
    check(&case(p, s, true));
}

#[test]
fn gate_in_kernel() {
    let p = problem(2, 5, 1, 2, None, flags(|o| o.gate_in_kernel = true));
    let g = check(&case(p, spec(8, true), true));
    for d in [g.da_log.unwrap(), g.ddt_bias.unwrap()] {
        assert!(
            d.iter().all(|x| x.abs() > 1e-8),
            "dA_log / ddt_bias all nonzero: {d:?}"
        );
    }
}

#[test]
fn state_v_first() {
    let p = problem(2, 4, 1, 1, None, flags(|o| o.state_v_first = true));
    check(&case(p, spec(9, true), true));
}

#[test]
fn gva_sums_over_the_group() {
    let p = problem(1, 5, 1, 2, None, flags(|o| o.l2norm_qk = true));
    check(&case(p, spec(10, true), true));
    let p = problem(1, 4, 2, 4, None, Options::default());
    check(&case(p, spec(11, true), true));
}

#[test]
fn varlen_with_length_one_and_empty_sequences() {
    let cu = Some(vec![0, 1, 1, 4, 6]);
    let p = problem(1, 6, 1, 2, cu.clone(), Options::default());
    check(&case(p, spec(12, true), true));
    let p = problem(1, 6, 1, 2, cu, flags(|o| o.gate_in_kernel = true));
    check(&case(p, spec(13, false), true));
}

#[test]
fn zero_and_erasing_gates() {
    for (i, gate_in_kernel) in [false, true].into_iter().enumerate() {
        let p = problem(
            1,
            5,
            1,
            3,
            None,
            flags(|o| o.gate_in_kernel = gate_in_kernel),
        );
        let s = RandomSpec {
            zero_gate_heads: 1,
            strong_gate_heads: 1,
            ..spec(14 + i as u64, true)
        };
        check(&case(p, s, true));
    }
}

#[test]
fn every_flag_at_once() {
    let options = flags(|o| {
        o.l2norm_qk = true;
        o.beta_sigmoid = true;
        o.allow_neg_eigval = true;
        o.gate_in_kernel = true;
        o.state_v_first = true;
        o.scale = Some(0.7);
    });
    let p = problem(1, 6, 1, 2, Some(vec![0, 1, 6]), options);
    check(&case(p, spec(16, true), true));
}

#[test]
fn long_sequence_crosses_checkpoints() {
    // More than two 64-token replay segments, the last one partial.
    let p = problem(1, 150, 1, 1, None, flags(|o| o.l2norm_qk = true));
    check(&case(p, spec(17, true), true));
}

#[test]
fn wrong_shapes_are_typed_errors() {
    let c = case(
        problem(1, 4, 1, 2, None, Options::default()),
        spec(18, true),
        true,
    );
    let p = &c.problem;
    let bad_o = HostTensor::new([1, 4, 2, 8], vec![0.0; 64]);
    match reference::backward(p, &c.inputs.as_ref(), &bad_o, c.dht.as_ref()) {
        Err(Error::Shape { name, .. }) => assert_eq!(name, "d_o"),
        other => panic!("expected a Shape error for d_o, got {other:?}"),
    }
    let bad_dht = HostTensor::new([1, 1, 16, 16], vec![0.0; 256]);
    match reference::backward(p, &c.inputs.as_ref(), &c.d_o, Some(&bad_dht)) {
        Err(Error::Shape { name, .. }) => assert_eq!(name, "dht"),
        other => panic!("expected a Shape error for dht, got {other:?}"),
    }
    let mut x = widen(&c.inputs);
    x.q.pop();
    assert!(matches!(forward_f64(p, &x), Err(Error::Value { .. })));
}
