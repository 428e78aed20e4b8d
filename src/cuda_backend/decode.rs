//! The decode kernel (`shaders/cuda/decode.cu`): a window of tokens per sequence (one per step
//! in serving, a few for speculative verification) over an f32 state pool updated in place,
//! every option and storage dtype, f32 arithmetic. One warp per 16 v columns and the whole K:
//! no shared memory and no block barriers, the state streamed once with 128-bit accesses.
//! [`decode_into`](super::decode_into) routes decode steps here.

use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};

use super::context::{Context, driver_error};
use super::kernels::{DECODE, option_flags};
use super::recurrent::{STORAGE_DTYPES, SeqBounds, Window, check_tensor};
use super::tensor::CudaTensor;
use crate::error::{Error, Result};
use crate::problem::{ForwardInputs, Problem};
use crate::tensor::{DType, TensorMeta};

/// v columns per warp and warps per block: `DECODE_COLS` and `DECODE_WARPS` in decode.cu.
const WARP_COLS: usize = 16;
const WARPS: usize = 2;

/// The largest K of the smaller-register instantiation (`*_k128`); larger K up to 256 runs
/// `*_k256`.
const SMALL_KEY_DIM: usize = 128;

/// Mirrors `gdn::DecodeParams` in decode.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct DecodeParams {
    heads_qk: i32,
    heads_v: i32,
    key_dim: i32,
    value_dim: i32,
    group: i32,
    flags: i32,
    window_begin: i32,
    window_len: i32,
    scale: f32,
}

// SAFETY: plain old data of 4-byte fields, laid out like the C struct the kernel takes by value.
unsafe impl DeviceRepr for DecodeParams {}

fn to_i32(name: &str, x: usize) -> Result<i32> {
    i32::try_from(x).map_err(|_| Error::value(name, format!("at most {}", i32::MAX), x))
}

/// The kernel name for `dtype` and `key_dim`.
fn function_name(dtype: DType, key_dim: usize) -> &'static str {
    let small = key_dim <= SMALL_KEY_DIM;
    match (dtype, small) {
        (DType::F32, true) => "gdn_decode_f32_k128",
        (DType::F16, true) => "gdn_decode_f16_k128",
        (DType::BF16, true) => "gdn_decode_bf16_k128",
        (DType::F32, false) => "gdn_decode_f32_k256",
        (DType::F16, false) => "gdn_decode_f16_k256",
        (DType::BF16, false) => "gdn_decode_bf16_k256",
    }
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
    let params = DecodeParams {
        heads_qk: to_i32("heads_qk", p.heads_qk)?,
        heads_v: to_i32("heads_v", p.heads_v)?,
        key_dim: to_i32("key_dim", p.key_dim)?,
        value_dim: to_i32("value_dim", p.value_dim)?,
        group: to_i32("group", p.group())?,
        flags: option_flags(p),
        window_begin: window.begin.min(i32::MAX as usize) as i32,
        window_len: window.len.min(i32::MAX as usize) as i32,
        scale: p.scale(),
    };
    let function = function_name(dtype, p.key_dim);
    let func = ctx.function(&DECODE, function)?;
    let cfg = LaunchConfig {
        grid_dim: (
            p.value_dim.div_ceil(WARP_COLS * WARPS) as u32,
            p.heads_v as u32,
            seq.sequences() as u32,
        ),
        block_dim: ((WARPS * 32) as u32, 1, 1),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_k128_kernels_cover_k_up_to_128() {
        assert_eq!(function_name(DType::BF16, 128), "gdn_decode_bf16_k128");
        assert_eq!(function_name(DType::F16, 16), "gdn_decode_f16_k128");
        assert_eq!(function_name(DType::F32, 144), "gdn_decode_f32_k256");
        assert_eq!(function_name(DType::BF16, 256), "gdn_decode_bf16_k256");
    }
}
