//! Faults are typed errors, never panics: device loss (`Device::destroy`) from every entry
//! point, a context that reports the loss, and a new context in the same process that gives
//! oracle-correct results; validation failures from the library's own calls; out-of-memory;
//! and decode steps that fail, which leave the state pool as it was (read back bitwise).
//!
//! Each test makes its own `Context` (these tests destroy devices and provoke errors, so never
//! the shared one of tests/common).

mod common;

use common::backward::upstream;
use common::decode::{random_pool, spec};
use common::{problem, upload_inputs};
use gdn_wgpu::tolerance::{Case, Op, Quantity};
use gdn_wgpu::wgpu_backend::decode::{StateLayout, StatePool, StateSlot, decode_host};
use gdn_wgpu::wgpu_backend::{
    self, Context, DecodeOutputs, DecodePlan, FiniteCheck, ForwardWorkspace, GpuTensor, Require,
};
use gdn_wgpu::{
    Backend, DType, Error, ForwardInputs, ForwardOutputs, HostTensor, Options, Oracle, RandomSpec,
    relative_l2,
};

use StateSlot::{Fresh, Resume};

/// This binary's tests run one at a time. On the H200 (NVIDIA 580, Vulkan, 2026-12-01) the
/// tests run in parallel hung (four of them past 60 s, killed at 90 s) while each passes alone
/// in ≤ 1.5 s, any pair with the device-loss test passes, and `--test-threads 1` passes all in
/// 1.2 s; the cause (several devices created, lost and destroyed at once in one process) is not
/// isolated. lavapipe runs them in parallel fine. Serial keeps the binary usable on GPUs.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A context of the test's own, or `None` (loudly) without an adapter unless
/// `GDN_REQUIRE_GPU=1`.
fn own_context() -> Option<Context> {
    match Context::new_blocking() {
        Ok(ctx) => Some(ctx),
        Err(e) if std::env::var("GDN_REQUIRE_GPU").is_ok_and(|v| v == "1") => {
            panic!("GDN_REQUIRE_GPU=1 but no GPU context: {e}")
        }
        Err(e) => {
            eprintln!("SKIPPED (no GPU adapter; set GDN_REQUIRE_GPU=1 to fail instead): {e}");
            None
        }
    }
}

#[track_caller]
fn assert_lost<T>(what: &str, result: gdn_wgpu::Result<T>) {
    match result {
        Err(Error::DeviceLost(_)) => {}
        Err(e) => panic!("{what}: {e} is not Error::DeviceLost"),
        Ok(_) => panic!("{what} succeeded on a lost device"),
    }
}

fn bitwise_equal(a: &HostTensor, b: &HostTensor) -> bool {
    a.data.len() == b.data.len()
        && a.data
            .iter()
            .zip(&b.data)
            .all(|(x, y)| x.to_bits() == y.to_bits())
}

/// A GPU tensor whose buffer cannot be bound as storage: every pass that binds it fails the
/// device's validation (a stand-in for any validation failure inside a call).
fn unbindable(ctx: &Context, shape: &[usize]) -> GpuTensor {
    let len: usize = shape.iter().product();
    GpuTensor::from_buffer(
        ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("not a storage buffer"),
            size: 4 * len as u64,
            usage: wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        }),
        shape,
        DType::F32,
    )
}

/// After `Device::destroy`: the context says it is lost, every entry point (recording,
/// host helpers, tensors, pools, plans, the `Backend` trait, the finite check) returns
/// `Error::DeviceLost`, and a new context in the same process gives oracle-correct forward,
/// backward and decode results.
#[test]
fn device_loss_is_typed_everywhere_and_a_new_context_works() {
    let _serial = serial();
    let Some(ctx) = own_context() else { return };
    let p = problem(1, 70, 1, 2, 32, 32, None, Options::default());
    let host = RandomSpec {
        seed: 11,
        ..RandomSpec::default()
    }
    .generate(&p);
    let (d_o_host, _) = upstream(&p, 11, false);
    let inputs = upload_inputs(&ctx, &host);
    let d_o = GpuTensor::upload(&ctx, "do", &d_o_host).unwrap();
    let mut enc = ctx.create_encoder("before the loss");
    let (fwd, saved) = wgpu_backend::forward_saved(&ctx, &mut enc, &p, &inputs.as_ref()).unwrap();
    ctx.submit_and_wait(enc).unwrap();
    let workspace = ForwardWorkspace::new(&ctx, &p, DType::F32).unwrap();

    let dp = problem(2, 1, 1, 2, 32, 32, None, Options::default());
    let mut dinputs = upload_inputs(&ctx, &spec(12).generate(&dp));
    dinputs.initial_state = None;
    let pool = StatePool::for_problem(&ctx, &dp, 2).unwrap();
    let o = GpuTensor::empty(&ctx, "o", &dp.v_shape(), DType::F32).unwrap();
    let outs = DecodeOutputs {
        o: &o,
        per_token_states: None,
    };
    let slots = [Resume(0), Resume(1)];
    let mut plan = DecodePlan::new(&ctx, &dp, &dinputs.as_ref(), &pool, &slots, &outs).unwrap();
    assert!(!ctx.is_lost());
    ctx.check().unwrap();

    ctx.device.destroy();
    assert!(ctx.is_lost(), "a destroyed device is lost");
    assert_lost("check", ctx.check());
    assert_lost("check_lost", ctx.check_lost());

    // Tensors and pools.
    assert_lost("empty", GpuTensor::empty(&ctx, "x", &[4], DType::F32));
    assert_lost("upload", GpuTensor::upload(&ctx, "q", &host.q));
    assert_lost("download", fwd.o.download_blocking(&ctx));
    assert_lost("pool", StatePool::for_problem(&ctx, &dp, 2));
    assert_lost("workspace", ForwardWorkspace::new(&ctx, &p, DType::F32));

    // Recording entry points.
    let mut enc = ctx.create_encoder("after the loss");
    let gpu_inputs = inputs.as_ref();
    assert_lost(
        "forward",
        wgpu_backend::forward(&ctx, &mut enc, &p, &gpu_inputs),
    );
    let outputs = ForwardOutputs {
        o: &fwd.o,
        final_state: &fwd.final_state,
    };
    assert_lost(
        "forward_into",
        wgpu_backend::forward_into(&ctx, &mut enc, &p, &gpu_inputs, &outputs),
    );
    assert_lost(
        "forward_into_workspace",
        wgpu_backend::forward_into_workspace(
            &ctx,
            &mut enc,
            &p,
            &gpu_inputs,
            &outputs,
            &workspace,
            None,
        ),
    );
    assert_lost(
        "forward_saved",
        wgpu_backend::forward_saved(&ctx, &mut enc, &p, &gpu_inputs),
    );
    assert_lost(
        "backward",
        wgpu_backend::backward(&ctx, &mut enc, &saved, &d_o, None),
    );
    assert_lost(
        "forward_backward",
        wgpu_backend::forward_backward(&ctx, &mut enc, &p, &gpu_inputs, &d_o, None),
    );
    let dgpu = dinputs.as_ref();
    assert_lost(
        "decode_step",
        wgpu_backend::decode_step(&ctx, &mut enc, &dp, &dgpu, &pool, &slots, &outs),
    );
    assert_lost(
        "DecodePlan::new",
        DecodePlan::new(&ctx, &dp, &dgpu, &pool, &slots, &outs),
    );
    assert_lost("set_slots", plan.set_slots(&ctx, &[Fresh(0), Resume(1)]));
    assert_lost(
        "FiniteCheck::record",
        FiniteCheck::record(&ctx, &mut enc, &[("q", &inputs.q, Require::Finite)]),
    );
    // Recording a prepared step cannot fail; its submission reports the loss.
    plan.record(&mut enc);
    assert_lost("submit_and_wait", ctx.submit_and_wait(enc));

    // Host helpers and the Backend trait.
    let h = host.as_ref();
    assert_lost("forward_host", wgpu_backend::forward_host(&ctx, &p, &h));
    assert_lost(
        "backward_host",
        wgpu_backend::backward_host(&ctx, &p, &h, &d_o_host, None),
    );
    assert_lost("decode_host", decode_host(&ctx, &p, &h, 1));
    let backend: &dyn Backend = &ctx;
    assert_lost("Backend::forward", backend.forward(&p, &h));
    assert_lost(
        "Backend::forward_backward",
        backend.forward_backward(&p, &h, &d_o_host, None),
    );
    assert_lost("Backend::decode", backend.decode(&p, &h, 4));
    assert_lost(
        "check_finite",
        wgpu_backend::check_finite(&ctx, &[("q", &inputs.q)]),
    );
    assert_lost(
        "check_inputs_finite",
        wgpu_backend::check_inputs_finite(&ctx, &p, &gpu_inputs),
    );
    assert!(ctx.is_lost(), "a lost context stays lost");

    // A new context in the same process: forward, backward and decode match the oracle.
    let fresh = own_context().expect("a new context after a device loss");
    assert!(!fresh.is_lost());
    let case = |op| Case::new(op, DType::F32);
    let (out, grads) = fresh.forward_backward(&p, &h, &d_o_host, None).unwrap();
    let (want, want_grads) = Oracle.forward_backward(&p, &h, &d_o_host, None).unwrap();
    let e = relative_l2(&out.o.data, &to_f64(&want.o));
    assert!(
        e <= case(Op::Forward).tolerance(Quantity::Output),
        "o {e:e}"
    );
    let e = relative_l2(&out.final_state.data, &to_f64(&want.final_state));
    assert!(
        e <= case(Op::Forward).tolerance(Quantity::State),
        "state {e:e}"
    );
    for (name, got, want, quantity) in [
        ("dq", &grads.dq, &want_grads.dq, Quantity::GradQkv),
        ("dk", &grads.dk, &want_grads.dk, Quantity::GradQkv),
        ("dv", &grads.dv, &want_grads.dv, Quantity::GradQkv),
        ("dg", &grads.dg, &want_grads.dg, Quantity::GradGates),
        (
            "dbeta",
            &grads.dbeta,
            &want_grads.dbeta,
            Quantity::GradGates,
        ),
    ] {
        let e = relative_l2(&got.data, &to_f64(want));
        assert!(e <= case(Op::Backward).tolerance(quantity), "{name} {e:e}");
    }
    let out = fresh.decode(&p, &h, 4).unwrap();
    let want = Oracle.forward(&p, &h).unwrap();
    let e = relative_l2(&out.o.data, &to_f64(&want.o));
    assert!(
        e <= case(Op::Decode).tolerance(Quantity::Output),
        "decode o {e:e}"
    );
    let e = relative_l2(&out.final_state.data, &to_f64(&want.final_state));
    assert!(
        e <= case(Op::Decode).tolerance(Quantity::State),
        "decode state {e:e}"
    );
    fresh.check().unwrap();
}

fn to_f64(t: &HostTensor) -> Vec<f64> {
    t.data.iter().map(|&x| x as f64).collect()
}

/// Loss while a step is in flight: the step's submission and the pool's readback report
/// `DeviceLost`, never stale data as a success.
#[test]
fn loss_with_a_step_in_flight_is_reported() {
    let _serial = serial();
    let Some(ctx) = own_context() else { return };
    let dp = problem(2, 1, 1, 2, 32, 32, None, Options::default());
    let mut inputs = upload_inputs(&ctx, &spec(21).generate(&dp));
    inputs.initial_state = None;
    let pool = StatePool::from_tensor(
        GpuTensor::upload(&ctx, "pool", &random_pool(&dp, 2, 21)).unwrap(),
        StateLayout::of(&dp),
    )
    .unwrap();
    let o = GpuTensor::empty(&ctx, "o", &dp.v_shape(), DType::F32).unwrap();
    let outs = DecodeOutputs {
        o: &o,
        per_token_states: None,
    };
    let plan = DecodePlan::new(
        &ctx,
        &dp,
        &inputs.as_ref(),
        &pool,
        &[Resume(0), Resume(1)],
        &outs,
    )
    .unwrap();
    let mut enc = ctx.create_encoder("step");
    plan.record(&mut enc);
    ctx.queue.submit([enc.finish()]);
    ctx.device.destroy();
    assert_lost("pool readback", pool.tensor().download_blocking(&ctx));
    assert_lost("o readback", o.download_blocking(&ctx));
    assert!(ctx.is_lost());
}

/// The pieces of a decode step over a pool of three random states.
struct Step {
    p: gdn_wgpu::Problem,
    host: ForwardInputs<HostTensor>,
    inputs: ForwardInputs<GpuTensor>,
    pool: StatePool,
    pool_before: HostTensor,
}

fn step(ctx: &Context, seed: u64) -> Step {
    let p = problem(2, 1, 1, 2, 32, 32, None, Options::default());
    let mut host = spec(seed).generate(&p);
    host.initial_state = None;
    let inputs = upload_inputs(ctx, &host);
    let pool_before = random_pool(&p, 3, seed);
    let pool = StatePool::from_tensor(
        GpuTensor::upload(ctx, "pool", &pool_before).unwrap(),
        StateLayout::of(&p),
    )
    .unwrap();
    Step {
        p,
        host,
        inputs,
        pool,
        pool_before,
    }
}

#[track_caller]
fn assert_pool_unchanged(ctx: &Context, s: &Step, what: &str) {
    let after = s.pool.tensor().download_blocking(ctx).unwrap();
    assert!(
        bitwise_equal(&after, &s.pool_before),
        "{what}: the pool changed"
    );
}

/// A decode step that fails after it was recorded — an invalid command later in the same
/// submission, or an output the caller destroyed before submitting — leaves every slot of the
/// pool bitwise as it was; the failure is a typed `Error::Gpu`, the context is not lost, and
/// the next step on it is oracle-correct.
#[test]
fn a_failed_decode_step_leaves_the_pool_as_it_was() {
    let _serial = serial();
    let Some(ctx) = own_context() else { return };
    let s = step(&ctx, 31);
    let slots = [Resume(0), Fresh(2)];
    let o = GpuTensor::empty(&ctx, "o", &s.p.v_shape(), DType::F32).unwrap();
    let outs = DecodeOutputs {
        o: &o,
        per_token_states: None,
    };
    let plan = DecodePlan::new(&ctx, &s.p, &s.inputs.as_ref(), &s.pool, &slots, &outs).unwrap();

    // 1. The step, then a copy past the end of a buffer in the same command buffer.
    let mut enc = ctx.create_encoder("step + invalid copy");
    plan.record(&mut enc);
    enc.copy_buffer_to_buffer(&o.buffer, o.buffer.size(), &o.buffer, 0, 4);
    let e = ctx.submit_and_wait(enc).unwrap_err();
    assert!(matches!(e, Error::Gpu(_)), "{e}");
    assert_pool_unchanged(&ctx, &s, "step + invalid copy");

    // 2. The step's output destroyed by the caller between recording and submitting.
    let mut enc = ctx.create_encoder("step with a destroyed output");
    plan.record(&mut enc);
    o.buffer.destroy();
    let e = ctx.submit_and_wait(enc).unwrap_err();
    assert!(matches!(e, Error::Gpu(_)), "{e}");
    assert_pool_unchanged(&ctx, &s, "destroyed output");

    // 3. A plan the device refuses (its output cannot be bound): an error from the plan,
    //    before anything is recorded.
    let bad_o = unbindable(&ctx, &s.p.v_shape());
    let bad = DecodeOutputs {
        o: &bad_o,
        per_token_states: None,
    };
    let e = DecodePlan::new(&ctx, &s.p, &s.inputs.as_ref(), &s.pool, &slots, &bad)
        .err()
        .expect("a plan with an unbindable output");
    assert!(matches!(e, Error::Gpu(_)), "{e}");
    assert!(e.to_string().contains("recurrent_step"), "{e}");
    assert_pool_unchanged(&ctx, &s, "refused plan");

    // The context is usable: no loss, no stray errors, and a step matches the oracle.
    assert!(!ctx.is_lost());
    ctx.check().unwrap();
    let o = GpuTensor::filled(&ctx, "o", &s.p.v_shape(), DType::F32, f32::NAN).unwrap();
    let outs = DecodeOutputs {
        o: &o,
        per_token_states: None,
    };
    let plan = DecodePlan::new(&ctx, &s.p, &s.inputs.as_ref(), &s.pool, &slots, &outs).unwrap();
    let mut enc = ctx.create_encoder("a good step");
    plan.record(&mut enc);
    ctx.submit_and_wait(enc).unwrap();
    let after = s.pool.tensor().download_blocking(&ctx).unwrap();
    let slot_len = s.pool_before.data.len() / 3;
    let slot = |t: &HostTensor, i: usize| t.data[i * slot_len..(i + 1) * slot_len].to_vec();
    // The oracle from slot 0 (resumed) and zeros (fresh).
    let mut h0 = slot(&s.pool_before, 0);
    h0.extend(vec![0.0; slot_len]);
    let mut oracle_inputs = s.host.clone();
    oracle_inputs.initial_state = Some(HostTensor::new(s.p.state_shape(), h0));
    let want = Oracle.forward(&s.p, &oracle_inputs.as_ref()).unwrap();
    let want_states = to_f64(&want.final_state);
    let tol = Case::new(Op::Decode, DType::F32);
    let e = relative_l2(&o.download_blocking(&ctx).unwrap().data, &to_f64(&want.o));
    assert!(e <= tol.tolerance(Quantity::Output), "o {e:e}");
    for (pool_slot, entry) in [(0, 0), (2, 1)] {
        let e = relative_l2(
            &slot(&after, pool_slot),
            &want_states[entry * slot_len..(entry + 1) * slot_len],
        );
        assert!(
            e <= tol.tolerance(Quantity::State),
            "slot {pool_slot}: {e:e}"
        );
    }
    assert_eq!(
        slot(&after, 1),
        slot(&s.pool_before, 1),
        "slot 1 is not in the step"
    );
}

/// A validation failure inside a recording entry point is a typed `Error::Gpu` naming the
/// pass, caught in the library's error scope: it does not reach the context's handler (so
/// `check` stays clean) and the context stays usable.
#[test]
fn validation_failures_are_typed_errors_from_the_entry_point() {
    let _serial = serial();
    let Some(ctx) = own_context() else { return };
    let p = problem(1, 70, 1, 2, 32, 32, None, Options::default());
    let inputs = upload_inputs(&ctx, &RandomSpec::default().generate(&p));
    let o = unbindable(&ctx, &p.v_shape());
    let state = GpuTensor::empty(&ctx, "final_state", &p.state_shape(), DType::F32).unwrap();
    let mut enc = ctx.create_encoder("forward into an unbindable o");
    let e = wgpu_backend::forward_into(
        &ctx,
        &mut enc,
        &p,
        &inputs.as_ref(),
        &ForwardOutputs {
            o: &o,
            final_state: &state,
        },
    )
    .unwrap_err();
    assert!(matches!(e, Error::Gpu(_)), "{e}");
    assert!(!e.is_input_error());
    ctx.check().unwrap();
    assert!(!ctx.is_lost());
    // The same context still runs a forward.
    let out = wgpu_backend::forward_host(&ctx, &p, &RandomSpec::default().generate(&p).as_ref());
    out.unwrap();
}

/// Set in the child process of `out_of_memory_is_a_typed_error`.
const OOM_CHILD: &str = "GDN_FAULTS_OOM_CHILD";

/// This process's virtual memory size in KiB (Linux).
fn vm_size_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmSize:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// An allocation larger than the device can give is a typed error, not a panic: past the
/// binding or buffer limit `Error::TooLarge` before anything is allocated; within the limits
/// but past the memory the device can give, `Error::OutOfMemory` naming the tensor and its
/// bytes, and the context stays usable once memory is freed.
///
/// lavapipe allocates device memory lazily from the host's virtual memory and by itself never
/// runs out (an unbounded loop of 2 GiB buffers passed 17 TB of address space without an
/// error, and wgpu's memory-budget thresholds do not trigger there). So on a CPU adapter the
/// test runs itself again in a child process whose address space is capped (`ulimit -v`, this
/// process's size + 2 GiB): lavapipe's allocations then fail the way a GPU's do when its memory
/// is full, through the same out-of-memory path of wgpu. On a GPU, run
/// `out_of_memory_on_the_device` (ignored: it fills the device's memory).
#[test]
fn out_of_memory_is_a_typed_error() {
    let _serial = serial();
    if std::env::var_os(OOM_CHILD).is_some() {
        let Some(ctx) = own_context() else { return };
        fill_the_device(&ctx);
        return;
    }
    let Some(ctx) = own_context() else { return };
    let cpu = ctx
        .adapter_info
        .as_ref()
        .is_some_and(|i| i.device_type == wgpu::DeviceType::Cpu);
    if !cpu {
        eprintln!("SKIPPED on a GPU adapter: run the ignored out_of_memory_on_the_device");
        return;
    }
    let Some(vm) = vm_size_kib() else {
        eprintln!("SKIPPED: no /proc/self/status to size the child's address space from");
        return;
    };
    drop(ctx);
    let cap = vm + (2 << 20);
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v {cap} && exec \"$0\" --exact out_of_memory_is_a_typed_error \
             --nocapture --test-threads 1"
        ))
        .arg(exe)
        .env(OOM_CHILD, "1")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("child (address space ≤ {cap} KiB):\n{text}");
    assert!(out.status.success(), "the child failed: {}", out.status);
    assert!(text.contains("1 passed"), "the child ran no test");
}

/// `out_of_memory_is_a_typed_error` on a real GPU: fills its memory with 1 GiB tensors (and
/// stops at 160 GiB, should the driver spill into host memory instead of refusing).
#[test]
#[ignore = "fills the device's memory; for GPUs (lavapipe runs the capped child instead)"]
fn out_of_memory_on_the_device() {
    let _serial = serial();
    let Some(ctx) = own_context() else { return };
    if ctx
        .adapter_info
        .as_ref()
        .is_some_and(|i| i.device_type == wgpu::DeviceType::Cpu)
    {
        eprintln!("SKIPPED on a CPU adapter: out_of_memory_is_a_typed_error covers it");
        return;
    }
    fill_the_device(&ctx);
}

/// Allocate tensors until the device refuses: the refusal is `Error::OutOfMemory` naming the
/// tensor and its bytes; a host helper then fails the same way; once the tensors are freed the
/// context allocates again and runs an oracle-correct forward.
fn fill_the_device(ctx: &Context) {
    let limits = ctx.limits();
    let too_large = limits
        .max_buffer_size
        .max(limits.max_storage_buffer_binding_size)
        / 4
        + 1;
    // One row past the largest buffer (larger tensors of smaller rows are split into buffers).
    let e = GpuTensor::empty(ctx, "huge", &[1, 1, too_large as usize], DType::F32).unwrap_err();
    assert!(matches!(e, Error::TooLarge { .. }), "{e}");
    let big = problem(1, 1 << 17, 1, 2, 32, 32, None, Options::default());
    let inputs = RandomSpec::default().generate(&big);
    // Large tensors, then smaller ones, so that what is left is below the last size.
    let mut held = Vec::new();
    let mut last = None;
    for mib in [1024u64, 128, 16] {
        let bytes = (mib << 20).min(limits.max_storage_buffer_binding_size);
        let elements = (bytes / 4) as usize;
        let err = loop {
            match GpuTensor::empty(ctx, "ballast", &[elements], DType::F32) {
                Ok(t) => held.push(t),
                Err(e) => break e,
            }
            // More than an H200's 141 GB without a refusal: the driver is spilling into host
            // memory, which this test must not exhaust.
            let total: u64 = held.iter().map(|t| t.bytes()).sum();
            assert!(
                total < 160 << 30,
                "{total} bytes allocated without an out-of-memory error"
            );
        };
        eprintln!("{} tensors held; {bytes} bytes more: {err}", held.len());
        match &err {
            Error::OutOfMemory {
                name, bytes: got, ..
            } => {
                assert_eq!(name, "ballast");
                assert_eq!(*got, Some(4 * elements as u64));
            }
            e => panic!("{e} is not Error::OutOfMemory"),
        }
        assert!(!err.is_input_error());
        last = Some(err);
    }
    assert!(last.is_some());
    // While the memory is held, a host helper needing 16 MiB tensors fails typed (its host
    // inputs were made before the fill: a host allocation past the address-space cap aborts).
    let e = wgpu_backend::forward_host(ctx, &big, &inputs.as_ref()).unwrap_err();
    assert!(matches!(e, Error::OutOfMemory { .. }), "{e}");
    // Freeing memory makes the context usable again.
    drop(held);
    assert!(!ctx.is_lost());
    ctx.check().unwrap();
    let p = problem(1, 70, 1, 2, 32, 32, None, Options::default());
    let inputs = RandomSpec::default().generate(&p);
    let out = wgpu_backend::forward_host(ctx, &p, &inputs.as_ref()).unwrap();
    let want = Oracle.forward(&p, &inputs.as_ref()).unwrap();
    let e = relative_l2(&out.o.data, &to_f64(&want.o));
    assert!(
        e <= Case::new(Op::Forward, DType::F32).tolerance(Quantity::Output),
        "{e:e}"
    );
}

/// A context on the caller's device leaves the device-lost callback to the caller, who
/// forwards the loss with `notify_device_lost`.
#[test]
fn a_context_on_the_callers_device_reports_a_forwarded_loss() {
    let _serial = serial();
    let Some(own) = own_context() else { return };
    let ctx = std::sync::Arc::new(
        Context::from_device(
            own.device.clone(),
            own.queue.clone(),
            own.adapter_info.clone(),
        )
        .unwrap(),
    );
    let weak = std::sync::Arc::downgrade(&ctx);
    ctx.device.set_device_lost_callback(move |reason, msg| {
        if let Some(ctx) = weak.upgrade() {
            ctx.notify_device_lost(format!("{reason:?}: {msg}"));
        }
    });
    assert!(!ctx.is_lost());
    ctx.device.destroy();
    assert!(ctx.is_lost());
    assert_lost("empty", GpuTensor::empty(&ctx, "x", &[4], DType::F32));
}
