//! The chunked tensor-core forward (`shaders/cuda/chunked.cu`, C = 64) for f16/bf16 storage,
//! and the per-call choice between it and the recurrent kernel ([`forward_path`]).
//!
//! Launches: the in-kernel l2norm of q and k (only with `Options::l2norm_qk`), the parallel
//! per-(chunk, v-head) pass that writes T·diag(β), P = scale·Γ⊙QKᵀ and the gate decays to a
//! workspace, and the sequential per-(V-block, v-head, unit) pass that carries the f32 state
//! in registers and writes o and the final state. A unit is a sequence; with sequence
//! parallelism ([`Segments`]) a segment of one, and two launches come first: the same
//! sequential kernel's local pass (each segment's end state from zero and its transition)
//! and the combine step (`shaders/cuda/chunk_combine.cu`, every segment's exact start
//! state). A [`ChunkPlan`] holds the chunk and unit tables and the workspace, so
//! [`launch_chunked`] only enqueues (no allocation, no host synchronisation).

use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg, sys};

use super::chunk_combine::{combine_smem, launch_chunk_combine};
use super::context::{Context, driver_error};
use super::kernels::{CHUNKED, option_flags};
use super::nvrtc::Target;
use super::recurrent::{check_tensor, to_i32};
use super::segment_window::launch_segment_window;
use super::tensor::CudaTensor;
use crate::error::{Error, Result};
use crate::problem::{CHUNK, ForwardInputs, ForwardOutputs, Problem};
use crate::tensor::{DType, TensorMeta};
use crate::wgpu_backend::{SegmentPaths, SegmentWindow};

/// Largest K the chunked pass runs (its shared memory); larger heads take the recurrent kernel.
pub const MAX_CHUNKED_KEY_DIM: usize = 128;

/// Threads per block of l2norm (`THREADS`) and prep (`PREP_THREADS`); the sequential pass
/// runs a warp per 16 columns.
const THREADS: u32 = 128;
const PREP_THREADS: u32 = 256;

/// chunked.cu's SPLIT_STATE bit: the state enters K·S and Q·S as two 16-bit parts.
const SPLIT_STATE: i32 = 1 << 8;
/// chunked.cu's LOCAL_PASS bit: the segments' local pass (end states from zero, transitions).
const LOCAL_PASS: i32 = 1 << 9;
/// chunk.cuh's PREP_FFMA bit: the prep's inverse block products on the CUDA cores instead of
/// 3xTF32 MMAs (an A/B switch while both exist: `GDN_CUDA_PREP_FFMA=1`).
const PREP_FFMA: i32 = 1 << 10;
/// chunked.cu's WGMMA_STAGES3: the wgmma main pass copies two chunks ahead (three stages)
/// instead of one ([`PlanOptions::wgmma_stages`]).
const WGMMA_STAGES3: i32 = 1 << 11;
/// The unit flags of chunked.cu and chunk_bwd_chain.cuh: the unit starts / ends its sequence.
const UNIT_FIRST: i32 = 1;
const UNIT_LAST: i32 = 2;

/// The sequential pass's V-blocks (a warp per 16 columns), smallest first.
pub const VALUE_BLOCKS: [usize; 3] = [32, 64, 128];

/// The automatic [`PlanOptions::roles`].
const AUTO_ROLES: bool = true;

/// The automatic [`PlanOptions::wgmma`], at K = 128 (the measured case; a smaller K would run
/// the same eight k16 steps on zero columns): on. On an H100, 2026-12-05, fresh processes, two
/// rounds, bf16: 16/64 × 1x32768 1.589–1.591 ms against 1.730–1.735 with mma.sync, 2/8 ×
/// 4096x8 0.232–0.234 against 0.243–0.248 (BENCHMARKS.md).
pub const AUTO_WGMMA: bool = true;

/// The automatic [`PlanOptions::wgmma_stages`] where its shared memory fits (else 2): on an
/// H100, 2026-12-05, fresh processes, two rounds, bf16: 16/64 × 1x32768 1.545–1.551 ms against
/// 1.586–1.608 with two stages, 2/8 × 4096x8 0.225–0.231 against 0.230–0.234 (BENCHMARKS.md).
pub const AUTO_WGMMA_STAGES: usize = 3;

/// The wgmma main pass's stage counts ([`PlanOptions::wgmma_stages`]).
pub const WGMMA_STAGES: [usize; 2] = [2, 3];

/// The shortest segment the automatic choice cuts (in chunks of 64 tokens): shorter ones
/// spend more on the local pass and the combine than they gain (2/8 × 32768 bf16 on the
/// H200, 2026-12-01, with the 8-column combine: segments of 16 chunks 0.663 ms, of 32
/// chunks 0.604, of 64 chunks 0.757).
const MIN_SEGMENT_CHUNKS: usize = 16;

/// How a [`ChunkPlan`] cuts sequences into segments that are scanned at once (sequence
/// parallelism, exact: each segment's start state is chained from the ones before it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Segments {
    /// Chosen from the grid: segments when v-heads × sequences × V-blocks leave most of the
    /// device idle (few heads, few long sequences), never otherwise.
    #[default]
    Auto,
    /// One unit per sequence.
    Off,
    /// Every sequence longer than this many chunks is cut into segments of this many.
    Chunks(usize),
}

/// The choices a [`ChunkPlan`] makes, for overriding them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PlanOptions {
    /// Sequence parallelism.
    pub segments: Segments,
    /// The sequential pass's V-block, one of [`VALUE_BLOCKS`]; `None`: chosen from the grid.
    pub value_block: Option<usize>,
    /// Split roles in the main pass at V-blocks 32 and 64 (`gdn_chunk_fwd{32,64}r_*`: per 16
    /// columns a state warp that runs the chain and an output warp that forms o from the state
    /// and v' it publishes; the same bits as one warp per 16 columns), or the warp pairs
    /// (`false`); `None`: chosen. V-block 128 and the split-state option keep one warp per 16
    /// columns whatever this says.
    pub roles: Option<bool>,
    /// The split-roles main pass on Hopper warpgroup MMAs (`gdn_chunk_fwd64w_*`) where the
    /// device is sm_90a, the V-block 64 and the roles on; `None`: [`AUTO_WGMMA`] where K =
    /// 128, else off. Elsewhere the mma.sync kernels run whatever this says.
    pub wgmma: Option<bool>,
    /// The wgmma main pass's pipeline depth, one of [`WGMMA_STAGES`]: 2 copies the next chunk's
    /// tiles during this one, 3 two chunks ahead (≈ 58 KiB more shared memory); `None`:
    /// [`AUTO_WGMMA_STAGES`] where the device's shared memory fits it, else 2. An error where
    /// the forced count does not fit; without the wgmma pass it changes nothing.
    pub wgmma_stages: Option<usize>,
}

/// Which kernel a forward call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ForwardPath {
    /// The token-by-token kernel: f32 arithmetic (the exact mode for f32 storage).
    Recurrent,
    /// The chunked tensor-core kernels: operands in the storage dtype, f32 accumulators.
    Chunked,
}

/// Mirrors `gdn::chunked::ChunkParams` in chunk.cuh (the chunked backward's kernels take it
/// too).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChunkParams {
    pub(crate) heads_qk: i32,
    pub(crate) heads_v: i32,
    pub(crate) key_dim: i32,
    pub(crate) value_dim: i32,
    pub(crate) group: i32,
    pub(crate) flags: i32,
    pub(crate) num_chunks: i32,
    pub(crate) scale: f32,
}

impl ChunkParams {
    /// The parameters of `problem` with its option bits and `num_chunks` chunks.
    pub(crate) fn of(problem: &Problem, num_chunks: usize) -> Self {
        let p = problem;
        ChunkParams {
            heads_qk: p.heads_qk as i32,
            heads_v: p.heads_v as i32,
            key_dim: p.key_dim as i32,
            value_dim: p.value_dim as i32,
            group: p.group() as i32,
            flags: option_flags(p),
            num_chunks: num_chunks as i32,
            scale: p.scale(),
        }
    }
}

// SAFETY: plain old data of 4-byte fields, laid out like the C struct the kernels take by value.
unsafe impl DeviceRepr for ChunkParams {}

/// chunked.cu's fixed shared-memory row strides (elements): C × K tiles (for any K ≤ 128),
/// C × C tiles, f32 C × C tiles, a warp's o staging tile.
const LDK: usize = MAX_CHUNKED_KEY_DIM + 8;
const LDC: usize = CHUNK + 8;
const LDO: usize = 16 + 8;

/// The most v-heads one prep block walks (chunk.cuh PREP_GROUP).
const PREP_GROUP: usize = 4;

/// Pass 1's shared memory (chunk.cuh PREP_TILE): k (then block sums and the raw Gram
/// products), q (then T), L, the gates of up to PREP_GROUP v-heads.
pub(crate) fn prep_smem() -> usize {
    3 * 2 * CHUNK * LDK + PREP_GROUP * 2 * CHUNK * 4
}

/// The prep's grid (chunk.cuh prep_group): per chunk, each q/k head's GVA group in parts of
/// at most PREP_GROUP v-heads (a block forms KKᵀ and QKᵀ once and walks its part's v-heads).
/// `GDN_CUDA_PREP_GROUP=n` (read once per process) caps the v-heads per block (1: a block
/// per (chunk, v-head), as before), for an A/B.
pub(crate) fn prep_grid(p: &Problem, num_chunks: usize) -> (u32, u32, u32) {
    static CAP: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cap = *CAP.get_or_init(|| {
        std::env::var("GDN_CUDA_PREP_GROUP")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(PREP_GROUP)
            .clamp(1, PREP_GROUP)
    });
    let group = p.group();
    let per = (1..=cap.min(group))
        .rev()
        .find(|d| group.is_multiple_of(*d))
        .unwrap_or(1);
    (num_chunks as u32, (p.heads_qk * (group / per)) as u32, 1)
}

/// Warps per 16 state columns in the sequential pass at V-block `bv` (chunked.cu's KS): a
/// pair splits the state's K rows (half the chain's MMAs each, the partial K·S and Q·S summed
/// through shared memory) at 32 and 64; one warp at 128 (whose pairs would not fit).
fn warps_per_columns(bv: usize) -> usize {
    if bv <= 64 { 2 } else { 1 }
}

/// Threads per block of the sequential pass at V-block `bv`.
fn fwd_threads(bv: usize) -> u32 {
    (warps_per_columns(bv) * bv / 16 * 32) as u32
}

/// chunked.cu's FwdLayout: per stage k, V's block, T·diag(β), the decays, then q and P (main
/// pass only); two stages, then per warp pair three f32 C × 16 partial sums (KS = 2) or per
/// warp the main pass's o staging tile (KS = 1).
fn fwd_smem(bv: usize, local: bool) -> usize {
    let c = CHUNK;
    let local_stage = 2 * c * LDK + 2 * c * (bv + 8) + 2 * c * LDC + 4 * 2 * c;
    let stage = if local {
        local_stage
    } else {
        local_stage + 2 * c * LDK + 2 * c * LDC
    };
    let after = if warps_per_columns(bv) == 2 {
        (bv / 16) * 3 * 4 * c * 16
    } else if local {
        0
    } else {
        (bv / 16) * c * LDO * 2
    };
    2 * stage + after
}

/// chunked.cu's RolesLayout (`fwd_roles`, V-blocks 32 and 64, main pass): the two main
/// stages, then per 16 columns the state warp's published Sᵀ and v'ᵀ fragments and the output
/// warp's o staging tile.
fn roles_smem(bv: usize) -> usize {
    let c = CHUNK;
    let stage = 2 * 2 * c * LDK + 2 * c * (bv + 8) + 2 * 2 * c * LDC + 4 * 2 * c;
    let group = 16 * 32 * (MAX_CHUNKED_KEY_DIM / 16) + 16 * 32 * (c / 16) + 2 * c * LDO;
    2 * stage + (bv / 16) * group
}

/// chunked.cu's WgmmaLayout (`fwd_wgmma`, V-block 64): per stage k and q (128B-swizzled, 128
/// keys), T·diag(β) and P (swizzled), V's padded block and the decays, rounded up to 1024
/// bytes; two stages, the four column groups' fragments and o staging tiles, and 1024 bytes
/// of slack for aligning the stages; `stages` 2 or 3 (WGMMA_STAGES3, [`WGMMA_STAGES`]).
fn wgmma_smem(stages: usize) -> usize {
    let c = CHUNK;
    let half = c * 128;
    let stage = (6 * half + 2 * c * (64 + 8) + 4 * 2 * c).div_ceil(1024) * 1024;
    let group = 16 * 32 * (MAX_CHUNKED_KEY_DIM / 16) + 16 * 32 * (c / 16) + 2 * c * LDO;
    stages * stage + 4 * group + 1024
}

pub(crate) fn max_shared_optin(ctx: &Context) -> Result<usize> {
    let attr = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN;
    ctx.cuda_context()
        .attribute(attr)
        .map(|x| x.max(0) as usize)
        .map_err(|e| driver_error("shared memory limit", e))
}

fn device_attribute(ctx: &Context, attr: sys::CUdevice_attribute, what: &str) -> Result<usize> {
    ctx.cuda_context()
        .attribute(attr)
        .map(|x| x.max(0) as usize)
        .map_err(|e| driver_error(what, e))
}

/// Whether the chunked passes fit the device's shared memory at all (prep, and the sequential
/// pass at its smallest V-block).
fn chunked_fits(ctx: &Context) -> Result<bool> {
    let limit = max_shared_optin(ctx)?;
    Ok(prep_smem() <= limit && fwd_smem(VALUE_BLOCKS[0], false) <= limit)
}

/// The kernel [`forward_into`](super::forward_into) runs for `problem` with q, k, v stored as
/// `dtype`: the chunked kernels for f16/bf16 with K ≤ 128 where the device's shared memory
/// holds them, the recurrent kernel otherwise (f32 storage keeps the exact f32 mode). Every
/// option, GVA and varlen run on either path.
pub fn forward_path(ctx: &Context, problem: &Problem, dtype: DType) -> Result<ForwardPath> {
    let chunked =
        dtype != DType::F32 && problem.key_dim <= MAX_CHUNKED_KEY_DIM && chunked_fits(ctx)?;
    Ok(if chunked {
        ForwardPath::Chunked
    } else {
        ForwardPath::Recurrent
    })
}

/// Sequence parallelism's segment length from `segments`: `auto` the rule's choice (`None`:
/// whole sequences), an explicit length only where the combine fits the device's shared
/// memory. `name` names the option in errors.
pub(crate) fn resolve_segments(
    segments: Segments,
    auto: impl FnOnce() -> Option<usize>,
    combine_fits: bool,
    key_dim: usize,
    name: &str,
) -> Result<Option<usize>> {
    match segments {
        Segments::Off => Ok(None),
        Segments::Auto => Ok(auto().filter(|_| combine_fits)),
        Segments::Chunks(0) => Err(Error::value(name, "at least 1 chunk", 0)),
        Segments::Chunks(_) if !combine_fits => Err(Error::unsupported(
            name,
            format!("K = {key_dim} on this device (its shared memory)"),
        )),
        Segments::Chunks(n) => Ok(Some(n)),
    }
}

/// The units the chunked kernels walk, forward and backward alike: each sequence's chunks cut
/// into segments of `segment_chunks` (`None`: whole sequences; an empty sequence is one empty
/// unit).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct UnitTable {
    /// (first chunk, end chunk, sequence, UNIT_FIRST | UNIT_LAST) per unit.
    pub units: Vec<i32>,
    /// Each sequence's first unit, then the number of units.
    pub seq_units: Vec<i32>,
    pub num_units: usize,
    /// `segment_chunks` where it cut a sequence, else `None`.
    pub segment_chunks: Option<usize>,
}

impl UnitTable {
    /// Cut sequences of `seq_chunks` chunks each (kernels index units by a 16-bit grid
    /// coordinate: at most 65535 units, else an error naming `name`).
    pub(crate) fn cut(
        seq_chunks: &[usize],
        segment_chunks: Option<usize>,
        name: &str,
    ) -> Result<Self> {
        let mut units = Vec::new();
        let mut seq_units = vec![0i32];
        let mut first = 0usize;
        let per = segment_chunks.unwrap_or(usize::MAX).max(1);
        for (n, &count) in seq_chunks.iter().enumerate() {
            let end = first + count;
            let mut a = first;
            loop {
                let b = a.saturating_add(per).min(end);
                let flags =
                    if a == first { UNIT_FIRST } else { 0 } | if b == end { UNIT_LAST } else { 0 };
                units.extend([a as i32, b as i32, n as i32, flags]);
                if b == end {
                    break;
                }
                a = b;
            }
            seq_units.push(to_i32("units", units.len() / 4)?);
            first = end;
        }
        let num_units = units.len() / 4;
        if num_units > 65535 {
            return Err(Error::unsupported(
                name,
                format!("{num_units} units on the cuda backend (at most 65535: longer segments)"),
            ));
        }
        let segmented = num_units > seq_chunks.len();
        Ok(Self {
            units,
            seq_units,
            num_units,
            segment_chunks: segment_chunks.filter(|_| segmented),
        })
    }
}

fn alloc(ctx: &Context, name: &str, bytes: usize) -> Result<CudaSlice<u8>> {
    // A zero-byte allocation is refused by the driver; one spare byte is never read.
    ctx.stream()
        .alloc_zeros::<u8>(bytes.max(1))
        .map_err(|e| driver_error(&format!("allocation of {name}"), e))
}

/// The device's numbers the plan's choices depend on.
pub(crate) struct DeviceLimits {
    /// Shared memory one block may opt in to.
    pub(crate) smem_per_block: usize,
    pub(crate) smem_per_sm: usize,
    pub(crate) sms: usize,
}

impl DeviceLimits {
    pub(crate) fn of(ctx: &Context) -> Result<Self> {
        use sys::CUdevice_attribute as A;
        Ok(DeviceLimits {
            smem_per_block: max_shared_optin(ctx)?,
            smem_per_sm: device_attribute(
                ctx,
                A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
                "shared memory per multiprocessor",
            )?,
            sms: device_attribute(
                ctx,
                A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                "multiprocessor count",
            )?
            .max(1),
        })
    }

    /// Blocks of `smem` bytes resident on the whole device at once (at least one per SM).
    pub(crate) fn resident(&self, smem: usize) -> usize {
        self.sms * (self.smem_per_sm / (smem + 1024)).max(1)
    }
}

/// The automatic segment length. Exact transitions: only when 32-wide V-blocks give at most
/// one block per SM (one warp per scheduler: 16/32 heads × 1×32768 bf16 on the H200, exact,
/// 2.283 ms whole, 1.901 ms in 4 segments at V-block 128; × 1×8192 0.589 → 0.555), then about
/// one wave of the main pass at V-block 128 (2/8 × 32768: segments of 32 chunks, 0.604 ms
/// against 0.757 at 64 chunks). With the gate-driven window (whose local pass is a warm-up per
/// pair) the segments aim at one wave of the main pass itself: of the wgmma pass at V-block 64
/// where it runs (`wgmma_main`; H100, 2026-12-06, bf16: 2/8 × 1×32768 0.250 ms in segments of
/// 64 chunks against 0.273 in 32 at V-block 128; 16/32 × 1×32768 0.841–0.865 in 2 segments
/// against 0.907 in 4 at 128), else at V-block 128 (2/8: 0.362 ms windowed in segments of 32
/// against 0.427 at 64 on the H200, 2026-12-01), cutting only where those blocks leave some SM
/// idle.
fn auto_segment_chunks(
    limits: &DeviceLimits,
    problem: &Problem,
    seq_chunks: &[usize],
    windowed: bool,
    wgmma_main: bool,
) -> Option<usize> {
    let p = problem;
    let n_seq = seq_chunks.len();
    let main_block = if windowed && wgmma_main { 64 } else { 128 };
    let blocks_per_unit = p.heads_v * p.value_dim.div_ceil(main_block);
    let idle = if windowed {
        blocks_per_unit * n_seq < limits.sms
    } else {
        p.heads_v * n_seq * p.value_dim.div_ceil(32) <= limits.sms
    };
    if !idle {
        return None;
    }
    let units = (limits.sms / blocks_per_unit).max(1);
    let total: usize = seq_chunks.iter().sum();
    let n = total.div_ceil(units).max(MIN_SEGMENT_CHUNKS);
    seq_chunks.iter().any(|&c| c > n).then_some(n)
}

/// The automatic V-block: the smallest whose grid is resident at once (more, shorter blocks
/// for a latency-bound scan: warp pairs at 32 and 64), else 64 where the wgmma main pass runs
/// and no sequence is cut, or the window cut them for it (`wgmma_64`: on the H200,
/// 2026-12-06, bf16, 16/64 × 4096x8 1.55 ms at 64 against 1.62 at 128, 16/32 × 4096x8 0.831
/// against 0.868; with exact segments, cut for 128-wide blocks, 64 lost: 16/32 × 1x32768 1.69
/// against 1.49), else the largest (fewest
/// copies of the shared tiles and of the pairs' duplicated X and v' work: 16/64 heads × 4096x8
/// on the H200 took 2.46 ms at 128 against 3.13 at 64 with pairs).
fn auto_value_block(
    limits: &DeviceLimits,
    problem: &Problem,
    units: usize,
    wgmma_64: bool,
) -> Option<usize> {
    let p = problem;
    let fits: Vec<usize> = VALUE_BLOCKS
        .into_iter()
        .filter(|&bv| fwd_smem(bv, false) <= limits.smem_per_block)
        .collect();
    fits.iter()
        .copied()
        .find(|&bv| {
            let blocks = p.value_dim.div_ceil(bv) * p.heads_v * units;
            blocks <= limits.resident(fwd_smem(bv, false))
        })
        .or_else(|| (wgmma_64 && fits.contains(&64)).then_some(64))
        .or(fits.last().copied())
}

/// The chunk and unit tables and the workspace of one problem shape and dtype: reusable
/// across calls.
#[derive(Debug)]
pub struct ChunkPlan {
    problem: Problem,
    dtype: DType,
    value_block: usize,
    num_chunks: usize,
    /// (first token, length) per chunk; chunks never cross a sequence boundary.
    chunks: CudaSlice<i32>,
    /// (first chunk, end chunk, sequence, UNIT_FIRST | UNIT_LAST) per unit.
    units: CudaSlice<i32>,
    num_units: usize,
    /// Each sequence's first unit, N + 1 entries.
    seq_units: CudaSlice<i32>,
    /// The segment length where some sequence was cut.
    segment_chunks: Option<usize>,
    /// γ_i = e^{G_i}, then γ_C/γ_i, per chunk and v-head (2 × C f32).
    ws_f: CudaSlice<u8>,
    /// T·diag(β) per chunk and v-head (C × C, storage dtype).
    ws_a: CudaSlice<u8>,
    ws_p: CudaSlice<u8>,
    /// Sequence parallelism: per unit [E | M] (K × (V + K) f32) and the start state (K × V).
    segment_states: Option<(CudaSlice<u8>, CudaSlice<u8>)>,
    /// The gate-driven window (segmented plans only; `None`: exact only).
    segment_window: Option<SegmentWindow>,
    /// Per (unit, v-head) the window's warm-up in chunks, −1 exact (segment_window.cu);
    /// allocated with the segment states.
    warmup: Option<CudaSlice<i32>>,
    /// Whether the last launch through the plan ran the window (what `warmup` holds).
    last_windowed: std::sync::atomic::AtomicBool,
    /// l2-normalized q and k (only with `Options::l2norm_qk`).
    normalized: Option<(CudaSlice<u8>, CudaSlice<u8>)>,
    split_state: bool,
    /// The prep's inverse on the CUDA cores (PREP_FFMA, `GDN_CUDA_PREP_FFMA=1`).
    prep_ffma: bool,
    /// The wgmma main pass's stages, one of [`WGMMA_STAGES`] (3: WGMMA_STAGES3).
    wgmma_stages: usize,
    /// The main pass by `gdn_chunk_fwd{32,64}r_*` (a state warp and an output warp per 16
    /// columns) where the V-block is 32 or 64 ([`PlanOptions::roles`]).
    roles: bool,
    /// The roles' main pass by `gdn_chunk_fwd64w_*` where it can run ([`PlanOptions::wgmma`]):
    /// already false off sm_90a.
    wgmma: bool,
}

impl ChunkPlan {
    /// Upload the chunk table and allocate the workspace (enqueued on the context's stream),
    /// with the automatic choices. An error where [`forward_path`] is not
    /// [`ForwardPath::Chunked`].
    pub fn new(ctx: &Context, problem: &Problem, dtype: DType) -> Result<Self> {
        Self::with_options(ctx, problem, dtype, PlanOptions::default())
    }

    /// [`Self::new`] with the choices in `options` overridden; a V-block the device cannot
    /// fit, or segments that need more shared memory or more units than the device allows,
    /// is a typed error. The gate-driven window is the context's
    /// ([`Context::segment_window`]).
    pub fn with_options(
        ctx: &Context,
        problem: &Problem,
        dtype: DType,
        options: PlanOptions,
    ) -> Result<Self> {
        Self::with_window(ctx, problem, dtype, options, ctx.segment_window())
    }

    /// [`Self::with_options`] with the gate-driven window `window` (`None`: exact only)
    /// instead of the context's; the automatic segments are chosen for it (with the window
    /// they are cut wherever 128-wide V-blocks leave SMs idle).
    pub fn with_window(
        ctx: &Context,
        problem: &Problem,
        dtype: DType,
        options: PlanOptions,
        window: Option<SegmentWindow>,
    ) -> Result<Self> {
        if forward_path(ctx, problem, dtype)? != ForwardPath::Chunked {
            return Err(Error::unsupported(
                "chunked cuda forward",
                format!(
                    "{dtype} storage with K = {} on this device (f16/bf16 with K ≤ \
                     {MAX_CHUNKED_KEY_DIM} only; the recurrent kernel runs the rest)",
                    problem.key_dim
                ),
            ));
        }
        let p = problem;
        for (name, x) in [
            ("heads_v (HV)", p.heads_v),
            ("sequences (N)", p.num_sequences()),
        ] {
            if x > 65535 {
                return Err(Error::unsupported(
                    name,
                    format!("{x} on the cuda backend (at most 65535)"),
                ));
            }
        }
        to_i32("tokens (B·T)", p.total_tokens())?;
        let limits = DeviceLimits::of(ctx)?;

        let mut table = Vec::new();
        let mut seq_chunks = Vec::new();
        for s in p.sequences() {
            for c in (s.start..s.end).step_by(CHUNK) {
                table.push(c as i32);
                table.push(((c + CHUNK).min(s.end) - c) as i32);
            }
            seq_chunks.push((s.end - s.start).div_ceil(CHUNK));
        }
        let num_chunks = table.len() / 2;
        to_i32("chunks", num_chunks)?;

        let wgmma = options
            .wgmma
            .unwrap_or(AUTO_WGMMA && p.key_dim == MAX_CHUNKED_KEY_DIM)
            && ctx.target() == Target::Sm90a;
        let roles = options.roles.unwrap_or(AUTO_ROLES);
        // Whether the automatic V-block may be 64 for the wgmma main pass.
        let wgmma_main = wgmma
            && roles
            && options.value_block.is_none_or(|bv| bv == 64)
            && wgmma_smem(WGMMA_STAGES[0]) <= limits.smem_per_block
            && fwd_smem(64, false) <= limits.smem_per_block;
        let combine_fits = combine_smem(p.key_dim) <= limits.smem_per_block;
        let segment_chunks = resolve_segments(
            options.segments,
            || auto_segment_chunks(&limits, p, &seq_chunks, window.is_some(), wgmma_main),
            combine_fits,
            p.key_dim,
            "segments",
        )?;
        let UnitTable {
            units,
            seq_units,
            num_units,
            segment_chunks,
        } = UnitTable::cut(&seq_chunks, segment_chunks, "segments")?;
        let segmented = segment_chunks.is_some();

        let value_block = match options.value_block {
            // Exact segments are cut for 128-wide blocks (64 lost there); windowed ones for
            // the wgmma pass where it runs (auto_segment_chunks).
            None => auto_value_block(
                &limits,
                p,
                num_units,
                wgmma_main && (!segmented || window.is_some()),
            )
            .unwrap_or(VALUE_BLOCKS[0]),
            Some(bv) => {
                if !VALUE_BLOCKS.contains(&bv) || fwd_smem(bv, false) > limits.smem_per_block {
                    return Err(Error::value(
                        "value_block",
                        format!("one of {VALUE_BLOCKS:?} that this device's shared memory fits"),
                        bv,
                    ));
                }
                bv
            }
        };

        let wgmma_stages = match options.wgmma_stages {
            None => WGMMA_STAGES
                .into_iter()
                .rev()
                .filter(|&n| n <= AUTO_WGMMA_STAGES)
                .find(|&n| wgmma_smem(n) <= limits.smem_per_block)
                .unwrap_or(WGMMA_STAGES[0]),
            Some(n) => {
                if !WGMMA_STAGES.contains(&n) || wgmma_smem(n) > limits.smem_per_block {
                    return Err(Error::value(
                        "wgmma_stages",
                        format!("one of {WGMMA_STAGES:?} that this device's shared memory fits"),
                        n,
                    ));
                }
                n
            }
        };

        if table.is_empty() {
            table.push(0);
        }
        let stream = ctx.stream();
        let upload = |what: &str, data: &[i32]| {
            stream
                .clone_htod(data)
                .map_err(|e| driver_error(&format!("upload of the {what}"), e))
        };
        let chunks = upload("chunk table", &table)?;
        let units_dev = upload("unit table", &units)?;
        let seq_units = upload("sequence units", &seq_units)?;
        let s = dtype.size();
        let (k, v, hv) = (p.key_dim, p.value_dim, p.heads_v);
        let rows = num_chunks * hv * CHUNK;
        let normalized = if p.options.l2norm_qk {
            let bytes = p.total_tokens() * p.heads_qk * k * s;
            Some((alloc(ctx, "q̂", bytes)?, alloc(ctx, "k̂", bytes)?))
        } else {
            None
        };
        let segment_states = if segmented {
            Some((
                alloc(ctx, "segment end states", num_units * hv * k * (v + k) * 4)?,
                alloc(ctx, "segment start states", num_units * hv * k * v * 4)?,
            ))
        } else {
            None
        };
        let warmup = if segmented {
            Some(
                stream
                    .alloc_zeros::<i32>(num_units * hv)
                    .map_err(|e| driver_error("allocation of the window table", e))?,
            )
        } else {
            None
        };
        Ok(ChunkPlan {
            problem: p.clone(),
            dtype,
            value_block,
            num_chunks,
            chunks,
            units: units_dev,
            num_units,
            seq_units,
            segment_chunks,
            ws_f: alloc(ctx, "decay workspace", rows * 2 * 4)?,
            ws_a: alloc(ctx, "T·diag(β) workspace", rows * CHUNK * s)?,
            ws_p: alloc(ctx, "P workspace", rows * CHUNK * s)?,
            segment_states,
            segment_window: window,
            warmup,
            last_windowed: std::sync::atomic::AtomicBool::new(false),
            normalized,
            split_state: false,
            prep_ffma: std::env::var("GDN_CUDA_PREP_FFMA").is_ok_and(|v| v.trim() == "1"),
            wgmma_stages,
            roles,
            wgmma,
        })
    }

    /// The same plan with the state entering K·S and Q·S as two 16-bit parts (`true`: no
    /// rounding of the state, twice those MMAs) or rounded once per chunk to the storage
    /// dtype (`false`, the default, as FLA: on the H200 both gave the same rel-L2 against the
    /// recurrent kernel at 1×32768, o 3.61e-3, state 2.25e-3, with the earlier kernel).
    pub fn with_split_state(self, split_state: bool) -> Self {
        ChunkPlan {
            split_state,
            ..self
        }
    }

    /// Sequence parallelism's gate-driven window for the launches through this plan
    /// (docs/sequence-parallelism.md; `None`: exact only, the default unless the context has
    /// one, [`Context::set_segment_window`]). Without segments it changes nothing; the
    /// automatic segments were chosen for the window the plan was made with
    /// ([`Self::with_window`]).
    pub fn set_segment_window(&mut self, window: Option<SegmentWindow>) {
        self.segment_window = window;
    }

    /// The gate-driven window the plan's segmented launches run.
    pub fn segment_window(&self) -> Option<SegmentWindow> {
        self.segment_window
    }

    /// Which path the (segment, v-head) pairs of the last launch through this plan took
    /// (waits for the stream and reads the window's table back; `None` without segments).
    /// Without the window every pair is exact.
    pub fn segment_paths(&self, ctx: &Context) -> Result<Option<SegmentPaths>> {
        let Some(warmup) = &self.warmup else {
            return Ok(None);
        };
        let pairs = self.num_units * self.problem.heads_v;
        if !self
            .last_windowed
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return Ok(Some(SegmentPaths {
                windowed: 0,
                exact: pairs,
                longest_warmup_chunks: 0,
            }));
        }
        let table = ctx
            .stream()
            .clone_dtoh(warmup)
            .map_err(|e| driver_error("read-back of the window table", e))?;
        let windowed: Vec<usize> = table
            .iter()
            .filter(|&&n| n >= 0)
            .map(|&n| n as usize)
            .collect();
        Ok(Some(SegmentPaths {
            windowed: windowed.len(),
            exact: table.len() - windowed.len(),
            longest_warmup_chunks: windowed.into_iter().max().unwrap_or(0),
        }))
    }

    /// Whether the state enters the MMAs as two 16-bit parts.
    pub fn split_state(&self) -> bool {
        self.split_state
    }

    /// Whether the main pass runs split roles (`gdn_chunk_fwd{32,64}r_*`).
    pub fn roles(&self) -> bool {
        self.roles && self.value_block <= 64 && !self.split_state
    }

    /// Whether the main pass runs on warpgroup MMAs (`gdn_chunk_fwd64w_*`).
    pub fn wgmma(&self) -> bool {
        self.wgmma && self.roles() && self.value_block == 64
    }

    /// The wgmma main pass's stages ([`PlanOptions::wgmma_stages`]; meaningful where
    /// [`Self::wgmma`]).
    pub fn wgmma_stages(&self) -> usize {
        self.wgmma_stages
    }

    /// The V-block width of the sequential pass.
    pub fn value_block(&self) -> usize {
        self.value_block
    }

    /// The segment length (in chunks of 64 tokens) where sequence parallelism cut some
    /// sequence; `None` when every sequence is scanned whole.
    pub fn segment_chunks(&self) -> Option<usize> {
        self.segment_chunks
    }

    /// Bytes of device memory the plan holds.
    pub fn workspace_bytes(&self) -> usize {
        let pair = |x: &Option<(CudaSlice<u8>, CudaSlice<u8>)>| {
            x.as_ref().map_or(0, |(a, b)| a.len() + b.len())
        };
        [&self.ws_f, &self.ws_a, &self.ws_p]
            .iter()
            .map(|b| b.len())
            .sum::<usize>()
            + pair(&self.segment_states)
            + pair(&self.normalized)
    }
}

/// Which passes [`launch_chunked_passes`] enqueues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkedPasses {
    /// Everything: o and the final state.
    All,
    /// The parallel passes only (l2norm, per-chunk T·diag(β), P): for timing them apart.
    Parallel,
}

/// Enqueue the chunked forward with `plan` (made for this problem and dtype): o and the final
/// state into `outputs`. No allocation, no host synchronisation.
pub fn launch_chunked(
    ctx: &Context,
    problem: &Problem,
    plan: &ChunkPlan,
    inputs: &ForwardInputs<&CudaTensor>,
    outputs: &ForwardOutputs<&CudaTensor>,
) -> Result<()> {
    launch_chunked_passes(ctx, problem, plan, inputs, outputs, ChunkedPasses::All)
}

/// [`launch_chunked`], or only its parallel passes.
pub fn launch_chunked_passes(
    ctx: &Context,
    problem: &Problem,
    plan: &ChunkPlan,
    inputs: &ForwardInputs<&CudaTensor>,
    outputs: &ForwardOutputs<&CudaTensor>,
    passes: ChunkedPasses,
) -> Result<()> {
    let p = problem;
    p.check_inputs(inputs, &[DType::F16, DType::BF16])?;
    let dtype = inputs.q.dtype();
    if plan.problem != *p || plan.dtype != dtype {
        return Err(Error::value(
            "chunk plan",
            format!("a plan for this problem with {dtype} storage"),
            format!("{:?} with {}", plan.problem, plan.dtype),
        ));
    }
    check_tensor("o", outputs.o, &p.v_shape(), dtype)?;
    check_tensor(
        "final_state",
        outputs.final_state,
        &p.state_shape(),
        DType::F32,
    )?;
    if let Some(h) = inputs.initial_state {
        check_tensor("initial_state", h, &p.state_shape(), DType::F32)?;
    }
    let params = ChunkParams::of(p, plan.num_chunks);
    let params = ChunkParams {
        flags: params.flags
            | if plan.split_state { SPLIT_STATE } else { 0 }
            | if plan.prep_ffma { PREP_FFMA } else { 0 }
            | if plan.wgmma_stages == 3 {
                WGMMA_STAGES3
            } else {
                0
            },
        ..params
    };
    let suffix = match dtype {
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::F32 => {
            return Err(Error::unsupported("chunked cuda forward", "f32 storage"));
        }
    };
    let stream = ctx.stream();
    let null: u64 = 0;
    let launch_err = |name: &str, e| driver_error(&format!("launch of {name}"), e);

    // l2norm: q̂, k̂ replace q, k for both passes.
    let (q, k) = match &plan.normalized {
        Some((qn, kn)) => {
            launch_l2norm(ctx, p, inputs, qn, kn)?;
            (qn, kn)
        }
        None => (inputs.q.buffer(), inputs.k.buffer()),
    };

    if plan.num_chunks > 0 {
        let name = format!("gdn_chunk_prep_{suffix}");
        let smem = prep_smem();
        let func = ctx.function_with_smem(&CHUNKED, &name, smem)?;
        let cfg = LaunchConfig {
            grid_dim: prep_grid(p, plan.num_chunks),
            block_dim: (PREP_THREADS, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let mut l = stream.launch_builder(&func);
        l.arg(&params)
            .arg(&plan.chunks)
            .arg(q)
            .arg(k)
            .arg(inputs.g.buffer())
            .arg(inputs.beta.buffer());
        match inputs.a_log {
            Some(t) => l.arg(t.buffer()),
            None => l.arg(&null),
        };
        match inputs.dt_bias {
            Some(t) => l.arg(t.buffer()),
            None => l.arg(&null),
        };
        l.arg(&plan.ws_f).arg(&plan.ws_a).arg(&plan.ws_p);
        // SAFETY: matches gdn_chunk_prep_* in chunked.cu; inputs were checked against the
        // problem, the workspace was sized for it by ChunkPlan::new.
        unsafe { l.launch(cfg) }.map_err(|e| launch_err(&name, e))?;
    }

    if passes == ChunkedPasses::Parallel || plan.num_units == 0 {
        return Ok(());
    }
    // The gate-driven window's table, written after the prep (it reads the decays).
    let window_table = match (plan.segment_window, &plan.warmup) {
        (Some(window), Some(warmup)) => {
            launch_segment_window(
                ctx,
                window,
                p.heads_v,
                plan.num_units,
                &plan.units,
                &plan.ws_f,
                warmup,
            )?;
            Some(warmup)
        }
        _ => None,
    };
    plan.last_windowed
        .store(window_table.is_some(), std::sync::atomic::Ordering::Relaxed);
    let bv = plan.value_block;
    let roles = plan.roles();
    let wgmma = plan.wgmma();
    // The sequential kernel, in the local pass (`local`) or the main pass.
    let sequential = |local: bool| -> Result<()> {
        let roles = roles && !local;
        let wgmma = wgmma && !local;
        let name = if wgmma {
            format!("gdn_chunk_fwd{bv}w_{suffix}")
        } else if roles {
            format!("gdn_chunk_fwd{bv}r_{suffix}")
        } else {
            format!("gdn_chunk_fwd{bv}_{suffix}")
        };
        let smem = if wgmma {
            wgmma_smem(plan.wgmma_stages)
        } else if roles {
            roles_smem(bv)
        } else {
            fwd_smem(bv, local)
        };
        let func = ctx.function_with_smem(&CHUNKED, &name, smem)?;
        let column_blocks =
            p.value_dim.div_ceil(bv) + if local { p.key_dim.div_ceil(bv) } else { 0 };
        let cfg = LaunchConfig {
            grid_dim: (
                column_blocks as u32,
                p.heads_v as u32,
                plan.num_units as u32,
            ),
            block_dim: (
                if roles {
                    4 * bv as u32
                } else {
                    fwd_threads(bv)
                },
                1,
                1,
            ),
            shared_mem_bytes: smem as u32,
        };
        let params = ChunkParams {
            flags: params.flags | if local { LOCAL_PASS } else { 0 },
            ..params
        };
        let mut l = stream.launch_builder(&func);
        l.arg(&params)
            .arg(&plan.chunks)
            .arg(&plan.units)
            .arg(q)
            .arg(k)
            .arg(inputs.v.buffer())
            .arg(&plan.ws_f)
            .arg(&plan.ws_a)
            .arg(&plan.ws_p);
        match inputs.initial_state {
            Some(t) => l.arg(t.buffer()),
            None => l.arg(&null),
        };
        match &plan.segment_states {
            Some((_, start)) => l.arg(start),
            None => l.arg(&null),
        };
        l.arg(outputs.o.buffer()).arg(outputs.final_state.buffer());
        if !roles {
            match &plan.segment_states {
                Some((end, _)) => l.arg(end),
                None => l.arg(&null),
            };
            match window_table {
                Some(w) => l.arg(w),
                None => l.arg(&null),
            };
        }
        // SAFETY: matches gdn_chunk_fwd* in chunked.cu; o, the states and the workspace were
        // checked or sized for this problem, the unit table indexes only the chunk table.
        unsafe { l.launch(cfg) }.map_err(|e| launch_err(&name, e))?;
        Ok(())
    };
    if let Some((end, start)) = &plan.segment_states {
        sequential(true)?;
        launch_chunk_combine(
            ctx,
            p,
            &plan.seq_units,
            window_table,
            inputs.initial_state,
            end,
            start,
        )?;
    }
    sequential(false)
}

/// Enqueue the in-kernel l2norm (`gdn_l2norm_*` in chunked.cu): q̂, k̂ rounded to the storage
/// dtype of q and k into `qn`, `kn` (each `B·T·H·K` elements of that dtype).
pub(crate) fn launch_l2norm(
    ctx: &Context,
    problem: &Problem,
    inputs: &ForwardInputs<&CudaTensor>,
    qn: &CudaSlice<u8>,
    kn: &CudaSlice<u8>,
) -> Result<()> {
    let p = problem;
    let suffix = match inputs.q.dtype() {
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::F32 => return Err(Error::unsupported("chunked l2norm", "f32 storage")),
    };
    let rows = p.total_tokens() * p.heads_qk;
    if rows == 0 {
        return Ok(());
    }
    let name = format!("gdn_l2norm_{suffix}");
    let func = ctx.function(&CHUNKED, &name)?;
    let cfg = LaunchConfig {
        grid_dim: (rows.div_ceil(4) as u32, 2, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let (rows, key_dim) = (rows as i32, p.key_dim as i32);
    let mut l = ctx.stream().launch_builder(&func);
    l.arg(&rows)
        .arg(&key_dim)
        .arg(inputs.q.buffer())
        .arg(inputs.k.buffer())
        .arg(qn)
        .arg(kn);
    // SAFETY: matches gdn_l2norm_* in chunked.cu; q, k (checked against the problem by the
    // callers) and q̂, k̂ hold rows·K elements of the storage dtype.
    unsafe { l.launch(cfg) }.map_err(|e| driver_error(&format!("launch of {name}"), e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::Options;

    /// The H200's numbers (132 SMs, 228 KiB of shared memory per SM, 227 KiB per block).
    fn h200() -> DeviceLimits {
        DeviceLimits {
            smem_per_block: 232_448,
            smem_per_sm: 233_472,
            sms: 132,
        }
    }

    fn chunks_of(problem: &Problem) -> Vec<usize> {
        problem
            .sequences()
            .iter()
            .map(|s| (s.end - s.start).div_ceil(CHUNK))
            .collect()
    }

    #[test]
    fn automatic_segments_aim_at_one_wave_at_value_block_128() {
        let d = Options::default();
        let shape = |heads: (usize, usize), b: usize, t: usize| {
            Problem::new(b, t, heads.0, heads.1, 128, 128, None, d).unwrap()
        };
        let auto = |p: &Problem, windowed: bool| {
            auto_segment_chunks(&h200(), p, &chunks_of(p), windowed, false)
        };
        // 2/8 × 32768: 16 segments of 32 chunks, exact or windowed; × 8192: the minimum, 16.
        let few = shape((2, 8), 1, 32768);
        assert_eq!(auto(&few, false), Some(32));
        assert_eq!(auto(&few, true), Some(32));
        assert_eq!(
            auto(&shape((2, 8), 1, 8192), false),
            Some(MIN_SEGMENT_CHUNKS)
        );
        // 16/32 × one sequence (128 blocks at V-block 32: one warp per scheduler): four
        // segments, V-block 128.
        assert_eq!(auto(&shape((16, 32), 1, 32768), false), Some(128));
        assert_eq!(auto(&shape((16, 32), 1, 8192), false), Some(32));
        // 16/64 × 32768: whole when exact, two windowed segments.
        let many = shape((16, 64), 1, 32768);
        assert_eq!(auto(&many, false), None);
        assert_eq!(auto(&many, true), Some(256));
        // Batches that fill the device stay whole either way.
        assert_eq!(auto(&shape((16, 64), 8, 4096), true), None);
        assert_eq!(auto(&shape((2, 8), 8, 4096), false), None);
        // Sequences no longer than a segment are never cut.
        assert_eq!(auto(&shape((2, 8), 1, 1024), false), None);
    }

    #[test]
    fn windowed_segments_aim_at_one_wave_of_the_wgmma_pass() {
        let d = Options::default();
        let shape = |heads: (usize, usize), b: usize, t: usize| {
            Problem::new(b, t, heads.0, heads.1, 128, 128, None, d).unwrap()
        };
        let limits = h200();
        // (segment length, V-block) as the plan picks them with the wgmma main pass.
        let pick = |p: &Problem, windowed: bool| {
            let chunks = chunks_of(p);
            let n = auto_segment_chunks(&limits, p, &chunks, windowed, true);
            let units = UnitTable::cut(&chunks, n, "segments").unwrap().num_units;
            let wgmma_64 = n.is_none() || windowed;
            (n, auto_value_block(&limits, p, units, wgmma_64))
        };
        // 2/8 × 32768: 8 windowed segments of 64 chunks, 128 blocks at V-block 64; exact
        // segments stay cut for V-block 128.
        assert_eq!(pick(&shape((2, 8), 1, 32768), true), (Some(64), Some(64)));
        assert_eq!(pick(&shape((2, 8), 1, 32768), false), (Some(32), Some(128)));
        // 16/32 × 32768: two windowed segments; 16/64 × 32768 already fills a wave whole.
        assert_eq!(
            pick(&shape((16, 32), 1, 32768), true),
            (Some(256), Some(64))
        );
        assert_eq!(pick(&shape((16, 64), 1, 32768), true), (None, Some(64)));
        assert_eq!(pick(&shape((16, 64), 8, 4096), false), (None, Some(64)));
    }

    #[test]
    fn units_cut_each_sequence_and_flag_its_ends() {
        const BOTH: i32 = UNIT_FIRST | UNIT_LAST;
        // Sequences of 5, 0 and 2 chunks in segments of 2: 3 + 1 (empty) + 1 units.
        let t = UnitTable::cut(&[5, 0, 2], Some(2), "segments").unwrap();
        #[rustfmt::skip]
        let units = vec![
            0, 2, 0, UNIT_FIRST,  2, 4, 0, 0,  4, 5, 0, UNIT_LAST,
            5, 5, 1, BOTH,
            5, 7, 2, BOTH,
        ];
        assert_eq!(t.units, units);
        assert_eq!((t.seq_units, t.num_units), (vec![0, 3, 4, 5], 5));
        assert_eq!(t.segment_chunks, Some(2));
        // Segments no shorter than any sequence cut nothing: whole sequences, no segments.
        let whole = UnitTable::cut(&[5, 0, 2], None, "segments").unwrap();
        assert_eq!(
            UnitTable::cut(&[5, 0, 2], Some(5), "segments").unwrap(),
            whole
        );
        assert_eq!((whole.num_units, whole.segment_chunks), (3, None));
        // Past 65535 units: an error naming the option.
        let err = UnitTable::cut(&[70_000], Some(1), "backward segments").unwrap_err();
        assert!(err.to_string().contains("backward segments"), "{err}");
    }

    #[test]
    fn segment_options_are_checked() {
        let auto = || Some(4);
        assert_eq!(
            resolve_segments(Segments::Off, auto, true, 128, "s").unwrap(),
            None
        );
        assert_eq!(
            resolve_segments(Segments::Auto, auto, true, 128, "s").unwrap(),
            Some(4)
        );
        assert_eq!(
            resolve_segments(Segments::Auto, auto, false, 128, "s").unwrap(),
            None
        );
        assert_eq!(
            resolve_segments(Segments::Chunks(8), auto, true, 128, "s").unwrap(),
            Some(8)
        );
        for (segments, fits) in [(Segments::Chunks(0), true), (Segments::Chunks(8), false)] {
            let err = resolve_segments(segments, auto, fits, 128, "backward segments").unwrap_err();
            assert!(err.to_string().contains("backward segments"), "{err}");
        }
    }
}
