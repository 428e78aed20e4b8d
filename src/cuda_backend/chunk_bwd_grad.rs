//! The chunked backward's parallel passes (`shaders/cuda/chunk_bwd_grad.cu`): the prep (the
//! forward's, with T, G and β kept; a block per (chunk, q/k head, up to 4 v-heads of its
//! group)), and the gradients inside each chunk together with those through its start state
//! and end-state gradient (a block per (chunk, q/k head), over the v-heads of its GVA group).

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::chunk_bwd_chain::ChainBuffers;
use super::chunked::{ChunkParams, MAX_CHUNKED_KEY_DIM, prep_grid, prep_smem};
use super::context::{Context, driver_error};
use super::kernels::CHUNK_BWD_GRAD;
use crate::error::Result;
use crate::problem::{CHUNK, Problem};

/// Threads per block of the prep (`PREP_THREADS`).
const PREP_THREADS: u32 = 256;
/// Threads per block of the gradient pass (`GRAD_THREADS`): 16 warps.
const GRAD_THREADS: u32 = 512;
/// Its last step's column groups (`GRAD_COLS`): a quarter of the warps.
const GRAD_COLS: usize = GRAD_THREADS as usize / 32 / 4;
/// The largest V the per-chunk passes hold (`MAX_V`).
pub const MAX_CHUNKED_BWD_VALUE_DIM: usize = 128;

const LDK: usize = MAX_CHUNKED_KEY_DIM + 8;
const LDC: usize = CHUNK + 8;

/// chunk_bwd_grad.cu's GradLayout: q, k, dO; v'ᵀ; the intra-chunk room (Xᵀ, dv'ᵀ, T, P, dT);
/// the state room (Sᵀ, dS'ᵀ, dX); the gates twice (this v-head's and the next one's); five
/// sums' partials per 16×16 block row or column; dG, the row partials and the warp sums.
pub(crate) fn grad_smem() -> usize {
    let c = CHUNK;
    let v = MAX_CHUNKED_BWD_VALUE_DIM;
    3 * 2 * c * LDK
        + 2 * v * LDC
        + (2 * 2 * v * LDC + 3 * 2 * c * LDC)
        + (2 * 2 * v * LDK + 2 * c * LDK)
        + 2 * 4 * 4 * c
        + 4 * 5 * (c / 16) * c
        + 4 * ((1 + 2 * GRAD_COLS) * c + 4 * GRAD_COLS)
}

fn grid(num_chunks: usize, heads: usize) -> (u32, u32, u32) {
    (num_chunks as u32, heads as u32, 1)
}

/// Where the gradient pass writes dq and dk (`[B·T, H, K]`, summed over each GVA group).
pub(crate) enum QkOut<'a> {
    /// In the storage dtype: the gradients themselves (no l2norm chain rule follows).
    Final {
        dq: &'a CudaSlice<u8>,
        dk: &'a CudaSlice<u8>,
    },
    /// In f32, for backward.cu's l2norm chain rule.
    Partials {
        dq: &'a CudaSlice<f32>,
        dk: &'a CudaSlice<f32>,
    },
}

/// What the gradient pass writes: dq, dk, and the f32 per-v-head dβ and dg (`[B·T, HV]`),
/// taken through the activations by backward.cu's finishing kernels.
pub(crate) struct GradParts<'a> {
    pub qk: QkOut<'a>,
    pub dbeta: &'a CudaSlice<f32>,
    pub dg: &'a CudaSlice<f32>,
}

/// Enqueue the backward's prep: the gates, T·diag(β), P and T per (chunk, v-head) into `ws`
/// and `t`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_prep(
    ctx: &Context,
    problem: &Problem,
    params: &ChunkParams,
    num_chunks: usize,
    suffix: &str,
    ws: &ChainBuffers<'_>,
    t: &CudaSlice<u8>,
    q: &CudaSlice<u8>,
    k: &CudaSlice<u8>,
    g: &CudaSlice<u8>,
    beta: &CudaSlice<u8>,
    a_log: Option<&CudaSlice<u8>>,
    dt_bias: Option<&CudaSlice<u8>>,
) -> Result<()> {
    let name = format!("gdn_chunk_bwd_prep_{suffix}");
    let smem = prep_smem();
    let func = ctx.function_with_smem(&CHUNK_BWD_GRAD, &name, smem)?;
    let null: u64 = 0;
    let mut l = ctx.stream().launch_builder(&func);
    l.arg(params).arg(ws.chunks).arg(q).arg(k).arg(g).arg(beta);
    for x in [a_log, dt_bias] {
        match x {
            Some(x) => l.arg(x),
            None => l.arg(&null),
        };
    }
    l.arg(ws.gates).arg(ws.t_beta).arg(ws.p).arg(t);
    let cfg = LaunchConfig {
        grid_dim: prep_grid(problem, num_chunks),
        block_dim: (PREP_THREADS, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    // SAFETY: matches gdn_chunk_bwd_prep_* in chunk_bwd_grad.cu; inputs checked against the
    // problem by the caller, the workspace sized for its chunks.
    unsafe { l.launch(cfg) }.map_err(|e| driver_error(&format!("launch of {name}"), e))?;
    Ok(())
}

/// Enqueue the per-chunk gradient pass: dq, dk (inside the chunk, through P and the inverse,
/// and through its start state and end-state gradient), dβ, and dg (the reverse chunk-local
/// cumsum of dG). Reads dv as the dh pass wrote it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_grad(
    ctx: &Context,
    problem: &Problem,
    params: &ChunkParams,
    num_chunks: usize,
    suffix: &str,
    ws: &ChainBuffers<'_>,
    t: &CudaSlice<u8>,
    q: &CudaSlice<u8>,
    k: &CudaSlice<u8>,
    d_o: &CudaSlice<u8>,
    dv: &CudaSlice<u8>,
    parts: &GradParts<'_>,
) -> Result<()> {
    let name = format!("gdn_chunk_bwd_grad_{suffix}");
    let smem = grad_smem();
    let func = ctx.function_with_smem(&CHUNK_BWD_GRAD, &name, smem)?;
    let null: u64 = 0;
    let mut l = ctx.stream().launch_builder(&func);
    l.arg(params)
        .arg(ws.chunks)
        .arg(q)
        .arg(k)
        .arg(d_o)
        .arg(dv)
        .arg(ws.gates)
        .arg(ws.p)
        .arg(t)
        .arg(ws.x)
        .arg(ws.v_new)
        .arg(ws.dv_new)
        .arg(ws.states)
        .arg(ws.state_grads);
    match &parts.qk {
        QkOut::Final { dq, dk } => l.arg(&null).arg(&null).arg(*dq).arg(*dk),
        QkOut::Partials { dq, dk } => l.arg(*dq).arg(*dk).arg(&null).arg(&null),
    };
    l.arg(parts.dg).arg(parts.dbeta);
    let cfg = LaunchConfig {
        grid_dim: grid(num_chunks, problem.heads_qk),
        block_dim: (GRAD_THREADS, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    // SAFETY: matches gdn_chunk_bwd_grad_* in chunk_bwd_grad.cu (exactly one of the f32 and
    // the storage-dtype dq, dk pointers is null); the workspace and the parts were sized for
    // this problem's chunks and tokens, dq, dk checked against the problem.
    unsafe { l.launch(cfg) }.map_err(|e| driver_error(&format!("launch of {name}"), e))?;
    Ok(())
}
