//! The recurrent kernel (`shaders/cuda/recurrent.cu`): the token-by-token recurrence with every
//! option, serving both the forward and decode. Launchers only enqueue on the context's
//! stream; the `*_host` functions upload, launch, wait and download.

use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg};

use super::context::{Context, driver_error};
use super::kernels::{RECURRENT, option_flags};
use super::tensor::{CudaTensor, upload_inputs};
use crate::error::{Error, Result};
use crate::problem::{ForwardInputs, ForwardOutputs, Problem};
use crate::tensor::{DType, HostTensor, TensorMeta};

/// Storage dtypes of q, k, v (and o) the recurrent kernel takes.
pub const STORAGE_DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// v columns per thread block and threads per block: `BV` and `BV·KSPLIT` in recurrent.cu.
const BLOCK_V: usize = 32;
const THREADS: u32 = 128;

/// Mirrors `gdn::RecurrentParams` in recurrent.cu and `gdn::DecodeParams` in decode.cu (the
/// same layout): the problem's dims and options and the window of tokens one launch runs.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecurrentParams {
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
unsafe impl DeviceRepr for RecurrentParams {}

impl RecurrentParams {
    /// The parameters of a launch of `p` over `window`; a dim past i32 is an error naming it.
    pub(crate) fn new(p: &Problem, window: Window) -> Result<Self> {
        Ok(RecurrentParams {
            heads_qk: to_i32("heads_qk", p.heads_qk)?,
            heads_v: to_i32("heads_v", p.heads_v)?,
            key_dim: to_i32("key_dim", p.key_dim)?,
            value_dim: to_i32("value_dim", p.value_dim)?,
            group: to_i32("group", p.group())?,
            flags: option_flags(p),
            window_begin: window.begin.min(i32::MAX as usize) as i32,
            window_len: window.len.min(i32::MAX as usize) as i32,
            scale: p.scale(),
        })
    }
}

/// The sequences' token boundaries on the packed axis (`cu_seqlens`, or `b·T` without it), as
/// the kernel reads them (i32, N + 1 entries).
#[derive(Debug)]
pub struct SeqBounds {
    sequences: usize,
    buf: CudaSlice<i32>,
}

pub(crate) fn to_i32(name: &str, x: usize) -> Result<i32> {
    i32::try_from(x).map_err(|_| Error::value(name, format!("at most {}", i32::MAX), x))
}

impl SeqBounds {
    /// Upload the boundaries of `problem`'s sequences (enqueued on the context's stream).
    pub fn upload(ctx: &Context, problem: &Problem) -> Result<Self> {
        let seqs = problem.sequences();
        let mut bounds = Vec::with_capacity(seqs.len() + 1);
        bounds.push(0);
        for s in &seqs {
            bounds.push(to_i32("tokens (B·T)", s.end)?);
        }
        let buf = ctx
            .stream()
            .clone_htod(&bounds)
            .map_err(|e| driver_error("upload of the sequence bounds", e))?;
        Ok(SeqBounds {
            sequences: seqs.len(),
            buf,
        })
    }

    /// How many sequences (N).
    pub(crate) fn sequences(&self) -> usize {
        self.sequences
    }

    /// The device buffer of the N + 1 bounds, for kernel arguments.
    pub(crate) fn buffer(&self) -> &CudaSlice<i32> {
        &self.buf
    }
}

/// The tokens of each sequence one launch runs: `begin..begin + len` relative to each
/// sequence's start (clamped to its end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// First token, relative to each sequence's start.
    pub begin: usize,
    /// Tokens per sequence (at most; a shorter sequence stops at its end).
    pub len: usize,
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

/// Where one recurrent launch reads its states and writes o and its states.
#[derive(Debug, Clone, Copy)]
pub struct RecurrentIo<'a> {
    /// The state each sequence starts from (the problem's state shape, f32); zeros when `None`.
    pub h_in: Option<&'a CudaTensor>,
    /// `[B,T,HV,V]` in the dtype of v: o of the window's tokens.
    pub o: &'a CudaTensor,
    /// The state after the window (may be `h_in`: a pool updated in place).
    pub h_out: &'a CudaTensor,
}

/// Enqueue one recurrent launch: for every sequence and v-head, read the state from `io.h_in`,
/// run the tokens of `window`, write o for them and the state to `io.h_out`. No host
/// synchronisation.
pub fn launch_recurrent(
    ctx: &Context,
    problem: &Problem,
    seq: &SeqBounds,
    inputs: &ForwardInputs<&CudaTensor>,
    io: RecurrentIo<'_>,
    window: Window,
) -> Result<()> {
    let RecurrentIo { h_in, o, h_out } = io;
    let p = problem;
    p.check_inputs(inputs, &STORAGE_DTYPES)?;
    let dtype = inputs.q.dtype();
    check_tensor("o", o, &p.v_shape(), dtype)?;
    check_tensor("final_state", h_out, &p.state_shape(), DType::F32)?;
    if let Some(h) = h_in {
        check_tensor("initial_state", h, &p.state_shape(), DType::F32)?;
    }
    if seq.sequences != p.num_sequences() {
        return Err(Error::value(
            "sequence bounds",
            format!("{} sequences (the problem's N)", p.num_sequences()),
            seq.sequences,
        ));
    }
    to_i32("tokens (B·T)", p.total_tokens())?;
    // Grid y and z are limited to 65535 blocks.
    for (name, x) in [
        ("heads_v (HV)", p.heads_v),
        ("sequences (N)", seq.sequences),
    ] {
        if x > 65535 {
            return Err(Error::unsupported(
                name,
                format!("{x} on the cuda backend (at most 65535)"),
            ));
        }
    }
    let params = RecurrentParams::new(p, window)?;
    let function = match dtype {
        DType::F32 => "gdn_recurrent_f32",
        DType::F16 => "gdn_recurrent_f16",
        DType::BF16 => "gdn_recurrent_bf16",
    };
    let func = ctx.function(&RECURRENT, function)?;
    let cfg = LaunchConfig {
        grid_dim: (
            p.value_dim.div_ceil(BLOCK_V) as u32,
            p.heads_v as u32,
            seq.sequences as u32,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // Absent optional tensors are null pointers.
    let null: u64 = 0;
    let stream = ctx.stream();
    let mut launch = stream.launch_builder(&func);
    launch
        .arg(&params)
        .arg(&seq.buf)
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
    match h_in {
        Some(t) => launch.arg(t.buffer()),
        None => launch.arg(&null),
    };
    launch.arg(o.buffer()).arg(h_out.buffer());
    // SAFETY: the argument list matches GDN_RECURRENT in recurrent.cu; every buffer was checked
    // above to have the shape and dtype the kernel indexes with.
    unsafe { launch.launch(cfg) }.map_err(|e| driver_error(&format!("launch of {function}"), e))?;
    Ok(())
}

/// Enqueue the forward on the path [`forward_path`](super::forward_path) picks: the chunked
/// kernels (with a [`ChunkPlan`](super::ChunkPlan) made for this call: it allocates and uploads
/// the chunk table) or one recurrent launch over every token. o and the final state into
/// `outputs`. Not for CUDA-graph capture on the chunked path (the plan allocates): use
/// [`launch_chunked`](super::launch_chunked) with a plan made beforehand.
pub fn forward_into(
    ctx: &Context,
    problem: &Problem,
    seq: &SeqBounds,
    inputs: &ForwardInputs<&CudaTensor>,
    outputs: &ForwardOutputs<&CudaTensor>,
) -> Result<()> {
    let dtype = inputs.q.dtype();
    if super::forward_path(ctx, problem, dtype)? == super::ForwardPath::Chunked {
        if seq.sequences != problem.num_sequences() {
            return Err(Error::value(
                "sequence bounds",
                format!("{} sequences (the problem's N)", problem.num_sequences()),
                seq.sequences,
            ));
        }
        let plan = super::ChunkPlan::new(ctx, problem, dtype)?;
        return super::launch_chunked(ctx, problem, &plan, inputs, outputs);
    }
    forward_recurrent_into(ctx, problem, seq, inputs, outputs)
}

/// Enqueue the forward on the recurrent kernel whatever the dtype: one launch over every
/// token, o and the final state into `outputs`.
pub fn forward_recurrent_into(
    ctx: &Context,
    problem: &Problem,
    seq: &SeqBounds,
    inputs: &ForwardInputs<&CudaTensor>,
    outputs: &ForwardOutputs<&CudaTensor>,
) -> Result<()> {
    let longest = problem
        .sequences()
        .iter()
        .map(|s| s.len())
        .max()
        .unwrap_or(0);
    launch_recurrent(
        ctx,
        problem,
        seq,
        inputs,
        RecurrentIo {
            h_in: inputs.initial_state,
            o: outputs.o,
            h_out: outputs.final_state,
        },
        Window {
            begin: 0,
            len: longest,
        },
    )
}

pub(crate) fn check_host(problem: &Problem, inputs: &ForwardInputs<&HostTensor>) -> Result<()> {
    problem.check_inputs(inputs, &STORAGE_DTYPES)?;
    crate::problem::check_host_values(problem, inputs)
}

/// The forward on host tensors: check, upload, launch, wait, download.
pub fn forward_host(
    ctx: &Context,
    problem: &Problem,
    inputs: &ForwardInputs<&HostTensor>,
) -> Result<ForwardOutputs<HostTensor>> {
    check_host(problem, inputs)?;
    let dev = upload_inputs(ctx, inputs)?;
    let seq = SeqBounds::upload(ctx, problem)?;
    let o = CudaTensor::zeros(ctx, "o", &problem.v_shape(), inputs.v.dtype)?;
    let state = CudaTensor::zeros(ctx, "final_state", &problem.state_shape(), DType::F32)?;
    forward_into(
        ctx,
        problem,
        &seq,
        &dev.as_ref(),
        &ForwardOutputs {
            o: &o,
            final_state: &state,
        },
    )?;
    ctx.synchronize()?;
    Ok(ForwardOutputs {
        o: o.download(ctx)?,
        final_state: state.download(ctx)?,
    })
}
