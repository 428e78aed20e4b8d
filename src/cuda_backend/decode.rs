//! The decode kernel (`shaders/cuda/decode.cu`): a window of tokens per sequence (one per step
//! in serving, a few for speculative verification) over an f32 state pool updated in place,
//! every option and storage dtype, f32 arithmetic. One warp per 16 v columns and the whole K:
//! no shared memory and no block barriers, the state streamed once with 128-bit accesses.
//! [`decode_into`] (below) runs every decode step here.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::context::{Context, driver_error};
use super::kernels::DECODE;
use super::recurrent::{
    RecurrentParams, STORAGE_DTYPES, SeqBounds, Window, check_host, check_tensor, to_i32,
};
use super::tensor::{CudaTensor, upload_inputs};
use crate::error::{Error, Result};
use crate::problem::{ForwardInputs, ForwardOutputs, Problem};
use crate::tensor::{DType, HostTensor, TensorMeta};

/// v columns per warp: `DECODE_COLS` in decode.cu.
const WARP_COLS: usize = 16;

/// Grids of at least this many warps run 4-warp blocks, smaller ones 2-warp blocks: on the
/// H200, 4 warps measured 1–2 % faster at B = 64 and 256 (16/32 heads, 8192+ warps), 2 warps
/// ~10 % faster at B = 1 (more SMs busy on a latency-bound launch).
const LARGE_GRID_WARPS: usize = 8192;

/// The largest K of the smaller-register instantiation (`*_k128`); larger K up to 256 runs
/// `*_k256`.
const SMALL_KEY_DIM: usize = 128;

/// The kernel name for `dtype`, `key_dim` and warps per block (2 or 4).
fn function_name(dtype: DType, key_dim: usize, warps: usize) -> String {
    let dtype = match dtype {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
    };
    let k = if key_dim <= SMALL_KEY_DIM { 128 } else { 256 };
    format!("gdn_decode_{dtype}_k{k}_w{warps}")
}

/// Enqueue one decode launch: for every sequence and v-head, run the tokens of `window` on the
/// state in `pool` (the problem's state shape, f32), write o for them and the state back in
/// place. A sequence with no token in the window is not touched. `inputs.initial_state` is
/// ignored. No host synchronisation.
pub fn launch_decode(
    ctx: &Context,
    problem: &Problem,
    seq: &SeqBounds,
    inputs: &ForwardInputs<&CudaTensor>,
    o: &CudaTensor,
    pool: &CudaTensor,
    window: Window,
) -> Result<()> {
    let p = problem;
    p.check_inputs(inputs, &STORAGE_DTYPES)?;
    let dtype = inputs.q.dtype();
    check_tensor("o", o, &p.v_shape(), dtype)?;
    check_tensor("state pool", pool, &p.state_shape(), DType::F32)?;
    if seq.sequences() != p.num_sequences() {
        return Err(Error::value(
            "sequence bounds",
            format!("{} sequences (the problem's N)", p.num_sequences()),
            seq.sequences(),
        ));
    }
    to_i32("tokens (B·T)", p.total_tokens())?;
    // Grid y and z are limited to 65535 blocks.
    for (name, x) in [
        ("heads_v (HV)", p.heads_v),
        ("sequences (N)", seq.sequences()),
    ] {
        if x > 65535 {
            return Err(Error::unsupported(
                name,
                format!("{x} on the cuda backend (at most 65535)"),
            ));
        }
    }
    let params = RecurrentParams::new(p, window)?;
    let warps_needed = p.value_dim.div_ceil(WARP_COLS) * p.heads_v * seq.sequences();
    let warps = if warps_needed >= LARGE_GRID_WARPS {
        4
    } else {
        2
    };
    let function = function_name(dtype, p.key_dim, warps);
    let func = ctx.function(&DECODE, &function)?;
    let cfg = LaunchConfig {
        grid_dim: (
            p.value_dim.div_ceil(WARP_COLS * warps) as u32,
            p.heads_v as u32,
            seq.sequences() as u32,
        ),
        block_dim: ((warps * 32) as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    // Absent optional tensors are null pointers.
    let null: u64 = 0;
    let stream = ctx.stream();
    let mut launch = stream.launch_builder(&func);
    launch
        .arg(&params)
        .arg(seq.buffer())
        .arg(inputs.q.buffer())
        .arg(inputs.k.buffer())
        .arg(inputs.v.buffer())
        .arg(inputs.g.buffer())
        .arg(inputs.beta.buffer());
    match inputs.a_log {
        Some(t) => launch.arg(t.buffer()),
        None => launch.arg(&null),
    };
    match inputs.dt_bias {
        Some(t) => launch.arg(t.buffer()),
        None => launch.arg(&null),
    };
    launch.arg(o.buffer()).arg(pool.buffer());
    // SAFETY: the argument list matches GDN_DECODE in decode.cu; every buffer was checked above
    // to have the shape and dtype the kernel indexes with (K, V multiples of 16, so every
    // vector access is aligned on the allocations' 256-byte bases).
    unsafe { launch.launch(cfg) }.map_err(|e| driver_error(&format!("launch of {function}"), e))?;
    Ok(())
}

/// Enqueue decode steps of `tokens_per_step` tokens per sequence over `pool` (the state
/// shape, f32, holding each sequence's starting state), updated in place; o into `o`.
/// `inputs.initial_state` is ignored: the pool is the state.
pub fn decode_into(
    ctx: &Context,
    problem: &Problem,
    seq: &SeqBounds,
    inputs: &ForwardInputs<&CudaTensor>,
    o: &CudaTensor,
    pool: &CudaTensor,
    tokens_per_step: usize,
) -> Result<()> {
    if tokens_per_step == 0 {
        return Err(Error::value("tokens_per_step", "at least 1", 0));
    }
    let inputs = ForwardInputs {
        initial_state: None,
        ..*inputs
    };
    let longest = problem
        .sequences()
        .iter()
        .map(|s| s.len())
        .max()
        .unwrap_or(0);
    // One launch even for empty sequences, so the pool is validated and o checked.
    let steps = longest.div_ceil(tokens_per_step).max(1);
    for step in 0..steps {
        let window = Window {
            begin: step * tokens_per_step,
            len: tokens_per_step,
        };
        // The barrier-free decode kernel runs every window (any length, every option).
        launch_decode(ctx, problem, seq, &inputs, o, pool, window)?;
    }
    Ok(())
}

/// Decode on host tensors: a pool seeded with the initial states (zeros without), steps of
/// `tokens_per_step` tokens, wait, download o and the pool.
pub fn decode_host(
    ctx: &Context,
    problem: &Problem,
    inputs: &ForwardInputs<&HostTensor>,
    tokens_per_step: usize,
) -> Result<ForwardOutputs<HostTensor>> {
    check_host(problem, inputs)?;
    if tokens_per_step == 0 {
        return Err(Error::value("tokens_per_step", "at least 1", 0));
    }
    let mut dev = upload_inputs(ctx, inputs)?;
    let pool = match dev.initial_state.take() {
        Some(h0) => h0,
        None => CudaTensor::zeros(ctx, "state pool", &problem.state_shape(), DType::F32)?,
    };
    let seq = SeqBounds::upload(ctx, problem)?;
    let o = CudaTensor::zeros(ctx, "o", &problem.v_shape(), inputs.v.dtype)?;
    decode_into(
        ctx,
        problem,
        &seq,
        &dev.as_ref(),
        &o,
        &pool,
        tokens_per_step,
    )?;
    ctx.synchronize()?;
    Ok(ForwardOutputs {
        o: o.download(ctx)?,
        final_state: pool.download(ctx)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_k128_kernels_cover_k_up_to_128() {
        assert_eq!(
            function_name(DType::BF16, 128, 2),
            "gdn_decode_bf16_k128_w2"
        );
        assert_eq!(function_name(DType::F16, 16, 4), "gdn_decode_f16_k128_w4");
        assert_eq!(function_name(DType::F32, 144, 2), "gdn_decode_f32_k256_w2");
        assert_eq!(
            function_name(DType::BF16, 256, 4),
            "gdn_decode_bf16_k256_w4"
        );
    }
}
