//! criterion benches of small shapes on whatever adapter wgpu finds (lavapipe works): the
//! forward, the backward and one decode step, each first checked against the f64 oracle by
//! `gdn bench`'s gate. No speed assertions — for numbers to publish use `gdn bench`.
//!
//!     cargo bench --bench kernels
//!     GDN_ADAPTER=h200 cargo bench --bench kernels -- forward
//!
//! One iteration = record + submit + wait (criterion's wall clock, like `gdn bench`'s wall ms).

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use gdn_cli::bench::check::{check_backward, check_decode, check_forward};
use gdn_cli::bench::verify;
use gdn_wgpu::wgpu_backend::decode::{RecurrentStepTiles, StatePool, StateSlot};
use gdn_wgpu::wgpu_backend::{self, Context, DecodeOutputs, DecodePlan, GpuTensor};
use gdn_wgpu::{DType, ForwardInputs, ForwardOutputs, HostTensor, Options, Problem, RandomSpec};

fn problem(b: usize, t: usize) -> Problem {
    Problem::new(b, t, 2, 4, 64, 64, None, Options::default()).expect("valid problem")
}

fn upload(ctx: &Context, inputs: &ForwardInputs<HostTensor>) -> ForwardInputs<GpuTensor> {
    wgpu_backend::upload_inputs(ctx, &inputs.as_ref()).expect("upload")
}

/// Time `iters` runs of `record`, each submitted and waited for.
fn timed(ctx: &Context, iters: u64, mut record: impl FnMut(&mut wgpu::CommandEncoder)) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        let mut encoder = ctx.create_encoder("criterion");
        record(&mut encoder);
        ctx.submit_and_wait(encoder).expect("GPU run");
    }
    start.elapsed()
}

fn kernels(c: &mut Criterion) {
    let mut ctx = match Context::new_blocking() {
        Ok(ctx) => ctx,
        Err(e) => {
            eprintln!("no GPU adapter ({e}): nothing to benchmark");
            return;
        }
    };
    let name = ctx
        .adapter_info
        .as_ref()
        .map_or("wgpu".into(), |i| i.name.clone());
    eprintln!("adapter: {name}");

    // Forward, B=1 T=512 H=2 HV=4 K=V=64.
    let p = problem(1, 512);
    let vb = ctx.tuning().state_scan_v_block(&p);
    let small = problem(1, 131);
    verify(&check_forward(&mut ctx, &small, DType::F32, vb).expect("check"))
        .expect("forward is correct");
    let inputs = RandomSpec::default().generate(&p);
    let gpu_inputs = upload(&ctx, &inputs);
    let o = GpuTensor::empty(&ctx, "o", &p.v_shape(), DType::F32).expect("o");
    let state = GpuTensor::empty(&ctx, "state", &p.state_shape(), DType::F32).expect("state");
    let outputs = ForwardOutputs {
        o: &o,
        final_state: &state,
    };
    c.bench_function("forward B1 T512 H2 HV4 K64 V64", |b| {
        b.iter_custom(|iters| {
            timed(&ctx, iters, |enc| {
                wgpu_backend::forward_into(&ctx, enc, &p, &gpu_inputs.as_ref(), &outputs)
                    .expect("forward");
            })
        })
    });

    // Backward of the same problem (the forward that saves its context runs once).
    let vb = wgpu_backend::backward::scan_v_block(&ctx, &p).expect("backward fits");
    verify(&check_backward(&mut ctx, &small, DType::F32, vb).expect("check"))
        .expect("backward is correct");
    let mut enc = ctx.create_encoder("saved");
    let (_, saved) =
        wgpu_backend::forward_saved(&ctx, &mut enc, &p, &gpu_inputs.as_ref()).expect("forward");
    ctx.submit_and_wait(enc).expect("forward");
    let d_o = GpuTensor::filled(&ctx, "do", &p.v_shape(), DType::F32, 0.5).expect("do");
    c.bench_function("backward B1 T512 H2 HV4 K64 V64", |b| {
        b.iter_custom(|iters| {
            timed(&ctx, iters, |enc| {
                wgpu_backend::backward(&ctx, enc, &saved, &d_o, None).expect("backward");
            })
        })
    });

    // One decode step of 16 sequences.
    let step = problem(16, 1);
    let tiles = RecurrentStepTiles::choose_for(&ctx, &step).expect("tiling");
    verify(&check_decode(&ctx, &problem(3, 1), DType::F32, DType::F32, tiles).expect("check"))
        .expect("decode is correct");
    let step_inputs = RandomSpec {
        initial_state: false,
        ..RandomSpec::default()
    }
    .generate(&step);
    let step_gpu = upload(&ctx, &step_inputs);
    let pool = StatePool::for_problem(&ctx, &step, 16).expect("pool");
    let slots: Vec<StateSlot> = (0..16).map(StateSlot::Resume).collect();
    let o = GpuTensor::empty(&ctx, "o", &step.v_shape(), DType::F32).expect("o");
    let outputs = DecodeOutputs {
        o: &o,
        per_token_states: None,
    };
    let plan = DecodePlan::with_tiles(
        &ctx,
        &step,
        &step_gpu.as_ref(),
        &pool,
        &slots,
        &outputs,
        tiles,
    )
    .expect("plan");
    c.bench_function("decode step B16 H2 HV4 K64 V64", |b| {
        b.iter_custom(|iters| timed(&ctx, iters, |enc| plan.record(enc)))
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    targets = kernels
}
criterion_main!(benches);
