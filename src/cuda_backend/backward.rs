//! The CUDA backward, on one of two paths ([`backward_path`] says which a call takes):
//!
//! - **chunked** (`shaders/cuda/chunk_bwd_chain.cuh` through `chunk_bwd_chain_{f16,bf16}.cu`, `chunk_bwd_grad.cu`, launched by
//!   `cuda_backend/chunk_bwd.rs`): tensor cores for f16/bf16 storage with K, V ≤ 128, operands in the
//!   storage dtype, f32 accumulators;
//! - **exact** (`shaders/cuda/backward.cu`): BPTT through the token recurrence in f32, for f32
//!   storage (the exact-f32 mode) and the shapes the chunked path does not take.
//!
//! Both give every gradient and option of [`crate::reference::backward`] and share the
//! finishing kernels (GVA sums with the l2norm chain rule, the sigmoid and gate-activation
//! chain rules, dA_log and ddt_bias). A [`BackwardWorkspace`] holds everything the kernels need
//! besides inputs and outputs, so [`backward_into`] only enqueues launches (no allocation, no
//! host synchronisation). `GDN_CUDA_BACKWARD` (or [`Context::with_backward_path`]) forces a
//! path.

use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg};

use super::chunk_bwd::ChunkedScratch;
pub use super::chunk_bwd::{AUTO_WARP_PAIRS, BackwardOptions, ChainSchedule, ChunkedStage};
use super::context::{Context, driver_error};
use super::kernels::{BACKWARD, option_flags};
use super::recurrent::{self, STORAGE_DTYPES, SeqBounds, to_i32};
use super::tensor::{CudaTensor, upload_inputs};
use crate::error::{Error, Result};
use crate::problem::{ForwardInputs, ForwardOutputs, Gradients, Problem};
use crate::tensor::{DType, HostTensor, TensorMeta};

/// v columns per block of the recurrent backward kernel (`BV` in backward.cu).
const BLOCK_V: usize = 32;
/// Tokens per checkpoint segment (`CK` in backward.cu).
const CHECKPOINT: usize = 64;

/// Which backward a call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackwardPath {
    /// BPTT through the token recurrence, f32 arithmetic (backward.cu).
    Exact,
    /// The chunked tensor-core backward: MMA operands in the storage dtype, f32 accumulators.
    Chunked,
}

impl BackwardPath {
    /// The name `GDN_CUDA_BACKWARD` and reports use.
    pub fn name(self) -> &'static str {
        match self {
            BackwardPath::Exact => "exact",
            BackwardPath::Chunked => "chunked",
        }
    }

    /// `auto` (→ `None`), `exact` or `chunked`, case-insensitive; anything else is an
    /// `Error::Value` naming `what`.
    pub fn parse_override(what: &str, s: &str) -> Result<Option<BackwardPath>> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(None),
            "exact" => Ok(Some(BackwardPath::Exact)),
            "chunked" => Ok(Some(BackwardPath::Chunked)),
            _ => Err(Error::value(what, "auto, exact or chunked", s)),
        }
    }
}

/// The backward [`backward_into`] runs for `problem` with q, k, v stored as `dtype`: the
/// chunked one for f16/bf16 with K, V ≤ 128 where the device's shared memory holds its passes,
/// the exact one otherwise, unless the context forces one ([`Context::with_backward_path`],
/// `GDN_CUDA_BACKWARD`). Forcing the chunked path where it cannot run is
/// `Error::Unsupported`.
pub fn backward_path(ctx: &Context, problem: &Problem, dtype: DType) -> Result<BackwardPath> {
    let runs = super::chunk_bwd::chunked_backward_runs(ctx, problem, dtype)?;
    match ctx.backward_path_override() {
        Some(BackwardPath::Chunked) if !runs => Err(chunked_unsupported(problem, dtype)),
        Some(path) => Ok(path),
        None if runs => Ok(BackwardPath::Chunked),
        None => Ok(BackwardPath::Exact),
    }
}

fn chunked_unsupported(problem: &Problem, dtype: DType) -> Error {
    Error::unsupported(
        "chunked cuda backward",
        format!(
            "{dtype} storage with K = {}, V = {} on this device (f16/bf16 with K, V ≤ 128 \
             where the shared memory fits; the exact backward runs the rest)",
            problem.key_dim, problem.value_dim
        ),
    )
}

/// Mirrors `gdn::BackwardParams` in backward.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct BackwardParams {
    heads_qk: i32,
    heads_v: i32,
    key_dim: i32,
    value_dim: i32,
    group: i32,
    flags: i32,
    v_blocks: i32,
    total_tokens: i32,
    scale: f32,
}

// SAFETY: plain old data of 4-byte fields, laid out like the C struct the kernel takes by value.
unsafe impl DeviceRepr for BackwardParams {}

impl BackwardParams {
    fn of(problem: &Problem, v_blocks: usize) -> Self {
        let p = problem;
        BackwardParams {
            heads_qk: p.heads_qk as i32,
            heads_v: p.heads_v as i32,
            key_dim: p.key_dim as i32,
            value_dim: p.value_dim as i32,
            group: p.group() as i32,
            flags: option_flags(p),
            v_blocks: v_blocks as i32,
            total_tokens: p.total_tokens() as i32,
            scale: p.scale(),
        }
    }
}

pub(crate) fn alloc_f32(ctx: &Context, name: &str, len: usize) -> Result<CudaSlice<f32>> {
    // A zero-length allocation is refused by the driver; one spare element is never read.
    ctx.stream()
        .alloc_zeros::<f32>(len.max(1))
        .map_err(|e| driver_error(&format!("allocation of {name}"), e))
}

/// Scratch memory of the exact backward: sequence bounds, checkpoints (the state every 64
/// tokens), one 64-token replay buffer per (sequence, v-head, V-block), and the per-V-block
/// partial sums of dq, dk, dβ, dg.
#[derive(Debug)]
struct ExactScratch {
    bounds: CudaSlice<i32>,
    ckpt_base: CudaSlice<i32>,
    ckpt: CudaSlice<f32>,
    seg: CudaSlice<f32>,
    dq_part: CudaSlice<f32>,
    dk_part: CudaSlice<f32>,
    dbeta_part: CudaSlice<f32>,
    dg_part: CudaSlice<f32>,
    gate_sums: CudaSlice<f32>,
}

impl ExactScratch {
    /// `4·HV·K·V·(Σ⌈len/64⌉ + 64·N) + 8·⌈V/32⌉·B·T·HV·(K + 1) + 8·HV·⌈B·T/256⌉` bytes.
    fn new(ctx: &Context, problem: &Problem) -> Result<Self> {
        let p = problem;
        let seqs = p.sequences();
        let mut bounds = vec![0i32];
        let mut base = vec![0i32];
        let mut checkpoints = 0usize;
        for s in &seqs {
            bounds.push(to_i32("tokens (B·T)", s.end)?);
            checkpoints += s.len().div_ceil(CHECKPOINT);
            base.push(to_i32("checkpoints", checkpoints)?);
        }
        let up = |name: &str, x: &[i32]| {
            ctx.stream()
                .clone_htod(x)
                .map_err(|e| driver_error(&format!("upload of {name}"), e))
        };
        let vb = p.value_dim.div_ceil(BLOCK_V);
        let slice = p.key_dim * vb * BLOCK_V; // one block's state slice, V padded to whole blocks
        let per_token = vb * p.total_tokens() * p.heads_v;
        Ok(ExactScratch {
            bounds: up("sequence bounds", &bounds)?,
            ckpt_base: up("checkpoint offsets", &base)?,
            ckpt: alloc_f32(ctx, "checkpoints", checkpoints * p.heads_v * slice)?,
            seg: alloc_f32(
                ctx,
                "replay buffer",
                seqs.len() * p.heads_v * CHECKPOINT * slice,
            )?,
            dq_part: alloc_f32(ctx, "dq partials", per_token * p.key_dim)?,
            dk_part: alloc_f32(ctx, "dk partials", per_token * p.key_dim)?,
            dbeta_part: alloc_f32(ctx, "dbeta partials", per_token)?,
            dg_part: alloc_f32(ctx, "dg partials", per_token)?,
            gate_sums: alloc_f32(ctx, "gate sums", gate_sums_len(p))?,
        })
    }

    fn bytes(&self) -> usize {
        4 * (self.ckpt.len()
            + self.gate_sums.len()
            + self.seg.len()
            + self.dq_part.len()
            + self.dk_part.len()
            + self.dbeta_part.len()
            + self.dg_part.len())
    }
}

#[derive(Debug)]
enum Scratch {
    Exact(Box<ExactScratch>),
    Chunked(Box<ChunkedScratch>),
}

/// Scratch memory of the backward for one problem shape and storage dtype, on the path it was
/// made for: reused across calls, so that [`backward_into`] allocates nothing.
#[derive(Debug)]
pub struct BackwardWorkspace {
    problem: Problem,
    dtype: DType,
    scratch: Scratch,
}

impl BackwardWorkspace {
    /// Allocate the workspace for `problem` with q, k, v stored as `dtype` (enqueued on the
    /// context's stream), for the path [`backward_path`] chooses.
    pub fn new(ctx: &Context, problem: &Problem, dtype: DType) -> Result<Self> {
        let path = backward_path(ctx, problem, dtype)?;
        Self::with_path(ctx, problem, dtype, path)
    }

    /// [`Self::new`] for `path` whatever the automatic choice (to compare the two); the chunked
    /// path where it cannot run is `Error::Unsupported`.
    pub fn with_path(
        ctx: &Context,
        problem: &Problem,
        dtype: DType,
        path: BackwardPath,
    ) -> Result<Self> {
        Self::with_options(ctx, problem, dtype, path, BackwardOptions::default())
    }

    /// [`Self::with_path`] with the chunked path's choices overridden (the exact path has
    /// none and ignores them); a schedule or V-block that cannot run is `Error::Value`.
    pub fn with_options(
        ctx: &Context,
        problem: &Problem,
        dtype: DType,
        path: BackwardPath,
        options: BackwardOptions,
    ) -> Result<Self> {
        let scratch = match path {
            BackwardPath::Exact => Scratch::Exact(Box::new(ExactScratch::new(ctx, problem)?)),
            BackwardPath::Chunked => {
                if !super::chunk_bwd::chunked_backward_runs(ctx, problem, dtype)? {
                    return Err(chunked_unsupported(problem, dtype));
                }
                Scratch::Chunked(Box::new(ChunkedScratch::new(ctx, problem, dtype, options)?))
            }
        };
        Ok(BackwardWorkspace {
            problem: problem.clone(),
            dtype,
            scratch,
        })
    }

    /// The path this workspace runs.
    pub fn path(&self) -> BackwardPath {
        match self.scratch {
            Scratch::Exact(_) => BackwardPath::Exact,
            Scratch::Chunked(_) => BackwardPath::Chunked,
        }
    }

    /// The chunked path's V-block of its sequential passes (`None` on the exact path).
    pub fn value_block(&self) -> Option<usize> {
        match &self.scratch {
            Scratch::Exact(_) => None,
            Scratch::Chunked(c) => Some(c.value_block()),
        }
    }

    /// How the chunked path launches its two sequential passes (`None` on the exact path).
    pub fn chain_schedule(&self) -> Option<ChainSchedule> {
        match &self.scratch {
            Scratch::Exact(_) => None,
            Scratch::Chunked(c) => Some(c.chains()),
        }
    }

    /// Whether the chunked path's sequential passes run with warp pairs (`None` on the exact
    /// path).
    pub fn warp_pairs(&self) -> Option<bool> {
        match &self.scratch {
            Scratch::Exact(_) => None,
            Scratch::Chunked(c) => Some(c.warp_pairs()),
        }
    }

    /// The segment length (in chunks of 64 tokens) where the chunked path's chains cut some
    /// sequence (sequence parallelism); `None` on the exact path or without segments.
    pub fn segment_chunks(&self) -> Option<usize> {
        match &self.scratch {
            Scratch::Exact(_) => None,
            Scratch::Chunked(c) => c.segment_chunks(),
        }
    }

    /// Bytes of device memory the workspace holds.
    pub fn workspace_bytes(&self) -> usize {
        match &self.scratch {
            Scratch::Exact(e) => e.bytes(),
            Scratch::Chunked(c) => c.bytes(),
        }
    }
}

pub(crate) fn check_tensor<T: TensorMeta>(
    name: &str,
    t: &T,
    shape: &[usize],
    dtype: DType,
) -> Result<()> {
    if t.shape() != shape {
        return Err(Error::shape(name, shape, t.shape()));
    }
    if t.dtype() != dtype {
        return Err(Error::DType {
            name: name.into(),
            expected: dtype.to_string(),
            got: t.dtype().to_string(),
        });
    }
    Ok(())
}

fn present(name: &str, want: bool, got: bool, why: &str) -> Result<()> {
    match (want, got) {
        (true, false) => Err(Error::Missing {
            name: name.into(),
            why: why.into(),
        }),
        (false, true) => Err(Error::value(name, format!("none ({why})"), "a tensor")),
        _ => Ok(()),
    }
}

/// Enqueue the backward of `L = Σ o ⊙ d_o + Σ final_state ⊙ dht` into `grads` on the
/// workspace's path: no allocation, no host synchronisation. `d_o` is `[B,T,HV,V]` in the
/// dtype of v, `dht` (optional) the state shape in f32. `grads.dh0` must be present exactly
/// when the inputs have an initial state, `da_log` / `ddt_bias` exactly with
/// `gate_in_kernel`.
pub fn backward_into(
    ctx: &Context,
    problem: &Problem,
    workspace: &BackwardWorkspace,
    inputs: &ForwardInputs<&CudaTensor>,
    d_o: &CudaTensor,
    dht: Option<&CudaTensor>,
    grads: &Gradients<&CudaTensor>,
) -> Result<()> {
    let p = problem;
    p.check_inputs(inputs, &STORAGE_DTYPES)?;
    let dtype = inputs.q.dtype();
    if workspace.problem != *p || workspace.dtype != dtype {
        return Err(Error::value(
            "backward workspace",
            format!("one made for this problem with {dtype} storage"),
            format!("{:?} with {}", workspace.problem, workspace.dtype),
        ));
    }
    let f32_ = DType::F32;
    check_tensor("do", d_o, &p.v_shape(), inputs.v.dtype())?;
    if let Some(t) = dht {
        check_tensor("dht", t, &p.state_shape(), f32_)?;
    }
    check_tensor("dq", grads.dq, &p.qk_shape(), dtype)?;
    check_tensor("dk", grads.dk, &p.qk_shape(), inputs.k.dtype())?;
    check_tensor("dv", grads.dv, &p.v_shape(), inputs.v.dtype())?;
    check_tensor("dg", grads.dg, &p.gate_shape(), f32_)?;
    check_tensor("dbeta", grads.dbeta, &p.gate_shape(), f32_)?;
    let has_h0 = inputs.initial_state.is_some();
    present("dh0", has_h0, grads.dh0.is_some(), "exactly with h0")?;
    if let Some(t) = grads.dh0 {
        check_tensor("dh0", t, &p.state_shape(), f32_)?;
    }
    let gate = p.options.gate_in_kernel;
    for (name, t) in [("dA_log", grads.da_log), ("ddt_bias", grads.ddt_bias)] {
        present(name, gate, t.is_some(), "exactly with gate_in_kernel")?;
        if let Some(t) = t {
            check_tensor(name, t, &[p.heads_v], f32_)?;
        }
    }
    to_i32("tokens (B·T)", p.total_tokens())?;
    for (name, x) in [
        ("heads_v (HV)", p.heads_v),
        ("sequences (N)", p.num_sequences()),
        ("heads_qk (H)", p.heads_qk),
    ] {
        if x > 65535 {
            return Err(Error::unsupported(
                name,
                format!("{x} on the cuda backend (at most 65535)"),
            ));
        }
    }
    match &workspace.scratch {
        Scratch::Exact(ws) => record_exact(ctx, p, ws, inputs, d_o, dht, grads),
        Scratch::Chunked(ws) => ws.record(ctx, p, inputs, d_o, dht, grads, ChunkedStage::All),
    }
}

/// [`backward_into`] on a chunked workspace stopped after `until` (the gradients are then
/// incomplete): for timing the passes apart. An exact workspace is `Error::Value`.
#[allow(clippy::too_many_arguments)]
pub fn backward_stages_into(
    ctx: &Context,
    problem: &Problem,
    workspace: &BackwardWorkspace,
    inputs: &ForwardInputs<&CudaTensor>,
    d_o: &CudaTensor,
    dht: Option<&CudaTensor>,
    grads: &Gradients<&CudaTensor>,
    until: ChunkedStage,
) -> Result<()> {
    match &workspace.scratch {
        Scratch::Chunked(ws) if workspace.problem == *problem => {
            ws.record(ctx, problem, inputs, d_o, dht, grads, until)
        }
        _ => Err(Error::value(
            "backward workspace",
            "a chunked one made for this problem",
            format!(
                "{:?} on the {} path",
                workspace.problem,
                workspace.path().name()
            ),
        )),
    }
}

/// The storage dtype's kernel-name suffix.
pub(crate) fn dtype_suffix(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
    }
}

/// The exact path: the BPTT kernel, then the finishing kernels.
fn record_exact(
    ctx: &Context,
    problem: &Problem,
    ws: &ExactScratch,
    inputs: &ForwardInputs<&CudaTensor>,
    d_o: &CudaTensor,
    dht: Option<&CudaTensor>,
    grads: &Gradients<&CudaTensor>,
) -> Result<()> {
    let p = problem;
    let v_blocks = p.value_dim.div_ceil(BLOCK_V);
    let params = BackwardParams::of(p, v_blocks);
    let suffix = dtype_suffix(inputs.q.dtype());
    let stream = ctx.stream();
    let null: u64 = 0;

    // 1. The recurrent BPTT kernel.
    let name = format!("gdn_bwd_recurrent_{suffix}");
    let func = ctx.function(&BACKWARD, &name)?;
    let mut launch = stream.launch_builder(&func);
    launch
        .arg(&params)
        .arg(&ws.bounds)
        .arg(&ws.ckpt_base)
        .arg(inputs.q.buffer())
        .arg(inputs.k.buffer())
        .arg(inputs.v.buffer())
        .arg(inputs.g.buffer())
        .arg(inputs.beta.buffer());
    for t in [
        inputs.a_log,
        inputs.dt_bias,
        inputs.initial_state,
        Some(d_o),
        dht,
        Some(grads.dv),
        grads.dh0,
    ] {
        // Absent optional tensors are null pointers.
        match t {
            Some(t) => launch.arg(t.buffer()),
            None => launch.arg(&null),
        };
    }
    launch
        .arg(&ws.ckpt)
        .arg(&ws.seg)
        .arg(&ws.dq_part)
        .arg(&ws.dk_part)
        .arg(&ws.dbeta_part)
        .arg(&ws.dg_part);
    let cfg = LaunchConfig {
        grid_dim: (v_blocks as u32, p.heads_v as u32, p.num_sequences() as u32),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match GDN_BWD in backward.cu; every tensor was checked by
    // backward_into to have the shape and dtype the kernel indexes with, the workspace was
    // made for `problem`.
    unsafe { launch.launch(cfg) }.map_err(|e| driver_error(&format!("launch of {name}"), e))?;

    launch_finish(
        ctx,
        p,
        v_blocks,
        QkPartials::PerVHead,
        inputs,
        [&ws.dq_part, &ws.dk_part, &ws.dbeta_part, &ws.dg_part],
        &ws.gate_sums,
        grads,
    )
}

/// What the dq, dk partials handed to [`launch_finish`] hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QkPartials {
    /// Per V-block, token and v-head: summed over the V-blocks and the GVA group.
    PerVHead,
    /// One per token and q/k head, already summed (only the l2norm chain rule is left).
    PerQkHead,
    /// None: dq, dk are written already (no qk finish).
    Written,
}

/// Rows (warps) per block of `gdn_bwd_qk_finish_*` (`QK_ROWS` in backward.cu).
const QK_FINISH_ROWS: usize = 8;
/// Tokens per block of `gdn_bwd_gate_finish` (`GATE_TOKENS` in backward.cu; 8 warps).
const GATE_FINISH_TOKENS: usize = 256;

/// Floats of the finishing kernels' dA_log / ddt_bias partial sums: two per (block of
/// [`GATE_FINISH_TOKENS`] tokens, v-head).
pub(crate) fn gate_sums_len(problem: &Problem) -> usize {
    2 * problem.total_tokens().div_ceil(GATE_FINISH_TOKENS) * problem.heads_v
}

/// The finishing kernels of either path: dq, dk from their f32 partials (as `qk` says:
/// `v_blocks` per token and v-head summed over them and the GVA group, or one per q/k head;
/// then the l2norm chain rule), and dβ, dg, dA_log, ddt_bias from theirs (`parts` = dq, dk,
/// dβ, dg partials).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_finish(
    ctx: &Context,
    problem: &Problem,
    v_blocks: usize,
    qk: QkPartials,
    inputs: &ForwardInputs<&CudaTensor>,
    parts: [&CudaSlice<f32>; 4],
    gate_sums: &CudaSlice<f32>,
    grads: &Gradients<&CudaTensor>,
) -> Result<()> {
    let p = problem;
    let params = BackwardParams::of(p, v_blocks);
    let suffix = dtype_suffix(inputs.q.dtype());
    let stream = ctx.stream();
    let null: u64 = 0;
    let [dq_part, dk_part, dbeta_part, dg_part] = parts;
    let tokens = p.total_tokens();

    // dq, dk: V-block and GVA sums, l2norm chain rule (no tokens: nothing to write, and a grid
    // of zero blocks is refused). Partials per q/k head read as a problem without GVA.
    let qk_params = match qk {
        QkPartials::PerVHead => params,
        QkPartials::PerQkHead | QkPartials::Written => BackwardParams {
            heads_v: params.heads_qk,
            group: 1,
            v_blocks: 1,
            ..params
        },
    };
    let name = format!("gdn_bwd_qk_finish_{suffix}");
    let func = ctx.function(&BACKWARD, &name)?;
    let mut launch = stream.launch_builder(&func);
    launch
        .arg(&qk_params)
        .arg(inputs.q.buffer())
        .arg(inputs.k.buffer())
        .arg(dq_part)
        .arg(dk_part)
        .arg(grads.dq.buffer())
        .arg(grads.dk.buffer());
    let cfg = LaunchConfig {
        grid_dim: ((tokens * p.heads_qk).div_ceil(QK_FINISH_ROWS) as u32, 1, 1),
        block_dim: (32 * QK_FINISH_ROWS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    if tokens > 0 && qk != QkPartials::Written {
        // SAFETY: gdn_bwd_qk_finish_* in backward.cu; the partials hold v_blocks·B·T·HV·K
        // floats (PerQkHead: B·T·H·K), q, k, dq, dk were checked against the problem.
        unsafe { launch.launch(cfg) }.map_err(|e| driver_error(&format!("launch of {name}"), e))?;
    }

    // dβ, dg and per block of tokens the partial dA_log, ddt_bias sums; then those summed.
    let token_blocks = tokens.div_ceil(GATE_FINISH_TOKENS);
    let name = "gdn_bwd_gate_finish";
    let func = ctx.function(&BACKWARD, name)?;
    let mut launch = stream.launch_builder(&func);
    launch
        .arg(&params)
        .arg(inputs.g.buffer())
        .arg(inputs.beta.buffer());
    for t in [inputs.a_log, inputs.dt_bias] {
        match t {
            Some(t) => launch.arg(t.buffer()),
            None => launch.arg(&null),
        };
    }
    launch
        .arg(dbeta_part)
        .arg(dg_part)
        .arg(grads.dg.buffer())
        .arg(grads.dbeta.buffer())
        .arg(gate_sums);
    let cfg = LaunchConfig {
        grid_dim: (token_blocks as u32, p.heads_v.div_ceil(32) as u32, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    if tokens > 0 {
        // SAFETY: gdn_bwd_gate_finish in backward.cu; the partials hold v_blocks·B·T·HV
        // floats, gate_sums gate_sums_len(problem).
        unsafe { launch.launch(cfg) }.map_err(|e| driver_error(&format!("launch of {name}"), e))?;
    }
    if let (Some(da_log), Some(ddt_bias)) = (grads.da_log, grads.ddt_bias) {
        let name = "gdn_bwd_gate_sums";
        let func = ctx.function(&BACKWARD, name)?;
        let blocks = token_blocks as i32;
        let mut launch = stream.launch_builder(&func);
        launch
            .arg(&params)
            .arg(&blocks)
            .arg(gate_sums)
            .arg(da_log.buffer())
            .arg(ddt_bias.buffer());
        let cfg = LaunchConfig {
            grid_dim: (p.heads_v as u32, 1, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: gdn_bwd_gate_sums in backward.cu; gate_sums holds 2·blocks·HV floats
        // written by gdn_bwd_gate_finish (none read when there are no tokens).
        unsafe { launch.launch(cfg) }.map_err(|e| driver_error(&format!("launch of {name}"), e))?;
    }
    Ok(())
}

/// Gradient tensors for `problem` on the device, every element `fill` (NaN poisons in tests).
pub fn alloc_gradients(
    ctx: &Context,
    problem: &Problem,
    inputs: &ForwardInputs<&CudaTensor>,
    fill: f32,
) -> Result<Gradients<CudaTensor>> {
    let p = problem;
    let f = |name: &str, shape: &[usize], dtype: DType| {
        CudaTensor::filled(ctx, name, shape, dtype, fill)
    };
    let gate = p.options.gate_in_kernel;
    Ok(Gradients {
        dq: f("dq", &p.qk_shape(), inputs.q.dtype())?,
        dk: f("dk", &p.qk_shape(), inputs.k.dtype())?,
        dv: f("dv", &p.v_shape(), inputs.v.dtype())?,
        dg: f("dg", &p.gate_shape(), DType::F32)?,
        dbeta: f("dbeta", &p.gate_shape(), DType::F32)?,
        dh0: match inputs.initial_state {
            Some(_) => Some(f("dh0", &p.state_shape(), DType::F32)?),
            None => None,
        },
        da_log: gate
            .then(|| f("dA_log", &[p.heads_v], DType::F32))
            .transpose()?,
        ddt_bias: gate
            .then(|| f("ddt_bias", &[p.heads_v], DType::F32))
            .transpose()?,
    })
}

/// Borrow every gradient tensor.
pub fn gradients_ref(g: &Gradients<CudaTensor>) -> Gradients<&CudaTensor> {
    Gradients {
        dq: &g.dq,
        dk: &g.dk,
        dv: &g.dv,
        dg: &g.dg,
        dbeta: &g.dbeta,
        dh0: g.dh0.as_ref(),
        da_log: g.da_log.as_ref(),
        ddt_bias: g.ddt_bias.as_ref(),
    }
}

/// Forward and backward on host tensors: check, upload, launch, wait, download.
pub fn forward_backward_host(
    ctx: &Context,
    problem: &Problem,
    inputs: &ForwardInputs<&HostTensor>,
    d_o: &HostTensor,
    dht: Option<&HostTensor>,
) -> Result<(ForwardOutputs<HostTensor>, Gradients<HostTensor>)> {
    problem.check_inputs(inputs, &STORAGE_DTYPES)?;
    crate::problem::check_host_values(problem, inputs)?;
    crate::wgpu_backend::backward::check_host_gradients(problem, inputs.v.dtype, d_o, dht)?;
    let dev = upload_inputs(ctx, inputs)?;
    let dev = dev.as_ref();
    let d_o = CudaTensor::upload(ctx, "do", d_o)?;
    let dht = dht.map(|t| CudaTensor::upload(ctx, "dht", t)).transpose()?;
    let seq = SeqBounds::upload(ctx, problem)?;
    let o = CudaTensor::zeros(ctx, "o", &problem.v_shape(), inputs.v.dtype)?;
    let state = CudaTensor::zeros(ctx, "final_state", &problem.state_shape(), DType::F32)?;
    recurrent::forward_into(
        ctx,
        problem,
        &seq,
        &dev,
        &ForwardOutputs {
            o: &o,
            final_state: &state,
        },
    )?;
    let ws = BackwardWorkspace::new(ctx, problem, inputs.q.dtype)?;
    let grads = alloc_gradients(ctx, problem, &dev, 0.0)?;
    backward_into(
        ctx,
        problem,
        &ws,
        &dev,
        &d_o,
        dht.as_ref(),
        &gradients_ref(&grads),
    )?;
    ctx.synchronize()?;
    let down = |t: &CudaTensor| t.download(ctx);
    let opt = |t: &Option<CudaTensor>| t.as_ref().map(down).transpose();
    Ok((
        ForwardOutputs {
            o: down(&o)?,
            final_state: down(&state)?,
        },
        Gradients {
            dq: down(&grads.dq)?,
            dk: down(&grads.dk)?,
            dv: down(&grads.dv)?,
            dg: down(&grads.dg)?,
            dbeta: down(&grads.dbeta)?,
            dh0: opt(&grads.dh0)?,
            da_log: opt(&grads.da_log)?,
            ddt_bias: opt(&grads.ddt_bias)?,
        },
    ))
}
