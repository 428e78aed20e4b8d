//! The backward's memory plan and its workspace (docs/backward.md, "Memory").
//!
//! The backward walks token windows last to first (docs/windows.md): a window recomputes the
//! forward's intermediates and replays its states from the state where it starts (h0, or a
//! checkpoint `forward_saved` kept where a window continues a sequence), so its scratch is
//! sized by the window, not by T. A [`BackwardPlan`] chooses the windows: the longest whose
//! scratch, tables and checkpoints fit a [`MemoryBudget`], within the binding limit — all from
//! arithmetic, before anything is allocated. A [`BackwardWorkspace`] holds the buffers of one
//! plan and is reused between calls.

use crate::error::{Error, Result};
use crate::problem::{CHUNK, Problem};
use crate::tensor::DType;
use crate::wgpu_backend::forward::planned_windows;
use crate::wgpu_backend::params::{Params, upload_u32};
use crate::wgpu_backend::path::ComputePath;
use crate::wgpu_backend::windows::{TokenWindow, WindowCosts};
use crate::wgpu_backend::{Context, GpuTensor};

use super::{Saved, backward_costs, segment_table, storage_dtypes};

pub use crate::wgpu_backend::config::MemoryBudget;

/// Bytes of the backward's inputs with q, k, v, do stored as `dtype`: q, k, v, do, and g, β
/// (f32) — what [`MemoryBudget::TimesInputs`] multiplies.
pub fn input_bytes(problem: &Problem, dtype: DType) -> u64 {
    let bt = problem.total_tokens() as u64;
    let size = dtype.size() as u64;
    let qk = bt * problem.heads_qk as u64 * problem.key_dim as u64 * size;
    let v = bt * problem.heads_v as u64 * problem.value_dim as u64 * size;
    let gates = bt * problem.heads_v as u64 * 4;
    2 * qk + 2 * v + 2 * gates
}

/// What a plan holds on the device, in bytes of buffers (each rounded up to 4 bytes as
/// allocated).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PlanBytes {
    /// The [`BackwardWorkspace`]: scratch for the largest window, every window's tables and
    /// parameter block, the gate sums, the state-gradient carry.
    pub workspace: u64,
    /// The start states of windows that continue a sequence, which `forward_saved` copies and
    /// [`Saved`] keeps (one state per such window).
    pub checkpoints: u64,
}

impl PlanBytes {
    /// What the budget bounds: workspace and checkpoints.
    pub fn total(&self) -> u64 {
        self.workspace + self.checkpoints
    }
}

/// The backward's token windows for one problem and storage dtype, chosen for a memory
/// budget, and what they hold. `forward_saved_for` runs the forward in the same windows.
#[derive(Debug, Clone)]
pub struct BackwardPlan {
    pub(crate) problem: Problem,
    pub(crate) dtype: DType,
    /// The forward's compute path (its scratch bounds the windows too).
    pub(crate) path: ComputePath,
    /// The backward's compute path (scalar or coop; [`backward_path`](super::backward_path)):
    /// the coop path holds f16 operands too.
    pub(crate) backward_path: ComputePath,
    pub(crate) windows: Vec<TokenWindow>,
    /// The chunks per window the budget allows (`usize::MAX`: only the bindings bound them).
    pub(crate) max_chunks: usize,
    budget: Option<u64>,
    bytes: PlanBytes,
}

impl BackwardPlan {
    /// The plan for `problem` with q, k, v stored as `dtype` under `budget`: the whole problem
    /// in one window when it fits (and the bindings allow), else the longest windows whose
    /// [`PlanBytes::total`] fits. Nothing is allocated. A budget below the least plan (windows
    /// of one chunk, or the least total when longer windows need fewer checkpoints) is an
    /// [`Error::OverBudget`] naming both.
    pub fn new(
        ctx: &Context,
        problem: &Problem,
        dtype: DType,
        budget: MemoryBudget,
    ) -> Result<Self> {
        if !storage_dtypes(ctx).contains(&dtype) {
            return Err(Error::DType {
                name: "dtype".into(),
                expected: format!(
                    "one of {:?} (the backward's on this device)",
                    storage_dtypes(ctx)
                ),
                got: dtype.to_string(),
            });
        }
        // Windows start the backward's f32 replay from states the forward checkpointed: the
        // forward then runs on the scalar (f32) path, whose states are the replay's. A state
        // from a tensor-core path carries its f16 operands' rounding into every gradient of the
        // window (measured on the H200, 2/8 heads, 131 tokens in windows of one chunk: dg
        // 1.17e-4 against the oracle, over the policy's 1e-4).
        let path = ctx.forward_path(problem, dtype)?.path;
        let backward = super::backward_path(ctx, problem, dtype)?.path;
        match Self::on_path(ctx, problem, dtype, budget, path, backward) {
            Ok(plan) if plan.windows.len() == 1 || path == ComputePath::Scalar => Ok(plan),
            Err(e) if path == ComputePath::Scalar => Err(e),
            _ => Self::on_path(ctx, problem, dtype, budget, ComputePath::Scalar, backward),
        }
    }

    /// [`Self::new`] with the forward on `path`.
    fn on_path(
        ctx: &Context,
        problem: &Problem,
        dtype: DType,
        budget: MemoryBudget,
        path: ComputePath,
        backward_path: ComputePath,
    ) -> Result<Self> {
        let coop = backward_path == ComputePath::CoopMatrix;
        let costs = backward_costs(problem, dtype);
        let at = |max_chunks: usize| -> Result<(Vec<TokenWindow>, PlanBytes)> {
            let capped = WindowCosts {
                max_rows: max_chunks,
                ..costs.clone()
            };
            let windows = planned_windows(ctx, problem, dtype, path, &capped)?;
            let bytes = plan_bytes(problem, dtype, &windows, coop);
            Ok((windows, bytes))
        };
        let plan = |windows, max_chunks, budget, bytes| BackwardPlan {
            problem: problem.clone(),
            dtype,
            path,
            backward_path,
            windows,
            max_chunks,
            budget,
            bytes,
        };
        let (unbounded, unbounded_bytes) = at(usize::MAX)?;
        let (budget, floored) = match budget {
            MemoryBudget::Unbounded => {
                return Ok(plan(unbounded, usize::MAX, None, unbounded_bytes));
            }
            MemoryBudget::Bytes(b) => (b, false),
            MemoryBudget::TimesInputs(m) => {
                (input_bytes(problem, dtype).saturating_mul(m as u64), true)
            }
        };
        if unbounded_bytes.total() <= budget {
            return Ok(plan(unbounded, usize::MAX, Some(budget), unbounded_bytes));
        }
        // Chunks per window on a geometric grid (×1.25), then the largest that fits by
        // bisection above the largest grid point that does: past the least total (fewer
        // checkpoints against more scratch), longer windows only cost more.
        let longest = unbounded
            .iter()
            .map(|w| w.chunk_table().len() / 2)
            .max()
            .unwrap_or(1)
            .max(1);
        let mut grid = vec![1usize];
        while grid[grid.len() - 1] < longest {
            let last = grid[grid.len() - 1];
            grid.push((last + last.div_ceil(4)).min(longest));
        }
        let mut evaluated = Vec::with_capacity(grid.len());
        for &c in &grid {
            let (windows, bytes) = at(c)?;
            evaluated.push((c, windows, bytes));
        }
        let least = evaluated
            .iter()
            .map(|(_, _, b)| b.total())
            .min()
            .unwrap_or(0);
        let budget = if floored { budget.max(least) } else { budget };
        let Some(i) = evaluated.iter().rposition(|(_, _, b)| b.total() <= budget) else {
            return Err(Error::OverBudget {
                name: "backward memory budget".into(),
                needed: least,
                budget,
            });
        };
        let mut hi = evaluated.get(i + 1).map_or(evaluated[i].0 + 1, |e| e.0);
        let (mut lo, mut windows, mut bytes) = evaluated.swap_remove(i);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            let (w, b) = at(mid)?;
            if b.total() <= budget {
                (lo, windows, bytes) = (mid, w, b);
            } else {
                hi = mid;
            }
        }
        Ok(plan(windows, lo, Some(budget), bytes))
    }

    /// Token windows the backward walks (and `forward_saved_for` runs the forward in).
    pub fn windows(&self) -> usize {
        self.windows.len()
    }

    /// The tokens of the packed axis each window computes, in order.
    pub fn window_tokens(&self) -> Vec<std::ops::Range<usize>> {
        self.windows
            .iter()
            .map(|w| {
                let start = w
                    .pieces
                    .iter()
                    .find(|r| !r.is_empty())
                    .map_or(w.base, |r| r.start);
                start..w.base + w.tokens
            })
            .collect()
    }

    /// What the plan holds.
    pub fn bytes(&self) -> PlanBytes {
        self.bytes
    }

    /// The compute path of the forward `forward_saved_for` runs for it: the context's for one
    /// window, the scalar (f32) path for several (their start states are checkpointed for the
    /// backward's f32 replay).
    pub fn forward_path(&self) -> ComputePath {
        self.path
    }

    /// The backward's compute path: scalar, or coop (f16 cooperative-matrix replay).
    pub fn backward_path(&self) -> ComputePath {
        self.backward_path
    }

    /// The budget in bytes it was planned for (`None`: unbounded).
    pub fn budget(&self) -> Option<u64> {
        self.budget
    }

    /// The problem it was planned for.
    pub fn problem(&self) -> &Problem {
        &self.problem
    }

    /// The storage dtype of q, k, v it was planned for.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// `Error::Value` naming `backward plan` unless the plan was made for `problem` and
    /// `dtype`.
    pub(crate) fn check_matches(&self, name: &str, problem: &Problem, dtype: DType) -> Result<()> {
        if self.problem != *problem || self.dtype != dtype {
            return Err(Error::value(
                name,
                format!("one made for this problem ({problem:?}) and dtype {dtype}"),
                format!("one for {:?} and dtype {}", self.problem, self.dtype),
            ));
        }
        Ok(())
    }
}

/// The buffers of a workspace for windows of `rows` tokens and `slots` state slots, as
/// (name, shape, dtype); `windowed`: the recomputed intermediates and the carry too; `coop`:
/// the coop path's f16 operands (one chunk of padding rows each).
fn scratch_shapes(
    p: &Problem,
    dtype: DType,
    rows: usize,
    slots: usize,
    windowed: bool,
    coop: bool,
) -> Vec<(&'static str, Vec<usize>, DType)> {
    let (h, hv, kd, vd) = (p.heads_qk, p.heads_v, p.key_dim, p.value_dim);
    let f = DType::F32;
    let mut shapes = vec![
        ("recomputed states", vec![slots, hv, kd, vd], f),
        ("state gradients", vec![slots, hv, kd, vd], f),
        ("W and V'", vec![2, rows, hv, vd], f),
        ("dV' and dv", vec![2, rows, hv, vd], f),
        ("dP and dA", vec![2, rows, hv, CHUNK], f),
        (
            "dq dk per v-head | gated matrices",
            vec![rows, hv, (3 * kd + 1).max(2 * CHUNK)],
            f,
        ),
        ("dg and dbeta", vec![rows, hv, 2], f),
    ];
    if windowed {
        shapes.push(("gate_beta", vec![rows, hv, 2], f));
        shapes.push(("wy_inverse", vec![rows, hv, CHUNK], f));
        if p.options.l2norm_qk {
            shapes.push(("q_normed", vec![rows, h, kd], dtype));
            shapes.push(("k_normed", vec![rows, h, kd], dtype));
        }
        let s = p.state_shape();
        shapes.push(("state gradient carry", vec![1, hv, s[2], s[3]], f));
    }
    if coop {
        let padded = rows + CHUNK;
        shapes.push(("k16", vec![padded, h, kd], DType::F16));
        shapes.push(("gated16", vec![padded, hv, 2 * CHUNK], DType::F16));
        shapes.push(("qg16", vec![padded, hv, kd], DType::F16));
    }
    shapes
}

/// Bytes of a buffer of `len` elements of `dtype` as `GpuTensor::scratch` allocates it.
fn tensor_bytes(len: usize, dtype: DType) -> u64 {
    ((len * dtype.size()) as u64).div_ceil(4).max(1) * 4
}

/// Bytes of a u32 table as `upload_u32` allocates it.
fn table_bytes(words: usize) -> u64 {
    4 * words.max(1) as u64
}

/// The rows and state slots of the largest window.
fn window_extent(windows: &[TokenWindow]) -> (usize, usize) {
    let rows = windows.iter().map(|w| w.tokens).max().unwrap_or(0);
    let slots = windows
        .iter()
        .map(|w| w.chunk_table().len() / 2 + w.seqs())
        .max()
        .unwrap_or(0);
    (rows, slots)
}

/// What a plan over `windows` holds (the sizes [`BackwardWorkspace::from_plan`] allocates).
fn plan_bytes(p: &Problem, dtype: DType, windows: &[TokenWindow], coop: bool) -> PlanBytes {
    let windowed = windows.len() > 1;
    let (rows, slots) = window_extent(windows);
    let scratch: u64 = scratch_shapes(p, dtype, rows, slots, windowed, coop)
        .iter()
        .map(|(_, shape, dt)| tensor_bytes(shape.iter().product(), *dt))
        .sum();
    let params = std::mem::size_of::<Params>() as u64;
    let tables: u64 = windows
        .iter()
        .map(|w| params + table_bytes(w.chunk_table().len()) + table_bytes(4 * w.seqs()))
        .sum();
    let gates = 2 * 8 * p.heads_v as u64;
    let slot = (p.heads_v * p.key_dim * p.value_dim * 4) as u64;
    let sequences = p.sequences();
    let continuing = windows.iter().filter(|w| w.continues(&sequences)).count() as u64;
    PlanBytes {
        workspace: scratch + tables + gates,
        checkpoints: if windowed { continuing * slot } else { 0 },
    }
}

/// The scratch of one backward window, `rows` tokens and `slots` state slots (chunks, then one
/// tail slot per sequence), in the problem's state layout.
#[derive(Debug)]
pub(crate) struct Scratch {
    pub states: GpuTensor,
    pub dstates: GpuTensor,
    pub w_vnew: GpuTensor,
    pub dvnew_dv: GpuTensor,
    pub mats: GpuTensor,
    /// The per-v-head dq/dk terms (written from state_grad on) share their memory with the
    /// scans' gated matrices (read up to dh_scan).
    pub union: GpuTensor,
    pub dg_dbeta: GpuTensor,
    /// The coop path's f16 operands.
    pub coop: Option<CoopOperands>,
}

/// The coop backward's f16 operands, written by `wy_inverse_coop`: `[rows + 64, H, K]` k,
/// `[rows + 64, HV, 128]` gated matrices, `[rows + 64, HV, K]` γ ⊙ q; the padding rows are
/// zeroed before each window.
#[derive(Debug)]
pub(crate) struct CoopOperands {
    pub k16: GpuTensor,
    pub gated16: GpuTensor,
    pub qg16: GpuTensor,
}

impl Scratch {
    /// The tensors of a window of `rows` tokens and `slots` slots: views of the leading
    /// elements when the scratch was made for a larger window, else the scratch itself.
    pub fn window(&self, p: &Problem, rows: usize, slots: usize) -> Result<Scratch> {
        let (hv, kd, vd) = (p.heads_v, p.key_dim, p.value_dim);
        let u = (3 * kd + 1).max(2 * CHUNK);
        Ok(Scratch {
            states: fit(&self.states, &[slots, hv, kd, vd])?,
            dstates: fit(&self.dstates, &[slots, hv, kd, vd])?,
            w_vnew: fit(&self.w_vnew, &[2, rows, hv, vd])?,
            dvnew_dv: fit(&self.dvnew_dv, &[2, rows, hv, vd])?,
            mats: fit(&self.mats, &[2, rows, hv, CHUNK])?,
            union: fit(&self.union, &[rows, hv, u])?,
            dg_dbeta: fit(&self.dg_dbeta, &[rows, hv, 2])?,
            coop: match &self.coop {
                Some(c) => {
                    let padded = rows + CHUNK;
                    Some(CoopOperands {
                        k16: fit(&c.k16, &[padded, p.heads_qk, kd])?,
                        gated16: fit(&c.gated16, &[padded, hv, 2 * CHUNK])?,
                        qg16: fit(&c.qg16, &[padded, hv, kd])?,
                    })
                }
                None => None,
            },
        })
    }
}

/// `t` as `shape`: itself when that is its shape, else a view of its leading elements.
pub(crate) fn fit(t: &GpuTensor, shape: &[usize]) -> Result<GpuTensor> {
    if t.shape == shape {
        Ok(t.clone())
    } else {
        t.view("backward scratch", 0, shape)
    }
}

/// What a windowed backward recomputes per window (the forward's intermediates over the
/// window), and the gradient w.r.t. the state where a window cut a sequence, carried to the
/// window before.
#[derive(Debug)]
pub(crate) struct Recomputed {
    pub gate_beta: GpuTensor,
    pub a: GpuTensor,
    pub q_normed: Option<GpuTensor>,
    pub k_normed: Option<GpuTensor>,
    pub carry: GpuTensor,
}

/// One window's tables.
#[derive(Debug)]
pub(crate) struct WindowTables {
    pub window: TokenWindow,
    pub params: wgpu::Buffer,
    pub chunks: wgpu::Buffer,
    pub segments: wgpu::Buffer,
    pub num_chunks: usize,
    /// The window's slot in the saved checkpoints when its first piece continues a sequence.
    pub checkpoint: Option<usize>,
}

/// Every buffer a backward writes besides its gradients, for one [`BackwardPlan`]: scratch
/// for the plan's largest window, the recomputed intermediates and the state-gradient carry
/// (several windows), each window's tables, and the gate sums. Made once and reused: the
/// backward through a workspace ([`backward_into_workspace`](super::backward_into_workspace))
/// allocates nothing. It takes saved contexts of the plan's windows
/// ([`forward_saved_for`](super::forward_saved_for) with [`Self::plan`], or
/// [`forward_saved`](super::forward_saved) under the same budget); other contexts are an
/// `Error::Value` naming `backward workspace`.
#[derive(Debug)]
pub struct BackwardWorkspace {
    pub(crate) plan: BackwardPlan,
    pub(crate) windows: Vec<WindowTables>,
    pub(crate) scratch: Scratch,
    pub(crate) recomputed: Option<Recomputed>,
    /// `[A_log, dt_bias]` in and `[dA_log, ddt_bias]` accumulated, `[2 HV]` f32 each.
    pub(crate) gate_params: wgpu::Buffer,
    pub(crate) dgate_params: wgpu::Buffer,
}

impl BackwardWorkspace {
    /// A workspace for `problem` with q, k, v stored as `dtype`, planned for the context's
    /// budget (`GDN_BACKWARD_BUDGET`, [`Context::set_backward_budget`]; else
    /// [`MemoryBudget::DEFAULT`]) — the plan [`forward_saved`](super::forward_saved) uses.
    pub fn new(ctx: &Context, problem: &Problem, dtype: DType) -> Result<Self> {
        let budget = ctx
            .config()
            .backward_budget
            .unwrap_or(MemoryBudget::DEFAULT);
        Self::with_budget(ctx, problem, dtype, budget)
    }

    /// A workspace planned for `budget` ([`BackwardPlan::new`]; a budget below the least plan
    /// is an [`Error::OverBudget`] before anything is allocated).
    pub fn with_budget(
        ctx: &Context,
        problem: &Problem,
        dtype: DType,
        budget: MemoryBudget,
    ) -> Result<Self> {
        Self::from_plan(ctx, BackwardPlan::new(ctx, problem, dtype, budget)?)
    }

    /// Allocate the buffers of `plan`.
    pub fn from_plan(ctx: &Context, plan: BackwardPlan) -> Result<Self> {
        let p = &plan.problem;
        let windowed = plan.windows.len() > 1;
        let (rows, slots) = window_extent(&plan.windows);
        let mut tensors = Vec::new();
        let coop = plan.backward_path == ComputePath::CoopMatrix;
        for (name, shape, dtype) in scratch_shapes(p, plan.dtype, rows, slots, windowed, coop) {
            tensors.push(GpuTensor::scratch(ctx, name, &shape, dtype)?);
        }
        let mut tensors = tensors.into_iter();
        let mut next = || {
            tensors
                .next()
                .ok_or_else(|| Error::Gpu("backward workspace: a scratch buffer missing".into()))
        };
        let scratch = Scratch {
            states: next()?,
            dstates: next()?,
            w_vnew: next()?,
            dvnew_dv: next()?,
            mats: next()?,
            union: next()?,
            dg_dbeta: next()?,
            coop: None,
        };
        let recomputed = if windowed {
            let (gate_beta, a) = (next()?, next()?);
            let (q_normed, k_normed) = if p.options.l2norm_qk {
                (Some(next()?), Some(next()?))
            } else {
                (None, None)
            };
            Some(Recomputed {
                gate_beta,
                a,
                q_normed,
                k_normed,
                carry: next()?,
            })
        } else {
            None
        };
        let scratch = Scratch {
            coop: if coop {
                Some(CoopOperands {
                    k16: next()?,
                    gated16: next()?,
                    qg16: next()?,
                })
            } else {
                None
            },
            ..scratch
        };
        let sequences = p.sequences();
        let mut checkpoints = 0;
        let windows = plan
            .windows
            .iter()
            .map(|w| {
                let chunk_table = w.chunk_table();
                let num_chunks = chunk_table.len() / 2;
                let first = w
                    .pieces
                    .iter()
                    .find(|r| !r.is_empty())
                    .map_or(w.base, |r| r.start);
                let mut params = Params::for_problem(p, num_chunks, w.seqs());
                params.total_tokens = w.tokens as u32;
                // gate_finish sums from the window's first chunk, not from its aligned base.
                params.rows = (first - w.base) as u32;
                let checkpoint = (windowed && w.continues(&sequences)).then(|| {
                    checkpoints += 1;
                    checkpoints - 1
                });
                WindowTables {
                    window: w.clone(),
                    params: params.upload(ctx),
                    chunks: upload_u32(ctx, "chunks", &chunk_table),
                    segments: upload_u32(
                        ctx,
                        "backward segments",
                        &segment_table(&w.pieces, w.base),
                    ),
                    num_chunks,
                    checkpoint,
                }
            })
            .collect();
        let gates = |label: &str| {
            ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: (8 * p.heads_v) as u64,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_DST
                    | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            })
        };
        Ok(BackwardWorkspace {
            gate_params: gates("gate_params"),
            dgate_params: gates("dgate_params"),
            plan,
            windows,
            scratch,
            recomputed,
        })
    }

    /// A workspace for the windows `saved` was computed in (what a backward without a
    /// workspace allocates per call).
    pub(crate) fn for_saved(ctx: &Context, saved: &Saved) -> Result<Self> {
        let p = &saved.problem;
        let dtype = saved.inputs.q.dtype;
        let windows = match &saved.windows {
            Some(sw) => sw.windows.clone(),
            None => vec![TokenWindow::whole(p)],
        };
        let max_chunks = if windows.len() > 1 {
            window_chunks(&windows)
        } else {
            usize::MAX
        };
        let path = if windows.len() > 1 {
            ComputePath::Scalar
        } else {
            ctx.forward_path(p, dtype)?.path
        };
        let backward_path = super::backward_path(ctx, p, dtype)?.path;
        let plan = BackwardPlan {
            problem: p.clone(),
            dtype,
            path,
            backward_path,
            bytes: plan_bytes(p, dtype, &windows, backward_path == ComputePath::CoopMatrix),
            windows,
            max_chunks,
            budget: None,
        };
        Self::from_plan(ctx, plan)
    }

    /// The plan the workspace holds the buffers of.
    pub fn plan(&self) -> &BackwardPlan {
        &self.plan
    }

    /// Bytes of its buffers (the plan's [`PlanBytes::workspace`]).
    pub fn bytes(&self) -> u64 {
        let s = &self.scratch;
        let mut tensors = vec![
            &s.states,
            &s.dstates,
            &s.w_vnew,
            &s.dvnew_dv,
            &s.mats,
            &s.union,
            &s.dg_dbeta,
        ];
        if let Some(r) = &self.recomputed {
            tensors.extend([&r.gate_beta, &r.a, &r.carry]);
            tensors.extend(r.q_normed.iter().chain(r.k_normed.iter()));
        }
        if let Some(c) = &s.coop {
            tensors.extend([&c.k16, &c.gated16, &c.qg16]);
        }
        let tables: u64 = self
            .windows
            .iter()
            .map(|w| w.params.size() + w.chunks.size() + w.segments.size())
            .sum();
        tensors.iter().map(|t| t.buffer.size()).sum::<u64>()
            + tables
            + self.gate_params.size()
            + self.dgate_params.size()
    }

    /// `Error::Value` naming `backward workspace` unless `saved` is of this workspace's
    /// problem, dtype and windows.
    pub(crate) fn check_saved(&self, saved: &Saved) -> Result<()> {
        let p = &saved.problem;
        self.plan
            .check_matches("backward workspace", p, saved.inputs.q.dtype)?;
        let whole;
        let windows = match &saved.windows {
            Some(sw) => &sw.windows,
            None => {
                whole = vec![TokenWindow::whole(p)];
                &whole
            }
        };
        if *windows != self.plan.windows {
            return Err(Error::value(
                "backward workspace",
                format!(
                    "one planned with the {} token windows of the saved forward (forward_saved_for \
                     with the workspace's plan)",
                    windows.len()
                ),
                format!("one planned with {} windows", self.plan.windows.len()),
            ));
        }
        Ok(())
    }
}

/// The most chunks of one window.
fn window_chunks(windows: &[TokenWindow]) -> usize {
    windows
        .iter()
        .map(|w| w.chunk_table().len() / 2)
        .max()
        .unwrap_or(1)
}

/// What one backward holds on the device while it runs, in bytes of distinct buffers (each
/// counted once, at its allocated size): [`backward_memory`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BackwardMemory {
    /// The caller's tensors it reads: q, k, v, g, β, h0, A_log, dt_bias, do, dht.
    pub inputs: u64,
    /// What the forward kept for it ([`Saved`]): the whole problem's intermediates, or the
    /// checkpoints of a windowed forward (other buffers than the inputs').
    pub saved: u64,
    /// The [`BackwardWorkspace`].
    pub workspace: u64,
    /// The gradients it writes.
    pub gradients: u64,
}

impl BackwardMemory {
    /// Everything the call holds at once: its peak.
    pub fn total(&self) -> u64 {
        self.inputs + self.saved + self.workspace + self.gradients
    }
}

/// Count the buffers one backward of `saved` through `ws` into `grads` holds.
pub fn backward_memory(
    saved: &Saved,
    d_o: &GpuTensor,
    dht: Option<&GpuTensor>,
    grads: &crate::problem::Gradients<&GpuTensor>,
    ws: &BackwardWorkspace,
) -> BackwardMemory {
    let mut seen: Vec<wgpu::Buffer> = Vec::new();
    let mut count = |tensors: &[Option<&GpuTensor>]| -> u64 {
        let mut bytes = 0;
        for t in tensors.iter().flatten() {
            if !seen.contains(&t.buffer) {
                seen.push(t.buffer.clone());
                bytes += t.buffer.size();
            }
        }
        bytes
    };
    let i = saved.inputs.as_ref();
    let inputs = count(&[
        Some(i.q),
        Some(i.k),
        Some(i.v),
        Some(i.g),
        Some(i.beta),
        i.initial_state,
        i.a_log,
        i.dt_bias,
        Some(d_o),
        dht,
    ]);
    let inter = &saved.intermediates;
    let saved_bytes = count(&[
        Some(&inter.gate_beta),
        Some(&inter.a),
        inter.q_normed.as_ref(),
        inter.k_normed.as_ref(),
        saved.windows.as_ref().and_then(|w| w.checkpoints.as_ref()),
    ]);
    let gradients = count(&[
        Some(grads.dq),
        Some(grads.dk),
        Some(grads.dv),
        Some(grads.dg),
        Some(grads.dbeta),
        grads.dh0,
        grads.da_log,
        grads.ddt_bias,
    ]);
    BackwardMemory {
        inputs,
        saved: saved_bytes,
        workspace: ws.bytes(),
        gradients,
    }
}
