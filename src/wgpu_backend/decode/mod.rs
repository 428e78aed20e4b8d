//! Inference on wgpu: decode steps and multi-token verification over an in-place state pool.
//!
//! A server keeps one state per request in a [`StatePool`] (`[P, HV, K, V]` or V-first; f32,
//! or bf16 to halve the traffic) and, per step, runs B sequences × T new tokens (T = 1 to
//! decode, a few more to verify speculative drafts; or `cu_seqlens` for differing lengths)
//! through one decode kernel — `recurrent_step` by default, or the opt-in `subgroup_step`
//! where the device has subgroups of ≥ 8 invocations ([`RecurrentStepTiles`]) — which reads
//! each sequence's state from its slot once, walks its tokens in FLA's order and writes the
//! state back once. Every forward option
//! applies; q, k, v and o may be stored as f32, bf16 or f16 ([`decode_storage_dtypes`]); the
//! arithmetic is f32 and a bf16 pool is rounded once per call, when the state is stored.
//!
//! - Each sequence names a [`StateSlot`]: `Resume(s)` continues slot s in place, `Fresh(s)`
//!   starts from zero and leaves its state in slot s, `Padding` starts from zero and writes no
//!   state. Slots are validated on the host (in range, no slot written twice) before anything
//!   is recorded, so bad input never touches the pool.
//! - [`DecodeOutputs::per_token_states`] also writes the state after every token
//!   (`[B·T, HV, ..]`), so a server verifying T draft tokens that accepts only k of them copies
//!   entry `start + k − 1` back with [`StatePool::copy_into_slot`].
//! - Prefill → decode: run [`wgpu_backend::forward`](crate::wgpu_backend::forward()) over the prompt and copy its
//!   `final_state` into the pool with [`StatePool::copy_into_slot`].
//! - No size limit but device memory: a pool past one buffer lives in several buffers of
//!   whole slots, and pools or calls past one binding run in pool and token windows
//!   (docs/windows.md, "Decode").
//! - Hot path: build a [`DecodePlan`] once and call [`DecodePlan::record`] per step (one
//!   compute pass, no allocation); [`decode_step`] builds a plan per call.
//! - A step that fails leaves the pool as it was. Everything that can fail is done before
//!   anything touches the pool: inputs and slots are checked on the host, and the plan's
//!   buffers, pipeline and bind group are made inside error scopes, so an allocation or
//!   validation failure is an error from [`DecodePlan::new`]. What is left is the submission,
//!   and WebGPU runs a command buffer whole or not at all: if anything in it is invalid (an
//!   output the caller destroyed, an invalid command recorded after the step) none of it runs
//!   and the pool keeps its states (tests/faults.rs reads it back). The kernel updates the
//!   pool in place rather than through a staging copy, which would double the traffic of a
//!   bandwidth-bound step and protect against nothing more: on a live device a dispatch
//!   cannot stop half-way, and a device lost mid-step takes the pool's memory with it. After
//!   a loss every call returns `Error::DeviceLost`; rebuild the states on a new `Context`
//!   (re-run the prompts), or restore slots checkpointed to the host
//!   ([`StatePool::copy_from_slot`], then a download).

mod pool;
mod recurrent_step;

pub use pool::{POOL_DTYPES, StateLayout, StatePool, StateSlot, check_slots};
pub use recurrent_step::{
    DecodeOutputs, DecodePlan, MAX_VEC4S_PER_THREAD, MAX_WORKGROUP, RecurrentStepTiles,
    SUBGROUP_V_BLOCK, StepKernel, TABLE_WORDS, max_sequences, subgroup_kernel_available,
};

use crate::error::{Error, Result};
use crate::problem::{ForwardInputs, Problem};
use crate::tensor::{DType, TensorMeta};
use crate::wgpu_backend::shaders::Pass;
#[cfg(not(target_arch = "wasm32"))]
use crate::wgpu_backend::tensor::copy_elements;
use crate::wgpu_backend::tensor::{check_distinct_buffers, named_inputs};
use crate::wgpu_backend::{Context, GpuTensor};

/// Record one decode (or verification) call: every sequence of `problem` continues from its
/// slot's state (see [`StateSlot`]) over its tokens, writing o and the new states in place.
/// `inputs.initial_state` must be `None`: the states come from the pool.
///
/// Precondition (not checked: it would need a readback): without `gate_in_kernel`, every g is
/// ≤ 0 and finite. Builds a [`DecodePlan`] per call; decode loops should keep a plan.
pub fn decode_step(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    problem: &Problem,
    inputs: &ForwardInputs<&GpuTensor>,
    pool: &StatePool,
    slots: &[StateSlot],
    outputs: &DecodeOutputs<'_>,
) -> Result<()> {
    DecodePlan::new(ctx, problem, inputs, pool, slots, outputs)?.record(encoder);
    Ok(())
}

/// Storage dtypes of q, k, v (and o) the decode kernel takes on this device: f32 and bf16
/// (packed in u32 words) everywhere, f16 where the device has SHADER_F16. The state is f32.
pub fn decode_storage_dtypes(ctx: &Context) -> Vec<DType> {
    let f16 = ctx.features().contains(wgpu::Features::SHADER_F16);
    Pass::RecurrentStep
        .storage_dtypes()
        .iter()
        .copied()
        .filter(|&d| d != DType::F16 || f16)
        .collect()
}

/// Everything a decode call checks before recording: inputs like the forward's, the pool's
/// layout and shape, the slots, the outputs and the uniform-binding limit the kernel relies
/// on.
pub(crate) fn check_decode(
    ctx: &Context,
    problem: &Problem,
    inputs: &ForwardInputs<&GpuTensor>,
    pool: &StatePool,
    slots: &[StateSlot],
    outputs: &DecodeOutputs<'_>,
) -> Result<()> {
    problem.check_inputs(inputs, &decode_storage_dtypes(ctx))?;
    if inputs.initial_state.is_some() {
        return Err(Error::value(
            "initial_state",
            "none: decode starts from the pool's slots",
            "a tensor",
        ));
    }
    pool.check_fits(problem)?;
    // More sequences than one uniform table holds run in several token windows.
    check_slots(slots, problem.num_sequences(), pool.slots())?;

    let o = outputs.o;
    if o.shape() != problem.v_shape() {
        return Err(Error::shape("o", &problem.v_shape(), o.shape()));
    }
    if o.dtype != inputs.v.dtype {
        return Err(Error::DType {
            name: "o".into(),
            expected: format!("{} (the dtype of v)", inputs.v.dtype),
            got: o.dtype.to_string(),
        });
    }
    if let Some(states) = outputs.per_token_states {
        let [a, b] = StateLayout::of(problem).inner_shape(problem.key_dim, problem.value_dim);
        let expected = [problem.total_tokens(), problem.heads_v, a, b];
        if states.shape() != expected {
            return Err(Error::shape("per_token_states", &expected, states.shape()));
        }
        if states.dtype != pool.dtype() {
            return Err(Error::DType {
                name: "per_token_states".into(),
                expected: format!("{} (the pool's dtype)", pool.dtype()),
                got: states.dtype.to_string(),
            });
        }
    }

    o.check_storage("o")?;
    let mut written = vec![("pool", pool.tensor()), ("o", o)];
    if let Some(states) = outputs.per_token_states {
        states.check_storage("per_token_states")?;
        written.push(("per_token_states", states));
    }
    check_distinct_buffers(&written, &named_inputs(inputs))?;

    // The grid's limits are checked where the plan's pass is prepared (`launch`).
    let limits = ctx.limits();
    let table_bytes = 4 * TABLE_WORDS as u64;
    if limits.max_uniform_buffer_binding_size < table_bytes {
        return Err(Error::unsupported(
            "device",
            format!("a max_uniform_buffer_binding_size below {table_bytes} bytes"),
        ));
    }
    Ok(())
}

/// Run `problem` through the decode kernel `tokens_per_step` tokens at a time per
/// sequence — each step a decode call over an f32 pool of N slots seeded with
/// `initial_state` (or fresh) — wait, and download o and the final states (the pool). Checks
/// host values first. The path of `gdn run decode`; a convenience, not a hot path (one
/// submit per step).
#[cfg(not(target_arch = "wasm32"))]
pub fn decode_host(
    ctx: &Context,
    problem: &Problem,
    inputs: &ForwardInputs<&crate::HostTensor>,
    tokens_per_step: usize,
) -> Result<crate::ForwardOutputs<crate::HostTensor>> {
    decode_host_in(ctx, problem, inputs, tokens_per_step, DType::F32)
}

/// [`decode_host`] over a pool stored as `pool_dtype` (one of [`POOL_DTYPES`]): with bf16 the
/// initial states are rounded to bf16 when uploaded and the states after every step; the
/// final states come back as f32 values of the bf16 pool.
#[cfg(not(target_arch = "wasm32"))]
pub fn decode_host_in(
    ctx: &Context,
    problem: &Problem,
    inputs: &ForwardInputs<&crate::HostTensor>,
    tokens_per_step: usize,
    pool_dtype: DType,
) -> Result<crate::ForwardOutputs<crate::HostTensor>> {
    use crate::HostTensor;

    problem.check_inputs(inputs, &decode_storage_dtypes(ctx))?;
    crate::problem::check_host_values(problem, inputs)?;
    if tokens_per_step == 0 {
        return Err(Error::value("tokens_per_step", "at least 1", 0));
    }
    if !POOL_DTYPES.contains(&pool_dtype) {
        return Err(Error::DType {
            name: "pool dtype".into(),
            expected: "F32 or BF16 (a state pool's storage dtypes)".into(),
            got: pool_dtype.to_string(),
        });
    }
    let p = problem;
    let pool = StatePool::for_problem_in(ctx, p, p.num_sequences(), pool_dtype)?;
    if let Some(h0) = inputs.initial_state {
        // Written into the pool's own buffers (whole slots each); values round to its dtype.
        pool.tensor().write_range(ctx, 0, &h0.data)?;
    }
    let o = GpuTensor::empty(ctx, "o", &p.v_shape(), inputs.v.dtype)?;
    let a_log = inputs
        .a_log
        .map(|t| GpuTensor::upload(ctx, "A_log", t))
        .transpose()?;
    let dt_bias = inputs
        .dt_bias
        .map(|t| GpuTensor::upload(ctx, "dt_bias", t))
        .transpose()?;

    let sequences = p.sequences();
    let longest = sequences.iter().map(|s| s.len()).max().unwrap_or(0);
    let o_row = p.heads_v * p.value_dim;
    for step in (0..longest).step_by(tokens_per_step) {
        let tokens: Vec<std::ops::Range<usize>> = sequences
            .iter()
            .map(|s| {
                let first = (s.start + step).min(s.end);
                first..(first + tokens_per_step).min(s.end)
            })
            .collect();
        let mut cu = vec![0];
        for r in &tokens {
            cu.push(cu.last().unwrap() + r.len());
        }
        let total = *cu.last().unwrap();
        let step_problem = Problem::new(
            1,
            total,
            p.heads_qk,
            p.heads_v,
            p.key_dim,
            p.value_dim,
            Some(cu.clone()),
            p.options,
        )?;
        let gather = |name: &str, t: &HostTensor, shape: Vec<usize>| {
            let row = t.len() / p.total_tokens();
            let data: Vec<f32> = tokens
                .iter()
                .flat_map(|r| t.data[r.start * row..r.end * row].iter().copied())
                .collect();
            GpuTensor::from_values(ctx, name, &shape, t.dtype, &data)
        };
        let (qk, v_shape, gate) = (
            step_problem.qk_shape().to_vec(),
            step_problem.v_shape().to_vec(),
            step_problem.gate_shape().to_vec(),
        );
        let (q, k, v) = (
            gather("q", inputs.q, qk.clone())?,
            gather("k", inputs.k, qk)?,
            gather("v", inputs.v, v_shape.clone())?,
        );
        let (g, beta) = (
            gather("g", inputs.g, gate.clone())?,
            gather("beta", inputs.beta, gate)?,
        );
        let step_inputs = ForwardInputs {
            q: &q,
            k: &k,
            v: &v,
            g: &g,
            beta: &beta,
            initial_state: None,
            a_log: a_log.as_ref(),
            dt_bias: dt_bias.as_ref(),
        };
        let slots: Vec<StateSlot> = tokens
            .iter()
            .enumerate()
            .map(
                |(n, r)| match (r.is_empty(), step == 0 && inputs.initial_state.is_none()) {
                    (true, _) => StateSlot::Padding,
                    (false, true) => StateSlot::Fresh(n as u32),
                    (false, false) => StateSlot::Resume(n as u32),
                },
            )
            .collect();
        let step_o = GpuTensor::empty(ctx, "o of a step", &v_shape, inputs.v.dtype)?;
        let mut encoder = ctx.create_encoder("gdn decode step");
        let outputs = DecodeOutputs {
            o: &step_o,
            per_token_states: None,
        };
        decode_step(
            ctx,
            &mut encoder,
            &step_problem,
            &step_inputs,
            &pool,
            &slots,
            &outputs,
        )?;
        for (n, r) in tokens.iter().enumerate().filter(|(_, r)| !r.is_empty()) {
            copy_elements(
                &mut encoder,
                "o",
                (&step_o, cu[n] * o_row),
                (&o, r.start * o_row),
                r.len() * o_row,
            )?;
        }
        ctx.scoped("decode step", None, || ctx.queue.submit([encoder.finish()]))?;
    }
    ctx.poll(wgpu::PollType::Wait {
        submission_index: None,
        timeout: None,
    })?;
    ctx.check()?;
    Ok(crate::ForwardOutputs {
        o: o.download_blocking(ctx)?,
        // F32 whatever the pool's dtype (a bf16 pool's values are exact in f32), as the
        // forward returns it.
        final_state: HostTensor {
            dtype: DType::F32,
            ..pool.tensor().download_blocking(ctx)?
        },
    })
}
