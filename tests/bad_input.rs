//! The bad-input catalogue, library side (docs/errors.md lists the classes). One table of named
//! cases per layer — problem, host inputs, GPU forward, decode, backward, files — each case
//! tagged with its class. Every case asserts the typed error (its variant), that it names the
//! parameter and says what was expected, and, where the call is given caller buffers, that none
//! of them changed: they are read back after the refused call (and after submitting whatever it
//! recorded) and compared bitwise. The CLI side is the catalogue in cli/tests/cli.rs;
//! `the_catalogue_is_documented` keeps docs/errors.md and both tables in step.

mod common;

use common::decode::{random_pool, spec as decode_spec};
use common::{gpu, problem, upload_inputs};
use gdn_wgpu::io::{self, IntDType, IntTensor, TensorFile};
use gdn_wgpu::wgpu_backend::decode::{StateLayout, StatePool, StateSlot};
use gdn_wgpu::wgpu_backend::{
    self, ComputePath, Context, DecodeOutputs, ForwardWorkspace, GpuTensor, decode_step,
};
use gdn_wgpu::{
    Backend, DType, Error, ForwardInputs, ForwardOutputs, HostTensor, Options, Oracle, Problem,
    RandomSpec,
};

/// The error variants, for matching without their fields.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Shape,
    DType,
    Value,
    Missing,
    Unsupported,
    TooLarge,
    OverBudget,
    Io,
    Safetensors,
}

fn kind(e: &Error) -> Option<Kind> {
    Some(match e {
        Error::Shape { .. } => Kind::Shape,
        Error::DType { .. } => Kind::DType,
        Error::Value { .. } => Kind::Value,
        Error::Missing { .. } => Kind::Missing,
        Error::Unsupported { .. } => Kind::Unsupported,
        Error::TooLarge { .. } => Kind::TooLarge,
        Error::OverBudget { .. } => Kind::OverBudget,
        Error::Io { .. } => Kind::Io,
        Error::Safetensors { .. } => Kind::Safetensors,
        _ => return None,
    })
}

/// What a refusal must say: its class (a slug of docs/errors.md), the variant, the parameter
/// the message opens with, and a fragment of what was expected.
#[derive(Debug, Clone, Copy)]
struct Expect {
    class: &'static str,
    kind: Kind,
    name: &'static str,
    expected: &'static str,
}

const fn expect(
    class: &'static str,
    kind: Kind,
    name: &'static str,
    expected: &'static str,
) -> Expect {
    Expect {
        class,
        kind,
        name,
        expected,
    }
}

impl Expect {
    /// Panics unless `result` is this refusal; `case` names the case in the message.
    fn check<T>(&self, case: &str, result: gdn_wgpu::Result<T>) {
        let Err(e) = result else {
            panic!("[{}] {case}: accepted, expected a refusal", self.class);
        };
        let msg = e.to_string();
        assert_eq!(
            kind(&e),
            Some(self.kind),
            "[{}] {case}: wrong kind of error: {msg}",
            self.class
        );
        assert!(
            msg.starts_with(self.name),
            "[{}] {case}: {msg:?} does not open with the parameter {:?}",
            self.class,
            self.name
        );
        assert!(
            msg.contains(self.expected),
            "[{}] {case}: {msg:?} does not say {:?}",
            self.class,
            self.expected
        );
        assert!(
            e.is_input_error(),
            "[{}] {case}: {msg:?} is not an input error",
            self.class
        );
    }
}

use Kind::{DType as Dt, Missing, OverBudget, Safetensors, Shape, TooLarge, Unsupported, Value};

// ---------------------------------------------------------------- problem

#[test]
fn problems() {
    let d = Options::default();
    let p = |b, t, h, hv, k, v, cu: Option<Vec<usize>>, o| Problem::new(b, t, h, hv, k, v, cu, o);
    let neg = Options {
        allow_neg_eigval: true,
        ..d
    };
    let scale = |s| Options {
        scale: Some(s),
        ..d
    };
    let big = usize::MAX / 4;
    let cases: Vec<(&str, gdn_wgpu::Result<Problem>, Expect)> = vec![
        (
            "B = 0",
            p(0, 8, 1, 1, 16, 16, None, d),
            expect("zero-size", Value, "batch (B)", "at least 1"),
        ),
        (
            "T = 0",
            p(1, 0, 1, 1, 16, 16, None, d),
            expect("zero-size", Value, "tokens (T)", "at least 1"),
        ),
        (
            "H = 0",
            p(1, 8, 0, 1, 16, 16, None, d),
            expect("zero-size", Value, "heads_qk (H)", "at least 1"),
        ),
        (
            "HV = 0",
            p(1, 8, 1, 0, 16, 16, None, d),
            expect("zero-size", Value, "heads_v (HV)", "positive multiple"),
        ),
        (
            "H 2, HV 3",
            p(1, 8, 2, 3, 16, 16, None, d),
            expect("gva-ratio", Value, "heads_v (HV)", "multiple of H = 2"),
        ),
        (
            "H 4, HV 2",
            p(1, 8, 4, 2, 16, 16, None, d),
            expect("gva-ratio", Value, "heads_v (HV)", "multiple of H = 4"),
        ),
        (
            "K 24",
            p(1, 8, 1, 1, 24, 16, None, d),
            expect(
                "head-dim",
                Value,
                "key_dim (K)",
                "multiple of 16 in 16..=256",
            ),
        ),
        (
            "K 272",
            p(1, 8, 1, 1, 272, 16, None, d),
            expect("head-dim", Value, "key_dim (K)", "16..=256"),
        ),
        (
            "K 0",
            p(1, 8, 1, 1, 0, 16, None, d),
            expect("head-dim", Value, "key_dim (K)", "16..=256"),
        ),
        (
            "V 8",
            p(1, 8, 1, 1, 16, 8, None, d),
            expect("head-dim", Value, "value_dim (V)", "multiple of 16"),
        ),
        (
            "B·T·H·K overflows",
            p(big, big, 1, 1, 16, 16, None, d),
            expect("size-overflow", Value, "problem size", "fit in usize"),
        ),
        (
            "scale NaN",
            p(1, 8, 1, 1, 16, 16, None, scale(f32::NAN)),
            expect("scale", Value, "scale", "a finite number"),
        ),
        (
            "scale inf",
            p(1, 8, 1, 1, 16, 16, None, scale(f32::INFINITY)),
            expect("scale", Value, "scale", "a finite number"),
        ),
        (
            "allow_neg_eigval alone",
            p(1, 8, 1, 1, 16, 16, None, neg),
            expect(
                "neg-eigval-without-sigmoid",
                Value,
                "allow_neg_eigval",
                "beta_sigmoid",
            ),
        ),
        (
            "cu_seqlens with B = 2",
            p(2, 8, 1, 1, 16, 16, Some(vec![0, 8]), d),
            expect("cu-seqlens-batch", Value, "cu_seqlens", "batch (B) == 1"),
        ),
        (
            "cu_seqlens [8]",
            p(1, 8, 1, 1, 16, 16, Some(vec![8]), d),
            expect(
                "cu-seqlens-short",
                Value,
                "cu_seqlens",
                "at least 2 entries",
            ),
        ),
        (
            "cu_seqlens []",
            p(1, 8, 1, 1, 16, 16, Some(vec![]), d),
            expect(
                "cu-seqlens-short",
                Value,
                "cu_seqlens",
                "at least 2 entries",
            ),
        ),
        (
            "cu_seqlens from 1",
            p(1, 8, 1, 1, 16, 16, Some(vec![1, 8]), d),
            expect("cu-seqlens-start", Value, "cu_seqlens", "first entry 0"),
        ),
        (
            "cu_seqlens 5 then 3",
            p(1, 8, 1, 1, 16, 16, Some(vec![0, 5, 3, 8]), d),
            expect("cu-seqlens-unsorted", Value, "cu_seqlens", "non-decreasing"),
        ),
        (
            "cu_seqlens ends before T",
            p(1, 8, 1, 1, 16, 16, Some(vec![0, 4, 7]), d),
            expect(
                "cu-seqlens-end",
                Value,
                "cu_seqlens",
                "last entry equal to T = 8",
            ),
        ),
        (
            "cu_seqlens beyond T",
            p(1, 8, 1, 1, 16, 16, Some(vec![0, 4, 9]), d),
            expect(
                "cu-seqlens-end",
                Value,
                "cu_seqlens",
                "last entry equal to T = 8",
            ),
        ),
    ];
    for (case, result, expect) in cases {
        expect.check(case, result);
    }
}

// ---------------------------------------------------------------- host inputs

/// A change to valid host inputs that makes them invalid.
type Break = fn(&mut ForwardInputs<HostTensor>);

struct HostCase {
    name: &'static str,
    options: Options,
    spoil: Break,
    expect: Expect,
}

/// The valid problem the host and GPU cases break one thing in: GVA 2, varlen with a
/// length-1 sequence, h0 given.
fn base_problem(options: Options) -> Problem {
    problem(1, 70, 1, 2, 16, 32, Some(vec![0, 1, 70]), options)
}

fn base_inputs(p: &Problem) -> ForwardInputs<HostTensor> {
    RandomSpec {
        seed: 12,
        ..RandomSpec::default()
    }
    .generate(p)
}

fn gated() -> Options {
    Options {
        gate_in_kernel: true,
        ..Options::default()
    }
}

fn host_cases() -> Vec<HostCase> {
    let d = Options::default();
    let case = |name, options, spoil: Break, expect| HostCase {
        name,
        options,
        spoil,
        expect,
    };
    vec![
        case(
            "q one K short",
            d,
            |x| x.q = HostTensor::new([1, 70, 1, 15], vec![0.0; 70 * 15]),
            expect("tensor-shape", Shape, "q", "[1, 70, 1, 16]"),
        ),
        case(
            "k of another T",
            d,
            |x| x.k = HostTensor::new([1, 69, 1, 16], vec![0.0; 69 * 16]),
            expect("tensor-shape", Shape, "k", "[1, 70, 1, 16]"),
        ),
        case(
            "v with HV 1",
            d,
            |x| x.v = HostTensor::new([1, 70, 1, 32], vec![0.0; 70 * 32]),
            expect("tensor-shape", Shape, "v", "[1, 70, 2, 32]"),
        ),
        case(
            "g of rank 2",
            d,
            |x| x.g.shape = vec![70, 2],
            expect("tensor-shape", Shape, "g", "[1, 70, 2]"),
        ),
        case(
            "beta per q-head",
            d,
            |x| x.beta = HostTensor::new([1, 70, 1], vec![0.5; 70]),
            expect("tensor-shape", Shape, "beta", "[1, 70, 2]"),
        ),
        case(
            "initial_state V-first while K-first",
            d,
            |x| {
                let h0 = x.initial_state.as_mut().unwrap();
                h0.shape = vec![2, 2, 32, 16];
            },
            expect("tensor-shape", Shape, "initial_state", "[2, 2, 16, 32]"),
        ),
        case(
            "initial_state per batch row, not per sequence",
            d,
            |x| x.initial_state = Some(HostTensor::new([1, 2, 16, 32], vec![0.0; 1024])),
            expect("tensor-shape", Shape, "initial_state", "[2, 2, 16, 32]"),
        ),
        case(
            "k F16 while q F32",
            d,
            |x| x.k = x.k.clone().with_dtype(DType::F16),
            expect("qkv-dtype-mixed", Dt, "k", "F32 (the dtype of q)"),
        ),
        case(
            "v BF16 while q F32",
            d,
            |x| x.v = x.v.clone().with_dtype(DType::BF16),
            expect("qkv-dtype-mixed", Dt, "v", "F32 (the dtype of q)"),
        ),
        case(
            "g BF16",
            d,
            |x| x.g = x.g.clone().with_dtype(DType::BF16),
            expect("f32-only-dtype", Dt, "g", "F32"),
        ),
        case(
            "beta F16",
            d,
            |x| x.beta = x.beta.clone().with_dtype(DType::F16),
            expect("f32-only-dtype", Dt, "beta", "F32"),
        ),
        case(
            "initial_state BF16",
            d,
            |x| {
                let h0 = x.initial_state.take().unwrap();
                x.initial_state = Some(h0.with_dtype(DType::BF16));
            },
            expect("f32-only-dtype", Dt, "initial_state", "F32"),
        ),
        case(
            "A_log F16",
            gated(),
            |x| x.a_log = Some(x.a_log.take().unwrap().with_dtype(DType::F16)),
            expect("f32-only-dtype", Dt, "A_log", "F32"),
        ),
        case(
            "A_log missing",
            gated(),
            |x| x.a_log = None,
            expect(
                "gate-params-missing",
                Missing,
                "A_log",
                "with gate_in_kernel",
            ),
        ),
        case(
            "dt_bias missing",
            gated(),
            |x| x.dt_bias = None,
            expect(
                "gate-params-missing",
                Missing,
                "dt_bias",
                "with gate_in_kernel",
            ),
        ),
        case(
            "A_log without gate_in_kernel",
            d,
            |x| x.a_log = Some(HostTensor::new([2], vec![0.0; 2])),
            expect(
                "gate-params-unexpected",
                Value,
                "A_log",
                "unless gate_in_kernel",
            ),
        ),
        case(
            "dt_bias without gate_in_kernel",
            d,
            |x| x.dt_bias = Some(HostTensor::new([2], vec![0.0; 2])),
            expect(
                "gate-params-unexpected",
                Value,
                "dt_bias",
                "unless gate_in_kernel",
            ),
        ),
        case(
            "dt_bias per q-head",
            gated(),
            |x| x.dt_bias = Some(HostTensor::new([1], vec![0.0])),
            expect("gate-params-shape", Shape, "dt_bias", "[2]"),
        ),
        case(
            "A_log empty",
            gated(),
            |x| x.a_log = Some(HostTensor::new([0], vec![])),
            expect("gate-params-shape", Shape, "A_log", "[2]"),
        ),
        case(
            "v holds fewer values than its shape",
            d,
            |x| {
                x.v.data.pop();
            },
            expect("host-storage-length", Value, "v", "4480 values"),
        ),
        case(
            "beta holds more values than its shape",
            d,
            |x| x.beta.data.push(0.5),
            expect("host-storage-length", Value, "beta", "140 values"),
        ),
        case(
            "NaN in v",
            d,
            |x| x.v.data[17] = f32::NAN,
            expect("non-finite", Value, "v", "finite values"),
        ),
        case(
            "inf in q",
            d,
            |x| x.q.data[3] = f32::INFINITY,
            expect("non-finite", Value, "q", "finite values"),
        ),
        case(
            "-inf in initial_state",
            d,
            |x| x.initial_state.as_mut().unwrap().data[5] = f32::NEG_INFINITY,
            expect("non-finite", Value, "initial_state", "finite values"),
        ),
        case(
            "NaN in dt_bias",
            gated(),
            |x| x.dt_bias.as_mut().unwrap().data[1] = f32::NAN,
            expect("non-finite", Value, "dt_bias", "finite values"),
        ),
        case(
            "g = 0.25",
            d,
            |x| x.g.data[5] = 0.25,
            expect("positive-log-decay", Value, "g", "log-space decays ≤ 0"),
        ),
    ]
}

/// Every host case through every host entry point: the shared check, the oracle's backend
/// (forward, forward + backward, decode) and, with a GPU, the wgpu context's. The caller's
/// tensors are compared with a copy taken before.
#[test]
fn host_inputs() {
    let mut backends: Vec<&dyn Backend> = vec![&Oracle];
    if let Some(ctx) = gpu() {
        backends.push(ctx);
    }
    for c in host_cases() {
        let p = base_problem(c.options);
        let mut inputs = base_inputs(&p);
        (c.spoil)(&mut inputs);
        let before = inputs.clone();
        let (d_o, _) = common::backward::upstream(&p, 3, false);
        // Value checks happen on host entry points; check_inputs alone sees shapes and dtypes.
        if !matches!(c.expect.class, "non-finite" | "positive-log-decay") {
            c.expect.check(
                c.name,
                p.check_inputs(&inputs.as_ref(), &[DType::F32, DType::F16, DType::BF16]),
            );
        }
        for b in &backends {
            let name = format!("{} via {}", c.name, b.name());
            c.expect
                .check(&format!("{name} forward"), b.forward(&p, &inputs.as_ref()));
            c.expect.check(
                &format!("{name} forward_backward"),
                b.forward_backward(&p, &inputs.as_ref(), &d_o, None),
            );
            c.expect
                .check(&format!("{name} decode"), b.decode(&p, &inputs.as_ref(), 1));
        }
        assert_eq!(
            format!("{before:?}"),
            format!("{inputs:?}"),
            "{}: inputs changed",
            c.name
        );
    }
}

/// Upstream gradients of a host backward, through the oracle's and the GPU's backends.
#[test]
fn host_upstream_gradients() {
    let p = base_problem(Options::default());
    let inputs = base_inputs(&p);
    let (d_o, _) = common::backward::upstream(&p, 3, false);
    let state = HostTensor::new(p.state_shape(), vec![0.5; 2 * 2 * 16 * 32]);
    let mut nan_do = d_o.clone();
    nan_do.data[9] = f32::NAN;
    let mut inf_dht = state.clone();
    inf_dht.data[0] = f32::INFINITY;
    let mut short_do = d_o.clone();
    short_do.data.truncate(10);
    type Upstream = (HostTensor, Option<HostTensor>);
    let cases: Vec<(&str, Upstream, Expect)> = vec![
        (
            "do of the shape of q",
            (HostTensor::new([1, 70, 1, 16], vec![0.0; 1120]), None),
            expect("upstream-gradient", Shape, "do", "[1, 70, 2, 32]"),
        ),
        (
            "do BF16 while v F32",
            (d_o.clone().with_dtype(DType::BF16), None),
            expect("upstream-gradient", Dt, "do", "F32 (the dtype of v)"),
        ),
        (
            "NaN in do",
            (nan_do, None),
            expect("upstream-gradient", Value, "do", "finite values"),
        ),
        (
            "do holds 10 values",
            (short_do, None),
            expect("host-storage-length", Value, "do", "4480 values"),
        ),
        (
            "dht V-first",
            (
                d_o.clone(),
                Some(HostTensor::new([2, 2, 32, 16], vec![0.0; 2048])),
            ),
            expect("upstream-gradient", Shape, "dht", "[2, 2, 16, 32]"),
        ),
        (
            "dht F16",
            (d_o.clone(), Some(state.with_dtype(DType::F16))),
            expect("upstream-gradient", Dt, "dht", "F32"),
        ),
        (
            "inf in dht",
            (d_o.clone(), Some(inf_dht)),
            expect("upstream-gradient", Value, "dht", "finite values"),
        ),
    ];
    let mut backends: Vec<&dyn Backend> = vec![&Oracle];
    if let Some(ctx) = gpu() {
        backends.push(ctx);
    }
    for (case, (d_o, dht), expect) in &cases {
        for b in &backends {
            expect.check(
                &format!("{case} via {}", b.name()),
                b.forward_backward(&p, &inputs.as_ref(), d_o, dht.as_ref()),
            );
        }
    }
    let zero = expect(
        "tokens-per-step-zero",
        Value,
        "tokens_per_step",
        "at least 1",
    );
    for b in &backends {
        zero.check(
            &format!("0 tokens per step via {}", b.name()),
            b.decode(&p, &inputs.as_ref(), 0),
        );
    }
}

// ---------------------------------------------------------------- GPU buffers

/// Tensors the caller owns, read back after a refused call and compared bitwise.
struct Watched<'a>(Vec<(&'a str, &'a GpuTensor, Vec<u32>)>);

impl<'a> Watched<'a> {
    fn new(ctx: &Context, tensors: &[(&'a str, &'a GpuTensor)]) -> Self {
        Watched(tensors.iter().map(|&(n, t)| (n, t, bits(ctx, t))).collect())
    }

    /// Panics if any watched tensor differs from when it was first read.
    fn unchanged(&self, ctx: &Context, case: &str) {
        for (name, t, before) in &self.0 {
            assert!(
                bits(ctx, t) == *before,
                "{case}: the caller's {name} changed after a refused call"
            );
        }
    }
}

/// The tensor's bytes as words (padding included: storage is word-sized).
fn bits(ctx: &Context, t: &GpuTensor) -> Vec<u32> {
    let words = GpuTensor::from_buffer(
        t.buffer.clone(),
        &[(t.buffer.size() / 4) as usize],
        DType::F32,
    );
    let host = words.download_blocking(ctx).unwrap();
    host.data.iter().map(|x| x.to_bits()).collect()
}

/// A tensor whose buffer holds `elements` f32 values but claims `shape`.
fn short_tensor(ctx: &Context, name: &str, shape: &[usize], elements: usize) -> GpuTensor {
    let mut t = GpuTensor::filled(ctx, name, &[elements], DType::F32, 0.75).unwrap();
    t.shape = shape.to_vec();
    t
}

/// Record a call that must be refused, submit whatever it recorded, check the context
/// reports no device error and that no watched buffer changed.
fn refused<T>(
    ctx: &Context,
    watched: &Watched<'_>,
    case: &str,
    expect: Expect,
    call: impl FnOnce(&mut wgpu::CommandEncoder) -> gdn_wgpu::Result<T>,
) {
    let mut encoder = ctx.create_encoder("refused call");
    expect.check(case, call(&mut encoder));
    ctx.submit_and_wait(encoder).unwrap();
    ctx.check().unwrap();
    watched.unchanged(ctx, case);
}

#[test]
fn gpu_forward() {
    let Some(ctx) = gpu() else { return };
    let p = base_problem(Options::default());
    let host = base_inputs(&p);
    let inputs = upload_inputs(ctx, &host);
    let fill = |name, shape: &[usize], dtype| GpuTensor::filled(ctx, name, shape, dtype, 0.25);
    let o = fill("o", &p.v_shape(), DType::F32).unwrap();
    let state = fill("final_state", &p.state_shape(), DType::F32).unwrap();
    let mut caller: Vec<(&str, &GpuTensor)> = vec![
        ("q", &inputs.q),
        ("k", &inputs.k),
        ("v", &inputs.v),
        ("g", &inputs.g),
        ("beta", &inputs.beta),
        ("initial_state", inputs.initial_state.as_ref().unwrap()),
        ("o", &o),
        ("final_state", &state),
    ];
    let o_wide = fill("o", &[1, 70, 2, 48], DType::F32).unwrap();
    let o_bf16 = fill("o", &p.v_shape(), DType::BF16).unwrap();
    let state_v_first = fill("final_state", &[2, 2, 32, 16], DType::F32).unwrap();
    let state_f16 = fill("final_state", &p.state_shape(), DType::F16).unwrap();
    let o_short = short_tensor(ctx, "o", &p.v_shape(), 100);
    let q_short = short_tensor(ctx, "q", &p.qk_shape(), 1000);
    let k_f16 = GpuTensor::upload(ctx, "k", &host.k.clone().with_dtype(DType::F16)).unwrap();
    let g_2d = fill("g", &[70, 2], DType::F32).unwrap();
    caller.extend([
        ("o_wide", &o_wide),
        ("o_bf16", &o_bf16),
        ("state_v_first", &state_v_first),
        ("state_f16", &state_f16),
        ("o_short", &o_short),
        ("q_short", &q_short),
        ("k_f16", &k_f16),
        ("g_2d", &g_2d),
    ]);
    let watched = Watched::new(ctx, &caller);
    let outputs = |o, final_state| ForwardOutputs { o, final_state };
    let h0 = inputs.initial_state.as_ref().unwrap();
    type Call<'a> = (
        &'static str,
        ForwardInputs<&'a GpuTensor>,
        ForwardOutputs<&'a GpuTensor>,
        Expect,
    );
    let valid = inputs.as_ref();
    let cases: Vec<Call> = vec![
        (
            "o of another V",
            valid,
            outputs(&o_wide, &state),
            expect("output-shape", Shape, "o", "[1, 70, 2, 32]"),
        ),
        (
            "final_state V-first",
            valid,
            outputs(&o, &state_v_first),
            expect("output-shape", Shape, "final_state", "[2, 2, 16, 32]"),
        ),
        (
            "o BF16 while v F32",
            valid,
            outputs(&o_bf16, &state),
            expect("output-dtype", Dt, "o", "F32"),
        ),
        (
            "final_state F16",
            valid,
            outputs(&o, &state_f16),
            expect("output-dtype", Dt, "final_state", "F32"),
        ),
        (
            "o is v",
            valid,
            outputs(&inputs.v, &state),
            expect("output-aliases-input", Value, "o", "not the buffer of v"),
        ),
        (
            "final_state is initial_state",
            valid,
            outputs(&o, h0),
            expect(
                "output-aliases-input",
                Value,
                "final_state",
                "not the buffer of initial_state",
            ),
        ),
        (
            "o's buffer holds 100 values",
            valid,
            outputs(&o_short, &state),
            expect("gpu-buffer-too-small", Value, "o", "at least 17920 bytes"),
        ),
        (
            "q's buffer holds 1000 values",
            ForwardInputs {
                q: &q_short,
                ..valid
            },
            outputs(&o, &state),
            expect("gpu-buffer-too-small", Value, "q", "at least 4480 bytes"),
        ),
        (
            "k F16 while q F32",
            ForwardInputs { k: &k_f16, ..valid },
            outputs(&o, &state),
            expect("qkv-dtype-mixed", Dt, "k", "the dtype of q"),
        ),
        (
            "g of rank 2",
            ForwardInputs { g: &g_2d, ..valid },
            outputs(&o, &state),
            expect("tensor-shape", Shape, "g", "[1, 70, 2]"),
        ),
    ];
    for (case, ins, outs, e) in &cases {
        refused(ctx, &watched, case, *e, |enc| {
            wgpu_backend::forward_into(ctx, enc, &p, ins, outs)
        });
    }
    // A forced compute path the problem cannot take (cooperative matrices need K = 128).
    refused(
        ctx,
        &watched,
        "cooperative matrices at K = 16",
        expect(
            "compute-path-unavailable",
            Unsupported,
            "compute path",
            "forcing coop when",
        ),
        |enc| {
            wgpu_backend::forward_into_with_path(
                ctx,
                enc,
                &p,
                &valid,
                &outputs(&o, &state),
                ComputePath::CoopMatrix,
            )
        },
    );
    // A workspace made for another problem.
    let other = problem(1, 70, 1, 2, 16, 32, None, Options::default());
    let ws = ForwardWorkspace::new(ctx, &other, DType::F32).unwrap();
    refused(
        ctx,
        &watched,
        "workspace of a dense problem",
        expect(
            "workspace-mismatch",
            Value,
            "workspace",
            "made for this problem",
        ),
        |enc| {
            wgpu_backend::forward_into_workspace(
                ctx,
                enc,
                &p,
                &valid,
                &outputs(&o, &state),
                &ws,
                None,
            )
        },
    );
    // One row (the innermost dimensions past the two outermost) larger than any buffer the
    // device allows: refused before anything is allocated (a tensor past one binding or past
    // one buffer is fine: it is split into buffers of whole rows, bound in windows).
    let row = ctx.limits().max_buffer_size as usize / 4 + 1024;
    for (case, result) in [
        (
            "empty",
            GpuTensor::empty(ctx, "v", &[1, 1, row], DType::F32),
        ),
        (
            "filled",
            GpuTensor::filled(ctx, "v", &[1, 1, row], DType::F32, 0.0),
        ),
    ] {
        expect("too-large", TooLarge, "v", "max_buffer_size").check(case, result);
    }
    expect("size-overflow", Value, "v", "fits in usize").check(
        "a shape whose element count overflows",
        GpuTensor::empty(ctx, "v", &[usize::MAX / 2, 4], DType::F32),
    );
}

// ---------------------------------------------------------------- decode

#[test]
fn gpu_decode() {
    let Some(ctx) = gpu() else { return };
    let p = problem(2, 1, 1, 2, 16, 16, None, Options::default());
    let mut inputs = upload_inputs(ctx, &decode_spec(130).generate(&p));
    inputs.initial_state = None;
    let pool = StatePool::from_tensor(
        GpuTensor::upload(ctx, "pool", &random_pool(&p, 3, 130)).unwrap(),
        StateLayout::of(&p),
    )
    .unwrap();
    let o = GpuTensor::filled(ctx, "o", &p.v_shape(), DType::F32, 0.25).unwrap();
    let states_short = short_tensor(ctx, "per_token_states", &[2, 2, 16, 16], 16);
    let entry = GpuTensor::filled(ctx, "entry", &[1, 2, 16, 16], DType::F32, 0.5).unwrap();
    let watched = Watched::new(
        ctx,
        &[
            ("q", &inputs.q),
            ("k", &inputs.k),
            ("v", &inputs.v),
            ("g", &inputs.g),
            ("beta", &inputs.beta),
            ("pool", pool.tensor()),
            ("o", &o),
            ("per_token_states", &states_short),
            ("entry", &entry),
        ],
    );
    use StateSlot::{Fresh, Padding, Resume};
    // Shaped like o, but in the pool's buffer (which is large enough to hold it).
    let o_in_pool = GpuTensor::from_buffer(pool.tensor().buffer.clone(), &p.v_shape(), DType::F32);
    let valid = inputs.as_ref();
    let out = |o, per_token_states| DecodeOutputs {
        o,
        per_token_states,
    };
    let both = vec![Resume(0), Resume(1)];
    let cases: Vec<(&str, Vec<StateSlot>, DecodeOutputs, Expect)> = vec![
        (
            "slot 3 of 3",
            vec![Resume(0), Resume(3)],
            out(&o, None),
            expect("slot-out-of-range", Value, "slots", "0..3"),
        ),
        (
            "fresh slot 7",
            vec![Fresh(7), Padding],
            out(&o, None),
            expect("slot-out-of-range", Value, "slots", "0..3"),
        ),
        (
            "slot 1 twice",
            vec![Resume(1), Fresh(1)],
            out(&o, None),
            expect("slot-repeated", Value, "slots", "a different pool slot"),
        ),
        (
            "one slot for two sequences",
            vec![Resume(0)],
            out(&o, None),
            expect(
                "slot-count",
                Value,
                "slots",
                "one slot per sequence (N = 2)",
            ),
        ),
        (
            "o over the pool's buffer",
            vec![Resume(0), Resume(1)],
            out(&o_in_pool, None),
            expect("output-aliases-input", Value, "o", "not the buffer of pool"),
        ),
        (
            "o is v",
            vec![Resume(0), Resume(1)],
            out(&inputs.v, None),
            expect("output-aliases-input", Value, "o", "not the buffer of v"),
        ),
        (
            "per_token_states' buffer holds 16 values",
            vec![Resume(0), Resume(1)],
            out(&o, Some(&states_short)),
            expect(
                "gpu-buffer-too-small",
                Value,
                "per_token_states",
                "at least 4096 bytes",
            ),
        ),
    ];
    for (case, slots, outputs, e) in &cases {
        refused(ctx, &watched, case, *e, |enc| {
            decode_step(ctx, enc, &p, &valid, &pool, slots, outputs)
        });
    }
    // The pool against the problem, and the inputs a decode takes.
    let narrow = StatePool::zeros(ctx, 3, 1, 16, 16, StateLayout::KFirst).unwrap();
    let v_first = StatePool::from_tensor(pool.tensor().clone(), StateLayout::VFirst).unwrap();
    let h0 = GpuTensor::filled(ctx, "h0", &p.state_shape(), DType::F32, 0.5).unwrap();
    let with_h0 = ForwardInputs {
        initial_state: Some(&h0),
        ..valid
    };
    let q_wide = GpuTensor::filled(ctx, "q", &[2, 1, 1, 32], DType::F32, 0.5).unwrap();
    let wide_q = ForwardInputs {
        q: &q_wide,
        ..valid
    };
    let states_per_sequence =
        GpuTensor::filled(ctx, "per_token_states", &[2, 1, 16, 16], DType::F32, 0.5).unwrap();
    let o_bf16 = GpuTensor::filled(ctx, "o", &p.v_shape(), DType::BF16, 0.5).unwrap();
    let calls: Vec<(
        &str,
        ForwardInputs<&GpuTensor>,
        &StatePool,
        DecodeOutputs,
        Expect,
    )> = vec![
        (
            "pool of HV 1",
            valid,
            &narrow,
            out(&o, None),
            expect("pool-shape", Shape, "pool", "[3, 2, 16, 16]"),
        ),
        (
            "V-first pool for a K-first problem (K = V)",
            valid,
            &v_first,
            out(&o, None),
            expect("pool-layout", Value, "pool", "K-first [P, HV, K, V] pool"),
        ),
        (
            "initial_state given",
            with_h0,
            &pool,
            out(&o, None),
            expect(
                "decode-initial-state",
                Value,
                "initial_state",
                "from the pool's slots",
            ),
        ),
        (
            "q with K = 32",
            wide_q,
            &pool,
            out(&o, None),
            expect("tensor-shape", Shape, "q", "[2, 1, 1, 16]"),
        ),
        (
            "one state per sequence, not per token and v-head",
            valid,
            &pool,
            out(&o, Some(&states_per_sequence)),
            expect(
                "per-token-states-shape",
                Shape,
                "per_token_states",
                "[2, 2, 16, 16]",
            ),
        ),
        (
            "o BF16 while v F32",
            valid,
            &pool,
            out(&o_bf16, None),
            expect("output-dtype", Dt, "o", "F32 (the dtype of v)"),
        ),
    ];
    for (case, inputs, pool, outputs, e) in &calls {
        refused(ctx, &watched, case, *e, |enc| {
            decode_step(ctx, enc, &p, inputs, pool, &both, outputs)
        });
    }
    let flat = GpuTensor::empty(ctx, "flat", &[3, 512], DType::F32).unwrap();
    expect(
        "pool-tensor",
        Shape,
        "pool",
        "K-first [P, HV, K, V] with P ≥ 1",
    )
    .check(
        "a 2-D pool",
        StatePool::from_tensor(flat, StateLayout::KFirst),
    );
    let half = GpuTensor::empty(ctx, "half", &[3, 2, 16, 16], DType::F16).unwrap();
    expect("pool-tensor", Dt, "pool", "F32").check(
        "an F16 pool",
        StatePool::from_tensor(half, StateLayout::KFirst),
    );
    let empty = GpuTensor::empty(ctx, "empty", &[0, 2, 16, 16], DType::F32).unwrap();
    expect("pool-tensor", Shape, "pool", "P ≥ 1").check(
        "a pool of 0 slots",
        StatePool::from_tensor(empty, StateLayout::KFirst),
    );
    expect("pool-tensor", Value, "pool", "at least one slot").check(
        "zeros(0 slots)",
        StatePool::zeros(ctx, 0, 2, 16, 16, StateLayout::KFirst),
    );
    // A pool over a buffer smaller than the states it claims (o's 64 values as 512).
    let o_as_pool = GpuTensor::from_buffer(o.buffer.clone(), &[1, 2, 16, 16], DType::F32);
    expect("gpu-buffer-too-small", Value, "pool", "at least 2048 bytes").check(
        "a pool over o's buffer",
        StatePool::from_tensor(o_as_pool, StateLayout::KFirst),
    );

    // Copies into and out of slots.
    let copy_cases: Vec<(&str, &GpuTensor, usize, usize, Expect)> = vec![
        (
            "slot 3 of 3",
            &entry,
            0,
            3,
            expect("copy-slot", Value, "slot", "a pool slot in 0..3"),
        ),
        (
            "entry 1 of 1",
            &entry,
            1,
            0,
            expect("copy-slot", Value, "states", "an entry in 0..1"),
        ),
        (
            "the pool into itself",
            pool.tensor(),
            0,
            1,
            expect("copy-slot", Value, "states", "other than the pool itself"),
        ),
    ];
    for (case, states, entry, slot, e) in &copy_cases {
        refused(
            ctx,
            &watched,
            &format!("copy_into_slot {case}"),
            *e,
            |enc| pool.copy_into_slot(enc, states, *entry, *slot),
        );
        refused(
            ctx,
            &watched,
            &format!("copy_from_slot {case}"),
            *e,
            |enc| pool.copy_from_slot(enc, *slot, states, *entry),
        );
    }
}

// ---------------------------------------------------------------- backward

#[test]
fn gpu_backward() {
    let Some(ctx) = gpu() else { return };
    let p = base_problem(Options::default());
    let host = base_inputs(&p);
    let inputs = upload_inputs(ctx, &host);
    let (d_o_host, _) = common::backward::upstream(&p, 5, false);
    let d_o = GpuTensor::upload(ctx, "do", &d_o_host).unwrap();
    let d_o_short = short_tensor(ctx, "do", &p.v_shape(), 64);
    let dht_f16 = GpuTensor::filled(ctx, "dht", &p.state_shape(), DType::F16, 0.5).unwrap();
    let mut encoder = ctx.create_encoder("forward to save");
    let (_, saved) = wgpu_backend::forward_saved(ctx, &mut encoder, &p, &inputs.as_ref()).unwrap();
    ctx.submit_and_wait(encoder).unwrap();
    let watched = Watched::new(
        ctx,
        &[
            ("q", &inputs.q),
            ("v", &inputs.v),
            ("initial_state", inputs.initial_state.as_ref().unwrap()),
            ("do", &d_o),
            ("do (short)", &d_o_short),
            ("dht", &dht_f16),
            ("saved A", &saved.intermediates.a),
        ],
    );
    let mut other = saved.clone();
    other.problem = problem(1, 70, 1, 2, 16, 32, None, Options::default());
    let mut no_normed = saved.clone();
    no_normed.problem.options.l2norm_qk = true;
    let cases: Vec<(
        &str,
        &wgpu_backend::backward::Saved,
        &GpuTensor,
        Option<&GpuTensor>,
        Expect,
    )> = vec![
        (
            "do's buffer holds 64 values",
            &saved,
            &d_o_short,
            None,
            expect("gpu-buffer-too-small", Value, "do", "at least 17920 bytes"),
        ),
        (
            "dht F16",
            &saved,
            &d_o,
            Some(&dht_f16),
            expect("upstream-gradient", Dt, "dht", "F32"),
        ),
        (
            "do as dht",
            &saved,
            &d_o,
            Some(&d_o),
            expect("upstream-gradient", Shape, "dht", "[2, 2, 16, 32]"),
        ),
        (
            "saved from a problem with other sequences",
            &other,
            &d_o,
            None,
            expect(
                "saved-context-mismatch",
                Shape,
                "initial_state",
                "[1, 2, 16, 32]",
            ),
        ),
        (
            "saved without the normalized q, k",
            &no_normed,
            &d_o,
            None,
            expect(
                "saved-context-mismatch",
                Missing,
                "saved q_normed",
                "l2norm_qk",
            ),
        ),
    ];
    for (case, saved, d_o, dht, e) in &cases {
        refused(ctx, &watched, case, *e, |enc| {
            wgpu_backend::backward(ctx, enc, saved, d_o, *dht)
        });
    }
    gpu_backward_workspace(ctx, &p, &inputs, &d_o);
}

/// The backward's memory plan and workspace: a budget below the least plan, a workspace or plan
/// of another problem or windows, and the caller's gradients of `backward_into_workspace`.
fn gpu_backward_workspace(
    ctx: &Context,
    p: &Problem,
    inputs: &ForwardInputs<GpuTensor>,
    d_o: &GpuTensor,
) {
    use wgpu_backend::backward::{self, BackwardWorkspace, MemoryBudget};
    let dtype = DType::F32;
    let ws = BackwardWorkspace::with_budget(ctx, p, dtype, MemoryBudget::Unbounded).unwrap();
    let mut encoder = ctx.create_encoder("forward to save");
    let (_, saved) =
        wgpu_backend::forward_saved_for(ctx, &mut encoder, p, &inputs.as_ref(), ws.plan()).unwrap();
    ctx.submit_and_wait(encoder).unwrap();
    let least = match backward::BackwardPlan::new(ctx, p, dtype, MemoryBudget::Bytes(1)) {
        Err(Error::OverBudget { needed, .. }) => needed,
        other => panic!("a 1-byte budget: {other:?}"),
    };
    // A longer problem whose least plan has several windows: a whole-problem saved context
    // and a workspace of that plan.
    let long_p = problem(1, 300, 1, 2, 16, 32, None, Options::default());
    let long_inputs = upload_inputs(ctx, &RandomSpec::default().generate(&long_p));
    let long_do = GpuTensor::filled(ctx, "do", &long_p.v_shape(), dtype, 0.5).unwrap();
    let long_least = match backward::BackwardPlan::new(ctx, &long_p, dtype, MemoryBudget::Bytes(1))
    {
        Err(Error::OverBudget { needed, .. }) => needed,
        other => panic!("a 1-byte budget: {other:?}"),
    };
    let tight =
        BackwardWorkspace::with_budget(ctx, &long_p, dtype, MemoryBudget::Bytes(long_least))
            .unwrap();
    assert!(tight.plan().windows() > 1);
    let mut encoder = ctx.create_encoder("forward to save");
    let whole_plan =
        backward::BackwardPlan::new(ctx, &long_p, dtype, MemoryBudget::Unbounded).unwrap();
    let (_, long_saved) = wgpu_backend::forward_saved_for(
        ctx,
        &mut encoder,
        &long_p,
        &long_inputs.as_ref(),
        &whole_plan,
    )
    .unwrap();
    ctx.submit_and_wait(encoder).unwrap();
    let long_grads = backward::alloc_gradients(ctx, &long_saved).unwrap();
    let other_p = problem(1, 70, 1, 2, 16, 32, None, Options::default());
    let other =
        BackwardWorkspace::with_budget(ctx, &other_p, dtype, MemoryBudget::Unbounded).unwrap();
    let grads = backward::alloc_gradients(ctx, &saved).unwrap();
    let fill = |name, shape: &[usize], dt| GpuTensor::filled(ctx, name, shape, dt, 0.5).unwrap();
    let dq_bf16 = fill("dq", &p.qk_shape(), DType::BF16);
    let dv_wide = fill("dv", &[1, 70, 2, 48], DType::F32);
    let dg_short = short_tensor(ctx, "dg", &p.gate_shape(), 10);
    let watched = Watched::new(
        ctx,
        &[
            ("q", &inputs.q),
            ("v", &inputs.v),
            ("do", d_o),
            ("dq", &grads.dq),
            ("dv", &grads.dv),
            ("dg", &grads.dg),
            ("dh0", grads.dh0.as_ref().unwrap()),
            ("dq (bf16)", &dq_bf16),
            ("dv (wide)", &dv_wide),
            ("dg (short)", &dg_short),
        ],
    );
    let into = |enc: &mut wgpu::CommandEncoder, g: &gdn_wgpu::Gradients<&GpuTensor>, ws| {
        wgpu_backend::backward_into_workspace(ctx, enc, &saved, d_o, None, g, ws, None)
    };
    type Case<'a> = (
        &'static str,
        gdn_wgpu::Gradients<&'a GpuTensor>,
        &'a BackwardWorkspace,
        Expect,
    );
    let base = || backward::gradients_ref(&grads);
    use gdn_wgpu::Gradients as G;
    let cases: Vec<Case> = vec![
        (
            "a workspace of another problem",
            base(),
            &other,
            expect(
                "backward-workspace-mismatch",
                Value,
                "backward workspace",
                "made for this problem",
            ),
        ),
        (
            "dq in BF16 for F32 q",
            G {
                dq: &dq_bf16,
                ..base()
            },
            &ws,
            expect("gradient-outputs", Dt, "dq", "F32"),
        ),
        (
            "dv of another V",
            G {
                dv: &dv_wide,
                ..base()
            },
            &ws,
            expect("gradient-outputs", Shape, "dv", "[1, 70, 2, 32]"),
        ),
        (
            "dg's buffer holds 10 values",
            G {
                dg: &dg_short,
                ..base()
            },
            &ws,
            expect("gradient-outputs", Value, "dg", "at least 560 bytes"),
        ),
        (
            "dh0 missing with h0",
            G {
                dh0: None,
                ..base()
            },
            &ws,
            expect("gradient-outputs", Missing, "dh0", "initial_state"),
        ),
        (
            "dA_log without gate_in_kernel",
            G {
                da_log: Some(&grads.dg),
                ..base()
            },
            &ws,
            expect("gradient-outputs", Value, "dA_log", "gate_in_kernel"),
        ),
        (
            "dk in dq's buffer",
            G {
                dk: &grads.dq,
                ..base()
            },
            &ws,
            expect("gradient-outputs", Value, "dk", "a buffer of its own"),
        ),
    ];
    for (case, g, ws, e) in &cases {
        refused(ctx, &watched, case, *e, |enc| into(enc, g, ws));
    }
    refused(
        ctx,
        &watched,
        "a workspace of other windows",
        expect(
            "backward-workspace-mismatch",
            Value,
            "backward workspace",
            "token windows of the saved forward",
        ),
        |enc| {
            wgpu_backend::backward_into_workspace(
                ctx,
                enc,
                &long_saved,
                &long_do,
                None,
                &backward::gradients_ref(&long_grads),
                &tight,
                None,
            )
        },
    );
    // A budget below the least plan, before anything is allocated.
    let budget = least - 1;
    let needed = least.to_string();
    refused(
        ctx,
        &watched,
        "a budget one byte below the least plan",
        expect(
            "backward-budget",
            OverBudget,
            "backward memory budget",
            "more than the memory budget",
        ),
        |_| BackwardWorkspace::with_budget(ctx, p, dtype, MemoryBudget::Bytes(budget)),
    );
    let e = BackwardWorkspace::with_budget(ctx, p, dtype, MemoryBudget::Bytes(budget)).unwrap_err();
    assert!(
        e.to_string().contains(&needed) && e.to_string().contains(&budget.to_string()),
        "{e}"
    );
    refused(
        ctx,
        &watched,
        "a plan of another problem",
        expect(
            "backward-workspace-mismatch",
            Value,
            "backward plan",
            "made for this problem",
        ),
        |enc| wgpu_backend::forward_saved_for(ctx, enc, p, &inputs.as_ref(), other.plan()),
    );
    for bad in ["lots", "0", "2.5x"] {
        refused(
            ctx,
            &watched,
            "GDN_BACKWARD_BUDGET not a size",
            expect(
                "backward-budget",
                Value,
                "GDN_BACKWARD_BUDGET",
                "a byte count",
            ),
            |_| {
                wgpu_backend::Config::from_lookup(|n| {
                    (n == "GDN_BACKWARD_BUDGET").then(|| bad.to_string())
                })
            },
        );
    }
}

// ---------------------------------------------------------------- files

/// A scratch folder unique to this process and test, removed when dropped.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(test: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("gdn-bad-input-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn path(&self, file: &str) -> std::path::PathBuf {
        self.0.join(file)
    }

    /// Names of the files in the folder, sorted.
    fn files(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A valid file's bytes: q (F32 [2, 3]) and cu_seqlens (I64 [3]).
fn valid_file_bytes(dir: &Scratch) -> Vec<u8> {
    let path = dir.path("valid.safetensors");
    let q = HostTensor::new([2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let cu = IntTensor {
        shape: vec![3],
        dtype: IntDType::I64,
        data: vec![0, 1, 2],
    };
    io::write(&path, [("q", (&q).into()), ("cu_seqlens", (&cu).into())]).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    bytes
}

/// A file with `header` as its JSON header and `data` after it.
fn with_header(header: &str, data: &[u8]) -> Vec<u8> {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(header.as_bytes());
    bytes.extend(data);
    bytes
}

#[test]
fn files() {
    let dir = Scratch::new("files");
    let valid = valid_file_bytes(&dir);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "truncated by 4 bytes",
            valid[..valid.len() - 4].to_vec(),
            "file-truncated",
        ),
        (
            "only the header length",
            valid[..8].to_vec(),
            "file-truncated",
        ),
        ("3 bytes", valid[..3].to_vec(), "file-truncated"),
        (
            "header length beyond the file",
            {
                let mut b = valid.clone();
                b[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
                b
            },
            "file-corrupt-header",
        ),
        (
            "header not JSON",
            with_header("{\"q\": [1, 2", &[0; 8]),
            "file-corrupt-header",
        ),
        (
            "offsets disagree with the shape",
            with_header(
                r#"{"q":{"dtype":"F32","shape":[2,3],"data_offsets":[0,8]}}"#,
                &[0; 8],
            ),
            "file-corrupt-header",
        ),
        (
            "a shape whose size overflows",
            with_header(
                r#"{"q":{"dtype":"F32","shape":[4611686018427387904,8],"data_offsets":[0,8]}}"#,
                &[0; 8],
            ),
            "file-corrupt-header",
        ),
        (
            "tensors overlapping",
            with_header(
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
                &[0; 8],
            ),
            "file-corrupt-header",
        ),
        (
            "text",
            b"this is not a safetensors file at all".to_vec(),
            "file-not-safetensors",
        ),
    ];
    for (case, bytes, class) in cases {
        let path = dir.path("bad.safetensors");
        std::fs::write(&path, bytes).unwrap();
        let shown = path.display().to_string();
        let e = Expect {
            class,
            kind: Safetensors,
            name: "",
            expected: "not a valid safetensors file",
        };
        e.check(case, TensorFile::open(&path));
        let msg = TensorFile::open(&path).unwrap_err().to_string();
        assert!(
            msg.starts_with(&shown),
            "{case}: {msg} does not name the file"
        );
        std::fs::remove_file(&path).unwrap();
    }
    let missing = dir.path("missing.safetensors");
    let e = TensorFile::open(&missing).unwrap_err();
    assert!(
        matches!(e, Error::Io { .. }) && e.to_string().starts_with(&*missing.to_string_lossy()),
        "file-missing: {e}"
    );

    // Tensors asked for as the wrong kind of number.
    let path = dir.path("valid.safetensors");
    std::fs::write(&path, &valid).unwrap();
    let file = TensorFile::open(&path).unwrap();
    expect("non-float-tensor", Dt, "cu_seqlens", "F32, F16 or BF16")
        .check("cu_seqlens read as floats", file.float("cu_seqlens"));
    expect("cu-seqlens-dtype", Dt, "q", "I32 or I64").check("q read as integers", file.int("q"));
    assert!(file.float("beta").unwrap().is_none(), "tensor-missing");
    std::fs::remove_file(&path).unwrap();

    // Writes that cannot happen leave nothing behind: no output, no temporary file.
    let out = dir.path("out.safetensors");
    let short = HostTensor {
        shape: vec![2, 3],
        dtype: DType::F32,
        data: vec![1.0; 5],
    };
    expect("host-storage-length", Value, "o", "6 values").check(
        "o of 5 values for [2, 3]",
        io::write(&out, [("o", (&short).into())]),
    );
    let wide = IntTensor {
        shape: vec![2],
        dtype: IntDType::I32,
        data: vec![0, 1 << 40],
    };
    expect("cu-seqlens-dtype", Value, "cu_seqlens", "fit I32").check(
        "cu_seqlens beyond I32",
        io::write(&out, [("cu_seqlens", (&wide).into())]),
    );
    let q = HostTensor::new([2], vec![1.0, 2.0]);
    let nowhere = dir.path("no such folder").join("out.safetensors");
    let e = io::write(&nowhere, [("q", (&q).into())]).unwrap_err();
    assert!(
        matches!(e, Error::Io { .. }) && e.to_string().contains("no such folder"),
        "output-unwritable: {e}"
    );
    let folder = dir.path("a folder");
    std::fs::create_dir(&folder).unwrap();
    let e = io::write(&folder, [("q", (&q).into())]).unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "output-unwritable: {e}");
    assert_eq!(
        dir.files(),
        ["a folder"],
        "a refused write left files behind"
    );
    // A pipe (like /dev/null or /dev/stdout, a special file) is written in place, never
    // renamed over; a FIFO in the scratch folder stands in for them, held open for reading so
    // the write does not wait.
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::FileTypeExt;
        let fifo = dir.path("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            let reader = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&fifo)
                .unwrap();
            io::write(&fifo, [("q", (&q).into())]).unwrap();
            let kind = std::fs::metadata(&fifo).unwrap().file_type();
            assert!(
                kind.is_fifo(),
                "io::write replaced a FIFO with a regular file"
            );
            drop(reader);
        }
    }
}

// ---------------------------------------------------------------- the catalogue

/// docs/errors.md lists every class once; each class has a case here or in the CLI's
/// catalogue, and every class a case names is listed.
#[test]
fn the_catalogue_is_documented() {
    let root = env!("CARGO_MANIFEST_DIR");
    let read = |p: &str| std::fs::read_to_string(format!("{root}/{p}")).unwrap();
    let doc = read("docs/errors.md");
    let classes: Vec<&str> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| "))
        .filter_map(|l| l.split(" | ").nth(1))
        .filter_map(|c| c.strip_prefix('`')?.strip_suffix('`'))
        .collect();
    let mut unique = classes.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), classes.len(), "a class is listed twice");
    assert!(
        classes.len() >= 25,
        "{} classes in docs/errors.md",
        classes.len()
    );
    let tests = read("tests/bad_input.rs") + &read("cli/tests/cli.rs");
    for class in &classes {
        assert!(
            tests.contains(&format!("\"{class}\"")),
            "class {class} has no case in tests/bad_input.rs or cli/tests/cli.rs"
        );
    }
    let source = read("tests/bad_input.rs");
    for tagged in source.split("expect(\"").skip(1) {
        let class = tagged.split('"').next().unwrap();
        assert!(
            classes.contains(&class),
            "class {class} is not in docs/errors.md"
        );
    }
}
