//! The chunked tensor-core forward (`shaders/cuda/chunked.cu`, C = 64) for f16/bf16 storage,
//! and the per-call choice between it and the recurrent kernel ([`forward_path`]).
//!
//! Three launches: the in-kernel l2norm of q and k (only with `Options::l2norm_qk`), the
//! parallel per-(chunk, v-head) pass that writes W, U, P and the chunk-local gate cumsum to a
//! workspace, and the sequential per-(V-block, v-head, sequence) pass that carries the f32
//! state and writes o and the final state. A [`ChunkPlan`] holds the chunk table and the
//! workspace, so [`launch_chunked`] only enqueues (no allocation, no host synchronisation).

use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg, sys};

use super::context::{Context, driver_error};
use super::kernels::{CHUNKED, option_flags};
use super::recurrent::check_tensor;
use super::tensor::CudaTensor;
use crate::error::{Error, Result};
use crate::problem::{CHUNK, ForwardInputs, ForwardOutputs, Problem};
use crate::tensor::{DType, TensorMeta};

/// Largest K the chunked pass runs (its shared memory); larger heads take the recurrent kernel.
pub const MAX_CHUNKED_KEY_DIM: usize = 128;

/// Threads per block: l2norm and prep (`THREADS`), the sequential pass (`FWD_THREADS`).
const THREADS: u32 = 128;
const FWD_THREADS: u32 = 256;

/// chunked.cu's SPLIT_STATE bit: the state enters W·S and Q·S as two 16-bit parts.
const SPLIT_STATE: i32 = 1 << 8;

/// Which kernel a forward call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ForwardPath {
    /// The token-by-token kernel: f32 arithmetic (the exact mode for f32 storage).
    Recurrent,
    /// The chunked tensor-core kernels: operands in the storage dtype, f32 accumulators.
    Chunked,
}

/// Mirrors `gdn::chunked::ChunkParams` in chunked.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct ChunkParams {
    heads_qk: i32,
    heads_v: i32,
    key_dim: i32,
    value_dim: i32,
    group: i32,
    flags: i32,
    num_chunks: i32,
    scale: f32,
}

// SAFETY: plain old data of 4-byte fields, laid out like the C struct the kernels take by value.
unsafe impl DeviceRepr for ChunkParams {}

// Shared-memory sizes, mirroring the carving in chunked.cu (`ld16`, `ld32`, `align128`).
fn align128(x: usize) -> usize {
    x.div_ceil(128) * 128
}

fn prep_smem(dtype: DType, k: usize, v: usize) -> usize {
    let s = dtype.size();
    let c = CHUNK;
    2 * align128(s * c * (k + 8))
        + align128(s * c * (v + 8))
        + 2 * align128(4 * c * (c + 4))
        + 2 * align128(s * c * (c + 8))
        + align128(4 * 4 * 16 * 16)
        + 2 * c * 4
}

fn fwd_smem(dtype: DType, k: usize, bv: usize) -> usize {
    let s = dtype.size();
    let c = CHUNK;
    align128(4 * k * (bv + 4))
        + 2 * align128(s * k * (bv + 8))
        + 3 * align128(s * c * (k + 8))
        + align128(s * c * (c + 8))
        + 2 * align128(4 * c * (bv + 4))
        + 2 * align128(s * c * (bv + 8))
        + 4 * c
}

fn max_shared_optin(ctx: &Context) -> Result<usize> {
    let attr = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN;
    ctx.cuda_context()
        .attribute(attr)
        .map(|x| x.max(0) as usize)
        .map_err(|e| driver_error("shared memory limit", e))
}

/// The V-block width of the sequential pass: 64 where its shared memory fits, else 32
/// (Ampere's 164 KiB at K = 128), else `None`.
fn value_block(ctx: &Context, problem: &Problem, dtype: DType) -> Result<Option<usize>> {
    let limit = max_shared_optin(ctx)?;
    if prep_smem(dtype, problem.key_dim, problem.value_dim) > limit {
        return Ok(None);
    }
    Ok([64, 32]
        .into_iter()
        .find(|&bv| fwd_smem(dtype, problem.key_dim, bv) <= limit))
}

/// The kernel [`forward_into`](super::forward_into) runs for `problem` with q, k, v stored as
/// `dtype`: the chunked kernels for f16/bf16 with K ≤ 128 where the device's shared memory
/// holds them, the recurrent kernel otherwise (f32 storage keeps the exact f32 mode). Every
/// option, GVA and varlen run on either path.
pub fn forward_path(ctx: &Context, problem: &Problem, dtype: DType) -> Result<ForwardPath> {
    let chunked = dtype != DType::F32
        && problem.key_dim <= MAX_CHUNKED_KEY_DIM
        && value_block(ctx, problem, dtype)?.is_some();
    Ok(if chunked {
        ForwardPath::Chunked
    } else {
        ForwardPath::Recurrent
    })
}

fn to_i32(name: &str, x: usize) -> Result<i32> {
    i32::try_from(x).map_err(|_| Error::value(name, format!("at most {}", i32::MAX), x))
}

fn alloc(ctx: &Context, name: &str, bytes: usize) -> Result<CudaSlice<u8>> {
    // A zero-byte allocation is refused by the driver; one spare byte is never read.
    ctx.stream()
        .alloc_zeros::<u8>(bytes.max(1))
        .map_err(|e| driver_error(&format!("allocation of {name}"), e))
}

/// The chunk table and workspace of one problem shape and dtype: reusable across calls.
#[derive(Debug)]
pub struct ChunkPlan {
    problem: Problem,
    dtype: DType,
    value_block: usize,
    num_chunks: usize,
    /// (first token, length) per chunk; chunks never cross a sequence boundary.
    chunks: CudaSlice<i32>,
    /// Each sequence's first chunk, N + 1 entries.
    seq_chunks: CudaSlice<i32>,
    ws_g: CudaSlice<u8>,
    ws_w: CudaSlice<u8>,
    ws_u: CudaSlice<u8>,
    ws_p: CudaSlice<u8>,
    /// l2-normalized q and k (only with `Options::l2norm_qk`).
    normalized: Option<(CudaSlice<u8>, CudaSlice<u8>)>,
    split_state: bool,
}

impl ChunkPlan {
    /// Upload the chunk table and allocate the workspace (enqueued on the context's stream).
    /// An error where [`forward_path`] is not [`ForwardPath::Chunked`].
    pub fn new(ctx: &Context, problem: &Problem, dtype: DType) -> Result<Self> {
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
        let value_block = value_block(ctx, problem, dtype)?.unwrap_or(32);
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
        let mut table = Vec::new();
        let mut seq_chunks = vec![0i32];
        for s in p.sequences() {
            for c in (s.start..s.end).step_by(CHUNK) {
                table.push(c as i32);
                table.push(((c + CHUNK).min(s.end) - c) as i32);
            }
            seq_chunks.push(to_i32("chunks", table.len() / 2)?);
        }
        let num_chunks = table.len() / 2;
        if table.is_empty() {
            table.push(0);
        }
        let stream = ctx.stream();
        let chunks = stream
            .clone_htod(&table)
            .map_err(|e| driver_error("upload of the chunk table", e))?;
        let seq_chunks = stream
            .clone_htod(&seq_chunks)
            .map_err(|e| driver_error("upload of the sequence chunks", e))?;
        let s = dtype.size();
        let rows = num_chunks * p.heads_v * CHUNK;
        let normalized = if p.options.l2norm_qk {
            let bytes = p.total_tokens() * p.heads_qk * p.key_dim * s;
            Some((alloc(ctx, "q̂", bytes)?, alloc(ctx, "k̂", bytes)?))
        } else {
            None
        };
        Ok(ChunkPlan {
            problem: p.clone(),
            dtype,
            value_block,
            num_chunks,
            chunks,
            seq_chunks,
            ws_g: alloc(ctx, "gate cumsum workspace", rows * 4)?,
            ws_w: alloc(ctx, "W workspace", rows * p.key_dim * s)?,
            ws_u: alloc(ctx, "U workspace", rows * p.value_dim * 4)?,
            ws_p: alloc(ctx, "P workspace", rows * CHUNK * s)?,
            normalized,
            split_state: false,
        })
    }

    /// The same plan with the state entering W·S and Q·S as two 16-bit parts (`true`: no
    /// rounding of the state, twice those MMAs) or rounded once per chunk to the storage
    /// dtype (`false`, the default, as FLA: on the H200 both gave the same rel-L2 against the
    /// recurrent kernel at 1×32768, o 3.61e-3, state 2.25e-3).
    pub fn with_split_state(self, split_state: bool) -> Self {
        ChunkPlan {
            split_state,
            ..self
        }
    }

    /// Whether the state enters the MMAs as two 16-bit parts.
    pub fn split_state(&self) -> bool {
        self.split_state
    }

    /// The V-block width of the sequential pass.
    pub fn value_block(&self) -> usize {
        self.value_block
    }

    /// Bytes of device memory the plan holds.
    pub fn workspace_bytes(&self) -> usize {
        [&self.ws_g, &self.ws_w, &self.ws_u, &self.ws_p]
            .iter()
            .map(|b| b.len())
            .sum::<usize>()
            + self
                .normalized
                .as_ref()
                .map_or(0, |(a, b)| a.len() + b.len())
    }
}

/// Which passes [`launch_chunked_passes`] enqueues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkedPasses {
    /// Everything: o and the final state.
    All,
    /// The parallel passes only (l2norm, per-chunk W, U, P): for timing them apart.
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
    let params = ChunkParams {
        heads_qk: p.heads_qk as i32,
        heads_v: p.heads_v as i32,
        key_dim: p.key_dim as i32,
        value_dim: p.value_dim as i32,
        group: p.group() as i32,
        flags: option_flags(p) | if plan.split_state { SPLIT_STATE } else { 0 },
        num_chunks: plan.num_chunks as i32,
        scale: p.scale(),
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
            let name = format!("gdn_l2norm_{suffix}");
            let func = ctx.function(&CHUNKED, &name)?;
            let rows = p.total_tokens() * p.heads_qk;
            if rows > 0 {
                let cfg = LaunchConfig {
                    grid_dim: (rows.div_ceil(4) as u32, 2, 1),
                    block_dim: (THREADS, 1, 1),
                    shared_mem_bytes: 0,
                };
                let (rows, key_dim) = (rows as i32, p.key_dim as i32);
                let mut l = stream.launch_builder(&func);
                l.arg(&rows)
                    .arg(&key_dim)
                    .arg(inputs.q.buffer())
                    .arg(inputs.k.buffer())
                    .arg(qn)
                    .arg(kn);
                // SAFETY: matches gdn_l2norm_* in chunked.cu; q, k and q̂, k̂ hold rows·K
                // elements of the storage dtype.
                unsafe { l.launch(cfg) }.map_err(|e| launch_err(&name, e))?;
            }
            (qn, kn)
        }
        None => (inputs.q.buffer(), inputs.k.buffer()),
    };

    if plan.num_chunks > 0 {
        let name = format!("gdn_chunk_prep_{suffix}");
        let smem = prep_smem(dtype, p.key_dim, p.value_dim);
        let func = ctx.function_with_smem(&CHUNKED, &name, smem)?;
        let cfg = LaunchConfig {
            grid_dim: (plan.num_chunks as u32, p.heads_v as u32, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let mut l = stream.launch_builder(&func);
        l.arg(&params)
            .arg(&plan.chunks)
            .arg(q)
            .arg(k)
            .arg(inputs.v.buffer())
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
        l.arg(&plan.ws_g)
            .arg(&plan.ws_w)
            .arg(&plan.ws_u)
            .arg(&plan.ws_p);
        // SAFETY: matches gdn_chunk_prep_* in chunked.cu; inputs were checked against the
        // problem, the workspace was sized for it by ChunkPlan::new.
        unsafe { l.launch(cfg) }.map_err(|e| launch_err(&name, e))?;
    }

    if passes == ChunkedPasses::Parallel {
        return Ok(());
    }
    let name = format!("gdn_chunk_fwd{}_{suffix}", plan.value_block);
    let smem = fwd_smem(dtype, p.key_dim, plan.value_block);
    let func = ctx.function_with_smem(&CHUNKED, &name, smem)?;
    let cfg = LaunchConfig {
        grid_dim: (
            p.value_dim.div_ceil(plan.value_block) as u32,
            p.heads_v as u32,
            p.num_sequences() as u32,
        ),
        block_dim: (FWD_THREADS, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    let mut l = stream.launch_builder(&func);
    l.arg(&params)
        .arg(&plan.chunks)
        .arg(&plan.seq_chunks)
        .arg(q)
        .arg(k)
        .arg(&plan.ws_g)
        .arg(&plan.ws_w)
        .arg(&plan.ws_u)
        .arg(&plan.ws_p);
    match inputs.initial_state {
        Some(t) => l.arg(t.buffer()),
        None => l.arg(&null),
    };
    l.arg(outputs.o.buffer()).arg(outputs.final_state.buffer());
    // SAFETY: matches gdn_chunk_fwd* in chunked.cu; o, the states and the workspace were
    // checked or sized for this problem.
    unsafe { l.launch(cfg) }.map_err(|e| launch_err(&name, e))?;
    Ok(())
}
