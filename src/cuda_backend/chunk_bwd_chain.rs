//! The chunked backward's sequential passes (`shaders/cuda/chunk_bwd_chain.cuh`): the states
//! pass (each chunk's start state, X and v', forward over the chunks) and the dh pass (each
//! chunk's end-state gradient and dv', dv and dh0, backward over the chunks), one block per
//! (V-block, v-head, sequence).

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::chunked::{ChunkParams, DeviceLimits, MAX_CHUNKED_KEY_DIM};
use super::context::{Context, driver_error};
use super::kernels::{Source, chunk_bwd_chain_source};
use crate::error::{Error, Result};
use crate::problem::{CHUNK, Problem};

/// The V-blocks of both passes (a warp per 16 columns), smallest first.
pub const CHAIN_VALUE_BLOCKS: [usize; 3] = [32, 64, 128];

/// chunk_bwd_chain.cuh's ChainLayout: per stage k, the V-block of v or dO, T·diag(β), the
/// decays, then (dh pass) q and P; two stages, then (dh pass) a C × 16 staging tile of dv per
/// 16 columns; with warp pairs, a 16 × C f32 partial sum per warp.
pub(crate) fn chain_smem(bv: usize, dh: bool, pairs: bool) -> usize {
    let c = CHUNK;
    let ldk = MAX_CHUNKED_KEY_DIM + 8;
    let ldc = c + 8;
    let states_stage = 2 * c * ldk + 2 * c * (bv + 8) + 2 * c * ldc + 4 * 2 * c;
    let partials = if pairs { 2 * (bv / 16) * 4 * 16 * c } else { 0 };
    partials
        + if dh {
            2 * (states_stage + 2 * c * ldk + 2 * c * ldc) + (bv / 16) * c * (16 + 8) * 2
        } else {
            // Single warps' staging tiles for the S stores (STAGING_BYTES; pairs stage through
            // their partial slots).
            let staging = if pairs {
                0
            } else {
                (bv / 16) * 2 * 16 * (MAX_CHUNKED_KEY_DIM / 2 + 8)
            };
            2 * states_stage + staging
        }
}

/// The V-blocks with warp-pair kernels: one after the other, and together.
pub(crate) const PAIR_VALUE_BLOCKS: [usize; 2] = [32, 64];
pub(crate) const PAIR_TOGETHER_VALUE_BLOCKS: [usize; 1] = [32];

/// The chains' source for the kernels' dtype suffix (`f16`, `bf16`).
fn chain_source(suffix: &str) -> Result<&'static Source> {
    chunk_bwd_chain_source(suffix)
        .ok_or_else(|| Error::unsupported("chunked backward dtype", suffix.to_string()))
}

/// The kernels' V-block suffix: `32`, or `32p` with warp pairs.
fn kernel_block(bv: usize, pairs: bool) -> String {
    if pairs {
        format!("{bv}p")
    } else {
        bv.to_string()
    }
}

/// Warps per 16 columns.
fn warps_per_group(pairs: bool) -> usize {
    if pairs { 2 } else { 1 }
}

/// How the two chains are launched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ChainSchedule {
    /// [`ChainSchedule::Together`] where a V-block of it fits and its grid is resident at
    /// once, else [`ChainSchedule::Serial`].
    #[default]
    Auto,
    /// The states pass, then the dh pass: two launches.
    Serial,
    /// One launch, each block running both chains of its (V-block, v-head, sequence) side by
    /// side in two groups of warps (V-blocks 32 and 64: both layouts must fit one block's
    /// shared memory).
    Together,
    /// One launch, each block running one chain (V-block 32 with warp pairs): the dh pass's
    /// blocks, then the states pass's, so that where both grids are resident at one block per
    /// SM each chain has an SM of its own.
    Apart,
}

impl ChainSchedule {
    /// The name `GDN_BWD_CHAINS` and reports use.
    pub fn name(self) -> &'static str {
        match self {
            ChainSchedule::Auto => "auto",
            ChainSchedule::Serial => "serial",
            ChainSchedule::Together => "together",
            ChainSchedule::Apart => "apart",
        }
    }
}

/// The V-blocks [`ChainSchedule::Together`] has kernels for.
pub(crate) const TOGETHER_VALUE_BLOCKS: [usize; 2] = [32, 64];

/// The V-blocks [`ChainSchedule::Apart`] has kernels for (with warp pairs only).
pub(crate) const PAIR_APART_VALUE_BLOCKS: [usize; 1] = [32];

/// Whether `Auto` takes [`ChainSchedule::Apart`] where both grids are resident at one block
/// per SM: yes (H200, 2026-12-02, 2/8 heads × 1×32768 bf16 without segments: 3.24 ms apart
/// against 4.15–4.19 together; where the automatic segments cut, as there, together in
/// segments of 64 chunks took 2.66 and apart in segments of 256 2.98; BENCHMARKS.md).
pub(crate) const AUTO_APART: bool = true;

/// Shared memory of one block of [`ChainSchedule::Apart`]: the larger layout, the dh pass's.
pub(crate) fn apart_smem(bv: usize, pairs: bool) -> usize {
    chain_smem(bv, false, pairs).max(chain_smem(bv, true, pairs))
}

/// Whether [`ChainSchedule::Apart`]'s grid over `units` (both chains' blocks) is resident at
/// once.
pub(crate) fn apart_resident(
    limits: &DeviceLimits,
    problem: &Problem,
    bv: usize,
    pairs: bool,
    units: usize,
) -> bool {
    let blocks = 2 * problem.value_dim.div_ceil(bv) * problem.heads_v * units;
    blocks <= limits.resident(apart_smem(bv, pairs))
}

/// Shared memory of one block running both chains: the states layout, then the dh layout.
pub(crate) fn together_smem(bv: usize, pairs: bool) -> usize {
    chain_smem(bv, false, pairs) + chain_smem(bv, true, pairs)
}

/// The schedule and V-block of the chains: with `Auto`, with warp pairs, apart (a block per
/// chain, one launch) where both grids are resident at once at V-block 32 ([`AUTO_APART`]),
/// else both chains together at the smallest
/// V-block whose grid is resident at once (a latency-bound chain wants more, shorter blocks,
/// and the two chains then overlap), else one after the other at the smallest V-block whose
/// grid of either pass is resident, else at the largest that fits. A forced schedule or
/// V-block that cannot run is `Error::Value` naming it; `None` when nothing fits.
pub(crate) fn chain_plan(
    limits: &DeviceLimits,
    problem: &Problem,
    schedule: ChainSchedule,
    value_block: Option<usize>,
    pairs: bool,
) -> Result<Option<(ChainSchedule, usize)>> {
    let p = problem;
    let blocks = |bv: usize| p.value_dim.div_ceil(bv) * p.heads_v * p.num_sequences();
    let (together_blocks, serial_blocks): (&[usize], &[usize]) = if pairs {
        (&PAIR_TOGETHER_VALUE_BLOCKS, &PAIR_VALUE_BLOCKS)
    } else {
        (&TOGETHER_VALUE_BLOCKS, &CHAIN_VALUE_BLOCKS)
    };
    let together: Vec<usize> = together_blocks
        .iter()
        .copied()
        .filter(|&bv| together_smem(bv, pairs) <= limits.smem_per_block)
        .filter(|&bv| value_block.is_none_or(|b| b == bv))
        .collect();
    let serial: Vec<usize> = serial_blocks
        .iter()
        .copied()
        .filter(|&bv| chain_smem(bv, true, pairs) <= limits.smem_per_block)
        .filter(|&bv| value_block.is_none_or(|b| b == bv))
        .collect();
    let resident_together = together
        .iter()
        .copied()
        .find(|&bv| blocks(bv) <= limits.resident(together_smem(bv, pairs)));
    let serial_plan = serial
        .iter()
        .copied()
        .find(|&bv| blocks(bv) <= limits.resident(chain_smem(bv, true, pairs)))
        .or(serial.last().copied())
        .map(|bv| (ChainSchedule::Serial, bv));
    let apart: Vec<usize> = if pairs {
        &PAIR_APART_VALUE_BLOCKS[..]
    } else {
        &[]
    }
    .iter()
    .copied()
    .filter(|&bv| apart_smem(bv, pairs) <= limits.smem_per_block)
    .filter(|&bv| value_block.is_none_or(|b| b == bv))
    .collect();
    let resident_apart = apart
        .iter()
        .copied()
        .find(|&bv| apart_resident(limits, p, bv, pairs, p.num_sequences()));
    let plan = match schedule {
        ChainSchedule::Auto => resident_apart
            .filter(|_| AUTO_APART)
            .map(|bv| (ChainSchedule::Apart, bv))
            .or(resident_together.map(|bv| (ChainSchedule::Together, bv)))
            .or(serial_plan),
        ChainSchedule::Apart => apart.first().map(|&bv| (ChainSchedule::Apart, bv)),
        ChainSchedule::Serial => serial_plan,
        ChainSchedule::Together => resident_together
            .or(together.first().copied())
            .map(|bv| (ChainSchedule::Together, bv)),
    };
    if plan.is_none() && (schedule != ChainSchedule::Auto || value_block.is_some()) {
        return Err(Error::value(
            "backward chains",
            format!(
                "a schedule and V-block (of {CHAIN_VALUE_BLOCKS:?}; together: of \
                 {TOGETHER_VALUE_BLOCKS:?}; with warp pairs {PAIR_VALUE_BLOCKS:?}, together \
                 {PAIR_TOGETHER_VALUE_BLOCKS:?} and apart {PAIR_APART_VALUE_BLOCKS:?}) whose \
                 shared memory fits the device"
            ),
            format!(
                "{} at V-block {value_block:?}{}",
                schedule.name(),
                if pairs { " with warp pairs" } else { "" }
            ),
        ));
    }
    Ok(plan)
}

/// chunk_bwd_chain.cuh's BWD_LOCAL bit: the segments' local pass.
const BWD_LOCAL: i32 = 1 << 9;

/// Which pass of a segmented chain a launch runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChainPass {
    /// Every unit from its start state (h0, or the combined one) and end gradient (dht, or
    /// the combined one): what the rest of the backward reads.
    Main,
    /// Every segment from zero: E, the transitions M (K more column blocks) and E' for the
    /// combines.
    Local,
}

/// The grid: (V-blocks, + K's column blocks for the transitions in the local pass, v-heads,
/// units).
fn grid(problem: &Problem, bv: usize, units: usize, transitions: bool) -> (u32, u32, u32) {
    let extra = if transitions {
        problem.key_dim.div_ceil(bv)
    } else {
        0
    };
    (
        (problem.value_dim.div_ceil(bv) + extra) as u32,
        problem.heads_v as u32,
        units as u32,
    )
}

/// The parameters of `pass`.
fn pass_params(params: &ChunkParams, pass: ChainPass) -> ChunkParams {
    ChunkParams {
        flags: params.flags
            | if pass == ChainPass::Local {
                BWD_LOCAL
            } else {
                0
            },
        ..*params
    }
}

/// Sequence parallelism's buffers (f32, per slot and v-head): the combined start states and
/// the states local pass's [E | M] (slot = unit), the gradients entering each unit's end and
/// the dh local pass's [E' | Mᵀ] (slot = the unit's place in its sequence reversed).
#[derive(Debug)]
pub(crate) struct SegmentBuffers {
    pub start: CudaSlice<u8>,
    pub end: CudaSlice<u8>,
    pub dh_start: CudaSlice<u8>,
    pub dh_end: CudaSlice<u8>,
}

/// The segments' kernel arguments (chunk_bwd_chain.cuh GDN_CHUNK_BWD_SEG_ARGS): null without
/// segments.
fn push_segments<'a>(
    l: &mut cudarc::driver::LaunchArgs<'a>,
    ws: &'a ChainBuffers<'a>,
    null: &'a u64,
) {
    match ws.segments {
        Some(b) => {
            l.arg(ws.seq_units)
                .arg(&b.start)
                .arg(&b.end)
                .arg(&b.dh_start)
                .arg(&b.dh_end);
        }
        None => {
            for _ in 0..5 {
                l.arg(null);
            }
        }
    }
}

/// The backward's per-(chunk, v-head) workspace the chains read and write.
pub(crate) struct ChainBuffers<'a> {
    /// (first token, length) per chunk.
    pub chunks: &'a CudaSlice<i32>,
    /// (first chunk, end chunk, sequence, flags) per unit (a sequence or a segment of one).
    pub units: &'a CudaSlice<i32>,
    pub num_units: usize,
    /// Per sequence its first unit, then the end.
    pub seq_units: &'a CudaSlice<i32>,
    /// The segments' buffers (`None`: every unit a whole sequence).
    pub segments: Option<&'a SegmentBuffers>,
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
    pass: ChainPass,
    bv: usize,
    pairs: bool,
    suffix: &str,
    ws: &ChainBuffers<'_>,
    k: &CudaSlice<u8>,
    v: &CudaSlice<u8>,
    h0: Option<&CudaSlice<u8>>,
) -> Result<()> {
    let name = format!("gdn_chunk_bwd_states{}_{suffix}", kernel_block(bv, pairs));
    let smem = chain_smem(bv, false, pairs);
    let func = ctx.function_with_smem(chain_source(suffix)?, &name, smem)?;
    let null: u64 = 0;
    let params = pass_params(params, pass);
    let mut l = ctx.stream().launch_builder(&func);
    l.arg(&params)
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
    push_segments(&mut l, ws, &null);
    let cfg = LaunchConfig {
        grid_dim: grid(problem, bv, ws.num_units, pass == ChainPass::Local),
        block_dim: ((bv / 16 * warps_per_group(pairs) * 32) as u32, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    // SAFETY: matches gdn_chunk_bwd_states* in chunk_bwd_chain.cuh; the workspace was sized for
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
    pass: ChainPass,
    bv: usize,
    pairs: bool,
    suffix: &str,
    ws: &ChainBuffers<'_>,
    q: &CudaSlice<u8>,
    k: &CudaSlice<u8>,
    d_o: &CudaSlice<u8>,
    dht: Option<&CudaSlice<u8>>,
    dv: &CudaSlice<u8>,
    dh0: Option<&CudaSlice<u8>>,
) -> Result<()> {
    let name = format!("gdn_chunk_bwd_dh{}_{suffix}", kernel_block(bv, pairs));
    let smem = chain_smem(bv, true, pairs);
    let func = ctx.function_with_smem(chain_source(suffix)?, &name, smem)?;
    let null: u64 = 0;
    let params = pass_params(params, pass);
    let mut l = ctx.stream().launch_builder(&func);
    l.arg(&params)
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
    push_segments(&mut l, ws, &null);
    let cfg = LaunchConfig {
        grid_dim: grid(problem, bv, ws.num_units, false),
        block_dim: ((bv / 16 * warps_per_group(pairs) * 32) as u32, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    // SAFETY: matches gdn_chunk_bwd_dh* in chunk_bwd_chain.cuh; dv, dht, dh0 were checked
    // against the problem by the caller, the workspace sized for its chunks.
    unsafe { l.launch(cfg) }.map_err(|e| driver_error(&format!("launch of {name}"), e))?;
    Ok(())
}

/// Enqueue both chains in one launch ([`ChainSchedule::Together`], V-block `bv` of
/// [`TOGETHER_VALUE_BLOCKS`]; with `apart`, [`ChainSchedule::Apart`], a block per chain):
/// what [`launch_states`] and [`launch_dh`] write.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_together(
    ctx: &Context,
    problem: &Problem,
    params: &ChunkParams,
    pass: ChainPass,
    bv: usize,
    pairs: bool,
    suffix: &str,
    ws: &ChainBuffers<'_>,
    io: &ChainInputs<'_>,
    apart: bool,
) -> Result<()> {
    let kind = if apart { "apart" } else { "chains" };
    let name = format!("gdn_chunk_bwd_{kind}{}_{suffix}", kernel_block(bv, pairs));
    let smem = if apart {
        apart_smem(bv, pairs)
    } else {
        together_smem(bv, pairs)
    };
    let func = ctx.function_with_smem(chain_source(suffix)?, &name, smem)?;
    let null: u64 = 0;
    let params = pass_params(params, pass);
    let mut l = ctx.stream().launch_builder(&func);
    l.arg(&params)
        .arg(ws.chunks)
        .arg(ws.units)
        .arg(io.q)
        .arg(io.k)
        .arg(io.v)
        .arg(io.d_o)
        .arg(ws.gates)
        .arg(ws.t_beta)
        .arg(ws.p);
    for t in [io.h0, io.dht] {
        match t {
            Some(t) => l.arg(t),
            None => l.arg(&null),
        };
    }
    l.arg(io.dv);
    match io.dh0 {
        Some(t) => l.arg(t),
        None => l.arg(&null),
    };
    l.arg(ws.states)
        .arg(ws.x)
        .arg(ws.v_new)
        .arg(ws.state_grads)
        .arg(ws.dv_new);
    push_segments(&mut l, ws, &null);
    // Apart: the units twice in z (the dh pass's blocks, then the states pass's), one chain's
    // warps per block.
    let (x, y, units) = grid(problem, bv, ws.num_units, pass == ChainPass::Local);
    let (chains_per_block, z) = if apart { (1, 2 * units) } else { (2, units) };
    let cfg = LaunchConfig {
        grid_dim: (x, y, z),
        block_dim: (
            (chains_per_block * bv / 16 * warps_per_group(pairs) * 32) as u32,
            1,
            1,
        ),
        shared_mem_bytes: smem as u32,
    };
    // SAFETY: matches gdn_chunk_bwd_{chains,apart}* in chunk_bwd_chain.cuh; the tensors were checked
    // against the problem by the caller, the workspace sized for its chunks.
    unsafe { l.launch(cfg) }.map_err(|e| driver_error(&format!("launch of {name}"), e))?;
    Ok(())
}

/// The chains' inputs and outputs besides the workspace.
pub(crate) struct ChainInputs<'a> {
    pub q: &'a CudaSlice<u8>,
    pub k: &'a CudaSlice<u8>,
    pub v: &'a CudaSlice<u8>,
    pub d_o: &'a CudaSlice<u8>,
    pub h0: Option<&'a CudaSlice<u8>>,
    pub dht: Option<&'a CudaSlice<u8>>,
    pub dv: &'a CudaSlice<u8>,
    pub dh0: Option<&'a CudaSlice<u8>>,
}
