//! Sequence parallelism's combine step (`shaders/cuda/chunk_combine.cu`): per (8 v columns,
//! v-head, sequence), the segments' exact start states from their end states E and
//! transitions M (the chunked forward's local pass), `start_{i+1} = M_i·start_i + E_i` in f32;
//! with the gate-driven window, `start_{i+1} = E_i` where segment i's pair was windowed.
//! Launched by [`launch_chunked`](super::launch_chunked) between the local and the main pass.

use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg};

use super::context::{Context, driver_error};
use super::kernels::{CHUNK_COMBINE, option_flags};
use super::tensor::CudaTensor;
use crate::error::Result;
use crate::problem::Problem;

/// Threads per block and v columns per block (chunk_combine.cu `THREADS`, `COLS`).
const THREADS: u32 = 256;
const COLS: usize = 8;

/// Mirrors `gdn::combine::CombineParams` in chunk_combine.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct CombineParams {
    heads_v: i32,
    key_dim: i32,
    value_dim: i32,
    flags: i32,
}

// SAFETY: plain old data of 4-byte fields, laid out like the C struct the kernel takes by value.
unsafe impl DeviceRepr for CombineParams {}

/// Shared memory of the combine kernel: two K × (K + 4) stages of M, two K × 8 stages of E's
/// columns and the start state's 8 columns of K + 4.
pub(crate) fn combine_smem(key_dim: usize) -> usize {
    4 * (2 * key_dim * (key_dim + 4) + 2 * key_dim * COLS + COLS * (key_dim + 4))
}

/// Enqueue the combine: `seq_units` gives each sequence's units (segments) in order,
/// `segment_ends` their [E | M] rows (K × (V + K) f32 per unit and v-head), and the start
/// state of every unit but each sequence's first goes to `segment_starts` (K × V f32).
/// `warmup` (per unit and v-head, the gate-driven window's table: > 0 windowed) makes a
/// windowed unit's next start state its E alone; `None`: every unit exact.
pub(crate) fn launch_chunk_combine(
    ctx: &Context,
    problem: &Problem,
    seq_units: &CudaSlice<i32>,
    warmup: Option<&CudaSlice<i32>>,
    initial_state: Option<&CudaTensor>,
    segment_ends: &CudaSlice<u8>,
    segment_starts: &CudaSlice<u8>,
) -> Result<()> {
    let p = problem;
    let name = "gdn_chunk_combine";
    let smem = combine_smem(p.key_dim);
    let func = ctx.function_with_smem(&CHUNK_COMBINE, name, smem)?;
    let params = CombineParams {
        heads_v: p.heads_v as i32,
        key_dim: p.key_dim as i32,
        value_dim: p.value_dim as i32,
        flags: option_flags(p),
    };
    let cfg = LaunchConfig {
        grid_dim: (
            p.value_dim.div_ceil(COLS) as u32,
            p.heads_v as u32,
            p.num_sequences() as u32,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    let null: u64 = 0;
    let mut l = ctx.stream().launch_builder(&func);
    l.arg(&params).arg(seq_units);
    match warmup {
        Some(w) => l.arg(w),
        None => l.arg(&null),
    };
    match initial_state {
        Some(t) => l.arg(t.buffer()),
        None => l.arg(&null),
    };
    l.arg(segment_ends).arg(segment_starts);
    // SAFETY: matches gdn_chunk_combine in chunk_combine.cu; the caller (launch_chunked) sized
    // the segment buffers for its plan's units and checked the initial state's shape.
    unsafe { l.launch(cfg) }.map_err(|e| driver_error(&format!("launch of {name}"), e))?;
    Ok(())
}
