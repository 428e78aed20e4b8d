//! The chunked backward on wgpu. The forward keeps q̂, k̂ (normalized with `l2norm_qk`, else the
//! inputs themselves), v, the chunk-local gate cumsum G and β (packed), the gate-free inverse A
//! and h0 — no per-chunk state. The backward recomputes what it needs, in eight passes:
//!
//! 1. `state_recompute` — the forward scan replayed: chunk-start states h, and W, V' per token.
//! 2. `dh_scan` — the reverse inter-chunk scan: dh (gradient w.r.t. each chunk's end state),
//!    dh0, and per token dV' and dv.
//! 3. `value_grams` — per chunk dP = scale·Γ⊙(dO V'ᵀ) and dAb = Γ⊙(dV' Wᵀ).
//! 4. `wy_grad` — through A·diag(β) and the WY inverse: dβ, a part of dG, dAt.
//! 5. `state_grad` — the dq, dk and dG terms through h and dh.
//! 6. `qk_grad` — dq, dk per v-head; dG completed and reverse-cumsummed per chunk into dg.
//! 7. `qk_finish` — GVA group sums and the l2norm backward → dq, dk `[B,T,H,K]`.
//! 8. `gate_finish` — β and gate activation chain rules, dA_log and ddt_bias.
//!
//! Passes 1–2 are sequential over chunks (one workgroup per segment, v-head, V-block) and
//! independent of each other (recorded dh_scan first, so that the GPU may overlap them); the
//! others are parallel over chunks or tokens. Nothing here submits or reads back.

mod dh_scan;
mod dh_scan_coop;
mod gate_finish;
mod qk_finish;
mod qk_grad;
mod qk_grad_coop;
mod state_grad;
mod state_grad_coop;
mod state_recompute;
mod state_recompute_coop;
mod value_grams;
mod value_grams_coop;
mod workspace;
mod wy_grad;
mod wy_grad_coop;

pub use dh_scan::{DhScanBuffers, dh_scan};
pub use dh_scan_coop::{DhScanCoopBuffers, dh_scan_coop};
pub use gate_finish::{GateFinishBuffers, gate_finish};
pub use qk_finish::{QkFinishBuffers, dv_finish, qk_finish};
pub use qk_grad::{QkGradBuffers, qk_grad};
pub use qk_grad_coop::qk_grad_coop;
pub use state_grad::{StateGradBuffers, state_grad};
pub use state_grad_coop::state_grad_coop;
pub use state_recompute::{RecomputeBuffers, state_recompute};
pub use state_recompute_coop::{RecomputeCoopBuffers, state_recompute_coop};
pub use value_grams::{ValueGramsBuffers, value_grams};
pub use value_grams_coop::value_grams_coop;
pub use workspace::{
    BackwardMemory, BackwardPlan, BackwardWorkspace, MemoryBudget, PlanBytes, backward_memory,
    input_bytes,
};
pub use wy_grad::{WyGradBuffers, wy_grad};
pub use wy_grad_coop::wy_grad_coop;

use crate::error::{Error, Result};
use crate::problem::{CHUNK, ForwardInputs, ForwardOutputs, Gradients, Problem};
use crate::tensor::{DType, HostTensor, TensorMeta};
use crate::wgpu_backend::forward::{
    Forward, ForwardWorkspace, Intermediates, PrepareGateBuffers, ScanDims, WyInverseBuffers,
    WyInverseCoopBuffers, forward_with_checkpoints, prepare_gate, prepare_qk, wy_inverse,
    wy_inverse_coop,
};
use crate::wgpu_backend::path::{ComputePath, PathChoice};
use crate::wgpu_backend::shaders::Pass;
use crate::wgpu_backend::tensor::{check_distinct_buffers, named_inputs};
use crate::wgpu_backend::tuning::{
    BACKWARD_SCANS, STATE_GRAD_COOP_BYTES, V_BLOCK_WIDTHS, choose_v_block, token_slice,
};
use crate::wgpu_backend::windows::{TokenWindow, WindowCosts};
use crate::wgpu_backend::{Context, GpuTensor, GpuTimer};
use workspace::{Scratch, fit};

/// f32 words of workgroup memory of `state_recompute` and `dh_scan` at V-block width `bv`
/// (mirrors the layouts in their headers), the least either needs: the 64 × bv tile, then one
/// region reused by the phases — the K slice (64 × 17) plus a 16 × bv state slice; the packed
/// 64×64 lower triangle (which also holds `state_recompute`'s K token slice, `T·(K+1)` ≤ 2080
/// words); `dh_scan`'s second 64 × bv tile plus K and Q token slices (`2·T·(K+1)` ≤ 1088 words
/// at `T·K` ≤ 512; [`dh_scan_tiling`] widens them where the device has the memory).
pub fn scan_arena_words(bv: u32) -> u32 {
    scan_arena_words_with(bv, 1088)
}

/// The backward scans' arena at V-block `bv` with `token_slices` words of `dh_scan`'s K and Q
/// token slices (the one layout both [`scan_arena_words`] and [`dh_scan_tiling`] size).
fn scan_arena_words_with(bv: u32, token_slices: u32) -> u32 {
    let slices = 64 * 17 + 16 * bv;
    let triangle = 64 * 65 / 2;
    let update = 64 * bv + token_slices;
    64 * bv + slices.max(triangle).max(update)
}

/// Total workgroup bytes of the backward scans at their least (arena + two 64-vectors).
pub fn scan_bytes(bv: u32) -> u32 {
    4 * (scan_arena_words(bv) + 2 * 64)
}

/// Tokens per K slice in `state_recompute`'s state update: `T·K` ≤ 2048 (two vec4 loads per
/// invocation) with the slice (`T·(K+1)` words) inside the triangle's 2080 words.
pub fn recompute_token_slice(key_dim: u32) -> u32 {
    let mut t = token_slice(key_dim, 2048, 64);
    while t > 1 && t * (key_dim + 1) > 64 * 65 / 2 {
        t /= 2;
    }
    t
}

/// Tokens per K and Q slice of `dh_scan`'s state update, and its arena words, on a device
/// with `workgroup_bytes`: `T·K` ≤ 1024 (one vec4 of K and of Q per invocation) where that
/// fits, else `T·K` ≤ 512 (within [`scan_arena_words`]; 16 KiB at V-block 16).
pub fn dh_scan_tiling(bv: u32, key_dim: u32, workgroup_bytes: u32) -> (u32, u32) {
    let words = |t: u32| scan_arena_words_with(bv, 2 * t * (key_dim + 1));
    let wide = token_slice(key_dim, 1024, 32);
    if 4 * (words(wide) + 2 * 64) <= workgroup_bytes {
        return (wide, words(wide));
    }
    let narrow = token_slice(key_dim, 512, 32);
    (narrow, words(narrow))
}

/// The backward's passes that read or write q, k, v, do, dq, dk or dv (`gate_finish` reads f32
/// tensors only), besides the forward's `wy_inverse`, which it runs again.
const STORAGE_PASSES: [Pass; 7] = [
    Pass::StateRecompute,
    Pass::DhScan,
    Pass::ValueGrams,
    Pass::WyGrad,
    Pass::StateGrad,
    Pass::QkGrad,
    Pass::QkFinish,
];

/// Storage dtypes of q, k, v (and do, dq, dk, dv) the backward takes on this device: those
/// of the forward (f16 needs `SHADER_F16`) that every backward pass has kernels for.
pub fn storage_dtypes(ctx: &Context) -> Vec<DType> {
    ctx.forward_storage_dtypes()
        .into_iter()
        .filter(|d| {
            STORAGE_PASSES
                .iter()
                .all(|p| p.storage_dtypes().contains(d))
        })
        .collect()
}

/// V-block width of the two backward scans ([`BACKWARD_SCANS`]): the widest that fits the
/// device's workgroup memory (their arena, larger than the forward's) and divides V, narrowed
/// while the grid (sequences × v-heads × V-blocks) is small. A forced width (`GDN_V_BLOCK`)
/// is used where it fits and divides V.
pub fn scan_v_block(ctx: &Context, problem: &Problem) -> Result<u32> {
    let tuning = ctx.tuning();
    let fits: Vec<u32> = V_BLOCK_WIDTHS
        .into_iter()
        .filter(|&bv| scan_bytes(bv) <= tuning.workgroup_bytes)
        .collect();
    choose_v_block(&fits, tuning.forced_v_block, problem, BACKWARD_SCANS).ok_or_else(|| {
        Error::unsupported(
            "device",
            format!(
                "{} bytes of workgroup memory for the backward scans (need {})",
                tuning.workgroup_bytes,
                scan_bytes(16)
            ),
        )
    })
}

/// The backward's compute path for `problem` with q, k, v stored as `dtype`, and why:
/// `CoopMatrix` (the state replay's chunk GEMMs on f16 cooperative matrices, f32
/// accumulators; the other passes scalar) or `Scalar`. Forced by `GDN_BACKWARD_PATH` /
/// [`Context::set_backward_path`]; else the forward's choice ([`Context::forward_path`]: coop
/// for f16/bf16 storage where the adapter and shape allow it, `GDN_COMPUTE_PATH` forcing both),
/// with the forward's f16 math mapped to scalar (the backward has no f16-math passes). Forcing
/// coop where the adapter or shape cannot run it is `Error::Unsupported`.
pub fn backward_path(ctx: &Context, problem: &Problem, dtype: DType) -> Result<PathChoice> {
    const FORCED: &str = "forced (GDN_BACKWARD_PATH or Context::set_backward_path)";
    match ctx.config().backward_path {
        Some(ComputePath::CoopMatrix) => match ctx.path_support().coop_rejects(problem, dtype) {
            None => Ok(PathChoice {
                path: ComputePath::CoopMatrix,
                reason: FORCED.into(),
            }),
            Some(why) => Err(Error::unsupported(
                "backward compute path",
                format!("forcing coop when {why}"),
            )),
        },
        Some(_) => Ok(PathChoice {
            path: ComputePath::Scalar,
            reason: FORCED.into(),
        }),
        None => {
            let fwd = ctx.forward_path(problem, dtype)?;
            Ok(match fwd.path {
                ComputePath::F16Math => PathChoice {
                    path: ComputePath::Scalar,
                    reason: "the forward's path is f16 math, which the backward has no passes for"
                        .into(),
                },
                path => PathChoice {
                    path,
                    reason: format!("the forward's: {}", fwd.reason),
                },
            })
        }
    }
}

/// What the backward consumes: the problem, the forward's raw inputs (GPU buffers are shared
/// handles, so keeping them costs no memory) and the forward's intermediates. This is the
/// context an autograd integration saves between forward and backward.
#[derive(Debug, Clone)]
pub struct Saved {
    /// The problem the forward ran.
    pub problem: Problem,
    /// The forward's inputs as given (raw q, k, before any l2norm).
    pub inputs: ForwardInputs<GpuTensor>,
    /// What the forward kept for the backward ([`Forward::saved`](crate::wgpu_backend::Forward::saved)).
    pub intermediates: Intermediates,
    /// A forward that ran in token windows ([`forward_saved`] past one storage binding): its
    /// windows and start-state checkpoints; the backward walks the same windows.
    pub(crate) windows: Option<SavedWindows>,
}

/// The token windows of a forward and the start states of the windows that continue a
/// sequence (`[continuing windows, HV, ..]` f32, in the problem's layout; `None` when no
/// window does), which the windowed backward starts those replays from (the others start
/// from h0).
#[derive(Debug, Clone)]
pub(crate) struct SavedWindows {
    pub windows: Vec<TokenWindow>,
    pub checkpoints: Option<GpuTensor>,
}

impl Saved {
    /// Keep `inputs` and the intermediates a forward on them returned.
    pub fn new(
        problem: &Problem,
        inputs: &ForwardInputs<&GpuTensor>,
        intermediates: Intermediates,
    ) -> Self {
        Saved {
            problem: problem.clone(),
            inputs: ForwardInputs {
                q: inputs.q.clone(),
                k: inputs.k.clone(),
                v: inputs.v.clone(),
                g: inputs.g.clone(),
                beta: inputs.beta.clone(),
                initial_state: inputs.initial_state.cloned(),
                a_log: inputs.a_log.cloned(),
                dt_bias: inputs.dt_bias.cloned(),
            },
            intermediates,
            windows: None,
        }
    }

    /// Token windows the forward ran in and the backward will walk (1: the whole problem).
    pub fn windows(&self) -> usize {
        self.windows.as_ref().map_or(1, |w| w.windows.len())
    }
}

/// Bytes the forward keeps for the backward beyond its own inputs and outputs: (G, β) and A
/// per token and v-head (8 + 256 bytes), plus q̂ and k̂ with `l2norm_qk`.
pub fn saved_bytes(problem: &Problem, dtype: DType) -> u64 {
    let (bt, hv) = (problem.total_tokens() as u64, problem.heads_v as u64);
    let normed = if problem.options.l2norm_qk {
        2 * bt * problem.heads_qk as u64 * problem.key_dim as u64 * dtype.size() as u64
    } else {
        0
    };
    bt * hv * 4 * (2 + CHUNK as u64) + normed
}

/// Scratch bytes the backward allocates besides its outputs: chunk-start states and their
/// gradients (`[chunks + N, HV, K, V]` f32 each), W, V', dV', dv (`[B·T, HV, V]` f32 each), dP
/// and dA (`[B·T, HV, 64]` f32 each), the per-v-head dq/dk terms (`[B·T, HV, 3K + 1]` f32,
/// sharing their memory with the scans' gated matrices, `[B·T, HV, 128]`) and (dg, dβ)
/// (`[B·T, HV, 2]` f32).
pub fn workspace_bytes(problem: &Problem) -> u64 {
    let (bt, hv) = (problem.total_tokens() as u64, problem.heads_v as u64);
    let (kd, vd) = (problem.key_dim as u64, problem.value_dim as u64);
    let slots = (problem.chunks().len() + problem.num_sequences()) as u64;
    let states = 2 * slots * hv * kd * vd;
    let per_token = 4 * vd + 2 * CHUNK as u64 + (3 * kd + 1).max(2 * CHUNK as u64) + 2;
    4 * (states + bt * hv * per_token)
}

/// Record a forward and return its outputs with the context the backward needs. Always the
/// chunked algorithm, whatever `forward` would choose: the backward replays its scan from the
/// intermediates it keeps (A, the gate cumsum and β), which the recurrent kernel has none of.
/// The forward runs in the token windows of the backward's plan for the context's budget
/// (`GDN_BACKWARD_BUDGET`, [`Context::set_backward_budget`]; [`MemoryBudget::DEFAULT`]
/// otherwise), which also keep every binding within the binding limit: one window when the
/// whole problem fits, else windows whose continued sequences' start states it keeps
/// (docs/windows.md). A budget below the least plan is an [`Error::OverBudget`], before
/// anything is allocated.
pub fn forward_saved(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    problem: &Problem,
    inputs: &ForwardInputs<&GpuTensor>,
) -> Result<(Forward, Saved)> {
    ctx.check()?;
    problem.check_inputs(inputs, &ctx.forward_storage_dtypes())?;
    let budget = ctx
        .config()
        .backward_budget
        .unwrap_or(MemoryBudget::DEFAULT);
    let plan = BackwardPlan::new(ctx, problem, inputs.q.dtype, budget)?;
    forward_saved_for(ctx, encoder, problem, inputs, &plan)
}

/// [`forward_saved`] in the windows of `plan` (e.g. [`BackwardWorkspace::plan`], so that the
/// workspace takes the saved context). A plan made for another problem or dtype is an
/// `Error::Value` naming `backward plan`.
pub fn forward_saved_for(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    problem: &Problem,
    inputs: &ForwardInputs<&GpuTensor>,
    plan: &BackwardPlan,
) -> Result<(Forward, Saved)> {
    ctx.check()?;
    problem.check_inputs(inputs, &ctx.forward_storage_dtypes())?;
    let dtype = inputs.q.dtype;
    plan.check_matches("backward plan", problem, dtype)?;
    let costs = WindowCosts {
        max_rows: plan.max_chunks,
        ..backward_costs(problem, dtype)
    };
    let ws = ForwardWorkspace::with_window_costs(ctx, problem, dtype, plan.path, &costs)?;
    let windows = ws.token_windows();
    if windows != plan.windows {
        return Err(Error::value(
            "backward plan",
            format!(
                "the {} token windows the context plans for it now",
                windows.len()
            ),
            format!(
                "a plan of {} windows (made under another binding limit or GDN_SEGMENT_CHUNKS)",
                plan.windows.len()
            ),
        ));
    }
    let sequences = problem.sequences();
    let continuing = windows.iter().filter(|w| w.continues(&sequences)).count();
    let checkpoints = if windows.len() > 1 && continuing > 0 {
        let mut shape = problem.state_shape().to_vec();
        shape[0] = continuing;
        Some(GpuTensor::scratch(
            ctx,
            "state checkpoints",
            &shape,
            DType::F32,
        )?)
    } else {
        None
    };
    let o = GpuTensor::empty(ctx, "o", &problem.v_shape(), inputs.v.dtype)?;
    let final_state = GpuTensor::empty(ctx, "final_state", &problem.state_shape(), DType::F32)?;
    let mut intermediates = forward_with_checkpoints(
        ctx,
        encoder,
        problem,
        inputs,
        &ForwardOutputs {
            o: &o,
            final_state: &final_state,
        },
        &ws,
        checkpoints.as_ref(),
    )?;
    let windowed = windows.len() > 1;
    if windowed {
        // The windowed backward recomputes the intermediates in its own workspace: keeping
        // the last window's rows would only hold the forward's scratch.
        intermediates = no_rows(ctx, problem, dtype)?;
    }
    let mut saved = Saved::new(problem, inputs, intermediates.clone());
    if windowed {
        saved.windows = Some(SavedWindows {
            windows,
            checkpoints,
        });
    }
    let fwd = Forward {
        o,
        final_state,
        saved: Some(intermediates),
    };
    Ok((fwd, saved))
}

/// Intermediates that hold no rows (`tokens` empty, at the end of the packed axis).
fn no_rows(ctx: &Context, p: &Problem, dtype: DType) -> Result<Intermediates> {
    let (h, hv, kd) = (p.heads_qk, p.heads_v, p.key_dim);
    let normed = |name: &str| GpuTensor::empty(ctx, name, &[0, h, kd], dtype);
    let (q_normed, k_normed) = if p.options.l2norm_qk {
        (Some(normed("q_normed")?), Some(normed("k_normed")?))
    } else {
        (None, None)
    };
    let bt = p.total_tokens();
    Ok(Intermediates {
        q_normed,
        k_normed,
        gate_beta: GpuTensor::empty(ctx, "gate_beta", &[0, hv, 2], DType::F32)?,
        a: GpuTensor::empty(ctx, "wy_inverse", &[0, hv, CHUNK], DType::F32)?,
        tokens: bt..bt,
    })
}

/// What one token window of the backward binds (docs/windows.md): the caller's tensors at an
/// offset (q, k, v, do and their gradients; g, β, dg, dβ), the scratch of a window, and the
/// chunk-start states with one tail slot per sequence.
pub(crate) fn backward_costs(problem: &Problem, dtype: DType) -> WindowCosts {
    let (h, hv) = (problem.heads_qk as u64, problem.heads_v as u64);
    let (k, v, c) = (
        problem.key_dim as u64,
        problem.value_dim as u64,
        CHUNK as u64,
    );
    let size = dtype.size() as u64;
    let caller = vec![h * k * size, hv * v * size, hv * 4];
    let scratch = [
        2 * hv * v * 4,                  // W and V'; dV' and dv
        2 * hv * c * 4,                  // dP and dA
        hv * (3 * k + 1).max(2 * c) * 4, // dq/dk terms | gated matrices
        hv * 8,                          // (dg, dβ); (G, β)
        hv * c * 4,                      // A
        h * k * size,                    // q̂, k̂
    ];
    let slot_bytes = hv * k * v * 4;
    WindowCosts {
        token_bytes: caller.iter().chain(&scratch).copied().collect(),
        offset_token_bytes: caller,
        pad_tokens: 0,
        slot_bytes,
        chunk_bytes: slot_bytes,
        segments: None,
        max_rows: usize::MAX,
        part_tokens: None,
    }
}

/// Record a forward and its backward for `d_o` (and `dht`, the gradient of the final state).
pub fn forward_backward(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    problem: &Problem,
    inputs: &ForwardInputs<&GpuTensor>,
    d_o: &GpuTensor,
    dht: Option<&GpuTensor>,
) -> Result<(Forward, Gradients<GpuTensor>)> {
    let (fwd, saved) = forward_saved(ctx, encoder, problem, inputs)?;
    let grads = backward(ctx, encoder, &saved, d_o, dht)?;
    Ok((fwd, grads))
}

/// Record the backward: the gradients of `L = Σ o ⊙ d_o + Σ final_state ⊙ dht` w.r.t. the raw
/// inputs of the forward that produced `saved`. `d_o` is `[B,T,HV,V]` in the dtype of v; `dht`
/// (optional) has the state shape, f32. Allocates the gradients and a workspace for the
/// windows of `saved` (its plan's budget; see [`backward_into_workspace`] to reuse one).
///
/// Precondition (not checked, it would need a readback): `d_o` and `dht` are finite.
pub fn backward(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    saved: &Saved,
    d_o: &GpuTensor,
    dht: Option<&GpuTensor>,
) -> Result<Gradients<GpuTensor>> {
    record_backward(ctx, encoder, saved, d_o, dht, None, None)
}

/// [`backward`] with a timestamp after each pass (labelled with the pass name; one per window
/// when there are several); mark the start yourself before calling.
pub fn backward_profiled(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    saved: &Saved,
    d_o: &GpuTensor,
    dht: Option<&GpuTensor>,
    timer: &GpuTimer,
) -> Result<Gradients<GpuTensor>> {
    record_backward(ctx, encoder, saved, d_o, dht, None, Some(timer))
}

/// [`backward`] through a workspace made once ([`BackwardWorkspace`]): allocates only the
/// gradients.
pub fn backward_with_workspace(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    saved: &Saved,
    d_o: &GpuTensor,
    dht: Option<&GpuTensor>,
    workspace: &BackwardWorkspace,
) -> Result<Gradients<GpuTensor>> {
    record_backward(ctx, encoder, saved, d_o, dht, Some(workspace), None)
}

/// [`backward`] into the caller's gradients through a workspace made once: allocates nothing.
/// `grads` has the shapes and dtypes [`backward`] returns (dh0 exactly with an initial state,
/// dA_log and ddt_bias exactly with `gate_in_kernel`), each in a buffer of its own. `timer`:
/// timestamps as [`backward_profiled`] writes them.
#[allow(clippy::too_many_arguments)]
pub fn backward_into_workspace(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    saved: &Saved,
    d_o: &GpuTensor,
    dht: Option<&GpuTensor>,
    grads: &Gradients<&GpuTensor>,
    workspace: &BackwardWorkspace,
    timer: Option<&GpuTimer>,
) -> Result<()> {
    ctx.scoped("backward", None, || {
        ctx.check()?;
        check_saved(ctx, saved, d_o, dht)?;
        workspace.check_saved(saved)?;
        check_gradient_outputs(saved, d_o, dht, grads)?;
        record_plan(ctx, encoder, saved, d_o, dht, grads, workspace, timer)
    })?
}

/// The gradient tensors `saved`'s backward writes, for [`backward_into_workspace`], on the
/// device (uninitialized).
pub fn alloc_gradients(ctx: &Context, saved: &Saved) -> Result<Gradients<GpuTensor>> {
    let p = &saved.problem;
    let inputs = saved.inputs.as_ref();
    let f32 = |name: &str, shape: &[usize]| GpuTensor::empty(ctx, name, shape, DType::F32);
    let gate = p.options.gate_in_kernel;
    Ok(Gradients {
        dq: GpuTensor::empty(ctx, "dq", &p.qk_shape(), inputs.q.dtype)?,
        dk: GpuTensor::empty(ctx, "dk", &p.qk_shape(), inputs.k.dtype)?,
        dv: GpuTensor::empty(ctx, "dv", &p.v_shape(), inputs.v.dtype)?,
        dg: f32("dg", &p.gate_shape())?,
        dbeta: f32("dbeta", &p.gate_shape())?,
        dh0: match inputs.initial_state {
            Some(_) => Some(f32("dh0", &p.state_shape())?),
            None => None,
        },
        da_log: gate.then(|| f32("dA_log", &[p.heads_v])).transpose()?,
        ddt_bias: gate.then(|| f32("ddt_bias", &[p.heads_v])).transpose()?,
    })
}

/// Borrow every gradient.
pub fn gradients_ref(g: &Gradients<GpuTensor>) -> Gradients<&GpuTensor> {
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

/// The caller's gradients against the problem: shapes, dtypes, buffer sizes, presence, and
/// buffers of their own (not an input's, nor another gradient's).
fn check_gradient_outputs(
    saved: &Saved,
    d_o: &GpuTensor,
    dht: Option<&GpuTensor>,
    grads: &Gradients<&GpuTensor>,
) -> Result<()> {
    let p = &saved.problem;
    let inputs = saved.inputs.as_ref();
    let f32_ = DType::F32;
    let tensor = |name: &str, t: &GpuTensor, shape: &[usize], dtype: DType| -> Result<()> {
        if t.shape() != shape {
            return Err(Error::shape(name, shape, t.shape()));
        }
        if t.dtype != dtype {
            return Err(Error::DType {
                name: name.into(),
                expected: dtype.to_string(),
                got: t.dtype.to_string(),
            });
        }
        t.check_storage(name)
    };
    tensor("dq", grads.dq, &p.qk_shape(), inputs.q.dtype)?;
    tensor("dk", grads.dk, &p.qk_shape(), inputs.k.dtype)?;
    tensor("dv", grads.dv, &p.v_shape(), inputs.v.dtype)?;
    tensor("dg", grads.dg, &p.gate_shape(), f32_)?;
    tensor("dbeta", grads.dbeta, &p.gate_shape(), f32_)?;
    let present = |name: &str, want: bool, got: Option<&GpuTensor>, why: &str| match (want, got) {
        (true, None) => Err(Error::Missing {
            name: name.into(),
            why: why.into(),
        }),
        (false, Some(_)) => Err(Error::value(name, format!("none ({why})"), "a tensor")),
        _ => Ok(()),
    };
    present(
        "dh0",
        inputs.initial_state.is_some(),
        grads.dh0,
        "exactly with initial_state",
    )?;
    if let Some(t) = grads.dh0 {
        tensor("dh0", t, &p.state_shape(), f32_)?;
    }
    let gate = p.options.gate_in_kernel;
    for (name, t) in [("dA_log", grads.da_log), ("ddt_bias", grads.ddt_bias)] {
        present(name, gate, t, "exactly with gate_in_kernel")?;
        if let Some(t) = t {
            tensor(name, t, &[p.heads_v], f32_)?;
        }
    }
    let mut outputs = vec![
        ("dq", grads.dq),
        ("dk", grads.dk),
        ("dv", grads.dv),
        ("dg", grads.dg),
        ("dbeta", grads.dbeta),
    ];
    outputs.extend(
        [
            ("dh0", grads.dh0),
            ("dA_log", grads.da_log),
            ("ddt_bias", grads.ddt_bias),
        ]
        .into_iter()
        .filter_map(|(n, t)| Some((n, t?))),
    );
    let mut read = named_inputs(&inputs);
    read.push(("do", d_o));
    read.extend(dht.map(|t| ("dht", t)));
    check_distinct_buffers(&outputs, &read)
}

fn check_saved(
    ctx: &Context,
    saved: &Saved,
    d_o: &GpuTensor,
    dht: Option<&GpuTensor>,
) -> Result<()> {
    let p = &saved.problem;
    p.check_inputs(&saved.inputs.as_ref(), &storage_dtypes(ctx))?;
    if d_o.shape() != p.v_shape() {
        return Err(Error::shape("do", &p.v_shape(), d_o.shape()));
    }
    if d_o.dtype != saved.inputs.v.dtype {
        return Err(Error::DType {
            name: "do".into(),
            expected: format!("{} (the dtype of v)", saved.inputs.v.dtype),
            got: d_o.dtype.to_string(),
        });
    }
    d_o.check_storage("do")?;
    if let Some(dht) = dht {
        dht.check_storage("dht")?;
        if dht.shape() != p.state_shape() {
            return Err(Error::shape("dht", &p.state_shape(), dht.shape()));
        }
        if dht.dtype != DType::F32 {
            return Err(Error::DType {
                name: "dht".into(),
                expected: "F32".into(),
                got: dht.dtype.to_string(),
            });
        }
    }
    let (bt, hv) = (p.total_tokens(), p.heads_v);
    if let Some(sw) = &saved.windows {
        // The windows recompute the intermediates; a window that continues a sequence starts
        // from its checkpoint.
        let sequences = p.sequences();
        let continuing = sw
            .windows
            .iter()
            .filter(|w| w.continues(&sequences))
            .count();
        let mut shape = p.state_shape().to_vec();
        shape[0] = continuing;
        let got = sw.checkpoints.as_ref().map_or(&[0usize][..], |c| c.shape());
        if continuing > 0 && got != shape {
            return Err(Error::shape("saved checkpoints", &shape, got));
        }
        return Ok(());
    }
    let inter = &saved.intermediates;
    if inter.tokens != (0..bt) {
        return Err(Error::unsupported(
            "saved intermediates",
            format!(
                "a backward over intermediates of a forward that ran in token windows (they \
                 hold tokens {:?} of {bt}); forward_saved keeps what a windowed backward needs",
                inter.tokens
            ),
        ));
    }
    check_scratch_bindings(ctx, p)?;
    if inter.gate_beta.shape() != [bt, hv, 2] {
        return Err(Error::shape(
            "saved gate_beta",
            &[bt, hv, 2],
            inter.gate_beta.shape(),
        ));
    }
    if inter.a.shape() != [bt, hv, CHUNK] {
        return Err(Error::shape(
            "saved wy_inverse",
            &[bt, hv, CHUNK],
            inter.a.shape(),
        ));
    }
    if p.options.l2norm_qk && (inter.q_normed.is_none() || inter.k_normed.is_none()) {
        return Err(Error::Missing {
            name: "saved q_normed, k_normed".into(),
            why: "with l2norm_qk (from the same forward)".into(),
        });
    }
    Ok(())
}

/// `Error::TooLarge` naming the first of the backward's scratch tensors that would exceed one
/// storage binding, before anything is allocated: a backward over whole-problem intermediates
/// runs as one window (`forward_saved` plans windows where they are needed).
fn check_scratch_bindings(ctx: &Context, p: &Problem) -> Result<()> {
    let limit = ctx.max_binding_bytes();
    let (bt, hv) = (p.total_tokens() as u64, p.heads_v as u64);
    let (kd, vd, c) = (p.key_dim as u64, p.value_dim as u64, CHUNK as u64);
    let slots = (p.chunks().len() + p.num_sequences()) as u64;
    let scratch = [
        ("recomputed states", 4 * slots * hv * kd * vd),
        ("W and V'", 4 * 2 * bt * hv * vd),
        ("dP and dA", 4 * 2 * bt * hv * c),
        (
            "dq dk per v-head | gated matrices",
            4 * bt * hv * (3 * kd + 1).max(2 * c),
        ),
    ];
    for (name, bytes) in scratch {
        if bytes > limit {
            return Err(Error::TooLarge {
                name: format!("backward scratch {name:?}"),
                bytes,
                limit_name: "max_storage_buffer_binding_size",
                limit,
            });
        }
    }
    Ok(())
}

fn record_backward(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    saved: &Saved,
    d_o: &GpuTensor,
    dht: Option<&GpuTensor>,
    workspace: Option<&BackwardWorkspace>,
    timer: Option<&GpuTimer>,
) -> Result<Gradients<GpuTensor>> {
    // Device errors anywhere in the recording (scratch, tables, pipelines) come back typed.
    ctx.scoped("backward", None, || {
        ctx.check()?;
        check_saved(ctx, saved, d_o, dht)?;
        let own;
        let ws = match workspace {
            Some(ws) => {
                ws.check_saved(saved)?;
                ws
            }
            None => {
                own = BackwardWorkspace::for_saved(ctx, saved)?;
                &own
            }
        };
        let grads = alloc_gradients(ctx, saved)?;
        record_plan(
            ctx,
            encoder,
            saved,
            d_o,
            dht,
            &gradients_ref(&grads),
            ws,
            timer,
        )?;
        Ok(grads)
    })?
}

/// Record the backward of a checked `saved` into `grads` through `ws` (of its windows).
#[allow(clippy::too_many_arguments)]
fn record_plan(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    saved: &Saved,
    d_o: &GpuTensor,
    dht: Option<&GpuTensor>,
    grads: &Gradients<&GpuTensor>,
    ws: &BackwardWorkspace,
    timer: Option<&GpuTimer>,
) -> Result<()> {
    let p = &saved.problem;
    let inputs = saved.inputs.as_ref();
    let hv4 = (4 * p.heads_v) as u64;
    if let (Some(a_log), Some(dt_bias)) = (inputs.a_log, inputs.dt_bias) {
        encoder.copy_buffer_to_buffer(&a_log.buffer, a_log.offset(), &ws.gate_params, 0, hv4);
        encoder.copy_buffer_to_buffer(&dt_bias.buffer, dt_bias.offset(), &ws.gate_params, hv4, hv4);
    }
    // gate_finish adds each window's sums.
    encoder.clear_buffer(&ws.dgate_params, 0, None);
    let outputs = GradientOutputs {
        dq: grads.dq,
        dk: grads.dk,
        dv: grads.dv,
        dg: grads.dg,
        dbeta: grads.dbeta,
        dh0: grads.dh0,
    };
    let gates = GateParams {
        params: &ws.gate_params,
        grads: &ws.dgate_params,
    };
    match &saved.windows {
        None => backward_whole(ctx, encoder, saved, ws, d_o, dht, &outputs, &gates, timer)?,
        Some(sw) => backward_windows(
            ctx, encoder, saved, sw, ws, d_o, dht, &outputs, &gates, timer,
        )?,
    }
    if let (Some(da_log), Some(ddt_bias)) = (grads.da_log, grads.ddt_bias) {
        encoder.copy_buffer_to_buffer(&ws.dgate_params, 0, &da_log.buffer, da_log.offset(), hv4);
        encoder.copy_buffer_to_buffer(
            &ws.dgate_params,
            hv4,
            &ddt_bias.buffer,
            ddt_bias.offset(),
            hv4,
        );
    }
    Ok(())
}

/// The gradients a backward writes (views of one window's rows in a windowed backward; dh0
/// always the whole tensor).
struct GradientOutputs<'a> {
    dq: &'a GpuTensor,
    dk: &'a GpuTensor,
    dv: &'a GpuTensor,
    dg: &'a GpuTensor,
    dbeta: &'a GpuTensor,
    dh0: Option<&'a GpuTensor>,
}

/// `[A_log, dt_bias]` in and `[dA_log, ddt_bias]` accumulated (each `[HV]` f32).
struct GateParams<'a> {
    params: &'a wgpu::Buffer,
    grads: &'a wgpu::Buffer,
}

/// The backward's tensors over one window: inputs (q̂/k̂ or the raw q/k, the gates, A), the
/// tables, and what it writes.
struct WindowPasses<'a> {
    problem: &'a Problem,
    params: &'a wgpu::Buffer,
    chunks: &'a wgpu::Buffer,
    segments: &'a wgpu::Buffer,
    num_chunks: usize,
    num_segments: usize,
    /// The window's token rows.
    rows: usize,
    q_raw: &'a GpuTensor,
    k_raw: &'a GpuTensor,
    q: &'a GpuTensor,
    k: &'a GpuTensor,
    v: &'a GpuTensor,
    g: &'a GpuTensor,
    beta: &'a GpuTensor,
    d_o: &'a GpuTensor,
    gate_beta: &'a GpuTensor,
    /// Where wy_inverse writes A, and the A that wy_grad reads.
    a_out: &'a GpuTensor,
    a: &'a GpuTensor,
    scratch: &'a Scratch,
    grads: &'a GradientOutputs<'a>,
    gates: &'a GateParams<'a>,
}

/// Record the backward's passes over one window whose tail slots hold the start states and
/// the gradients w.r.t. the end states. With `dh_done`, a hook after the two scans (the tail
/// slots then hold the gradients w.r.t. the start states).
fn record_window(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    w: &WindowPasses<'_>,
    timer: Option<&GpuTimer>,
    dh_done: &mut dyn FnMut(&mut wgpu::CommandEncoder),
) -> Result<()> {
    let mark = |encoder: &mut wgpu::CommandEncoder, label| {
        if let Some(t) = timer {
            t.mark(encoder, label);
        }
    };
    let p = w.problem;
    let (hv, kd, vd) = (p.heads_v, p.key_dim, p.value_dim);
    let sc = w.scratch;
    let dqk_parts = sc.union.reinterpret(&[w.rows, hv, 3 * kd + 1], DType::F32);
    let gated = sc.union.reinterpret(&[w.rows, hv, 2 * CHUNK], DType::F32);

    // Γ⊙A⊙β and Γ⊙QKᵀ per chunk, parallel over chunks: the forward's wy_inverse again. The
    // coop path's (f16 gated matrices, k and γ ⊙ q, the coop scans' operands) has its padding
    // rows zeroed first (it writes chunk rows only).
    if let Some(c) = &sc.coop {
        for (t, row) in [
            (&c.gated16, hv * 2 * CHUNK),
            (&c.k16, p.heads_qk * kd),
            (&c.qg16, hv * kd),
        ] {
            let row_bytes = (row * 2) as u64;
            encoder.clear_buffer(
                &t.buffer,
                t.offset() + w.rows as u64 * row_bytes,
                Some(CHUNK as u64 * row_bytes),
            );
        }
        let coop_buffers = WyInverseCoopBuffers {
            k: w.k,
            q: w.q,
            gate_beta: w.gate_beta,
            chunks: w.chunks,
            a: w.a_out,
            gated16: &c.gated16,
            k16: &c.k16,
            qg16: &c.qg16,
        };
        wy_inverse_coop(ctx, encoder, w.params, &coop_buffers, w.num_chunks, hv)?;
    } else {
        let wy_buffers = WyInverseBuffers {
            k: w.k,
            q: w.q,
            gate_beta: w.gate_beta,
            chunks: w.chunks,
            a: w.a_out,
            gated: &gated,
        };
        wy_inverse(ctx, encoder, w.params, &wy_buffers, w.num_chunks, hv)?;
    }
    mark(encoder, "gated_matrices");

    let dims = ScanDims {
        num_segments: w.num_segments,
        heads_v: hv,
        key_dim: kd,
        value_dim: vd,
        v_block: scan_v_block(ctx, p)?,
    };
    // The two scans do not depend on each other. The reverse scan goes first: its inputs
    // (the f16 operands, γ⊙q) are transitioned to reads before it, so the replay after it
    // needs no barrier on compute work and the GPU may run the two at once (with the other
    // order, γ⊙q's first read by the reverse scan ordered it after the whole replay).
    match &sc.coop {
        Some(c) => {
            let scan = DhScanCoopBuffers {
                k16: &c.k16,
                qg16: &c.qg16,
                gate_beta: w.gate_beta,
                gated16: &c.gated16,
                d_o: w.d_o,
                segments: w.segments,
                dstates: &sc.dstates,
                dvnew_dv: &sc.dvnew_dv,
            };
            dh_scan_coop(ctx, encoder, w.params, &scan, w.num_segments, hv)?;
        }
        None => {
            let scan = DhScanBuffers {
                q: w.q,
                k: w.k,
                gate_beta: w.gate_beta,
                gated: &gated,
                d_o: w.d_o,
                segments: w.segments,
                dstates: &sc.dstates,
                dvnew_dv: &sc.dvnew_dv,
            };
            dh_scan(ctx, encoder, w.params, &scan, dims)?;
        }
    }
    mark(encoder, "dh_scan");
    match &sc.coop {
        Some(c) => {
            let recompute = RecomputeCoopBuffers {
                k16: &c.k16,
                v: w.v,
                gate_beta: w.gate_beta,
                gated16: &c.gated16,
                segments: w.segments,
                states: &sc.states,
                w_vnew: &sc.w_vnew,
            };
            state_recompute_coop(ctx, encoder, w.params, &recompute, w.num_segments, hv)?;
        }
        None => {
            let recompute = RecomputeBuffers {
                k: w.k,
                v: w.v,
                gate_beta: w.gate_beta,
                gated: &gated,
                segments: w.segments,
                states: &sc.states,
                w_vnew: &sc.w_vnew,
            };
            state_recompute(ctx, encoder, w.params, &recompute, dims)?;
        }
    }
    // After both scans: the hook's copies of dh's tail slots would otherwise sit between them.
    dh_done(encoder);
    mark(encoder, "state_recompute");
    let grams = ValueGramsBuffers {
        d_o: w.d_o,
        w_vnew: &sc.w_vnew,
        dvnew_dv: &sc.dvnew_dv,
        gate_beta: w.gate_beta,
        chunks: w.chunks,
        mats: &sc.mats,
    };
    let coop_grads = ctx.tuning().coop_grads;
    if sc.coop.is_some() && coop_grads.value_grams {
        value_grams_coop(ctx, encoder, w.params, &grams, w.num_chunks, hv)?;
    } else {
        value_grams(ctx, encoder, w.params, &grams, w.num_chunks, hv)?;
    }
    mark(encoder, "value_grams");
    let wy = WyGradBuffers {
        q: w.q,
        k: w.k,
        a: w.a,
        gate_beta: w.gate_beta,
        chunks: w.chunks,
        mats: &sc.mats,
        dg_dbeta: &sc.dg_dbeta,
    };
    if sc.coop.is_some() && coop_grads.wy_grad {
        wy_grad_coop(ctx, encoder, w.params, &wy, w.num_chunks, hv)?;
    } else {
        wy_grad(ctx, encoder, w.params, &wy, w.num_chunks, hv)?;
    }
    mark(encoder, "wy_grad");
    let state_bufs = StateGradBuffers {
        d_o: w.d_o,
        w_vnew: &sc.w_vnew,
        dvnew_dv: &sc.dvnew_dv,
        states: &sc.states,
        dstates: &sc.dstates,
        gate_beta: w.gate_beta,
        chunks: w.chunks,
        dqk_parts: &dqk_parts,
    };
    let state_grad_fits = ctx.tuning().workgroup_bytes >= STATE_GRAD_COOP_BYTES;
    if sc.coop.is_some() && coop_grads.state_grad && state_grad_fits {
        state_grad_coop(ctx, encoder, w.params, &state_bufs, w.num_chunks, hv, kd)?;
    } else {
        state_grad(ctx, encoder, w.params, &state_bufs, w.num_chunks, hv, kd)?;
    }
    mark(encoder, "state_grad");
    let qk = QkGradBuffers {
        q: w.q,
        k: w.k,
        mats: &sc.mats,
        chunks: w.chunks,
        dqk_parts: &dqk_parts,
        dg_dbeta: &sc.dg_dbeta,
    };
    if sc.coop.is_some() && coop_grads.qk_grad {
        qk_grad_coop(ctx, encoder, w.params, &qk, w.num_chunks, hv)?;
    } else {
        qk_grad(ctx, encoder, w.params, &qk, w.num_chunks, hv)?;
    }
    mark(encoder, "qk_grad");

    let finish = QkFinishBuffers {
        q_raw: w.q_raw,
        k_raw: w.k_raw,
        dqk_parts: &dqk_parts,
        dq: w.grads.dq,
        dk: w.grads.dk,
    };
    qk_finish(ctx, encoder, w.params, &finish)?;
    mark(encoder, "qk_finish");

    let gate = GateFinishBuffers {
        g: w.g,
        beta: w.beta,
        gate_params: w.gates.params,
        dg_dbeta: &sc.dg_dbeta,
        dg: w.grads.dg,
        dbeta: w.grads.dbeta,
        dgate_params: w.gates.grads,
    };
    gate_finish(ctx, encoder, w.params, &gate, hv)?;
    mark(encoder, "gate_finish");

    // dv is the second half of `dvnew_dv`: a copy for f32 storage, else converted.
    let dv = w.grads.dv;
    if dv.dtype == DType::F32 {
        let dv_bytes = (w.rows * hv * vd * 4) as u64;
        let from = sc.dvnew_dv.offset() + dv_bytes;
        encoder.copy_buffer_to_buffer(&sc.dvnew_dv.buffer, from, &dv.buffer, dv.offset(), dv_bytes);
    } else {
        dv_finish(ctx, encoder, w.params, &sc.dvnew_dv, dv)?;
    }
    mark(encoder, "dv_finish");
    Ok(())
}

/// The segment table of the backward's scans: (start, length, first chunk, sequence) per
/// piece, tokens from `base`.
fn segment_table(pieces: &[std::ops::Range<usize>], base: usize) -> Vec<u32> {
    let mut table = Vec::with_capacity(4 * pieces.len());
    let mut first_chunk = 0usize;
    for (i, s) in pieces.iter().enumerate() {
        table.extend([
            (s.start - base) as u32,
            s.len() as u32,
            first_chunk as u32,
            i as u32,
        ]);
        first_chunk += s.len().div_ceil(CHUNK);
    }
    table
}

/// The backward over the whole problem from the forward's intermediates.
#[allow(clippy::too_many_arguments)]
fn backward_whole(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    saved: &Saved,
    ws: &BackwardWorkspace,
    d_o: &GpuTensor,
    dht: Option<&GpuTensor>,
    grads: &GradientOutputs<'_>,
    gates: &GateParams<'_>,
    timer: Option<&GpuTimer>,
) -> Result<()> {
    let p = &saved.problem;
    let inputs = saved.inputs.as_ref();
    let inter = &saved.intermediates;
    let (bt, hv) = (p.total_tokens(), p.heads_v);
    let wt = &ws.windows[0];
    let num_chunks = wt.num_chunks;

    // States and their gradients have one slot per chunk plus one per sequence (the start
    // state / dht in, dh0 out), in the problem's state layout.
    let scratch = &ws.scratch;
    let slot_bytes = (hv * p.key_dim * p.value_dim * 4) as u64;
    let tail_offset = num_chunks as u64 * slot_bytes;
    let tail_bytes = p.num_sequences() as u64 * slot_bytes;
    let (states, dstates) = (&scratch.states.buffer, &scratch.dstates.buffer);
    match inputs.initial_state {
        Some(h0) => {
            encoder.copy_buffer_to_buffer(&h0.buffer, h0.offset(), states, tail_offset, tail_bytes)
        }
        None => encoder.clear_buffer(states, tail_offset, Some(tail_bytes)),
    }
    match dht {
        Some(dht) => encoder.copy_buffer_to_buffer(
            &dht.buffer,
            dht.offset(),
            dstates,
            tail_offset,
            tail_bytes,
        ),
        None => encoder.clear_buffer(dstates, tail_offset, Some(tail_bytes)),
    }
    // wy_inverse's A goes to scratch (the first half of `mats`, written next by value_grams):
    // the backward reads the forward's.
    let a_scratch = scratch.mats.reinterpret(&[bt, hv, CHUNK], DType::F32);
    let passes = WindowPasses {
        problem: p,
        params: &wt.params,
        chunks: &wt.chunks,
        segments: &wt.segments,
        num_chunks,
        num_segments: p.num_sequences(),
        rows: bt,
        q_raw: inputs.q,
        k_raw: inputs.k,
        q: inter.q_normed.as_ref().unwrap_or(inputs.q),
        k: inter.k_normed.as_ref().unwrap_or(inputs.k),
        v: inputs.v,
        g: inputs.g,
        beta: inputs.beta,
        d_o,
        gate_beta: &inter.gate_beta,
        a_out: &a_scratch,
        a: &inter.a,
        scratch,
        grads,
        gates,
    };
    record_window(ctx, encoder, &passes, timer, &mut |_| {})?;
    if let Some(dh0) = grads.dh0 {
        encoder.copy_buffer_to_buffer(dstates, tail_offset, &dh0.buffer, dh0.offset(), tail_bytes);
    }
    Ok(())
}

/// The backward over the forward's token windows, last to first (docs/windows.md): each
/// window recomputes the forward's intermediates, replays its states from h0 or, where it
/// continues a sequence, the forward's checkpoint, and carries the gradient w.r.t. a cut
/// sequence's state back to the window before it.
#[allow(clippy::too_many_arguments)]
fn backward_windows(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    saved: &Saved,
    sw: &SavedWindows,
    ws: &BackwardWorkspace,
    d_o: &GpuTensor,
    dht: Option<&GpuTensor>,
    grads: &GradientOutputs<'_>,
    gates: &GateParams<'_>,
    timer: Option<&GpuTimer>,
) -> Result<()> {
    let p = &saved.problem;
    let inputs = saved.inputs.as_ref();
    let sequences = p.sequences();
    let slot_bytes = (p.heads_v * p.key_dim * p.value_dim * 4) as u64;
    let rc = ws.recomputed.as_ref().ok_or_else(|| {
        Error::Gpu("backward workspace: a windowed plan without recompute scratch".into())
    })?;
    let carry = &rc.carry;
    // Sequences no window computes (empty ones outside every window) keep dh0 = dht.
    if let Some(dh0) = grads.dh0 {
        match dht {
            Some(dht) => encoder.copy_buffer_to_buffer(
                &dht.buffer,
                dht.offset(),
                &dh0.buffer,
                dh0.offset(),
                dht.bytes(),
            ),
            None => encoder.clear_buffer(&dh0.buffer, dh0.offset(), Some(dh0.bytes())),
        }
    }

    for wt in ws.windows.iter().rev() {
        let w = &wt.window;
        let (base, rows) = (w.base, w.tokens);
        let num_chunks = wt.num_chunks;
        let tokens = |t: &GpuTensor, name: &str| -> Result<GpuTensor> {
            let dims = &t.shape[2..];
            let row: usize = dims.iter().product();
            let shape: Vec<usize> = [rows].into_iter().chain(dims.iter().copied()).collect();
            t.view(name, base * row, &shape)
        };
        let (q_raw, k_raw, v) = (
            tokens(inputs.q, "q")?,
            tokens(inputs.k, "k")?,
            tokens(inputs.v, "v")?,
        );
        let (g, beta, d_o) = (
            tokens(inputs.g, "g")?,
            tokens(inputs.beta, "beta")?,
            tokens(d_o, "do")?,
        );
        let (dq, dk, dv) = (
            tokens(grads.dq, "dq")?,
            tokens(grads.dk, "dk")?,
            tokens(grads.dv, "dv")?,
        );
        let (dg, dbeta) = (tokens(grads.dg, "dg")?, tokens(grads.dbeta, "dbeta")?);
        let rows_of = |t: &GpuTensor| -> Result<GpuTensor> {
            let shape: Vec<usize> = [rows]
                .into_iter()
                .chain(t.shape[1..].iter().copied())
                .collect();
            fit(t, &shape)
        };
        let gate_beta = rows_of(&rc.gate_beta)?;
        let a = rows_of(&rc.a)?;
        let q_n = rc.q_normed.as_ref().map(rows_of).transpose()?;
        let k_n = rc.k_normed.as_ref().map(rows_of).transpose()?;
        let sc = ws.scratch.window(p, rows, num_chunks + w.seqs())?;

        // The forward's intermediates over this window.
        if let (Some(qn), Some(kn)) = (&q_n, &k_n) {
            prepare_qk(ctx, encoder, &wt.params, &q_raw, qn)?;
            prepare_qk(ctx, encoder, &wt.params, &k_raw, kn)?;
        }
        prepare_gate(
            ctx,
            encoder,
            &wt.params,
            &PrepareGateBuffers {
                g: &g,
                beta: &beta,
                gate_params: gates.params,
                chunks: &wt.chunks,
                gate_beta: &gate_beta,
            },
            num_chunks,
            p.heads_v,
        )?;

        // Tail slots: the pieces' start states (h0 or 0; the checkpoint where the window
        // continues a sequence), and the gradients w.r.t. their end states: dht (or 0) where
        // the piece ends its sequence, the carry where it goes on.
        let tail = sc.states.offset() + num_chunks as u64 * slot_bytes;
        let dtail = sc.dstates.offset() + num_chunks as u64 * slot_bytes;
        let seqs_bytes = w.seqs() as u64 * slot_bytes;
        let seq_at = w.first_seq as u64 * slot_bytes;
        match inputs.initial_state {
            Some(h0) => encoder.copy_buffer_to_buffer(
                &h0.buffer,
                h0.offset() + seq_at,
                &sc.states.buffer,
                tail,
                seqs_bytes,
            ),
            None => encoder.clear_buffer(&sc.states.buffer, tail, Some(seqs_bytes)),
        }
        if let Some(i) = wt.checkpoint {
            let ck = sw.checkpoints.as_ref().ok_or_else(|| {
                Error::Gpu("saved windows: a continuing window without checkpoints".into())
            })?;
            let at = ck.offset() + i as u64 * slot_bytes;
            encoder.copy_buffer_to_buffer(&ck.buffer, at, &sc.states.buffer, tail, slot_bytes);
        }
        match dht {
            Some(dht) => encoder.copy_buffer_to_buffer(
                &dht.buffer,
                dht.offset() + seq_at,
                &sc.dstates.buffer,
                dtail,
                seqs_bytes,
            ),
            None => encoder.clear_buffer(&sc.dstates.buffer, dtail, Some(seqs_bytes)),
        }
        let last = w.seqs() - 1;
        if w.pieces[last].end < sequences[w.first_seq + last].end {
            let at = dtail + last as u64 * slot_bytes;
            encoder.copy_buffer_to_buffer(&carry.buffer, 0, &sc.dstates.buffer, at, slot_bytes);
        }

        let passes = WindowPasses {
            problem: p,
            params: &wt.params,
            chunks: &wt.chunks,
            segments: &wt.segments,
            num_chunks,
            num_segments: w.seqs(),
            rows,
            q_raw: &q_raw,
            k_raw: &k_raw,
            q: q_n.as_ref().unwrap_or(&q_raw),
            k: k_n.as_ref().unwrap_or(&k_raw),
            v: &v,
            g: &g,
            beta: &beta,
            d_o: &d_o,
            gate_beta: &gate_beta,
            a_out: &a,
            a: &a,
            scratch: &sc,
            grads: &GradientOutputs {
                dq: &dq,
                dk: &dk,
                dv: &dv,
                dg: &dg,
                dbeta: &dbeta,
                dh0: grads.dh0,
            },
            gates,
        };
        // After dh_scan the tail slots hold the gradients w.r.t. the pieces' start states: dh0
        // where a piece starts its sequence, else the carry for the window before.
        let mut dh_done = |encoder: &mut wgpu::CommandEncoder| {
            for (i, piece) in w.pieces.iter().enumerate() {
                let n = w.first_seq + i;
                let from = dtail + i as u64 * slot_bytes;
                if piece.start == sequences[n].start {
                    if let Some(dh0) = grads.dh0 {
                        let to = dh0.offset() + n as u64 * slot_bytes;
                        encoder.copy_buffer_to_buffer(
                            &sc.dstates.buffer,
                            from,
                            &dh0.buffer,
                            to,
                            slot_bytes,
                        );
                    }
                } else {
                    encoder.copy_buffer_to_buffer(
                        &sc.dstates.buffer,
                        from,
                        &carry.buffer,
                        0,
                        slot_bytes,
                    );
                }
            }
        };
        record_window(ctx, encoder, &passes, None, &mut dh_done)?;
        if let Some(t) = timer {
            t.mark(encoder, "window");
        }
    }
    Ok(())
}

/// Check that a host gradient input is finite (the GPU path cannot check without a readback).
fn check_finite(name: &str, t: &HostTensor) -> Result<()> {
    match t.data.iter().position(|x| !x.is_finite()) {
        Some(i) => Err(Error::value(
            name,
            "finite values",
            format!("{} at flat index {i}", t.data[i]),
        )),
        None => Ok(()),
    }
}

/// Check `do` and `dht` host tensors against the problem: shape, dtype, finite values.
pub fn check_host_gradients(
    problem: &Problem,
    v_dtype: DType,
    d_o: &HostTensor,
    dht: Option<&HostTensor>,
) -> Result<()> {
    if d_o.shape() != problem.v_shape() {
        return Err(Error::shape("do", &problem.v_shape(), d_o.shape()));
    }
    d_o.check_storage("do")?;
    if d_o.dtype != v_dtype {
        return Err(Error::DType {
            name: "do".into(),
            expected: format!("{v_dtype} (the dtype of v)"),
            got: d_o.dtype.to_string(),
        });
    }
    check_finite("do", d_o)?;
    if let Some(dht) = dht {
        if dht.shape() != problem.state_shape() {
            return Err(Error::shape("dht", &problem.state_shape(), dht.shape()));
        }
        dht.check_storage("dht")?;
        if dht.dtype != DType::F32 {
            return Err(Error::DType {
                name: "dht".into(),
                expected: "F32".into(),
                got: dht.dtype.to_string(),
            });
        }
        check_finite("dht", dht)?;
    }
    Ok(())
}

/// Upload host inputs, run forward and backward in one submission, wait, and download the
/// forward's outputs and every gradient. Checks host values first. Native only; a convenience
/// for the CLI, examples and tests.
#[cfg(not(target_arch = "wasm32"))]
pub fn backward_host(
    ctx: &Context,
    problem: &Problem,
    inputs: &ForwardInputs<&HostTensor>,
    d_o: &HostTensor,
    dht: Option<&HostTensor>,
) -> Result<(ForwardOutputs<HostTensor>, Gradients<HostTensor>)> {
    problem.check_inputs(inputs, &storage_dtypes(ctx))?;
    crate::problem::check_host_values(problem, inputs)?;
    check_host_gradients(problem, inputs.v.dtype, d_o, dht)?;
    let gpu_inputs = crate::wgpu_backend::upload_inputs(ctx, inputs)?;
    let d_o = GpuTensor::upload(ctx, "do", d_o)?;
    let dht = dht.map(|t| GpuTensor::upload(ctx, "dht", t)).transpose()?;
    let mut encoder = ctx.create_encoder("gdn forward + backward");
    let (fwd, grads) = forward_backward(
        ctx,
        &mut encoder,
        problem,
        &gpu_inputs.as_ref(),
        &d_o,
        dht.as_ref(),
    )?;
    ctx.submit_and_wait(encoder)?;
    let down = |t: &GpuTensor| t.download_blocking(ctx);
    let down_opt = |t: &Option<GpuTensor>| t.as_ref().map(down).transpose();
    let outputs = ForwardOutputs {
        o: down(&fwd.o)?,
        final_state: down(&fwd.final_state)?,
    };
    let grads = Gradients {
        dq: down(&grads.dq)?,
        dk: down(&grads.dk)?,
        dv: down(&grads.dv)?,
        dg: down(&grads.dg)?,
        dbeta: down(&grads.dbeta)?,
        dh0: down_opt(&grads.dh0)?,
        da_log: down_opt(&grads.da_log)?,
        ddt_bias: down_opt(&grads.ddt_bias)?,
    };
    Ok((outputs, grads))
}
