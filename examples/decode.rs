//! Decoding with a state pool: each sequence's state stays on the GPU between steps, a
//! `DecodePlan` is built once, and every step writes the next token's inputs into the plan's
//! tensors, records the plan and reads o. The result agrees with the f64 oracle run over the
//! whole sequences (tolerance from the crate's policy).
//!
//!     cargo run --release --example decode
//!
//! For timings (GPU time per step, host time, GB/s against the copy ceiling, tokens/s) use
//! `gdn bench --ops decode`.

use gdn_wgpu::tolerance::{Case, Op, Quantity};
use gdn_wgpu::wgpu_backend::decode::{StatePool, StateSlot};
use gdn_wgpu::wgpu_backend::{self, Context, DecodeOutputs, DecodePlan, GpuTensor, StateLayout};
use gdn_wgpu::{DType, ForwardInputs, HostTensor, Options, Problem, RandomSpec};
use gdn_wgpu::{reference, relative_l2};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // B = 4 sequences decoded for T = 8 steps, one token each; H = 2, HV = 4, K = V = 64.
    let (b, t) = (4, 8);
    let whole = Problem::new(b, t, 2, 4, 64, 64, None, Options::default())?;
    let step = Problem::new(b, 1, 2, 4, 64, 64, None, Options::default())?;
    let inputs = RandomSpec::default().generate(&whole);
    let ctx = Context::new_blocking()?;

    // Slot s of the pool holds sequence s's state, starting from its initial state.
    let h0 = inputs.initial_state.as_ref().expect("RandomSpec gives h0");
    let pool =
        StatePool::from_tensor(GpuTensor::upload(&ctx, "pool", h0)?, StateLayout::of(&step))?;
    let slots: Vec<StateSlot> = (0..b as u32).map(StateSlot::Resume).collect();

    // Token i of every sequence, as the inputs of one step.
    let token = |i: usize| {
        let take = |x: &HostTensor, shape: &[usize]| {
            let row = x.len() / (b * t);
            let data = (0..b).flat_map(|s| &x.data[(s * t + i) * row..][..row]);
            HostTensor::new(shape.to_vec(), data.copied().collect())
        };
        ForwardInputs {
            q: take(&inputs.q, &step.qk_shape()),
            k: take(&inputs.k, &step.qk_shape()),
            v: take(&inputs.v, &step.v_shape()),
            g: take(&inputs.g, &step.gate_shape()),
            beta: take(&inputs.beta, &step.gate_shape()),
            initial_state: None,
            a_log: None,
            dt_bias: None,
        }
    };
    let buffers = wgpu_backend::upload_inputs(&ctx, &token(0).as_ref())?;
    let o = GpuTensor::empty(&ctx, "o", &step.v_shape(), DType::F32)?;
    let outputs = DecodeOutputs {
        o: &o,
        per_token_states: None,
    };
    // Pipelines, bind groups and tiling are chosen once; a step only records the plan.
    let plan = DecodePlan::new(&ctx, &step, &buffers.as_ref(), &pool, &slots, &outputs)?;

    let row = whole.heads_v * whole.value_dim;
    let mut decoded = vec![0.0f32; b * t * row];
    for i in 0..t {
        let x = token(i);
        for (gpu, host) in [
            (&buffers.q, &x.q),
            (&buffers.k, &x.k),
            (&buffers.v, &x.v),
            (&buffers.g, &x.g),
            (&buffers.beta, &x.beta),
        ] {
            ctx.queue
                .write_buffer(&gpu.buffer, 0, bytemuck::cast_slice(&host.data));
        }
        let mut encoder = ctx.create_encoder("decode step");
        plan.record(&mut encoder);
        ctx.submit_and_wait(encoder)?;
        let step_o = o.download_blocking(&ctx)?;
        for s in 0..b {
            decoded[(s * t + i) * row..][..row].copy_from_slice(&step_o.data[s * row..][..row]);
        }
    }

    let want = reference::forward(&whole, &inputs.as_ref())?;
    let states = pool.tensor().download_blocking(&ctx)?;
    let case = Case::new(Op::Decode, DType::F32);
    let mut pass = true;
    for (name, got, want, quantity) in [
        ("o", &decoded, &want.o, Quantity::Output),
        ("state", &states.data, &want.final_state, Quantity::State),
    ] {
        let (err, tol) = (relative_l2(got, want), case.tolerance(quantity));
        println!("{name}: rel-L2 {err:.2e} against the oracle (tolerance {tol:.0e})");
        pass &= err <= tol; // NaN fails too
    }
    println!("{}", if pass { "PASS" } else { "FAIL" });
    std::process::exit(if pass { 0 } else { 1 });
}
