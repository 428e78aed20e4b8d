//! The forward through the recurrent kernel (`shaders/decode/recurrent_step.wgsl`, launched by
//! [`DecodePlan`]): the final state starts as a copy of h0 (or zeros), each sequence `n`
//! resumes from "pool slot" `n` of that final state and walks its tokens, writing o and the
//! state in place. One pass, one pipeline, f32 arithmetic whatever the storage dtype. Also
//! where the forward's algorithm is chosen ([`forward_algorithm`]).

use crate::error::Result;
use crate::problem::{ForwardInputs, ForwardOutputs, Problem};
use crate::tensor::DType;
use crate::wgpu_backend::decode::{
    DecodeOutputs, DecodePlan, RecurrentStepTiles, StateLayout, StatePool, StateSlot, TABLE_WORDS,
    decode_storage_dtypes, max_sequences,
};
use crate::wgpu_backend::path::{AlgorithmChoice, choose_algorithm};
use crate::wgpu_backend::shaders::Pass;
use crate::wgpu_backend::{Context, GpuTensor};

/// The algorithm the forward runs for `problem` with q, k, v stored as `dtype` on this
/// context, and why (see [`choose_algorithm`]): the context's forced algorithm if any, else
/// the automatic choice from the problem's sequence lengths and the adapter's type. What
/// `forward`, `forward_into`, `forward_into_profiled` and `forward_host` run; `gdn info`
/// and `gdn bench` report it.
pub fn forward_algorithm(
    ctx: &Context,
    problem: &Problem,
    dtype: DType,
) -> Result<AlgorithmChoice> {
    choose_algorithm(
        ctx.adapter_info.as_ref().map(|i| i.device_type),
        problem,
        recurrent_rejects(ctx, problem, dtype),
        ctx.forced_forward_algorithm(),
    )
}

/// Why the recurrent kernel cannot run `problem`'s forward with `dtype` storage on this
/// context, if it cannot: a storage dtype it does not take here, more sequences than its
/// uniform tables address, a device whose uniform bindings are smaller than the tables, or
/// no tiling within the workgroup limits.
pub fn recurrent_rejects(ctx: &Context, problem: &Problem, dtype: DType) -> Option<String> {
    if !decode_storage_dtypes(ctx).contains(&dtype) {
        return Some(format!(
            "the recurrent kernel takes no {dtype} storage on this device"
        ));
    }
    let most = max_sequences(problem.heads_v);
    if problem.num_sequences() > most {
        return Some(format!(
            "{} sequences (the recurrent kernel's tables address {most} per call)",
            problem.num_sequences()
        ));
    }
    let limits = ctx.limits();
    let table_bytes = 4 * TABLE_WORDS as u64;
    if limits.max_uniform_buffer_binding_size < table_bytes {
        return Some(format!(
            "uniform bindings of {} bytes (the recurrent kernel's tables need {table_bytes})",
            limits.max_uniform_buffer_binding_size
        ));
    }
    // The recurrent kernel binds whole tensors: past one binding the chunked scan, which runs
    // in token windows, takes the call.
    let limit = ctx.max_binding_bytes();
    let (tokens, hv) = (problem.total_tokens() as u64, problem.heads_v as u64);
    let widest = (tokens * hv * problem.value_dim as u64 * dtype.size() as u64)
        .max(tokens * problem.heads_qk as u64 * problem.key_dim as u64 * dtype.size() as u64)
        .max(
            problem.num_sequences() as u64 * hv * 4 * (problem.key_dim * problem.value_dim) as u64,
        );
    if widest > limit {
        return Some(format!(
            "a tensor of {widest} bytes, past one binding ({limit}): the recurrent kernel does not \
             run in windows"
        ));
    }
    // llvmpipe (lavapipe) silently ends a shader invocation's loops after 65,535 iterations in
    // all (docs/platforms.md), and the recurrent kernel loops over every token of a sequence
    // in one invocation. Measured: decode went wrong from token 9,363 at K = V = 16 (about 7
    // iterations per token); 3K/4 + 4 per token is a conservative bound for every K.
    let llvmpipe = ctx
        .adapter_info
        .as_ref()
        .is_some_and(|i| i.name.to_lowercase().contains("llvmpipe"));
    let longest = problem
        .sequences()
        .iter()
        .map(|s| s.len())
        .max()
        .unwrap_or(0);
    let per_token = 3 * problem.key_dim / 4 + 4;
    if llvmpipe && longest * per_token > LLVMPIPE_LOOP_ITERATIONS {
        return Some(format!(
            "a sequence of {longest} tokens on llvmpipe, whose shader loops stop after \
             {LLVMPIPE_LOOP_ITERATIONS} iterations (at most {} tokens per sequence at K = {})",
            LLVMPIPE_LOOP_ITERATIONS / per_token,
            problem.key_dim
        ));
    }
    recurrent_tiles(ctx, problem, dtype)
        .err()
        .map(|e| e.to_string())
}

/// Mesa's `LP_MAX_TGSI_LOOP_ITERATIONS`: llvmpipe's cap on one invocation's loop iterations.
const LLVMPIPE_LOOP_ITERATIONS: usize = 65_535;

/// The recurrent kernel's tiling for a forward on this context with `dtype` storage: the
/// decode default ([`RecurrentStepTiles::choose`], tuned for GPUs) except on CPU-type
/// adapters:
/// - In a browser (Chromium's SwiftShader): the column kernel (`column_step.wgsl`, two
///   columns per invocation, V-block nearest 32) where it takes the problem (f32 or f16
///   storage, K ≤ 128). Measured in Chromium 156 on SwiftShader (2026-12-02, `kernel-ab.mjs`,
///   T = 512, H/HV = 2/4, K = V = 128, dispatches alternated in one page, load 100–600): it
///   created its pipeline faster and ran 1.6–2.7× faster than the workgroup kernel at 32 × 32
///   (docs/compute-paths.md, "Tiling on CPU adapters").
/// - Elsewhere (lavapipe): the workgroup kernel with the most state per invocation (32 vec4s)
///   in workgroups of about 32 invocations: a CPU runs a workgroup's invocations one after
///   another, so fewer, fuller invocations spend less on the two barriers per token and the
///   per-invocation staging. Measured on lavapipe (2 cores shared with other jobs, 5 runs
///   each, median; docs/compute-paths.md): T = 512, H/HV = 2/4, K = V = 128: the GPU default
///   (V-block 32, 8 vec4s, 128 invocations) 388 / 965 ms in two sweeps, V-block 32 with 32
///   vec4s (32 invocations) 154 / 328 ms. The column kernel there (2026-12-02, T = 512,
///   alternated, load 400–600): 779–860 ms against 820–1018 ms warm, not clearly faster, and
///   54 s for LLVM to compile on an empty Mesa shader cache.
pub fn recurrent_tiles(
    ctx: &Context,
    problem: &Problem,
    dtype: DType,
) -> Result<RecurrentStepTiles> {
    let limits = ctx.limits();
    let info = ctx.adapter_info.as_ref();
    let cpu = info.is_some_and(|i| i.device_type == wgpu::DeviceType::Cpu);
    if !cpu {
        return RecurrentStepTiles::choose(&limits, problem);
    }
    let browser = info.is_some_and(|i| i.backend == wgpu::Backend::BrowserWebGpu);
    if browser
        && Pass::ColumnStep.storage_dtypes().contains(&dtype)
        && let Some(t) = RecurrentStepTiles::column_candidates(&limits, problem)
            .into_iter()
            .min_by_key(|t| t.v_block.abs_diff(32))
    {
        return Ok(t);
    }
    let score = |t: &RecurrentStepTiles| {
        (
            std::cmp::Reverse(t.vec4s_per_thread),
            t.workgroup().abs_diff(32),
            std::cmp::Reverse(t.v_block),
        )
    };
    match RecurrentStepTiles::candidates(&limits, problem)
        .into_iter()
        .min_by_key(score)
    {
        Some(t) => Ok(t),
        None => RecurrentStepTiles::choose(&limits, problem),
    }
}

/// A forward through the recurrent kernel, prepared for given inputs and outputs: record it
/// with [`RecurrentForward::record`] as often as you like (refill the bound inputs between
/// calls). Nothing is allocated per record: what a benchmark or a loop over short calls wants.
pub struct RecurrentForward {
    plan: DecodePlan,
    /// (h0, the final state, bytes) to copy before the kernel; `None` clears the final state.
    initial: Option<(wgpu::Buffer, u64)>,
    final_state: wgpu::Buffer,
}

impl RecurrentForward {
    /// Validate (like the chunked forward) and prepare. An `Error::Unsupported` naming
    /// "forward algorithm" where the recurrent kernel cannot run the problem
    /// ([`recurrent_rejects`]).
    pub fn new(
        ctx: &Context,
        problem: &Problem,
        inputs: &ForwardInputs<&GpuTensor>,
        outputs: &ForwardOutputs<&GpuTensor>,
    ) -> Result<Self> {
        Self::prepare(ctx, problem, inputs, outputs, None)
    }

    /// [`RecurrentForward::new`] with a given tiling (one of
    /// [`RecurrentStepTiles::candidates`]), for tests and tiling sweeps.
    pub fn with_tiles(
        ctx: &Context,
        problem: &Problem,
        inputs: &ForwardInputs<&GpuTensor>,
        outputs: &ForwardOutputs<&GpuTensor>,
        tiles: RecurrentStepTiles,
    ) -> Result<Self> {
        Self::prepare(ctx, problem, inputs, outputs, Some(tiles))
    }

    fn prepare(
        ctx: &Context,
        problem: &Problem,
        inputs: &ForwardInputs<&GpuTensor>,
        outputs: &ForwardOutputs<&GpuTensor>,
        tiles: Option<RecurrentStepTiles>,
    ) -> Result<Self> {
        super::check_call(ctx, problem, inputs, outputs)?;
        if let Some(why) = recurrent_rejects(ctx, problem, inputs.q.dtype) {
            return Err(crate::Error::unsupported(
                "forward algorithm",
                format!("the recurrent kernel for {why}"),
            ));
        }
        // The final state is the pool: slot n holds sequence n's state, resumed in place.
        let pool = StatePool::from_tensor(outputs.final_state.clone(), StateLayout::of(problem))?;
        let slots: Vec<StateSlot> = (0..problem.num_sequences() as u32)
            .map(StateSlot::Resume)
            .collect();
        let inputs_from_pool = ForwardInputs {
            initial_state: None,
            ..*inputs
        };
        let decode_outputs = DecodeOutputs {
            o: outputs.o,
            per_token_states: None,
        };
        let tiles = match tiles {
            Some(t) => t,
            None => recurrent_tiles(ctx, problem, inputs.q.dtype)?,
        };
        let plan = DecodePlan::with_tiles(
            ctx,
            problem,
            &inputs_from_pool,
            &pool,
            &slots,
            &decode_outputs,
            tiles,
        )?;
        Ok(RecurrentForward {
            plan,
            initial: inputs
                .initial_state
                .map(|h0| (h0.buffer.clone(), h0.bytes())),
            final_state: outputs.final_state.buffer.clone(),
        })
    }

    /// Record the forward: the final state set from h0 (or zeros), then one compute pass. The
    /// caller's h0 is never modified.
    pub fn record(&self, encoder: &mut wgpu::CommandEncoder) {
        match &self.initial {
            Some((h0, bytes)) => encoder.copy_buffer_to_buffer(h0, 0, &self.final_state, 0, *bytes),
            None => encoder.clear_buffer(&self.final_state, 0, None),
        }
        self.plan.record(encoder);
    }

    /// The recurrent kernel's tiling.
    pub fn tiles(&self) -> RecurrentStepTiles {
        self.plan.tiles()
    }
}
