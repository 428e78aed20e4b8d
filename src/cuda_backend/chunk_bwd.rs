//! The chunked tensor-core backward (C = 64) for f16/bf16 storage with K, V ≤ 128: the
//! workspace and the order of its launches.
//!
//! 1. l2norm of q and k (only with `Options::l2norm_qk`; chunked.cu's kernel, as the forward).
//! 2. prep per (chunk, v-head): the gate cumsum and decays, T = (I + L)⁻¹, T·diag(β), P
//!    (`chunk_bwd_grad.cu`, chunk.cuh's prep with the backward's extras).
//! 3. the states pass and 4. the dh pass per (V-block, v-head, sequence), sequential over the
//!    chunks (`chunk_bwd_chain.cuh`): each chunk's start state S, X, v' and end-state gradient
//!    dS', dv'; dv and dh0.
//! 5. the gradient pass per (chunk, q/k head) (`chunk_bwd_grad.cu`): the terms inside the
//!    chunk, then those through its start state and end-state gradient, in one block, for
//!    each v-head of the GVA group; dq, dk summed over the group (the gradients themselves,
//!    or f32 with `l2norm_qk`), dβ, dg per v-head.
//! 6. backward.cu's finishing kernels: the l2norm chain rule for dq, dk (with `l2norm_qk`);
//!    the sigmoid and gate-activation chain rules, dA_log and ddt_bias.
//!
//! Deterministic: no atomics, every sum in a fixed order.

use cudarc::driver::CudaSlice;

use super::backward::{QkPartials, alloc_f32, dtype_suffix, gate_sums_len, launch_finish};
pub use super::chunk_bwd_chain::ChainSchedule;
use super::chunk_bwd_chain::{
    ChainBuffers, ChainInputs, ChainPass, SegmentBuffers, apart_resident, chain_plan, chain_smem,
    launch_dh, launch_states, launch_together,
};
use super::chunk_bwd_grad::{
    GradParts, MAX_CHUNKED_BWD_VALUE_DIM, QkOut, grad_smem, launch_grad, launch_prep,
};
use super::chunk_combine::{combine_smem, launch_chunk_combine};
pub use super::chunked::Segments;
use super::chunked::{
    ChunkParams, DeviceLimits, MAX_CHUNKED_KEY_DIM, UnitTable, launch_l2norm, prep_smem,
    resolve_segments,
};
use super::context::{Context, driver_error};
use super::recurrent::to_i32;
use super::tensor::CudaTensor;
use crate::error::Result;
use crate::problem::{CHUNK, ForwardInputs, Gradients, Problem};
use crate::tensor::DType;

/// How far [`crate::cuda_backend::backward::backward_stages_into`] goes on the chunked path
/// (each stage includes the ones before it): for timing the passes apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ChunkedStage {
    /// l2norm (with `l2norm_qk`) and the prep.
    Prep,
    /// The states pass.
    States,
    /// The dh pass.
    Chains,
    /// The per-chunk gradient pass (inside the chunk and through its states, one launch).
    Grad,
    /// Everything: the finishing kernels too.
    All,
}

/// The chunked backward's choices, for overriding them
/// ([`crate::cuda_backend::backward::BackwardWorkspace::with_options`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BackwardOptions {
    /// How the two sequential passes are launched.
    pub chains: ChainSchedule,
    /// Their V-block, one of [`crate::cuda_backend::CHAIN_VALUE_BLOCKS`]; `None`: chosen from
    /// the grid.
    pub value_block: Option<usize>,
    /// A pair of warps per 16 columns, each holding half the state's (or state gradient's) K
    /// rows (V-blocks 32 and 64; together only 32): half of each warp's products, the partial
    /// K·S (K·dS') summed through shared memory. `None`: [`AUTO_WARP_PAIRS`] where the chains
    /// then run together, else single warps.
    pub warp_pairs: Option<bool>,
    /// Sequence parallelism for both chains (exact: a local pass per segment, two combines,
    /// the main pass; chunk_bwd_chain.cuh). `Auto`: segments only where the chains' grid
    /// leaves at least half the SMs idle (`AUTO_SEGMENTS` in chunk_bwd.rs: 2/8 heads × 1×32768 bf16 on the
    /// H200 4.17 → 2.67 ms).
    pub segments: Segments,
}

/// Whether `Segments::Auto` cuts segments at all: yes. On the H200 (2026-12-02, BENCHMARKS.md,
/// h-cudabwd4 b1; bf16, 1×32768, chains together, two rounds of fresh processes) 2/8 heads
/// took 4.167 / 4.194 ms whole and 2.733 / 2.736 in segments of 128 chunks, 2.671 / 2.689 of
/// 64, 2.694 / 2.720 of 32; 16/32 heads (which the rule leaves whole) 6.385 whole against
/// 9.82 / 10.01 / 10.33 in segments of 128 / 64 / 32.
const AUTO_SEGMENTS: bool = true;

/// The shortest segment the automatic choice cuts, in chunks (as the forward's).
const MIN_SEGMENT_CHUNKS: usize = 16;

/// The automatic segment length of the chains: only where their grid (V-blocks × v-heads ×
/// sequences at the planned V-block) leaves at least half the SMs idle; then segments of
/// about `SMs / (V-blocks × v-heads)` units in all, twice over (2/8 heads × 1×32768 at V-block
/// 32: 8 segments of 64 chunks, 256 blocks in the main pass: 2.67 ms on the H200, against 2.73
/// for 4 of 128, one wave, and 2.69–2.72 for 16 of 32; [`AUTO_SEGMENTS`]). Where the SMs are
/// full already the local pass (the segments from zero and their transitions) only adds work
/// (16/32 heads: 6.39 ms whole, 9.8–10.3 in segments).
fn auto_segment_chunks(
    limits: &DeviceLimits,
    problem: &Problem,
    value_block: usize,
    seq_chunks: &[usize],
) -> Option<usize> {
    let p = problem;
    let per_unit = p.value_dim.div_ceil(value_block) * p.heads_v;
    if 2 * per_unit * seq_chunks.len() > limits.sms {
        return None;
    }
    let units = 2 * (limits.sms / per_unit).max(1);
    let total: usize = seq_chunks.iter().sum();
    let n = total.div_ceil(units).max(MIN_SEGMENT_CHUNKS);
    seq_chunks.iter().any(|&c| c > n).then_some(n)
}

/// Whether the chains take warp pairs unless told, where both chains then run in one launch,
/// together or apart (their grid resident at once; else single warps): yes (on the H200, 16/32 and 2/8 heads ×
/// 32768 tokens, the states chain 1.73 → 1.60 ms; BENCHMARKS.md).
pub const AUTO_WARP_PAIRS: bool = true;

/// Warp pairs or not, and the chains' schedule and V-block ([`chain_plan`]): `options`'
/// choices, with `warp_pairs: None` pairs ([`AUTO_WARP_PAIRS`]) where they give
/// [`ChainSchedule::Together`] or [`ChainSchedule::Apart`], else single warps.
fn chain_choice(
    limits: &DeviceLimits,
    problem: &Problem,
    options: BackwardOptions,
) -> Result<(bool, Option<(ChainSchedule, usize)>)> {
    let plan_with = |pairs| chain_plan(limits, problem, options.chains, options.value_block, pairs);
    if let Some(pairs) = options.warp_pairs {
        return Ok((pairs, plan_with(pairs)?));
    }
    if AUTO_WARP_PAIRS
        && let Ok(Some(plan @ (ChainSchedule::Together | ChainSchedule::Apart, _))) =
            plan_with(true)
    {
        return Ok((true, Some(plan)));
    }
    Ok((false, plan_with(false)?))
}

/// Whether the chunked backward takes `problem` with q, k, v stored as `dtype` on this
/// device: f16/bf16, K and V ≤ 128, and every pass within the shared memory a block may use.
pub(crate) fn chunked_backward_runs(
    ctx: &Context,
    problem: &Problem,
    dtype: DType,
) -> Result<bool> {
    if dtype == DType::F32
        || problem.key_dim > MAX_CHUNKED_KEY_DIM
        || problem.value_dim > MAX_CHUNKED_BWD_VALUE_DIM
    {
        return Ok(false);
    }
    let limit = super::chunked::max_shared_optin(ctx)?;
    Ok([prep_smem(), chain_smem(32, true, false), grad_smem()]
        .iter()
        .all(|&s| s <= limit))
}

fn alloc(ctx: &Context, name: &str, bytes: usize) -> Result<CudaSlice<u8>> {
    // A zero-byte allocation is refused by the driver; one spare byte is never read.
    ctx.stream()
        .alloc_zeros::<u8>(bytes.max(1))
        .map_err(|e| driver_error(&format!("allocation of {name}"), e))
}

/// The chunked backward's tables and workspace for one problem shape and dtype.
#[derive(Debug)]
pub(crate) struct ChunkedScratch {
    dtype: DType,
    num_chunks: usize,
    value_block: usize,
    chains: ChainSchedule,
    pairs: bool,
    /// (first token, length) per chunk; chunks never cross a sequence boundary.
    chunks: CudaSlice<i32>,
    /// (first chunk, end chunk, sequence, flags) per unit: a sequence, or a segment of one.
    units: CudaSlice<i32>,
    num_units: usize,
    /// Per sequence its first unit, then the end.
    seq_units: CudaSlice<i32>,
    /// The segment length where some sequence was cut, and the segments' buffers.
    segment_chunks: Option<usize>,
    segments: Option<SegmentBuffers>,
    /// l2-normalized q and k (only with `Options::l2norm_qk`).
    normalized: Option<(CudaSlice<u8>, CudaSlice<u8>)>,
    /// Per (chunk, v-head): γ, γ_C/γ, G, β (4·C f32).
    gates: CudaSlice<u8>,
    /// Per (chunk, v-head), storage dtype: T·diag(β), P, T (C × C).
    t_beta: CudaSlice<u8>,
    p: CudaSlice<u8>,
    t: CudaSlice<u8>,
    /// Per (chunk, v-head), storage dtype: Sᵀ, dS'ᵀ (V × K), Xᵀ, v'ᵀ, dv'ᵀ (V × C).
    states: CudaSlice<u8>,
    state_grads: CudaSlice<u8>,
    x: CudaSlice<u8>,
    v_new: CudaSlice<u8>,
    dv_new: CudaSlice<u8>,
    /// f32 dq, dk per (token, q/k head) (K each; with `l2norm_qk` only, else one unused
    /// float), dβ, dg per (token, v-head).
    dq_part: CudaSlice<f32>,
    dk_part: CudaSlice<f32>,
    dbeta_part: CudaSlice<f32>,
    dg_part: CudaSlice<f32>,
    /// The finishing kernels' dA_log / ddt_bias partial sums.
    gate_sums: CudaSlice<f32>,
}

impl ChunkedScratch {
    /// Upload the tables and allocate the workspace (enqueued on the context's stream). Its
    /// size per (chunk, v-head) is `16·C + s·(3·C² + 2·V·K + 3·V·C)` bytes (s: the dtype's
    /// size), plus `4·B·T·(2·H·K + 2·HV)` for the f32 gradients (`2·H·K` with `l2norm_qk`
    /// only) and
    /// `8·HV·⌈B·T/256⌉` for the finishing kernels' gate sums.
    pub(crate) fn new(
        ctx: &Context,
        problem: &Problem,
        dtype: DType,
        options: BackwardOptions,
    ) -> Result<Self> {
        let p = problem;
        to_i32("tokens (B·T)", p.total_tokens())?;
        let mut table = Vec::new();
        let mut seq_chunks = Vec::new();
        for s in p.sequences() {
            for c in (s.start..s.end).step_by(CHUNK) {
                table.push(to_i32("tokens (B·T)", c)?);
                table.push(((c + CHUNK).min(s.end) - c) as i32);
            }
            seq_chunks.push((s.end - s.start).div_ceil(CHUNK));
        }
        let num_chunks = table.len() / 2;
        to_i32("chunks", num_chunks)?;
        if table.is_empty() {
            table.push(0);
        }
        let limits = DeviceLimits::of(ctx)?;
        let (pairs, plan) = chain_choice(&limits, p, options)?;
        let (mut chains, value_block) = plan.unwrap_or((ChainSchedule::Serial, 32));
        let combine_fits = combine_smem(p.key_dim) <= limits.smem_per_block;
        let segment_chunks = resolve_segments(
            options.segments,
            || auto_segment_chunks(&limits, p, value_block, &seq_chunks).filter(|_| AUTO_SEGMENTS),
            combine_fits,
            p.key_dim,
            "backward segments",
        )?;
        // Units as the forward's ChunkPlan cuts them (an empty sequence: one empty unit).
        let UnitTable {
            mut units,
            seq_units,
            num_units,
            segment_chunks,
        } = UnitTable::cut(&seq_chunks, segment_chunks, "backward segments")?;
        let segmented = segment_chunks.is_some();
        // Segments multiply the chains' blocks: the automatic Apart (chosen where the
        // sequences' grids are resident) falls back to Together, which chain_plan takes there
        // otherwise, where the units' grids are not.
        if options.chains == ChainSchedule::Auto
            && chains == ChainSchedule::Apart
            && !apart_resident(&limits, p, value_block, pairs, num_units)
        {
            chains = ChainSchedule::Together;
        }
        if units.is_empty() {
            units.push(0);
        }
        let stream = ctx.stream();
        let upload = |what: &str, data: &[i32]| {
            stream
                .clone_htod(data)
                .map_err(|e| driver_error(&format!("upload of the {what}"), e))
        };
        let s = dtype.size();
        let (k, v, hv, c) = (p.key_dim, p.value_dim, p.heads_v, CHUNK);
        let heads = num_chunks * hv;
        let normalized = if p.options.l2norm_qk {
            let bytes = p.total_tokens() * p.heads_qk * k * s;
            Some((alloc(ctx, "q̂", bytes)?, alloc(ctx, "k̂", bytes)?))
        } else {
            None
        };
        let per_token = p.total_tokens() * hv;
        let segments = if segmented {
            let (starts, ends) = (num_units * hv * k * v * 4, num_units * hv * k * (v + k) * 4);
            Some(SegmentBuffers {
                start: alloc(ctx, "segment start states", starts)?,
                end: alloc(ctx, "segment end states", ends)?,
                dh_start: alloc(ctx, "segment end-state gradients", starts)?,
                dh_end: alloc(ctx, "segment start gradients", ends)?,
            })
        } else {
            None
        };
        let qk_parts = if p.options.l2norm_qk {
            p.total_tokens() * p.heads_qk * k
        } else {
            0
        };
        Ok(ChunkedScratch {
            dtype,
            num_chunks,
            value_block,
            chains,
            pairs,
            chunks: upload("chunk table", &table)?,
            units: upload("unit table", &units)?,
            num_units,
            seq_units: upload("sequence units", &seq_units)?,
            segment_chunks,
            segments,
            normalized,
            gates: alloc(ctx, "gate workspace", heads * 4 * c * 4)?,
            t_beta: alloc(ctx, "T·diag(β) workspace", heads * c * c * s)?,
            p: alloc(ctx, "P workspace", heads * c * c * s)?,
            t: alloc(ctx, "T workspace", heads * c * c * s)?,
            states: alloc(ctx, "chunk states", heads * v * k * s)?,
            state_grads: alloc(ctx, "chunk state gradients", heads * v * k * s)?,
            x: alloc(ctx, "X workspace", heads * v * c * s)?,
            v_new: alloc(ctx, "v' workspace", heads * v * c * s)?,
            dv_new: alloc(ctx, "dv' workspace", heads * v * c * s)?,
            dq_part: alloc_f32(ctx, "dq before the l2norm", qk_parts)?,
            dk_part: alloc_f32(ctx, "dk before the l2norm", qk_parts)?,
            dbeta_part: alloc_f32(ctx, "dbeta per v-head", per_token)?,
            dg_part: alloc_f32(ctx, "dg per v-head", per_token)?,
            gate_sums: alloc_f32(ctx, "gate sums", gate_sums_len(p))?,
        })
    }

    /// The V-block of the sequential passes.
    pub(crate) fn value_block(&self) -> usize {
        self.value_block
    }

    /// How the sequential passes are launched (`Auto` resolved).
    pub(crate) fn chains(&self) -> ChainSchedule {
        self.chains
    }

    /// Whether the sequential passes run with warp pairs.
    pub(crate) fn warp_pairs(&self) -> bool {
        self.pairs
    }

    /// The segment length (in chunks) where sequence parallelism cut some sequence.
    pub(crate) fn segment_chunks(&self) -> Option<usize> {
        self.segment_chunks
    }

    /// Bytes of device memory held.
    pub(crate) fn bytes(&self) -> usize {
        let pair = |x: &Option<(CudaSlice<u8>, CudaSlice<u8>)>| {
            x.as_ref().map_or(0, |(a, b)| a.len() + b.len())
        };
        [
            &self.gates,
            &self.t_beta,
            &self.p,
            &self.t,
            &self.states,
            &self.state_grads,
            &self.x,
            &self.v_new,
            &self.dv_new,
        ]
        .iter()
        .map(|b| b.len())
        .sum::<usize>()
            + pair(&self.normalized)
            + self.segments.as_ref().map_or(0, |b| {
                b.start.len() + b.end.len() + b.dh_start.len() + b.dh_end.len()
            })
            + 4 * (self.dq_part.len()
                + self.dk_part.len()
                + self.dbeta_part.len()
                + self.dg_part.len()
                + self.gate_sums.len())
    }

    /// Enqueue every launch; `backward_into` checked the tensors against the problem and
    /// that this workspace was made for it and the inputs' dtype.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn record(
        &self,
        ctx: &Context,
        problem: &Problem,
        inputs: &ForwardInputs<&CudaTensor>,
        d_o: &CudaTensor,
        dht: Option<&CudaTensor>,
        grads: &Gradients<&CudaTensor>,
        until: ChunkedStage,
    ) -> Result<()> {
        let p = problem;
        let suffix = dtype_suffix(self.dtype);
        let params = ChunkParams::of(p, self.num_chunks);
        let (q, k) = match &self.normalized {
            Some((qn, kn)) => {
                launch_l2norm(ctx, p, inputs, qn, kn)?;
                (qn, kn)
            }
            None => (inputs.q.buffer(), inputs.k.buffer()),
        };
        let ws = ChainBuffers {
            chunks: &self.chunks,
            units: &self.units,
            num_units: self.num_units,
            seq_units: &self.seq_units,
            segments: self.segments.as_ref(),
            gates: &self.gates,
            t_beta: &self.t_beta,
            p: &self.p,
            states: &self.states,
            state_grads: &self.state_grads,
            x: &self.x,
            v_new: &self.v_new,
            dv_new: &self.dv_new,
        };
        let l2norm = p.options.l2norm_qk;
        let parts = GradParts {
            qk: if l2norm {
                QkOut::Partials {
                    dq: &self.dq_part,
                    dk: &self.dk_part,
                }
            } else {
                QkOut::Final {
                    dq: grads.dq.buffer(),
                    dk: grads.dk.buffer(),
                }
            },
            dbeta: &self.dbeta_part,
            dg: &self.dg_part,
        };
        let n = self.num_chunks;
        let bv = self.value_block;
        if n > 0 && until >= ChunkedStage::Prep {
            launch_prep(
                ctx,
                p,
                &params,
                n,
                suffix,
                &ws,
                &self.t,
                q,
                k,
                inputs.g.buffer(),
                inputs.beta.buffer(),
                inputs.a_log.map(|t| t.buffer()),
                inputs.dt_bias.map(|t| t.buffer()),
            )?;
        }
        // The dh pass runs for every sequence, empty ones too (dh0 = dht there). Together,
        // the States stage (for timing) runs the states pass alone. With segments, the local
        // pass (the dh one reads the transitions the states one writes) and the two combines
        // come first.
        let one_launch = matches!(self.chains, ChainSchedule::Together | ChainSchedule::Apart);
        let apart = self.chains == ChainSchedule::Apart;
        let run_states = n > 0 && until >= ChunkedStage::States;
        let run_dh = p.num_sequences() > 0 && until >= ChunkedStage::Chains;
        let v = inputs.v.buffer();
        let h0 = inputs.initial_state.map(|t| t.buffer());
        let io = ChainInputs {
            q,
            k,
            v,
            d_o: d_o.buffer(),
            h0,
            dht: dht.map(|t| t.buffer()),
            dv: grads.dv.buffer(),
            dh0: grads.dh0.map(|t| t.buffer()),
        };
        let chains = |pass: ChainPass| -> Result<()> {
            if one_launch && run_dh {
                return launch_together(
                    ctx, p, &params, pass, bv, self.pairs, suffix, &ws, &io, apart,
                );
            }
            if run_states {
                launch_states(ctx, p, &params, pass, bv, self.pairs, suffix, &ws, k, v, h0)?;
            }
            if run_dh {
                launch_dh(
                    ctx, p, &params, pass, bv, self.pairs, suffix, &ws, q, k, io.d_o, io.dht,
                    io.dv, io.dh0,
                )?;
            }
            Ok(())
        };
        if let Some(seg) = &self.segments {
            chains(ChainPass::Local)?;
            if run_states {
                let h0 = inputs.initial_state;
                launch_chunk_combine(ctx, p, &self.seq_units, None, h0, &seg.end, &seg.start)?;
            }
            if run_dh {
                let (ends, starts) = (&seg.dh_end, &seg.dh_start);
                launch_chunk_combine(ctx, p, &self.seq_units, None, dht, ends, starts)?;
            }
        }
        chains(ChainPass::Main)?;
        if n > 0 && until >= ChunkedStage::Grad {
            launch_grad(
                ctx,
                p,
                &params,
                n,
                suffix,
                &ws,
                &self.t,
                q,
                k,
                d_o.buffer(),
                grads.dv.buffer(),
                &parts,
            )?;
        }
        if until < ChunkedStage::All {
            return Ok(());
        }
        launch_finish(
            ctx,
            p,
            1,
            if l2norm {
                QkPartials::PerQkHead
            } else {
                QkPartials::Written
            },
            inputs,
            [
                &self.dq_part,
                &self.dk_part,
                &self.dbeta_part,
                &self.dg_part,
            ],
            &self.gate_sums,
            grads,
        )
    }
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

    #[test]
    fn automatic_segments_only_where_the_chains_leave_half_the_sms_idle() {
        let shape = |qk: usize, v: usize, t: usize| {
            Problem::new(1, t, qk, v, 128, 128, None, Options::default()).unwrap()
        };
        let auto = |p: &Problem, bv: usize| {
            let chunks: Vec<usize> = p
                .sequences()
                .iter()
                .map(|s| s.len().div_ceil(CHUNK))
                .collect();
            auto_segment_chunks(&h200(), p, bv, &chunks)
        };
        // 2/8 at V-block 32: 32 blocks a sequence, 8 units: segments of 64 chunks (× 8192:
        // of 16).
        assert_eq!(auto(&shape(2, 8, 32768), 32), Some(64));
        assert_eq!(auto(&shape(2, 8, 8192), 32), Some(16));
        // Never shorter than the minimum, never where a sequence fits one segment.
        assert_eq!(auto(&shape(2, 8, 2048), 32), Some(16));
        assert_eq!(auto(&shape(2, 8, 1024), 32), None);
        // 16/32 and 16/64 fill the SMs already.
        assert_eq!(auto(&shape(16, 32, 32768), 32), None);
        assert_eq!(auto(&shape(16, 64, 32768), 64), None);
    }

    #[test]
    fn warp_pairs_by_default_only_where_the_chains_run_in_one_launch() {
        let shape = |qk: usize, v: usize| {
            Problem::new(1, 32768, qk, v, 128, 128, None, Options::default()).unwrap()
        };
        let auto = BackwardOptions::default();
        let together = |bv| Some((ChainSchedule::Together, bv));
        // 16/32: both chains together at V-block 32 with pairs (128 blocks); 2/8: apart, a
        // block per chain (2 × 32 blocks, one per SM).
        assert_eq!(
            chain_choice(&h200(), &shape(16, 32), auto).unwrap(),
            (true, together(32))
        );
        assert_eq!(
            chain_choice(&h200(), &shape(2, 8), auto).unwrap(),
            (true, Some((ChainSchedule::Apart, 32)))
        );
        // Apart has pair kernels at V-block 32 only: forced elsewhere it is an error.
        for (value_block, warp_pairs) in [(None, Some(false)), (Some(64), Some(true))] {
            let apart = BackwardOptions {
                chains: ChainSchedule::Apart,
                value_block,
                warp_pairs,
                segments: Segments::Auto,
            };
            assert!(chain_choice(&h200(), &shape(2, 8), apart).is_err());
        }
        let forced = BackwardOptions {
            chains: ChainSchedule::Apart,
            ..auto
        };
        assert_eq!(
            chain_choice(&h200(), &shape(16, 32), forced).unwrap(),
            (true, Some((ChainSchedule::Apart, 32)))
        );
        // 16/64: 256 blocks at V-block 32 are not resident; single warps together at 64.
        let wide = shape(16, 64);
        assert_eq!(
            chain_choice(&h200(), &wide, auto).unwrap(),
            (false, together(64))
        );
        // Forced choices are kept, and a schedule pairs cannot run stays an error.
        let single = BackwardOptions {
            warp_pairs: Some(false),
            ..auto
        };
        assert_eq!(
            chain_choice(&h200(), &shape(16, 32), single).unwrap(),
            (false, together(32))
        );
        let pairs_at_64 = BackwardOptions {
            chains: ChainSchedule::Together,
            value_block: Some(64),
            warp_pairs: Some(true),
            segments: Segments::Auto,
        };
        assert!(chain_choice(&h200(), &wide, pairs_at_64).is_err());
        // Forced single-warp V-block 64 together, auto pairs: no pairs kernel there.
        let at_64 = BackwardOptions {
            chains: ChainSchedule::Together,
            value_block: Some(64),
            warp_pairs: None,
            segments: Segments::Auto,
        };
        assert_eq!(
            chain_choice(&h200(), &shape(16, 32), at_64).unwrap(),
            (false, together(64))
        );
    }
}
