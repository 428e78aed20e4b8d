//! Tensors larger than one storage binding: the forward in token windows and decode over
//! pool windows (docs/windows.md). The binding limit is lowered per context
//! (`Context::set_max_binding_bytes`, as `GDN_MAX_BINDING_BYTES` does) so small problems run
//! in windows of one chunk, of a few chunks, and of one or two sequences. Every storage
//! binding the library makes is checked against that limit (an `Error::TooLarge` otherwise),
//! so a pass that bound a whole tensor would fail here. Windowed results are compared bitwise
//! with the unwindowed run on the same path and with the f64 oracle under the tolerance
//! policy, on the hard cases of tests/common/cases.rs; outputs are NaN-poisoned first.

mod common;

use std::ops::Range;

use common::cases::{check, fail_on, hard_cases, inputs_and_oracle};
use gdn_wgpu::tolerance::Op;
use gdn_wgpu::wgpu_backend::config::MIN_BINDING_BYTES;
use gdn_wgpu::wgpu_backend::{
    self, ComputePath, Config, Context, ForwardWorkspace, GpuTensor, forward_into_with_path,
    forward_into_workspace,
};
use gdn_wgpu::{DType, Error, ForwardOutputs, HostTensor, Problem};

/// A context of our own (its binding limit changes), or `None` without an adapter (a failure
/// with GDN_REQUIRE_GPU=1).
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

/// The least binding limit (a multiple of 1 KiB) at which a workspace builds: windows of one
/// chunk, or of one sequence's state, whichever binds more.
fn least_limit(
    ctx: &mut Context,
    p: &Problem,
    dtype: DType,
    path: ComputePath,
    segments: Option<usize>,
) -> u64 {
    let builds = |ctx: &mut Context, limit: u64| {
        ctx.set_max_binding_bytes(Some(limit)).unwrap();
        match segments {
            Some(c) => ForwardWorkspace::with_segments(ctx, p, dtype, path, c).is_ok(),
            None => ForwardWorkspace::with_path(ctx, p, dtype, path).is_ok(),
        }
    };
    let (mut lo, mut hi) = (MIN_BINDING_BYTES / 1024, 1u64 << 20);
    assert!(
        builds(ctx, hi * 1024),
        "{p:?} does not build at 1 GiB bindings"
    );
    if builds(ctx, lo * 1024) {
        return lo * 1024;
    }
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if builds(ctx, mid * 1024) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi * 1024
}

/// Run a forward into NaN-poisoned outputs and download them.
fn run(
    ctx: &Context,
    p: &Problem,
    dtype: DType,
    record: impl FnOnce(
        &mut wgpu::CommandEncoder,
        &ForwardOutputs<&GpuTensor>,
    ) -> gdn_wgpu::Result<wgpu_backend::Intermediates>,
) -> ForwardOutputs<HostTensor> {
    let o = GpuTensor::filled(ctx, "o", &p.v_shape(), dtype, f32::NAN).unwrap();
    let s = GpuTensor::filled(ctx, "final_state", &p.state_shape(), DType::F32, f32::NAN).unwrap();
    let mut encoder = ctx.create_encoder("windows test");
    record(
        &mut encoder,
        &ForwardOutputs {
            o: &o,
            final_state: &s,
        },
    )
    .unwrap();
    ctx.submit_and_wait(encoder).unwrap();
    ForwardOutputs {
        o: o.download_blocking(ctx).unwrap(),
        final_state: s.download_blocking(ctx).unwrap(),
    }
}

fn bits(t: &HostTensor) -> Vec<u32> {
    t.data.iter().map(|x| x.to_bits()).collect()
}

/// Where the windows cut: (some window is exactly one chunk of one sequence, some window
/// boundary falls inside a sequence).
fn cuts(p: &Problem, windows: &[Range<usize>]) -> (bool, bool) {
    let seqs = p.sequences();
    let one_chunk = windows
        .iter()
        .any(|w| w.len() <= 64 && seqs.iter().any(|s| s.start <= w.start && w.end <= s.end));
    let inside = windows
        .iter()
        .any(|w| seqs.iter().any(|s| s.start < w.end && w.end < s.end));
    (one_chunk, inside)
}

/// The hard cases: windows of one chunk (the least limit) on every path the device has with
/// f32 storage and on the scalar path with bf16, bitwise equal to the unwindowed forward and
/// within the policy's bounds of the oracle; on the scalar path with f32 also windows of a
/// few chunks (twice the least limit) and sequence parallelism in windows (segments of one
/// and two chunks) against the oracle.
#[test]
fn hard_cases_in_windows_match_the_unwindowed_forward_and_the_oracle() {
    let Some(mut ctx) = context() else { return };
    let mut failures = Vec::new();
    let (mut saw_one_chunk, mut saw_cut) = (false, false);
    for case in hard_cases() {
        let p = &case.problem;
        for dtype in [DType::F32, DType::BF16] {
            if !ctx.forward_storage_dtypes().contains(&dtype) {
                continue;
            }
            let (inputs, expected) = inputs_and_oracle(&case, dtype);
            let up = common::upload_inputs(&ctx, &inputs);
            for path in ComputePath::ALL {
                let scalar = path == ComputePath::Scalar;
                if ctx.path_support().choose(p, dtype, Some(path)).is_err()
                    || (dtype != DType::F32 && !scalar)
                {
                    continue;
                }
                ctx.set_max_binding_bytes(None).unwrap();
                let whole = run(&ctx, p, dtype, |e, out| {
                    forward_into_with_path(&ctx, e, p, &up.as_ref(), out, path)
                });
                let least = least_limit(&mut ctx, p, dtype, path, None);
                let full = scalar && dtype == DType::F32;
                let limits: &[u64] = if full { &[least, 2 * least] } else { &[least] };
                for &limit in limits {
                    ctx.set_max_binding_bytes(Some(limit)).unwrap();
                    let ws = ForwardWorkspace::with_path(&ctx, p, dtype, path).unwrap();
                    if limit > least && ws.windows() == 1 {
                        continue;
                    }
                    let windows = ws.window_tokens();
                    let (one, cut) = cuts(p, &windows);
                    saw_one_chunk |= one;
                    saw_cut |= cut;
                    let what = format!("{path} limit {limit} ({} windows)", ws.windows());
                    let got = run(&ctx, p, dtype, |e, out| {
                        forward_into_workspace(&ctx, e, p, &up.as_ref(), out, &ws, None)
                    });
                    if bits(&got.o) != bits(&whole.o)
                        || bits(&got.final_state) != bits(&whole.final_state)
                    {
                        failures.push(format!(
                            "{what} [{}] {dtype}: not bitwise equal to the unwindowed forward \
                             (windows {windows:?})",
                            case.name
                        ));
                    }
                    let arithmetic = path.arithmetic();
                    if let Err(e) = check(
                        &what,
                        &case,
                        Op::Forward,
                        dtype,
                        arithmetic,
                        &got,
                        &expected,
                    ) {
                        failures.push(e);
                    }
                }
                let segment_chunks: &[usize] = if full { &[1, 2] } else { &[] };
                for &segment_chunks in segment_chunks {
                    let least = least_limit(&mut ctx, p, dtype, path, Some(segment_chunks));
                    ctx.set_max_binding_bytes(Some(least)).unwrap();
                    let ws = ForwardWorkspace::with_segments(&ctx, p, dtype, path, segment_chunks)
                        .unwrap();
                    let what = format!(
                        "{path} {segment_chunks}-chunk segments, limit {least} ({} windows)",
                        ws.windows()
                    );
                    let got = run(&ctx, p, dtype, |e, out| {
                        forward_into_workspace(&ctx, e, p, &up.as_ref(), out, &ws, None)
                    });
                    if let Err(e) = check(
                        &what,
                        &case,
                        Op::Forward,
                        dtype,
                        path.arithmetic(),
                        &got,
                        &expected,
                    ) {
                        failures.push(e);
                    }
                }
            }
        }
    }
    ctx.check().unwrap();
    assert!(saw_one_chunk, "no case ran a window of a single chunk");
    assert!(saw_cut, "no case cut a sequence at a window boundary");
    fail_on(failures);
}

/// A long sequence in many windows (every option, GVA, h0), with its o and state beyond the
/// binding limit: the caller's tensors are larger than any binding the library makes.
#[test]
fn a_sequence_longer_than_a_binding() {
    let Some(mut ctx) = context() else { return };
    let options = common::every_option();
    let p = common::problem(1, 3000, 1, 2, 32, 32, None, options);
    let case = common::cases::HardCase {
        name: "T3000 every option".into(),
        problem: p.clone(),
        spec: gdn_wgpu::RandomSpec {
            zero_gate_heads: 1,
            ..common::cases::spec(77, true)
        },
    };
    let (inputs, expected) = inputs_and_oracle(&case, DType::F32);
    let up = common::upload_inputs(&ctx, &inputs);
    // Workspaces of `with_path` never cut sequences into segments: on GPU adapters the
    // automatic sequence parallelism would cut this 47-chunk sequence differently with and
    // without windows (equal within the tolerances, not bitwise).
    let whole_ws = ForwardWorkspace::with_path(&ctx, &p, DType::F32, ComputePath::Scalar).unwrap();
    let whole = run(&ctx, &p, DType::F32, |e, out| {
        forward_into_workspace(&ctx, e, &p, &up.as_ref(), out, &whole_ws, None)
    });
    let limit = least_limit(&mut ctx, &p, DType::F32, ComputePath::Scalar, None);
    ctx.set_max_binding_bytes(Some(limit)).unwrap();
    assert!(
        up.v.bytes() > limit && up.q.bytes() > limit,
        "v and q exceed a binding"
    );
    let ws = ForwardWorkspace::with_path(&ctx, &p, DType::F32, ComputePath::Scalar).unwrap();
    let got = run(&ctx, &p, DType::F32, |e, out| {
        forward_into_workspace(&ctx, e, &p, &up.as_ref(), out, &ws, None)
    });
    assert!(ws.windows() > 10, "{} windows", ws.windows());
    assert!(
        ws.bytes() < 4 * limit,
        "scratch {} B is bounded by the window, not by T",
        ws.bytes()
    );
    assert_eq!(bits(&got.o), bits(&whole.o));
    assert_eq!(bits(&got.final_state), bits(&whole.final_state));
    check(
        "windowed",
        &case,
        Op::Forward,
        DType::F32,
        ComputePath::Scalar.arithmetic(),
        &got,
        &expected,
    )
    .unwrap();
    ctx.check().unwrap();
}

/// A limit below one chunk's bindings is a typed error naming it; the backward refuses the
/// intermediates of a plain forward that ran in windows; bad `GDN_MAX_BINDING_BYTES` values
/// are typed errors naming the variable.
#[test]
fn limits_too_small_and_bad_values_are_typed_errors() {
    for bad in ["0", "abc", "65535", "65538", "-1", "1TiB"] {
        let e = Config::from_lookup(|v| (v == "GDN_MAX_BINDING_BYTES").then(|| bad.to_string()))
            .unwrap_err();
        assert!(
            matches!(&e, Error::Value { name, .. } if name == "GDN_MAX_BINDING_BYTES"),
            "{bad}: {e}"
        );
    }
    for (good, bytes) in [
        ("65536", 65536),
        ("64KiB", 65536),
        ("3 MiB", 3 << 20),
        ("2GiB", 2 << 30),
    ] {
        let c = Config::from_lookup(|v| (v == "GDN_MAX_BINDING_BYTES").then(|| good.to_string()))
            .unwrap();
        assert_eq!(c.max_binding_bytes, Some(bytes), "{good}");
    }

    let Some(mut ctx) = context() else { return };
    assert!(ctx.set_max_binding_bytes(Some(1000)).is_err());
    // 16 v-heads of K = V = 256: one state is 4 MiB, over a 1 MiB binding.
    let p = common::problem(1, 100, 1, 16, 256, 256, None, Default::default());
    ctx.set_max_binding_bytes(Some(1 << 20)).unwrap();
    let e = ForwardWorkspace::new(&ctx, &p, DType::F32).unwrap_err();
    assert!(
        matches!(&e, Error::TooLarge { name, .. } if name.contains("one 64-token chunk") || name.contains("state of one sequence")),
        "{e}"
    );

    // Intermediates of a plain forward that ran in windows hold the last window only: the
    // backward says so (forward_saved keeps what a windowed backward needs).
    let p = common::problem(1, 600, 1, 2, 32, 32, None, Default::default());
    ctx.set_max_binding_bytes(Some(2 * MIN_BINDING_BYTES))
        .unwrap();
    let inputs = gdn_wgpu::RandomSpec::default().generate(&p);
    let up = common::upload_inputs(&ctx, &inputs);
    let mut encoder = ctx.create_encoder("windowed forward");
    // The chunked algorithm (the automatic choice on a CPU adapter is the recurrent kernel,
    // which keeps no intermediates).
    ctx.set_forward_algorithm(Some(wgpu_backend::ForwardAlgorithm::Chunked));
    let fwd = wgpu_backend::forward(&ctx, &mut encoder, &p, &up.as_ref()).unwrap();
    let intermediates = fwd
        .saved
        .clone()
        .expect("the chunked forward keeps intermediates");
    assert_ne!(intermediates.tokens, 0..600);
    let saved = wgpu_backend::Saved::new(&p, &up.as_ref(), intermediates);
    let e = wgpu_backend::backward(&ctx, &mut encoder, &saved, &fwd.o, None).unwrap_err();
    assert!(
        matches!(&e, Error::Unsupported { name, .. } if name == "saved intermediates"),
        "{e}"
    );
    ctx.submit_and_wait(encoder).unwrap();
}

/// Decode over a pool larger than a binding: slots in different pool windows (resumed, fresh,
/// padding), bitwise equal to the same call over the whole pool; untouched slots stay as they
/// were.
#[test]
fn decode_over_a_pool_larger_than_a_binding() {
    let Some(mut ctx) = context() else { return };
    let PoolCase {
        p,
        pool_slots,
        pool_host,
        inputs,
        slots,
        other,
    } = pool_case(3, 5);
    type Slots<'a> = &'a [wgpu_backend::StateSlot];
    let run = |ctx: &Context, slots: Slots, reuse: Option<Slots>| {
        let r = decode_run(ctx, &p, &inputs, &pool_host, slots, reuse, false);
        (r.pool_windows, r.o, r.pool)
    };
    for slots in [&slots[..], &other[..]] {
        ctx.set_max_binding_bytes(None).unwrap();
        let (windows, o, pool) = run(&ctx, slots, None);
        assert_eq!(windows, 1);
        assert!(o.data.iter().all(|x| x.is_finite()));
        let slot_len = pool.len() / pool_slots;
        for limit in [1u64 << 16, 3 << 16] {
            ctx.set_max_binding_bytes(Some(limit)).unwrap();
            for reuse in [None, Some(&other[..])] {
                let (w, o_w, pool_w) = run(&ctx, slots, reuse);
                assert_eq!(
                    w,
                    pool_slots.div_ceil((limit >> 16) as usize),
                    "limit {limit}"
                );
                assert_eq!(bits(&o_w), bits(&o), "o, limit {limit}, slots {slots:?}");
                assert_eq!(
                    bits(&pool_w),
                    bits(&pool),
                    "pool, limit {limit}, slots {slots:?}"
                );
            }
        }
        // Slots no sequence names keep their states.
        for s in 0..pool_slots {
            if !slots.iter().any(|x| x.slot() == Some(s as u32)) {
                let r = s * slot_len..(s + 1) * slot_len;
                assert_eq!(pool.data[r.clone()], pool_host.data[r], "slot {s}");
            }
        }
    }
    ctx.check().unwrap();
}

/// More chunks and sequences than one grid dimension holds (a device granting 4 workgroups
/// per dimension): windows of at most 4 chunks and sequences, within tolerance of the oracle.
#[test]
fn more_chunks_than_workgroups_per_dimension() {
    let Some(adapter) = pollster::block_on(wgpu_backend::list_adapters())
        .into_iter()
        .next()
    else {
        assert!(
            std::env::var("GDN_REQUIRE_GPU").as_deref() != Ok("1"),
            "GDN_REQUIRE_GPU=1 but no GPU adapter"
        );
        return;
    };
    let limits = wgpu::Limits {
        max_compute_workgroups_per_dimension: 4,
        ..adapter.limits()
    };
    let ctx = pollster::block_on(Context::from_adapter_with_config(
        adapter,
        limits,
        Config::default(),
    ))
    .unwrap();
    let p = common::problem(
        1,
        460,
        1,
        1,
        16,
        16,
        Some(vec![0, 1, 2, 3, 4, 200, 460]),
        Default::default(),
    );
    let case = common::cases::HardCase {
        name: "6 sequences, 9 chunks, a 4-wide grid".into(),
        problem: p.clone(),
        spec: common::cases::spec(9, true),
    };
    let (inputs, expected) = inputs_and_oracle(&case, DType::F32);
    let up = common::upload_inputs(&ctx, &inputs);
    let ws = ForwardWorkspace::with_path(&ctx, &p, DType::F32, ComputePath::Scalar).unwrap();
    assert!(ws.windows() >= 3, "{:?}", ws.window_tokens());
    let got = run(&ctx, &p, DType::F32, |e, out| {
        forward_into_workspace(&ctx, e, &p, &up.as_ref(), out, &ws, None)
    });
    check(
        "4-wide grid",
        &case,
        Op::Forward,
        DType::F32,
        ComputePath::Scalar.arithmetic(),
        &got,
        &expected,
    )
    .unwrap();
    ctx.check().unwrap();
}

/// The least binding limit (a multiple of 1 KiB) at which `forward_saved` plans its windows
/// (with the backward's costs): windows of one chunk or one sequence's states.
fn least_training_limit(
    ctx: &mut Context,
    p: &Problem,
    inputs: &gdn_wgpu::ForwardInputs<GpuTensor>,
) -> u64 {
    let plans = |ctx: &mut Context, limit: u64| {
        ctx.set_max_binding_bytes(Some(limit)).unwrap();
        let mut encoder = ctx.create_encoder("plan only");
        wgpu_backend::forward_saved(ctx, &mut encoder, p, &inputs.as_ref()).is_ok()
    };
    let (mut lo, mut hi) = (MIN_BINDING_BYTES / 1024, 1u64 << 20);
    assert!(plans(ctx, hi * 1024));
    if plans(ctx, lo * 1024) {
        return lo * 1024;
    }
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if plans(ctx, mid * 1024) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi * 1024
}

/// The backward in token windows (`forward_saved` cuts the windows the backward walks, with
/// checkpoints of their start states): every gradient of the hard cases within the policy's
/// bounds of the oracle, with and without dht, at the least limit (windows of one chunk or
/// of one sequence's states).
#[test]
fn backward_in_windows_matches_the_oracle() {
    use common::cases::{backward_case, check_gradients};
    let Some(mut ctx) = context() else { return };
    let mut failures = Vec::new();
    let mut windowed = 0;
    for (i, case) in hard_cases().iter().enumerate() {
        let p = &case.problem;
        let (inputs, d_o, dht, expected) = backward_case(case, DType::F32, i % 2 == 0);
        let up = common::upload_inputs(&ctx, &inputs);
        let limit = least_training_limit(&mut ctx, p, &up);
        ctx.set_max_binding_bytes(Some(limit)).unwrap();
        let mut encoder = ctx.create_encoder("windows of forward_saved");
        let (_, saved) = wgpu_backend::forward_saved(&ctx, &mut encoder, p, &up.as_ref()).unwrap();
        drop(encoder);
        if saved.windows() > 1 {
            windowed += 1;
        }
        let (_, grads) =
            wgpu_backend::backward_host(&ctx, p, &inputs.as_ref(), &d_o, dht.as_ref()).unwrap();
        let what = format!("backward, limit {limit} ({} windows)", saved.windows());
        failures.extend(check_gradients(&what, case, DType::F32, &grads, &expected));
    }
    ctx.check().unwrap();
    assert!(windowed >= 6, "only {windowed} cases ran in windows");
    fail_on(failures);
}

/// A long sequence with every option in many windows, forward and backward, f32 and bf16:
/// within the policy's bounds of the oracle, with scratch bounded by the window.
#[test]
fn backward_of_a_sequence_longer_than_a_binding() {
    use common::cases::{backward_case, check_gradients};
    let Some(mut ctx) = context() else { return };
    let case = common::cases::long_every_option();
    let p = &case.problem;
    let mut failures = Vec::new();
    for dtype in [DType::F32, DType::BF16] {
        let (inputs, d_o, dht, expected) = backward_case(&case, dtype, true);
        let up = common::upload_inputs(&ctx, &inputs);
        let limit = least_training_limit(&mut ctx, p, &up);
        ctx.set_max_binding_bytes(Some(limit)).unwrap();
        let mut encoder = ctx.create_encoder("windows of forward_saved");
        let (_, saved) = wgpu_backend::forward_saved(&ctx, &mut encoder, p, &up.as_ref()).unwrap();
        drop(encoder);
        assert!(saved.windows() > 10, "{} windows", saved.windows());
        assert!(up.v.bytes() > limit, "v exceeds a binding");
        let (out, grads) =
            wgpu_backend::backward_host(&ctx, p, &inputs.as_ref(), &d_o, dht.as_ref()).unwrap();
        let what = format!("backward, limit {limit} ({} windows)", saved.windows());
        failures.extend(check_gradients(&what, &case, dtype, &grads, &expected));
        // The forward in the backward's windows is bitwise the unwindowed forward and within
        // the oracle's bounds (bf16 with l2norm: o 3.3e-3, its q̂, k̂ rounding included).
        ctx.set_max_binding_bytes(None).unwrap();
        let (whole, _) =
            wgpu_backend::backward_host(&ctx, p, &inputs.as_ref(), &d_o, dht.as_ref()).unwrap();
        assert_eq!(bits(&out.o), bits(&whole.o), "{dtype} o");
        assert_eq!(
            bits(&out.final_state),
            bits(&whole.final_state),
            "{dtype} final state"
        );
        let (_, oracle) = inputs_and_oracle(&case, dtype);
        let arithmetic = ctx.forward_path(p, dtype).unwrap().path.arithmetic();
        if let Err(e) = check(&what, &case, Op::Forward, dtype, arithmetic, &out, &oracle) {
            failures.push(e);
        }
    }
    ctx.check().unwrap();
    fail_on(failures);
}

/// Tensors larger than the largest buffer (`Context::set_max_buffer_bytes`, as
/// `GDN_MAX_BUFFER_BYTES` does, lowered so small tensors span several buffers): uploads,
/// downloads, ranges across buffer boundaries and slab writes round-trip exactly; the forward
/// over inputs and outputs in several buffers is bitwise the one-buffer forward and within
/// the oracle's bounds; the backward (inputs, saved intermediates and gradients in several
/// buffers) is within the oracle's bounds.
#[test]
fn tensors_larger_than_a_buffer() {
    use common::cases::{backward_case, check_gradients};
    let Some(mut ctx) = context() else { return };
    const BUFFER: u64 = 128 << 10;

    // Round trips (odd lengths of 16-bit values included).
    ctx.set_max_buffer_bytes(Some(BUFFER)).unwrap();
    for dtype in [DType::F32, DType::BF16] {
        let rows = 3001;
        let shape = [1, rows, 3, 10];
        let len: usize = shape.iter().product();
        let values: Vec<f32> = (0..len).map(|i| (i % 251) as f32 - 125.0).collect();
        let t = GpuTensor::from_values(&ctx, "t", &shape, dtype, &values).unwrap();
        assert!(t.buffers().len() > 1, "{dtype}: one buffer");
        assert!(t.buffers().iter().all(|b| b.size() <= BUFFER));
        assert_eq!(t.download_blocking(&ctx).unwrap().data, values, "{dtype}");
        let (a, b) = (len / 3 + 1, 2 * len / 3 + 7);
        let got = t.download_range_blocking(&ctx, a..b).unwrap();
        assert_eq!(got.data, values[a..b], "{dtype} range");
        // Slab writes across a boundary, into a fresh tensor.
        let w = GpuTensor::empty(&ctx, "w", &shape, dtype).unwrap();
        let slab = 4 * 3 * 10 * 97;
        for first in (0..len).step_by(slab) {
            let end = (first + slab).min(len);
            w.write_range(&ctx, first, &values[first..end]).unwrap();
        }
        assert_eq!(
            w.download_blocking(&ctx).unwrap().data,
            values,
            "{dtype} writes"
        );
        assert!(w.write_range(&ctx, len - 3, &[1.0; 4]).is_err());
    }

    let options = common::every_option();
    let case = common::cases::HardCase {
        name: "T2048 + 952 every option GVA2, several buffers".into(),
        problem: common::problem(1, 3000, 1, 2, 32, 32, Some(vec![0, 2048, 3000]), options),
        spec: gdn_wgpu::RandomSpec {
            zero_gate_heads: 1,
            ..common::cases::spec(79, true)
        },
    };
    let p = &case.problem;
    let (inputs, expected) = inputs_and_oracle(&case, DType::F32);
    ctx.set_max_buffer_bytes(None).unwrap();
    let one = common::upload_inputs(&ctx, &inputs);
    let whole = run(&ctx, p, DType::F32, |e, out| {
        forward_into_with_path(&ctx, e, p, &one.as_ref(), out, ComputePath::Scalar)
    });
    ctx.set_max_buffer_bytes(Some(BUFFER)).unwrap();
    let split = common::upload_inputs(&ctx, &inputs);
    assert!(split.v.buffers().len() >= 4 && split.q.buffers().len() >= 2);
    let got = run(&ctx, p, DType::F32, |e, out| {
        forward_into_with_path(&ctx, e, p, &split.as_ref(), out, ComputePath::Scalar)
    });
    assert_eq!(bits(&got.o), bits(&whole.o));
    assert_eq!(bits(&got.final_state), bits(&whole.final_state));
    check(
        "several buffers",
        &case,
        Op::Forward,
        DType::F32,
        ComputePath::Scalar.arithmetic(),
        &got,
        &expected,
    )
    .unwrap();

    let mut failures = Vec::new();
    for dtype in [DType::F32, DType::BF16] {
        let (inputs, d_o, dht, expected) = backward_case(&case, dtype, true);
        let (_, grads) =
            wgpu_backend::backward_host(&ctx, p, &inputs.as_ref(), &d_o, dht.as_ref()).unwrap();
        let what = format!("backward, buffers of {BUFFER} B");
        failures.extend(check_gradients(&what, &case, dtype, &grads, &expected));
    }
    fail_on(failures);
    ctx.check().unwrap();
}

/// A pool of `host`'s states made on `ctx` (in several buffers of whole slots when it is
/// larger than the context's buffer limit).
fn pool_of(ctx: &Context, p: &Problem, host: &HostTensor) -> wgpu_backend::StatePool {
    let pool = wgpu_backend::StatePool::for_problem(ctx, p, host.shape[0]).unwrap();
    pool.tensor().write_range(ctx, 0, &host.data).unwrap();
    pool
}

/// The two pool tests' problem: 64 KiB per slot (HV = 4, K = V = 64, so a 64 KiB binding
/// holds one slot and 192 KiB three), 5 sequences over a pool of 10 slots, and two slot lists
/// of resumed, fresh and padding slots.
struct PoolCase {
    p: Problem,
    pool_slots: usize,
    pool_host: HostTensor,
    inputs: gdn_wgpu::ForwardInputs<HostTensor>,
    slots: [wgpu_backend::StateSlot; 5],
    other: [wgpu_backend::StateSlot; 5],
}

fn pool_case(pool_seed: u64, input_seed: u64) -> PoolCase {
    use wgpu_backend::StateSlot::{Fresh, Padding, Resume};
    let p = common::problem(
        1,
        9,
        2,
        4,
        64,
        64,
        Some(vec![0, 1, 3, 4, 6, 9]),
        Default::default(),
    );
    let pool_slots = 10;
    PoolCase {
        pool_host: common::decode::random_pool(&p, pool_slots, pool_seed),
        inputs: common::decode::spec(input_seed).generate(&p),
        p,
        pool_slots,
        slots: [Resume(9), Fresh(0), Padding, Resume(4), Resume(5)],
        other: [Resume(1), Padding, Fresh(8), Resume(7), Resume(2)],
    }
}

/// What a decode step left: o, the per-token states (when asked) and the pool.
struct DecodeRun {
    o: HostTensor,
    per_token_states: Option<HostTensor>,
    pool: HostTensor,
    pool_windows: usize,
    token_windows: usize,
    pool_buffers: usize,
}

/// One decode step of `p` over a pool seeded with `pool_host`, into NaN-poisoned outputs;
/// with `reuse`, the plan is made for those slots first and switched with `set_slots`.
fn decode_run(
    ctx: &Context,
    p: &Problem,
    inputs: &gdn_wgpu::ForwardInputs<HostTensor>,
    pool_host: &HostTensor,
    slots: &[wgpu_backend::StateSlot],
    reuse: Option<&[wgpu_backend::StateSlot]>,
    per_token_states: bool,
) -> DecodeRun {
    let tiles = wgpu_backend::decode::RecurrentStepTiles::choose_for(ctx, p).unwrap();
    decode_run_tiled(
        ctx,
        p,
        inputs,
        pool_host,
        slots,
        reuse,
        per_token_states,
        tiles,
    )
}

/// [`decode_run`] with a given tiling (the default depends on the call's size).
#[allow(clippy::too_many_arguments)]
fn decode_run_tiled(
    ctx: &Context,
    p: &Problem,
    inputs: &gdn_wgpu::ForwardInputs<HostTensor>,
    pool_host: &HostTensor,
    slots: &[wgpu_backend::StateSlot],
    reuse: Option<&[wgpu_backend::StateSlot]>,
    per_token_states: bool,
    tiles: wgpu_backend::decode::RecurrentStepTiles,
) -> DecodeRun {
    use gdn_wgpu::wgpu_backend::{DecodeOutputs, DecodePlan};
    let mut up = common::upload_inputs(ctx, inputs);
    up.initial_state = None;
    let pool = pool_of(ctx, p, pool_host);
    let o = GpuTensor::filled(ctx, "o", &p.v_shape(), inputs.v.dtype, f32::NAN).unwrap();
    let [a, b] = wgpu_backend::StateLayout::of(p).inner_shape(p.key_dim, p.value_dim);
    let states_shape = [p.total_tokens(), p.heads_v, a, b];
    let states = per_token_states
        .then(|| GpuTensor::filled(ctx, "states", &states_shape, DType::F32, f32::NAN).unwrap());
    let outputs = DecodeOutputs {
        o: &o,
        per_token_states: states.as_ref(),
    };
    let mut plan = DecodePlan::with_tiles(
        ctx,
        p,
        &up.as_ref(),
        &pool,
        reuse.unwrap_or(slots),
        &outputs,
        tiles,
    )
    .unwrap();
    if reuse.is_some() {
        plan.set_slots(ctx, slots).unwrap();
    }
    let mut encoder = ctx.create_encoder("decode windows");
    plan.record(&mut encoder);
    ctx.submit_and_wait(encoder).unwrap();
    DecodeRun {
        o: o.download_blocking(ctx).unwrap(),
        per_token_states: states.map(|s| s.download_blocking(ctx).unwrap()),
        pool: pool.tensor().download_blocking(ctx).unwrap(),
        pool_windows: plan.pool_windows(),
        token_windows: plan.token_windows(),
        pool_buffers: pool.tensor().buffers().len(),
    }
}

#[track_caller]
fn assert_same_run(got: &DecodeRun, want: &DecodeRun, what: &str) {
    assert_eq!(bits(&got.o), bits(&want.o), "o, {what}");
    assert_eq!(bits(&got.pool), bits(&want.pool), "pool, {what}");
    match (&got.per_token_states, &want.per_token_states) {
        (Some(g), Some(w)) => assert_eq!(bits(g), bits(w), "per-token states, {what}"),
        (None, None) => {}
        _ => panic!("per-token states in one run only, {what}"),
    }
}

/// A pool in several buffers of whole slots (`Context::set_max_buffer_bytes`): pool windows
/// end at the buffers' boundaries; slots resumed, fresh and padding in different buffers,
/// bitwise equal to the same step over a pool in one buffer; slot copies across buffers
/// round-trip; a step that fails leaves every buffer of the pool as it was.
#[test]
fn decode_over_a_pool_in_several_buffers() {
    use gdn_wgpu::wgpu_backend::{DecodeOutputs, DecodePlan};
    let Some(mut ctx) = context() else { return };
    let PoolCase {
        p,
        pool_slots,
        pool_host,
        inputs,
        slots,
        other,
    } = pool_case(7, 8);
    for slots in [&slots[..], &other[..]] {
        ctx.set_max_buffer_bytes(None).unwrap();
        ctx.set_max_binding_bytes(None).unwrap();
        let whole = decode_run(&ctx, &p, &inputs, &pool_host, slots, None, false);
        assert_eq!((whole.pool_windows, whole.pool_buffers), (1, 1));
        assert!(whole.o.data.iter().all(|x| x.is_finite()));
        // (buffer limit, binding limit) → (slots per buffer, windows).
        for (buffer, binding, buffers, windows) in [
            (3u64 << 16, None, 4, 4),
            (3 << 16, Some(1u64 << 16), 4, 10),
            (5 << 16, Some(2 << 16), 3, 5),
        ] {
            ctx.set_max_buffer_bytes(Some(buffer)).unwrap();
            ctx.set_max_binding_bytes(binding).unwrap();
            for reuse in [None, Some(&other[..])] {
                let got = decode_run(&ctx, &p, &inputs, &pool_host, slots, reuse, false);
                let what = format!("buffers of {buffer} B, bindings {binding:?}, {slots:?}");
                assert_eq!(
                    (got.pool_buffers, got.pool_windows),
                    (buffers, windows),
                    "{what}"
                );
                assert_same_run(&got, &whole, &what);
            }
        }
    }

    // Slot copies across buffers: slot 7 (third buffer) out to a tensor in two buffers of
    // its own, then into slot 2 (first buffer).
    ctx.set_max_buffer_bytes(Some(3 << 16)).unwrap();
    ctx.set_max_binding_bytes(None).unwrap();
    let pool = pool_of(&ctx, &p, &pool_host);
    assert_eq!(pool.slots_per_buffer(), 3);
    let mut shape = pool.tensor().shape.clone();
    shape[0] = 5;
    let entries = GpuTensor::empty(&ctx, "entries", &shape, DType::F32).unwrap();
    assert!(entries.buffers().len() > 1);
    let mut encoder = ctx.create_encoder("slot copies");
    pool.copy_from_slot(&mut encoder, 7, &entries, 4).unwrap();
    pool.copy_into_slot(&mut encoder, &entries, 4, 2).unwrap();
    ctx.submit_and_wait(encoder).unwrap();
    let slot_len = pool_host.len() / pool_slots;
    let entry = entries
        .download_range_blocking(&ctx, 4 * slot_len..5 * slot_len)
        .unwrap();
    assert_eq!(entry.data, pool_host.data[7 * slot_len..8 * slot_len]);
    let after = pool.tensor().download_blocking(&ctx).unwrap();
    let mut expected = pool_host.data.clone();
    expected.copy_within(7 * slot_len..8 * slot_len, 2 * slot_len);
    assert_eq!(after.data, expected);

    // A step that fails at submission (an invalid copy after it in the same command
    // buffer; then an output destroyed before submitting) leaves the pool as it was.
    ctx.set_max_binding_bytes(Some(1 << 16)).unwrap();
    let pool = pool_of(&ctx, &p, &pool_host);
    let mut up = common::upload_inputs(&ctx, &inputs);
    up.initial_state = None;
    let o = GpuTensor::empty(&ctx, "o", &p.v_shape(), DType::F32).unwrap();
    let outs = DecodeOutputs {
        o: &o,
        per_token_states: None,
    };
    let plan = DecodePlan::new(&ctx, &p, &up.as_ref(), &pool, &slots, &outs).unwrap();
    assert!(plan.active_passes() > 1 && pool.tensor().buffers().len() > 1);
    let mut encoder = ctx.create_encoder("step + invalid copy");
    plan.record(&mut encoder);
    encoder.copy_buffer_to_buffer(&o.buffer, o.buffer.size(), &o.buffer, 0, 4);
    assert!(matches!(ctx.submit_and_wait(encoder), Err(Error::Gpu(_))));
    let after = pool.tensor().download_blocking(&ctx).unwrap();
    assert_eq!(bits(&after), bits(&pool_host), "the pool changed");
    let mut encoder = ctx.create_encoder("step with a destroyed output");
    plan.record(&mut encoder);
    o.buffer.destroy();
    assert!(matches!(ctx.submit_and_wait(encoder), Err(Error::Gpu(_))));
    let after = pool.tensor().download_blocking(&ctx).unwrap();
    assert_eq!(bits(&after), bits(&pool_host), "the pool changed");
    ctx.check().unwrap();
}

/// A decode call larger than a binding and stored in several buffers: q, k, v, o and the
/// per-token states in token windows (16 tokens per window at 64 KiB bindings; v, o in 3
/// buffers, the per-token states in 38), sequences cut by windows resumed, fresh and padding
/// (a padding sequence carries its state through the plan's carry slot), an empty fresh
/// sequence, every option and bf16 inputs: bitwise equal to the same call in one window.
#[test]
fn decode_calls_larger_than_a_binding() {
    use StateSlot::{Fresh, Padding, Resume};
    use gdn_wgpu::wgpu_backend::decode::StateSlot;
    let Some(mut ctx) = context() else { return };
    let every = common::every_option();
    let cu = vec![0, 1, 150, 151, 400, 400, 600];
    let slots = [Resume(0), Fresh(1), Padding, Padding, Fresh(4), Resume(5)];
    let other = [Padding, Resume(3), Fresh(2), Resume(1), Padding, Fresh(0)];
    for (options, dtype) in [
        (gdn_wgpu::Options::default(), DType::F32),
        (every, DType::F32),
        (Default::default(), DType::BF16),
    ] {
        // HV = 4, K = V = 16: 4 KiB of state per token, 256 B of v.
        let p = common::problem(1, 600, 2, 4, 16, 16, Some(cu.clone()), options);
        let pool_host = common::decode::random_pool(&p, 6, 11);
        let mut inputs = common::decode::spec(12).generate(&p);
        for t in [&mut inputs.q, &mut inputs.k, &mut inputs.v] {
            *t = t.clone().with_dtype(dtype);
        }
        for slots in [&slots[..], &other[..]] {
            ctx.set_max_buffer_bytes(None).unwrap();
            ctx.set_max_binding_bytes(None).unwrap();
            let whole = decode_run(&ctx, &p, &inputs, &pool_host, slots, None, true);
            assert_eq!(whole.token_windows, 1);
            assert!(whole.o.data.iter().all(|x| x.is_finite()));
            let states = whole.per_token_states.as_ref().unwrap();
            assert!(states.data.iter().all(|x| x.is_finite()));
            for (buffer, binding) in [(None, Some(1u64 << 16)), (Some(1u64 << 16), None)] {
                ctx.set_max_buffer_bytes(buffer).unwrap();
                ctx.set_max_binding_bytes(binding).unwrap();
                for reuse in [None, Some(&other[..])] {
                    let what =
                        format!("{options:?} {dtype}, buffers {buffer:?}, bindings {binding:?}");
                    let got = decode_run(&ctx, &p, &inputs, &pool_host, slots, reuse, true);
                    assert!(
                        got.token_windows >= 600 / 16,
                        "{what}: {}",
                        got.token_windows
                    );
                    assert_same_run(&got, &whole, &what);
                }
            }
            // Without per-token states, v (256 B per token) alone is cut.
            ctx.set_max_buffer_bytes(None).unwrap();
            ctx.set_max_binding_bytes(Some(1 << 16)).unwrap();
            let got = decode_run(&ctx, &p, &inputs, &pool_host, slots, None, false);
            let v_bytes = 600 * 4 * 16 * dtype.size();
            assert_eq!(got.token_windows, v_bytes.div_ceil(1 << 16));
            assert_eq!(bits(&got.o), bits(&whole.o));
            assert_eq!(bits(&got.pool), bits(&whole.pool));
        }
    }
    ctx.check().unwrap();
}

/// More sequences than one call's uniform tables address (`max_sequences`): token windows of
/// at most that many sequences, bitwise equal to the same sequences in two calls that each
/// fit one table; fresh, resumed, padding and empty sequences.
#[test]
fn decode_calls_with_more_sequences_than_one_table() {
    use StateSlot::{Fresh, Padding, Resume};
    use gdn_wgpu::wgpu_backend::decode::StateSlot;
    let Some(ctx) = context() else { return };
    let most = wgpu_backend::decode::max_sequences(2);
    let n = most + 50;
    // One token per sequence, but every 97th sequence is empty and every 89th has three.
    let lens: Vec<usize> = (0..n)
        .map(|i| match (i % 97, i % 89) {
            (0, _) => 0,
            (_, 0) => 3,
            _ => 1,
        })
        .collect();
    let slot_of = |i: usize| match i % 5 {
        0 => Padding,
        1 => Fresh(i as u32),
        _ => Resume(i as u32),
    };
    let call = |range: Range<usize>| {
        let mut cu = vec![0];
        for &l in &lens[range.clone()] {
            cu.push(cu.last().unwrap() + l);
        }
        let total = *cu.last().unwrap();
        common::problem(1, total, 1, 2, 16, 16, Some(cu), Default::default())
    };
    let all = call(0..n);
    let pool_host = common::decode::random_pool(&all, n, 21);
    let inputs = common::decode::spec(22).generate(&all);
    let slots: Vec<StateSlot> = (0..n).map(slot_of).collect();
    // One tiling for all three calls (the default depends on the call's size).
    let tiles = wgpu_backend::decode::RecurrentStepTiles::choose_for(&ctx, &all).unwrap();
    let got = decode_run_tiled(&ctx, &all, &inputs, &pool_host, &slots, None, true, tiles);
    assert_eq!(got.token_windows, 2);

    // The same sequences as two calls (the first `most`, then the rest) over one pool.
    let half = most;
    let first = call(0..half);
    let split_at = first.total_tokens();
    let slice = |t: &HostTensor, tokens: Range<usize>, shape: Vec<usize>| {
        let row = t.len() / all.total_tokens();
        HostTensor {
            shape,
            dtype: t.dtype,
            data: t.data[tokens.start * row..tokens.end * row].to_vec(),
        }
    };
    let part = |p: &Problem, tokens: Range<usize>| gdn_wgpu::ForwardInputs {
        q: slice(&inputs.q, tokens.clone(), p.qk_shape().to_vec()),
        k: slice(&inputs.k, tokens.clone(), p.qk_shape().to_vec()),
        v: slice(&inputs.v, tokens.clone(), p.v_shape().to_vec()),
        g: slice(&inputs.g, tokens.clone(), p.gate_shape().to_vec()),
        beta: slice(&inputs.beta, tokens, p.gate_shape().to_vec()),
        initial_state: None,
        a_log: None,
        dt_bias: None,
    };
    let a = decode_run_tiled(
        &ctx,
        &first,
        &part(&first, 0..split_at),
        &pool_host,
        &slots[..half],
        None,
        true,
        tiles,
    );
    let second = call(half..n);
    let b = decode_run_tiled(
        &ctx,
        &second,
        &part(&second, split_at..all.total_tokens()),
        &a.pool,
        &slots[half..],
        None,
        true,
        tiles,
    );
    assert_eq!((a.token_windows, b.token_windows), (1, 1));
    let cat = |x: &HostTensor, y: &HostTensor| -> Vec<u32> {
        bits(x).into_iter().chain(bits(y)).collect()
    };
    let want = cat(&a.o, &b.o);
    let first_diff = bits(&got.o).iter().zip(&want).position(|(x, y)| x != y);
    assert_eq!(first_diff, None, "o: first difference (of {})", want.len());
    let states = |r: &DecodeRun| r.per_token_states.clone().unwrap();
    assert_eq!(bits(&states(&got)), cat(&states(&a), &states(&b)));
    assert_eq!(bits(&got.pool), bits(&b.pool));
    ctx.check().unwrap();
}

/// On a GPU with the real limits (ignored: needs ~6 GB of device memory; run on the H200 with
/// `cargo test --release --test windows -- --ignored a_pool_larger_than_4_gib`): a pool of
/// 2,500 slots at HV = 32, K = V = 128 f32 (5.2 GB, past the 4 GiB `max_buffer_size`) lives in
/// several buffers; a step over slots in both buffers is bitwise the same step over a small
/// pool holding the same states, slots no sequence names keep their states, and the finite
/// check finds a NaN in the second buffer at its index in the whole pool.
#[test]
#[ignore]
fn a_pool_larger_than_4_gib() {
    use StateSlot::{Fresh, Resume};
    use gdn_wgpu::wgpu_backend::decode::StateSlot;
    let Some(ctx) = context() else { return };
    let p = common::problem(4, 1, 16, 32, 128, 128, None, Default::default());
    let slots_big = 2500;
    let big = wgpu_backend::StatePool::for_problem(&ctx, &p, slots_big).unwrap();
    let per_buffer = big.slots_per_buffer();
    eprintln!(
        "{} slots of {} B in {} buffers of {per_buffer} slots; max_buffer_bytes {}",
        slots_big,
        big.slot_bytes(),
        big.tensor().buffers().len(),
        ctx.max_buffer_bytes()
    );
    assert!(big.tensor().buffers().len() > 1);
    let small_host = common::decode::random_pool(&p, 4, 41);
    let slot_len = small_host.len() / 4;
    // Sequence i's state: in slot `picked[i]` of the big pool, slot i of the small one.
    let picked = [0, per_buffer - 1, per_buffer, slots_big - 1];
    for (i, &s) in picked.iter().enumerate() {
        let state = &small_host.data[i * slot_len..(i + 1) * slot_len];
        big.tensor().write_range(&ctx, s * slot_len, state).unwrap();
    }
    let inputs = common::decode::spec(42).generate(&p);
    let tiles = wgpu_backend::decode::RecurrentStepTiles::choose_for(&ctx, &p).unwrap();
    let run = |pool: &wgpu_backend::StatePool, slots: &[StateSlot]| {
        use gdn_wgpu::wgpu_backend::{DecodeOutputs, DecodePlan};
        let mut up = common::upload_inputs(&ctx, &inputs);
        up.initial_state = None;
        let o = GpuTensor::filled(&ctx, "o", &p.v_shape(), DType::F32, f32::NAN).unwrap();
        let outs = DecodeOutputs {
            o: &o,
            per_token_states: None,
        };
        let plan =
            DecodePlan::with_tiles(&ctx, &p, &up.as_ref(), pool, slots, &outs, tiles).unwrap();
        let mut encoder = ctx.create_encoder("big pool step");
        plan.record(&mut encoder);
        ctx.submit_and_wait(encoder).unwrap();
        (o.download_blocking(&ctx).unwrap(), plan.pool_windows())
    };
    let big_slots = [
        Resume(picked[0] as u32),
        Resume(picked[1] as u32),
        Resume(picked[2] as u32),
        Fresh(picked[3] as u32),
    ];
    let (o_big, windows) = run(&big, &big_slots);
    assert!(windows >= 3, "{windows} pool windows");
    let small = pool_of(&ctx, &p, &small_host);
    let (o_small, _) = run(&small, &[Resume(0), Resume(1), Resume(2), Fresh(3)]);
    assert_eq!(bits(&o_big), bits(&o_small));
    let small_after = small.tensor().download_blocking(&ctx).unwrap();
    for (i, &s) in picked.iter().enumerate() {
        let got = big
            .tensor()
            .download_range_blocking(&ctx, s * slot_len..(s + 1) * slot_len)
            .unwrap();
        assert_eq!(
            bits(&got),
            bits(&HostTensor {
                shape: vec![slot_len],
                dtype: DType::F32,
                data: small_after.data[i * slot_len..(i + 1) * slot_len].to_vec(),
            }),
            "slot {s}"
        );
    }
    let untouched = big
        .tensor()
        .download_range_blocking(&ctx, 7 * slot_len..8 * slot_len)
        .unwrap();
    assert!(untouched.data.iter().all(|&x| x == 0.0));

    let index = (slots_big - 2) * slot_len + 12_345;
    big.tensor()
        .write_range(&ctx, index, &[f32::NAN, 0.0])
        .unwrap();
    let e = wgpu_backend::check_finite(&ctx, &[("pool", big.tensor())]).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("pool: expected finite values, got NaN at flat index {index}")
    );
}

/// Relative L2 error of tokens `rows` (of `row` elements each, the packed token axis
/// outermost) against the oracle's.
fn rows_error(got: &[f32], expected: &[f64], row: usize, rows: &Range<usize>) -> f64 {
    let r = rows.start * row..rows.end * row;
    gdn_wgpu::relative_l2(&got[r.clone()], &expected[r])
}

/// `forward_saved` then the backward through a workspace of the context's plan, into
/// NaN-poisoned gradients (and outputs); the outputs, gradients and the plan's windows.
fn backward_poisoned(
    ctx: &Context,
    p: &Problem,
    inputs: &gdn_wgpu::ForwardInputs<HostTensor>,
    d_o: &HostTensor,
    dht: Option<&HostTensor>,
) -> (
    ForwardOutputs<HostTensor>,
    gdn_wgpu::Gradients<HostTensor>,
    Vec<Range<usize>>,
) {
    let up = common::upload_inputs(ctx, inputs);
    let d_o = GpuTensor::upload(ctx, "do", d_o).unwrap();
    let dht = dht.map(|t| GpuTensor::upload(ctx, "dht", t).unwrap());
    let dtype = inputs.q.dtype;
    let ws = wgpu_backend::BackwardWorkspace::new(ctx, p, dtype).unwrap();
    let nan = |name: &str, shape: &[usize], dtype| {
        GpuTensor::filled(ctx, name, shape, dtype, f32::NAN).unwrap()
    };
    let sums = p.options.gate_in_kernel;
    let grads = gdn_wgpu::Gradients {
        dq: nan("dq", &p.qk_shape(), dtype),
        dk: nan("dk", &p.qk_shape(), dtype),
        dv: nan("dv", &p.v_shape(), dtype),
        dg: nan("dg", &p.gate_shape(), DType::F32),
        dbeta: nan("dbeta", &p.gate_shape(), DType::F32),
        dh0: inputs
            .initial_state
            .as_ref()
            .map(|_| nan("dh0", &p.state_shape(), DType::F32)),
        da_log: sums.then(|| nan("dA_log", &[p.heads_v], DType::F32)),
        ddt_bias: sums.then(|| nan("ddt_bias", &[p.heads_v], DType::F32)),
    };
    let mut encoder = ctx.create_encoder("forward_saved and backward");
    let (fwd, saved) =
        wgpu_backend::forward_saved_for(ctx, &mut encoder, p, &up.as_ref(), ws.plan()).unwrap();
    let refs = gdn_wgpu::Gradients {
        dq: &grads.dq,
        dk: &grads.dk,
        dv: &grads.dv,
        dg: &grads.dg,
        dbeta: &grads.dbeta,
        dh0: grads.dh0.as_ref(),
        da_log: grads.da_log.as_ref(),
        ddt_bias: grads.ddt_bias.as_ref(),
    };
    wgpu_backend::backward_into_workspace(
        ctx,
        &mut encoder,
        &saved,
        &d_o,
        dht.as_ref(),
        &refs,
        &ws,
        None,
    )
    .unwrap();
    ctx.submit_and_wait(encoder).unwrap();
    let down = |t: &GpuTensor| t.download_blocking(ctx).unwrap();
    let down_opt = |t: &Option<GpuTensor>| t.as_ref().map(down);
    (
        ForwardOutputs {
            o: down(&fwd.o),
            final_state: down(&fwd.final_state),
        },
        gdn_wgpu::Gradients {
            dq: down(&grads.dq),
            dk: down(&grads.dk),
            dv: down(&grads.dv),
            dg: down(&grads.dg),
            dbeta: down(&grads.dbeta),
            dh0: down_opt(&grads.dh0),
            da_log: down_opt(&grads.da_log),
            ddt_bias: down_opt(&grads.ddt_bias),
        },
        ws.plan().window_tokens(),
    )
}

/// Varlen chunks across the boundaries of tensors larger than one buffer (buffers of 128 KiB:
/// b = 512 tokens of v in f32, 1024 in bf16, so v, o, dv span five buffers): the windows end
/// at every boundary and cut the chunks that cross one, the piece after a cut continuing from
/// the state the window before left. Every option (bf16 without l2norm), GVA 2, h0 and dht
/// on, a g = 0 head, f32 and bf16: the forward (at the binding limit a buffer allows, at the least one: windows of
/// about one chunk, and in f32 sequence-parallel) and `forward_saved` + the backward (at both
/// limits) against the oracle at the policy's bounds, over all tokens and over the tokens
/// around each boundary, outputs and gradients NaN-poisoned first.
#[test]
fn varlen_chunks_across_buffer_boundaries() {
    use common::cases::{backward_case, check_gradients};
    use gdn_wgpu::tolerance::{Case, Quantity};
    let Some(mut ctx) = context() else { return };
    const BUFFER: usize = 128 << 10;
    let (vrow, qrow, grow) = (2 * 32, 32, 2);
    let mut failures = Vec::new();
    for dtype in [DType::F32, DType::BF16] {
        // bf16 without l2norm keeps its gradients at the tighter bounds without l2norm (with
        // l2norm the stored bf16 q̂, k̂ put o at 3.3e-3 here: src/tolerance.rs).
        let l2norm_qk = dtype == DType::F32;
        let options = gdn_wgpu::Options {
            l2norm_qk,
            ..common::every_option()
        };
        let b = BUFFER / (vrow * dtype.size());
        // The length-2 sequence b-1..b+1 is cut into two length-1 pieces; b+1..b+2 is a
        // length-1 sequence just after a boundary, 2b-1..2b one that ends at a boundary and
        // 2b..2b+1 one that starts at it; 2b+1..4b+52 spans three buffers, its chunk
        // 3b-63..3b+1 cut at 3b (the chunks after it count from 3b, so 4b cuts none);
        // 4b+52..4b+102 ends the problem.
        let cu = vec![
            0,
            100,
            b - 1,
            b + 1,
            b + 2,
            2 * b - 1,
            2 * b,
            2 * b + 1,
            4 * b + 52,
            4 * b + 102,
        ];
        let case = common::cases::HardCase {
            name: format!(
                "varlen across buffer boundaries every {b} tokens, GVA2, l2norm {l2norm_qk}"
            ),
            problem: common::problem(1, 4 * b + 102, 1, 2, 32, 32, Some(cu), options),
            spec: gdn_wgpu::RandomSpec {
                zero_gate_heads: 1,
                ..common::cases::spec(81, true)
            },
        };
        let p = &case.problem;
        let boundaries = [b, 2 * b, 3 * b, 4 * b];
        let near: Vec<Range<usize>> = boundaries.iter().map(|&t| t - 40..t + 40).collect();
        ctx.set_max_buffer_bytes(Some(BUFFER as u64)).unwrap();
        let (inputs, expected) = inputs_and_oracle(&case, dtype);
        let up = common::upload_inputs(&ctx, &inputs);
        assert_eq!(up.v.buffers().len(), 5, "{dtype}");
        let path = ctx.forward_path(p, dtype).unwrap().path;
        let tol = Case::new(Op::Forward, dtype)
            .with_arithmetic(path.arithmetic())
            .with_l2norm(l2norm_qk)
            .tolerance(Quantity::Output);

        // The forward at the binding limit a buffer allows, then at the least one.
        let buffer_limit = ctx.max_binding_bytes();
        let least = least_limit(&mut ctx, p, dtype, path, None);
        let mut forwards = vec![(buffer_limit, None), (least, None)];
        if dtype == DType::F32 {
            forwards.push((buffer_limit, Some(2)));
        }
        for (limit, segments) in forwards {
            ctx.set_max_binding_bytes(Some(limit)).unwrap();
            let ws = match segments {
                Some(c) => ForwardWorkspace::with_segments(&ctx, p, dtype, path, c).unwrap(),
                None => ForwardWorkspace::with_path(&ctx, p, dtype, path).unwrap(),
            };
            let starts: Vec<usize> = ws.window_tokens().iter().map(|w| w.start).collect();
            assert!(boundaries.iter().all(|t| starts.contains(t)), "{starts:?}");
            let got = run(&ctx, p, dtype, |e, out| {
                forward_into_workspace(&ctx, e, p, &up.as_ref(), out, &ws, None)
            });
            let what = format!(
                "forward, limit {limit}, segments {segments:?} ({} windows)",
                ws.windows()
            );
            let arithmetic = path.arithmetic();
            if let Err(e) = check(
                &what,
                &case,
                Op::Forward,
                dtype,
                arithmetic,
                &got,
                &expected,
            ) {
                failures.push(e);
            }
            for r in &near {
                let e = rows_error(&got.o.data, &expected.o, vrow, r);
                if e.is_nan() || e > tol {
                    failures.push(format!(
                        "{what} {dtype}: o over {r:?} rel-L2 {e:e} (tol {tol:e})"
                    ));
                }
            }
        }

        // forward_saved and the backward.
        let (inputs, d_o, dht, expected) = backward_case(&case, dtype, true);
        let grad_tol = Case::new(Op::Backward, dtype).with_l2norm(l2norm_qk);
        let qkv = grad_tol.tolerance(Quantity::GradQkv);
        let gates = grad_tol.tolerance(Quantity::GradGates);
        for least in [false, true] {
            let limit = if least {
                let up = common::upload_inputs(&ctx, &inputs);
                least_training_limit(&mut ctx, p, &up)
            } else {
                buffer_limit
            };
            ctx.set_max_binding_bytes(Some(limit)).unwrap();
            let (out, grads, windows) = backward_poisoned(&ctx, p, &inputs, &d_o, dht.as_ref());
            let starts: Vec<usize> = windows.iter().map(|w| w.start).collect();
            assert!(boundaries.iter().all(|t| starts.contains(t)), "{starts:?}");
            let what = format!("backward, limit {limit} ({} windows)", windows.len());
            failures.extend(check_gradients(&what, &case, dtype, &grads, &expected));
            for r in &near {
                for (name, got, want, row, t) in [
                    ("dq", &grads.dq, &expected.dq, qrow, qkv),
                    ("dk", &grads.dk, &expected.dk, qrow, qkv),
                    ("dv", &grads.dv, &expected.dv, vrow, qkv),
                    ("dg", &grads.dg, &expected.dg, grow, gates),
                    ("dbeta", &grads.dbeta, &expected.dbeta, grow, gates),
                ] {
                    let e = rows_error(&got.data, want, row, r);
                    if e.is_nan() || e > t {
                        failures.push(format!(
                            "{what} {dtype}: {name} over {r:?} rel-L2 {e:e} (tol {t:e})"
                        ));
                    }
                }
            }
            // forward_saved's forward (on the scalar path in several windows).
            let (_, oracle) = inputs_and_oracle(&case, dtype);
            let arithmetic = ComputePath::Scalar.arithmetic();
            if let Err(e) = check(&what, &case, Op::Forward, dtype, arithmetic, &out, &oracle) {
                failures.push(e);
            }
        }
        ctx.set_max_binding_bytes(None).unwrap();
    }
    ctx.set_max_buffer_bytes(None).unwrap();
    ctx.check().unwrap();
    fail_on(failures);
}
