//! The chunked backward's sequential passes (`shaders/cuda/chunk_bwd_chain.cu`): the states
//! pass (each chunk's start state, X and v', forward over the chunks) and the dh pass (each
//! chunk's end-state gradient and dv', dv and dh0, backward over the chunks), one block per
//! (V-block, v-head, sequence).

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::chunked::{ChunkParams, DeviceLimits, MAX_CHUNKED_KEY_DIM};
use super::context::{Context, driver_error};
use super::kernels::CHUNK_BWD_CHAIN;
use crate::error::Result;
use crate::problem::{CHUNK, Problem};

/// The V-blocks of both passes (a warp per 16 columns), smallest first.
pub const CHAIN_VALUE_BLOCKS: [usize; 3] = [32, 64, 128];

/// chunk_bwd_chain.cu's ChainLayout: per stage k, the V-block of v or dO, T·diag(β), the
/// decays, then (dh pass) q and P; two stages, then (dh pass) a C × 16 staging tile of dv per
/// warp.
pub(crate) fn chain_smem(bv: usize, dh: bool) -> usize {
    let c = CHUNK;
    let ldk = MAX_CHUNKED_KEY_DIM + 8;
    let ldc = c + 8;
    let states_stage = 2 * c * ldk + 2 * c * (bv + 8) + 2 * c * ldc + 4 * 2 * c;
    if dh {
        2 * (states_stage + 2 * c * ldk + 2 * c * ldc) + (bv / 16) * c * (16 + 8) * 2
    } else {
        2 * states_stage
    }
}

/// The smallest V-block whose grid of either pass is resident at once (a latency-bound chain
/// wants more, shorter blocks), else the largest that fits; `None` when none fits.
pub(crate) fn chain_value_block(limits: &DeviceLimits, problem: &Problem) -> Option<usize> {
    let p = problem;
    let fits: Vec<usize> = CHAIN_VALUE_BLOCKS
        .into_iter()
        .filter(|&bv| chain_smem(bv, true) <= limits.smem_per_block)
        .collect();
    fits.iter()
        .copied()
        .find(|&bv| {
            let blocks = p.value_dim.div_ceil(bv) * p.heads_v * p.num_sequences();
            blocks <= limits.resident(chain_smem(bv, true))
        })
        .or(fits.last().copied())
}

fn grid(problem: &Problem, bv: usize) -> (u32, u32, u32) {
    (
        problem.value_dim.div_ceil(bv) as u32,
        problem.heads_v as u32,
        problem.num_sequences() as u32,
    )
}

/// The backward's per-(chunk, v-head) workspace the chains read and write.
pub(crate) struct ChainBuffers<'a> {
    /// (first token, length) per chunk.
    pub chunks: &'a CudaSlice<i32>,
    /// (first chunk, end chunk, sequence, flags) per sequence.
    pub units: &'a CudaSlice<i32>,
    /// γ, γ_C/γ, G, β per chunk and v-head (4·C f32).
    pub gates: &'a CudaSlice<u8>,
    /// T·diag(β), P (C × C each, storage dtype).
    pub t_beta: &'a CudaSlice<u8>,
    pub p: &'a CudaSlice<u8>,
    /// Sᵀ and dS'ᵀ per chunk (V × K), Xᵀ, v'ᵀ, dv'ᵀ (V × C), storage dtype.
    pub states: &'a CudaSlice<u8>,
    pub state_grads: &'a CudaSlice<u8>,
    pub x: &'a CudaSlice<u8>,
    pub v_new: &'a CudaSlice<u8>,
    pub dv_new: &'a CudaSlice<u8>,
}

/// Enqueue the states pass (V-block `bv`, kernels for the storage dtype `suffix`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_states(
    ctx: &Context,
    problem: &Problem,
    params: &ChunkParams,
    bv: usize,
    suffix: &str,
    ws: &ChainBuffers<'_>,
    k: &CudaSlice<u8>,
    v: &CudaSlice<u8>,
    h0: Option<&CudaSlice<u8>>,
) -> Result<()> {
    let name = format!("gdn_chunk_bwd_states{bv}_{suffix}");
    let smem = chain_smem(bv, false);
    let func = ctx.function_with_smem(&CHUNK_BWD_CHAIN, &name, smem)?;
    let null: u64 = 0;
    let mut l = ctx.stream().launch_builder(&func);
    l.arg(params)
        .arg(ws.chunks)
        .arg(ws.units)
        .arg(k)
        .arg(v)
        .arg(ws.gates)
        .arg(ws.t_beta);
    match h0 {
        Some(t) => l.arg(t),
        None => l.arg(&null),
    };
    l.arg(ws.states).arg(ws.x).arg(ws.v_new);
    let cfg = LaunchConfig {
        grid_dim: grid(problem, bv),
        block_dim: ((bv / 16 * 32) as u32, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    // SAFETY: matches gdn_chunk_bwd_states* in chunk_bwd_chain.cu; the workspace was sized for
    // this problem's chunks and the inputs checked against it by the caller.
    unsafe { l.launch(cfg) }.map_err(|e| driver_error(&format!("launch of {name}"), e))?;
    Ok(())
}

/// Enqueue the dh pass: dv and dh0 (when given) into the gradients, dS' and dv' per chunk
/// into the workspace.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_dh(
    ctx: &Context,
    problem: &Problem,
    params: &ChunkParams,
    bv: usize,
    suffix: &str,
    ws: &ChainBuffers<'_>,
    q: &CudaSlice<u8>,
    k: &CudaSlice<u8>,
    d_o: &CudaSlice<u8>,
    dht: Option<&CudaSlice<u8>>,
    dv: &CudaSlice<u8>,
    dh0: Option<&CudaSlice<u8>>,
) -> Result<()> {
    let name = format!("gdn_chunk_bwd_dh{bv}_{suffix}");
    let smem = chain_smem(bv, true);
    let func = ctx.function_with_smem(&CHUNK_BWD_CHAIN, &name, smem)?;
    let null: u64 = 0;
    let mut l = ctx.stream().launch_builder(&func);
    l.arg(params)
        .arg(ws.chunks)
        .arg(ws.units)
        .arg(q)
        .arg(k)
        .arg(d_o)
        .arg(ws.gates)
        .arg(ws.t_beta)
        .arg(ws.p);
    match dht {
        Some(t) => l.arg(t),
        None => l.arg(&null),
    };
    l.arg(dv);
    match dh0 {
        Some(t) => l.arg(t),
        None => l.arg(&null),
    };
    l.arg(ws.state_grads).arg(ws.dv_new);
    let cfg = LaunchConfig {
        grid_dim: grid(problem, bv),
        block_dim: ((bv / 16 * 32) as u32, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    // SAFETY: matches gdn_chunk_bwd_dh* in chunk_bwd_chain.cu; dv, dht, dh0 were checked
    // against the problem by the caller, the workspace sized for its chunks.
    unsafe { l.launch(cfg) }.map_err(|e| driver_error(&format!("launch of {name}"), e))?;
    Ok(())
}
