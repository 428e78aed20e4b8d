//! Launcher of the decode kernels, `shaders/decode/recurrent_step.wgsl` (reductions through
//! workgroup memory, runs everywhere) and `shaders/decode/subgroup_step.wgsl` (reductions by
//! subgroup shuffles, no barriers): the token-by-token recurrence over a state pool. Both
//! share their bindings, so one plan records either. A [`DecodePlan`] holds everything a step
//! needs (pipeline, bind group, uniform tables), so recording a step is one compute pass: the
//! decode hot path allocates nothing.

use crate::error::{Error, Result};
use crate::problem::{ForwardInputs, Problem};
use crate::tensor::DType;
use crate::wgpu_backend::decode::pool::{StatePool, StateSlot, check_slots};
use crate::wgpu_backend::launch::{Bindings, Grid, Launch, Prepared};
use crate::wgpu_backend::params::{Params, init_buffer};
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::windows::{TokenWindow, plan_decode};
use crate::wgpu_backend::{Context, GpuTensor};
use std::ops::Range;

/// u32 words of the kernel's uniform `tables` (64 KiB: WebGPU's default uniform binding size).
pub const TABLE_WORDS: usize = 16384;
/// vec4 registers of state per invocation: the kernel's eight named quads of four.
pub const MAX_VEC4S_PER_THREAD: u32 = 32;
/// Largest workgroup the tile choice uses (every WebGPU device allows 256).
pub const MAX_WORKGROUP: u32 = 256;
/// Words of a k (q) row one invocation stages per token (the kernel's named registers).
const MAX_STAGE: u32 = 8;
/// Columns per workgroup of the subgroup kernel's own default tiling (workgroups of twice as
/// many invocations; the fastest subgroup tiling of the H200 sweep at every B); see
/// [`RecurrentStepTiles::choose_subgroup`].
pub const SUBGROUP_V_BLOCK: u32 = 32;

/// The largest number of sequences one call can address: the tables hold N + 1 token
/// starts, N slot codes and A_log, dt_bias (HV each).
pub fn max_sequences(heads_v: usize) -> usize {
    (TABLE_WORDS - 1).saturating_sub(2 * heads_v) / 2
}

/// The outputs of a decode call.
#[derive(Debug, Clone, Copy)]
pub struct DecodeOutputs<'a> {
    /// `[B, T, HV, V]`, in the dtype of v.
    pub o: &'a GpuTensor,
    /// `[B·T, HV, K, V]` (the pool's layout), f32: the state after every token, so a server
    /// can accept the first k of T draft tokens. `None` skips the extra writes.
    pub per_token_states: Option<&'a GpuTensor>,
}

/// Which decode kernel a tiling is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StepKernel {
    /// `recurrent_step.wgsl`: cross-invocation sums through workgroup memory, two barriers per
    /// token. Runs on every device (WebGPU's default limits included).
    Workgroup,
    /// `subgroup_step.wgsl`: teams of 8 invocations reduce by subgroup shuffles, no barriers
    /// and no workgroup memory. Needs `Features::SUBGROUP` with subgroups of at least 8
    /// invocations ([`subgroup_kernel_available`]).
    Subgroup,
    /// `column_step.wgsl`: two value columns (all K rows) per invocation, k and q staged in
    /// workgroup memory and copied to private memory, no cross-invocation sums; f32 state
    /// pools and one element per storage word (f32, f16) only. Made for SwiftShader, which
    /// compiles it faster than `recurrent_step` and ran the forward with it faster: the
    /// forward's kernel in the browser on CPU adapters, opt-in elsewhere
    /// (docs/compute-paths.md, "Tiling on CPU adapters").
    Column,
}

/// Whether the subgroup decode kernel can run on `ctx`'s device: SUBGROUP enabled and a
/// minimum subgroup size of at least 8 (a team of 8 lanes must share a subgroup; SwiftShader
/// and WARP have 4).
pub fn subgroup_kernel_available(ctx: &Context) -> bool {
    ctx.features().contains(wgpu::Features::SUBGROUP)
        && ctx.device.adapter_info().subgroup_min_size >= SUBGROUP_TEAM
}

/// Invocations of a subgroup-kernel team: they share 4 (or 8) value columns and the whole K.
const SUBGROUP_TEAM: u32 = 8;

/// Tile sizes of the decode kernels (WGSL override constants): a workgroup owns a K ×
/// `v_block` state slice, an invocation `vec4s_per_thread` vec4s of it; see the shaders'
/// headers.
///
/// Workgroup kernel, K-first: invocations are `row_vecs = v_block / 4` (one vec4 column each)
/// × `row_lanes = K / vec4s_per_thread` (the consecutive k rows `row_lane·vec4s_per_thread + r`). V-first:
/// `row_lanes = v_block` (one v row each) × `row_vecs = K / (4·vec4s_per_thread)` (vec4s
/// `lane_vec + row_vecs·r` of the row along k).
///
/// Subgroup kernel (either layout): `row_vecs = v_block / 4` teams of `row_lanes = 8`
/// invocations, each team 4 columns, each invocation `4·⌈K / 32⌉` vec4s (k groups
/// `32 gi + 4 lane`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecurrentStepTiles {
    /// The kernel these tiles are for.
    pub kernel: StepKernel,
    /// Value columns per workgroup: a workgroup owns a K × `v_block` slice of the state.
    pub v_block: u32,
    /// Invocations along the slice's non-contiguous axis (k rows for K-first, v rows for
    /// V-first).
    pub row_lanes: u32,
    /// Invocations along the storage-contiguous axis, one vec4 wide each.
    pub row_vecs: u32,
    /// vec4 registers of state per invocation.
    pub vec4s_per_thread: u32,
    /// Tiles for V-first states (`[.., V, K]`), which swap the lane axes.
    pub v_first: bool,
    /// Sequences one workgroup walks (workgroup kernel): with more than one, a workgroup
    /// loads the next sequence's slice while it walks this one's tokens, holding two slices
    /// (so `2·vec4s_per_thread ≤ 32`), unless [`prefetch_next`](Self::prefetch_next) is
    /// off; the grid has ⌈N / seqs_per_workgroup⌉ along z.
    pub seqs_per_workgroup: u32,
    /// With `seqs_per_workgroup > 1`: whether a workgroup loads the next sequence's slice
    /// while it walks this one (`VxNsS`), or walks its sequences one after another with the
    /// whole register budget for one slice (`VxNtS`, fewer and longer-lived workgroups).
    pub prefetch_next: bool,
    key_dim: u32,
}

impl RecurrentStepTiles {
    /// The tiling with `vec4s` registers per invocation, if it exists and fits the kernel.
    fn new(key_dim: u32, v_block: u32, vec4s: u32, v_first: bool) -> Option<Self> {
        if !v_block.is_multiple_of(4) || vec4s == 0 || vec4s > MAX_VEC4S_PER_THREAD {
            return None;
        }
        let (row_vecs, row_lanes) = if v_first {
            let row = key_dim / 4;
            if !row.is_multiple_of(vec4s) {
                return None;
            }
            (row / vec4s, v_block)
        } else {
            if !key_dim.is_multiple_of(vec4s) {
                return None;
            }
            (v_block / 4, key_dim / vec4s)
        };
        let tiles = RecurrentStepTiles {
            kernel: StepKernel::Workgroup,
            v_block,
            row_lanes,
            row_vecs,
            vec4s_per_thread: vec4s,
            v_first,
            seqs_per_workgroup: 1,
            prefetch_next: true,
            key_dim,
        };
        (tiles.workgroup() <= MAX_WORKGROUP && tiles.stage() <= MAX_STAGE).then_some(tiles)
    }

    /// The column kernel's tiling with `v_block` columns per workgroup (two per invocation),
    /// if it fits the kernel: K a multiple of 4 and at most 4·MAX_VEC4S_PER_THREAD.
    fn column(key_dim: u32, v_block: u32, v_first: bool) -> Option<Self> {
        let fits = key_dim.is_multiple_of(4)
            && key_dim / 4 <= MAX_VEC4S_PER_THREAD
            && v_block.is_multiple_of(4);
        fits.then_some(RecurrentStepTiles {
            kernel: StepKernel::Column,
            v_block,
            row_lanes: 1,
            row_vecs: v_block / 2,
            vec4s_per_thread: 2 * (key_dim / 4),
            v_first,
            key_dim,
            seqs_per_workgroup: 1,
            prefetch_next: true,
        })
    }

    /// These tiles walking `seqs` sequences per workgroup (see
    /// [`seqs_per_workgroup`](Self::seqs_per_workgroup)), if the two slices fit the registers.
    fn walking(self, seqs: u32) -> Option<Self> {
        let fits = self.kernel == StepKernel::Workgroup
            && seqs >= 1
            && (seqs == 1 || 2 * self.vec4s_per_thread <= MAX_VEC4S_PER_THREAD);
        fits.then_some(RecurrentStepTiles {
            seqs_per_workgroup: seqs,
            ..self
        })
    }

    /// These tiles walking `seqs` sequences per workgroup one after another (no prefetch, see
    /// [`prefetch_next`](Self::prefetch_next)).
    fn in_turn(self, seqs: u32) -> Option<Self> {
        let fits = self.kernel == StepKernel::Workgroup && seqs > 1;
        fits.then_some(RecurrentStepTiles {
            seqs_per_workgroup: seqs,
            prefetch_next: false,
            ..self
        })
    }

    /// The subgroup kernel's tiling with `v_block` columns per workgroup and `col_groups`
    /// (1 or 2) groups of 4 columns per team (workgroups of `2·v_block / col_groups`
    /// invocations), if it fits the kernel.
    fn subgroup(key_dim: u32, v_block: u32, col_groups: u32, v_first: bool) -> Option<Self> {
        let vec4s = 4 * key_dim.div_ceil(32) * col_groups;
        let fits = (1..=2).contains(&col_groups)
            && v_block.is_multiple_of(16 * col_groups)
            && vec4s <= MAX_VEC4S_PER_THREAD;
        fits.then_some(RecurrentStepTiles {
            kernel: StepKernel::Subgroup,
            v_block,
            row_lanes: SUBGROUP_TEAM,
            row_vecs: v_block / (4 * col_groups),
            vec4s_per_thread: vec4s,
            v_first,
            seqs_per_workgroup: 1,
            prefetch_next: true,
            key_dim,
        })
    }

    /// Groups of 4 columns each lane of the subgroup kernel holds (1 or 2).
    fn col_groups(&self) -> u32 {
        self.v_block / (4 * self.row_vecs)
    }

    /// Invocations per workgroup.
    pub fn workgroup(&self) -> u32 {
        self.row_vecs * self.row_lanes
    }

    /// Partial sums per result of the per-token reduction.
    fn lanes(&self) -> u32 {
        if self.v_first {
            self.row_vecs
        } else {
            self.row_lanes
        }
    }

    /// Elements of a k (q) row each invocation stages per token (f32: one per word).
    fn stage(&self) -> u32 {
        self.key_dim.div_ceil(self.workgroup())
    }

    /// vec4s of the per-invocation b partials (K-first only; the array needs one entry).
    fn pb_vec4s(&self) -> u32 {
        if self.v_first { 1 } else { self.workgroup() }
    }

    /// Bytes of workgroup memory: k of two tokens and q (vec4s), the a, b partials per
    /// invocation and (Σk², Σq², k·q) per reduction lane; none for the subgroup kernel.
    pub fn workgroup_bytes(&self) -> u32 {
        match self.kernel {
            StepKernel::Workgroup => {
                16 * (3 * self.key_dim / 4 + self.workgroup() + self.pb_vec4s() + self.lanes())
            }
            StepKernel::Subgroup => 0,
            // k and q of one token (arrays of K ≤ 128) and 8 parts of their norms.
            StepKernel::Column => 16 * (2 * MAX_VEC4S_PER_THREAD + 8),
        }
    }

    /// Workgroups along V: V-blocks (the subgroup kernel's last one may be partial).
    pub fn v_blocks(&self, value_dim: usize) -> usize {
        value_dim.div_ceil(self.v_block as usize)
    }

    /// The WGSL pass of these tiles on a pool of `state_dtype` (f32 or bf16).
    pub fn pass(&self, state_dtype: DType) -> Pass {
        match (self.kernel, state_dtype) {
            (StepKernel::Workgroup, DType::BF16) => Pass::RecurrentStepBf16State,
            (StepKernel::Workgroup, _) => Pass::RecurrentStep,
            (StepKernel::Subgroup, DType::BF16) => Pass::SubgroupStepBf16State,
            (StepKernel::Subgroup, _) => Pass::SubgroupStep,
            // f32 pools only (`DecodePlan::with_tiles` refuses others).
            (StepKernel::Column, _) => Pass::ColumnStep,
        }
    }

    /// The kernel's entry point.
    pub fn entry(&self) -> &'static str {
        match self.kernel {
            StepKernel::Workgroup => "recurrent_step",
            StepKernel::Subgroup => "subgroup_step",
            StepKernel::Column => "column_step",
        }
    }

    /// Every subgroup-kernel tiling of `problem` the device's limits fit (whether the device
    /// has subgroups is [`subgroup_kernel_available`]'s question): 16 to 128 columns per
    /// workgroup (up to V rounded up to 16), with 4 or (where K ≤ 128) 8 columns per team.
    pub fn subgroup_candidates(limits: &wgpu::Limits, problem: &Problem) -> Vec<Self> {
        let max_wg = limits
            .max_compute_invocations_per_workgroup
            .min(limits.max_compute_workgroup_size_x);
        let v = problem.value_dim as u32;
        let (k, v_first) = (problem.key_dim as u32, problem.options.state_v_first);
        let mut out = Vec::new();
        for col_groups in [1, 2] {
            for b in [16u32, 32, 64, 128] {
                if b > v.next_multiple_of(16 * col_groups) {
                    continue;
                }
                if let Some(t) = Self::subgroup(k, b, col_groups, v_first)
                    && t.workgroup() <= max_wg
                {
                    out.push(t);
                }
            }
        }
        out
    }

    /// Every column-kernel tiling of `problem` the device's limits fit: V-blocks of 4 to 128
    /// columns dividing V (whether the pool and storage dtypes suit it is
    /// [`DecodePlan::with_tiles`]'s question).
    pub fn column_candidates(limits: &wgpu::Limits, problem: &Problem) -> Vec<Self> {
        let max_wg = MAX_WORKGROUP
            .min(limits.max_compute_invocations_per_workgroup)
            .min(limits.max_compute_workgroup_size_x);
        let (k, v) = (problem.key_dim as u32, problem.value_dim as u32);
        [4u32, 8, 16, 32, 64, 128]
            .into_iter()
            .filter(|b| v.is_multiple_of(*b))
            .filter_map(|b| Self::column(k, b, problem.options.state_v_first))
            .filter(|t| {
                t.workgroup() <= max_wg
                    && t.workgroup_bytes() <= limits.max_compute_workgroup_storage_size
            })
            .collect()
    }

    /// Every tiling `ctx` can run `problem` with: the workgroup kernel's
    /// [`candidates`](Self::candidates), the column kernel's, then the subgroup kernel's
    /// where it is available.
    pub fn all_candidates(ctx: &Context, problem: &Problem) -> Vec<Self> {
        let limits = ctx.limits();
        let mut out = Self::candidates(&limits, problem);
        out.extend(Self::column_candidates(&limits, problem));
        if subgroup_kernel_available(ctx) {
            out.extend(Self::subgroup_candidates(&limits, problem));
        }
        out
    }

    /// The default decode tiling on `ctx` ([`DecodePlan::new`]'s): the workgroup kernel's
    /// [`choose`](Self::choose) on every device so far. The subgroup kernel is opt-in
    /// ([`choose_subgroup`](Self::choose_subgroup), `sgV` names): in the H200 sweep of
    /// 2026-12-01 (one process per setting, interleaved, three rounds within 1 %;
    /// docs/benchmark-history.md) it was slower for B ≥ 64 (B = 256, HV = 32, K = V = 128:
    /// sg32 346 µs against 64x32's 308 µs) and tied at B = 1 (11.7 against 32x8's 11.6 µs).
    pub fn choose_for(ctx: &Context, problem: &Problem) -> Result<Self> {
        Self::choose(&ctx.limits(), problem)
    }

    /// The subgroup kernel's default: SUBGROUP_V_BLOCK columns per workgroup (see
    /// [`SUBGROUP_V_BLOCK`]), 4 columns per team, narrower when the device's workgroups are
    /// smaller.
    pub fn choose_subgroup(limits: &wgpu::Limits, problem: &Problem) -> Option<Self> {
        let candidates = Self::subgroup_candidates(limits, problem);
        candidates
            .iter()
            .copied()
            .filter(|t| t.col_groups() == 1 && t.v_block <= SUBGROUP_V_BLOCK)
            .max_by_key(|t| t.v_block)
            .or_else(|| candidates.first().copied())
    }

    /// Every tiling of `problem` the device fits, for tests and benchmarks: V-blocks of 4 to
    /// 128 columns and 1 to 32 vec4s per invocation (powers of two), and, for V-blocks of
    /// ≥ 32 columns with 8 or 16 vec4s, 2, 4 and 8 sequences per workgroup.
    pub fn candidates(limits: &wgpu::Limits, problem: &Problem) -> Vec<Self> {
        let (k, v) = (problem.key_dim as u32, problem.value_dim as u32);
        let v_first = problem.options.state_v_first;
        let max_wg = MAX_WORKGROUP
            .min(limits.max_compute_invocations_per_workgroup)
            .min(limits.max_compute_workgroup_size_x);
        let mut out = Vec::new();
        for v_block in [4u32, 8, 16, 32, 64, 128] {
            if v % v_block != 0 {
                continue;
            }
            for vec4s in (0..6).map(|i| 1u32 << i) {
                let Some(t) = Self::new(k, v_block, vec4s, v_first) else {
                    continue;
                };
                if t.workgroup() <= max_wg
                    && t.workgroup_bytes() <= limits.max_compute_workgroup_storage_size
                {
                    out.push(t);
                    if v_block >= 32 && matches!(vec4s, 8 | 16) {
                        out.extend([2, 4, 8].into_iter().filter_map(|s| t.walking(s)));
                    }
                    if v_block >= 32 && matches!(vec4s, 16 | 32) {
                        out.extend([2, 4, 8].into_iter().filter_map(|s| t.in_turn(s)));
                    }
                }
            }
        }
        out
    }

    /// The default tiling. Decode moves every state byte once in and once out with ~2 FLOPs
    /// per byte, so it is bound by memory bandwidth, and what matters is how many bytes each
    /// SM keeps in flight and how short a workgroup's life is beyond its one memory latency:
    /// - K-first, large state (≥ 16 MiB, e.g. B ≥ 64 at HV = 32, K = V = 128): 16 vec4s of
    ///   state per invocation in workgroups of 128 (V-block 64, 8 row lanes). Measured on the
    ///   H200 (2026-12-02, branch h-wgsldecode2, `gdn bench --ops decode --heads H/HV
    ///   --decode-batch B --dtype f32 --reps 50 --warmup 400 [--decode-tiles VxN]`, fresh
    ///   processes alternated, T = 1 kernel): 16/32 B = 64 64x16 0.0829–0.0839 ms (4 processes,
    ///   87 % of the copy), 64x32 0.0862–0.0877, 32x32 0.0894 / 0.0902, 64x32t2 0.0970 /
    ///   0.0967, 64x32t4 0.0984 / 0.0983; B = 128 64x16 0.1482, 64x32 0.1512; B = 256 64x16
    ///   0.2784, 64x32 0.2798–0.2820, 32x32 0.2909 / 0.2916; 16/64 B = 64 64x16 0.1481, 64x32
    ///   0.1502–0.1514; bf16 pool B = 64 64x16 0.0772, 64x32 0.0800. (64x32, the default
    ///   before, had won the 2026-12-01 sweep of the kernel with its token loop.)
    /// - V-first, large state: 16 vec4s in workgroups of 128 (not yet swept).
    /// - Small state (B = 1): 8 vec4s in workgroups of 128 — all of it is one wave of loads, and
    ///   more invocations with fewer registers each spread it over more SMs (the 2026-12-01 sweep, B = 1:
    ///   32x8 0.0150 ms, 64x8 0.0150, 16x8 0.0153, 64x16 0.0156, 64x32 0.0184).
    /// - K-first V-blocks of ≥ 32 columns (a warp reads 128-byte row segments, full cache
    ///   lines), V-first ≥ 4 invocations along a row (64 B); when the grid would have fewer
    ///   than ~256 workgroups, narrower V-blocks to spread over the SMs.
    pub fn choose(limits: &wgpu::Limits, problem: &Problem) -> Result<Self> {
        let total_vec4s =
            problem.num_sequences() * problem.heads_v * problem.key_dim * problem.value_dim / 4;
        // Large states of either layout: 16 vec4s in workgroups of 128.
        let (target, wg_target) = if total_vec4s >= 1 << 20 {
            (16.0, 128.0)
        } else {
            (8.0, 128.0)
        };
        let blocks = problem.num_sequences() * problem.heads_v;
        let score = |t: &Self| {
            let registers = (t.vec4s_per_thread as f64 / target).log2().abs();
            let size = (t.workgroup() as f64 / wg_target).log2().abs();
            let short_rows = match t.v_first {
                false if t.row_vecs < 8 => 0.5,
                true if t.row_vecs < 4 => 0.5,
                _ => 0.0,
            };
            let grid = (blocks * problem.value_dim / t.v_block as usize) as f64;
            let few = (256.0 / grid).log2().max(0.0);
            registers + 0.5 * size + short_rows + 0.5 * few
        };
        Self::candidates(limits, problem)
            .into_iter()
            .filter(|t| t.seqs_per_workgroup == 1)
            .min_by(|a, b| score(a).total_cmp(&score(b)))
            .ok_or_else(|| {
                Error::unsupported(
                    "device",
                    format!(
                        "no decode tiling for K = {} within the workgroup limits",
                        problem.key_dim
                    ),
                )
            })
    }

    /// The tiling's name: `VxN` for the workgroup kernel (V-block × vec4s per invocation;
    /// `VxNsS` walking S sequences per workgroup), `sgV` for the subgroup kernel (V columns
    /// per workgroup) and `sgVw` for its wide form (8 columns per team); what
    /// [`named`](Self::named) reads, `gdn bench --decode-tiles` takes and records show.
    pub fn name(&self) -> String {
        match self.kernel {
            StepKernel::Workgroup if self.seqs_per_workgroup > 1 => format!(
                "{}x{}{}{}",
                self.v_block,
                self.vec4s_per_thread,
                if self.prefetch_next { "s" } else { "t" },
                self.seqs_per_workgroup
            ),
            StepKernel::Workgroup => format!("{}x{}", self.v_block, self.vec4s_per_thread),
            StepKernel::Subgroup if self.col_groups() > 1 => format!("sg{}w", self.v_block),
            StepKernel::Subgroup => format!("sg{}", self.v_block),
            StepKernel::Column => format!("col{}", self.v_block),
        }
    }

    /// The tiling of `ctx` for `problem` called `name` (see [`name`](Self::name)), one of
    /// [`all_candidates`](Self::all_candidates); a typed error naming `what` (the flag or
    /// parameter) listing the names that exist otherwise.
    pub fn named(ctx: &Context, problem: &Problem, name: &str, what: &str) -> Result<Self> {
        let candidates = Self::all_candidates(ctx, problem);
        candidates
            .iter()
            .copied()
            .find(|t| t.name() == name.trim())
            .ok_or_else(|| {
                let names: Vec<String> = candidates.iter().map(|t| t.name()).collect();
                Error::value(
                    what,
                    format!(
                        "a decode tiling of this problem on this device: {}",
                        names.join(", ")
                    ),
                    name,
                )
            })
    }

    /// The pipeline's override constants (public so the shader tests specialize every tiling).
    pub fn pipeline_constants(&self, per_token_states: bool) -> Vec<(&'static str, f64)> {
        self.step_constants(per_token_states, false)
    }

    /// [`pipeline_constants`](Self::pipeline_constants) for a call whose sequences have at
    /// most one token each when `one_token` (the workgroup kernel then walks no token loop).
    pub fn step_constants(
        &self,
        per_token_states: bool,
        one_token: bool,
    ) -> Vec<(&'static str, f64)> {
        let bool_constant = |b: bool| if b { 1.0 } else { 0.0 };
        if self.kernel == StepKernel::Column {
            return vec![
                ("WG", self.workgroup() as f64),
                ("K_DIM", self.key_dim as f64),
                ("V_FIRST", bool_constant(self.v_first)),
                ("PER_TOKEN_STATES", bool_constant(per_token_states)),
                ("K_VEC4S", (self.key_dim / 4) as f64),
            ];
        }
        if self.kernel == StepKernel::Subgroup {
            return vec![
                ("WG", self.workgroup() as f64),
                ("K_DIM", self.key_dim as f64),
                ("K_GROUPS", self.key_dim.div_ceil(32) as f64),
                ("COL_GROUPS", self.col_groups() as f64),
                ("V_FIRST", bool_constant(self.v_first)),
                ("PER_TOKEN_STATES", bool_constant(per_token_states)),
            ];
        }
        vec![
            ("WG", self.workgroup() as f64),
            ("K_DIM", self.key_dim as f64),
            ("V_BLOCK", self.v_block as f64),
            ("VEC4S", self.vec4s_per_thread as f64),
            ("ROW_VECS", self.row_vecs as f64),
            ("LANES", self.lanes() as f64),
            ("STAGE", self.stage() as f64),
            ("V_FIRST", bool_constant(self.v_first)),
            ("PER_TOKEN_STATES", bool_constant(per_token_states)),
            ("SEQS", self.seqs_per_workgroup as f64),
            ("PREFETCH", bool_constant(self.prefetch_next)),
            ("K2_VEC4S", (2 * self.key_dim / 4) as f64),
            ("K_VEC4S", (self.key_dim / 4) as f64),
            ("PB_VEC4S", self.pb_vec4s() as f64),
            ("ONE_TOKEN", bool_constant(one_token)),
        ]
    }
}

/// A prepared decode step: record it once per step with [`DecodePlan::record`]. It binds the
/// given tensors; refill them (e.g. `queue.write_buffer` of the next token's q, k, v, g,
/// beta) between steps.
///
/// Calls and pools of any size (docs/windows.md, "Decode"): a pool larger than one storage
/// binding ([`Context::max_binding_bytes`]) or stored in several buffers is bound in pool
/// windows of whole slots, each inside one buffer; a call whose q, k, v, o, g, β or
/// per-token states are larger than a binding, stored in several buffers, or that has more
/// sequences than one uniform table holds, runs in token windows (runs of the packed token
/// axis, each inside one buffer of every tensor). The plan records one pass per token window
/// and pool window that holds a sequence of the call; a sequence cut by a token window
/// continues from the state its slot holds (a padding sequence through a carry slot of the
/// plan's own).
pub struct DecodePlan {
    /// Passes in recording order: token window by token window, each over every pool window
    /// (and the carry window, where the token window holds a cut sequence).
    passes: Vec<StepPass>,
    /// Token windows of the call (one when it fits a binding).
    token_windows: Vec<TokenWindow>,
    /// Pool windows: slots `first..first + len`, each inside one buffer.
    pool_windows: Vec<Range<usize>>,
    /// Per sequence: its slot in the carry tensor when a token window boundary cuts it.
    carry_slots: Vec<Option<u32>>,
    /// First token of every sequence (a cut sequence starts fresh in its first piece only).
    sequence_starts: Vec<usize>,
    /// (A_log, dt_bias) with `gate_in_kernel`.
    gate_params: Option<(wgpu::Buffer, wgpu::Buffer)>,
    heads_v: usize,
    pool_slots: usize,
    slots: Vec<StateSlot>,
    tiles: RecurrentStepTiles,
}

/// Which states a pass binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StatesWindow {
    /// Pool window `i` of [`DecodePlan::pool_windows`].
    Pool(usize),
    /// The plan's carry slots (padding sequences cut by a token window).
    Carry,
}

/// The pass over one token window and one window of states.
struct StepPass {
    pass: Prepared,
    tables: wgpu::Buffer,
    token_window: usize,
    states: StatesWindow,
    /// Whether a sequence of the current slots runs in this pass.
    active: bool,
}

/// The code of a sequence whose slot lies in another pool window: its workgroups walk no
/// tokens and write nothing (`SLOT_ELSEWHERE` in `shaders/decode/recurrent_step.wgsl`).
const SLOT_ELSEWHERE: i32 = i32::MIN;

/// The kernel's code for `slot` in the pool window `slots` (index `window`): slots are
/// relative to the window, padding runs in the first window only.
fn window_code(slot: StateSlot, window: usize, slots: &Range<usize>) -> i32 {
    let first = slots.start as u32;
    match slot.slot() {
        Some(s) if slots.contains(&(s as usize)) => match slot {
            StateSlot::Resume(s) => StateSlot::Resume(s - first).code(),
            _ => StateSlot::Fresh(s - first).code(),
        },
        None if window == 0 => slot.code(),
        _ => SLOT_ELSEWHERE,
    }
}

/// A token-indexed tensor of the call: its name and elements per token.
struct TokenTensor<'a> {
    name: &'static str,
    tensor: &'a GpuTensor,
    token_elems: usize,
}

impl DecodePlan {
    /// Validate and prepare a step over `problem`'s tokens with the default tiling.
    pub fn new(
        ctx: &Context,
        problem: &Problem,
        inputs: &ForwardInputs<&GpuTensor>,
        pool: &StatePool,
        slots: &[StateSlot],
        outputs: &DecodeOutputs<'_>,
    ) -> Result<Self> {
        let tiles = RecurrentStepTiles::choose_for(ctx, problem)?;
        Self::with_tiles(ctx, problem, inputs, pool, slots, outputs, tiles)
    }

    /// [`DecodePlan::new`] with a given tiling (one of [`RecurrentStepTiles::all_candidates`]).
    pub fn with_tiles(
        ctx: &Context,
        problem: &Problem,
        inputs: &ForwardInputs<&GpuTensor>,
        pool: &StatePool,
        slots: &[StateSlot],
        outputs: &DecodeOutputs<'_>,
        tiles: RecurrentStepTiles,
    ) -> Result<Self> {
        ctx.check()?;
        super::check_decode(ctx, problem, inputs, pool, slots, outputs)?;
        if !RecurrentStepTiles::all_candidates(ctx, problem).contains(&tiles) {
            return Err(Error::value(
                "tiles",
                "a tiling from RecurrentStepTiles::all_candidates for this problem and device",
                format!("{tiles:?}"),
            ));
        }
        if tiles.kernel == StepKernel::Column
            && (pool.dtype() != DType::F32
                || !Pass::ColumnStep.storage_dtypes().contains(&inputs.q.dtype))
        {
            return Err(Error::value(
                "tiles",
                "the column kernel with an f32 pool and f32 or f16 q, k, v, o",
                format!(
                    "{} with a {} pool and {} storage",
                    tiles.name(),
                    pool.dtype(),
                    inputs.q.dtype
                ),
            ));
        }
        let pool_windows = pool_windows(ctx, pool)?;
        let token_windows = token_windows(ctx, problem, inputs, outputs)?;

        // Every buffer, the pipeline and the bind group are made here, inside error scopes,
        // so an allocation or validation failure is an error from `new` and `record` only
        // ever records a pass the device accepted.
        ctx.scoped("recurrent_step plan", None, || {
            Self::build(
                ctx,
                problem,
                inputs,
                pool,
                slots,
                outputs,
                tiles,
                pool_windows,
                token_windows,
            )
        })?
    }

    #[allow(clippy::too_many_arguments)]
    fn build(
        ctx: &Context,
        problem: &Problem,
        inputs: &ForwardInputs<&GpuTensor>,
        pool: &StatePool,
        slots: &[StateSlot],
        outputs: &DecodeOutputs<'_>,
        tiles: RecurrentStepTiles,
        pool_windows: Vec<Range<usize>>,
        token_windows: Vec<TokenWindow>,
    ) -> Result<Self> {
        let hv = problem.heads_v;
        let sequences = problem.sequences();
        let one_token_window = token_windows.len() == 1;

        // A sequence in more than one token window carries its state through its slot; a
        // padding one has none, so it gets a carry slot of the plan's own.
        let mut carry_slots = vec![None; sequences.len()];
        let mut cuts = 0u32;
        for w in &token_windows {
            for (i, piece) in w.pieces.iter().enumerate() {
                let n = w.first_seq + i;
                if piece.end < sequences[n].end && carry_slots[n].is_none() {
                    carry_slots[n] = Some(cuts);
                    cuts += 1;
                }
            }
        }
        let carry = (cuts > 0)
            .then(|| {
                let mut shape = pool.tensor().shape.clone();
                shape[0] = cuts as usize;
                GpuTensor::scratch(ctx, "decode carry states", &shape, pool.dtype())
            })
            .transpose()?;

        let gate_params = match (inputs.a_log, inputs.dt_bias) {
            (Some(a), Some(d)) => Some((a.buffer.clone(), d.buffer.clone())),
            _ => None,
        };
        // The binding exists whether or not the kernel writes it; 16 bytes = one vec4.
        let no_token_states = GpuTensor::from_buffer(
            ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("no per-token states"),
                size: 16,
                usage: wgpu::BufferUsages::STORAGE,
                mapped_at_creation: false,
            }),
            &[4],
            crate::DType::F32,
        );
        // T = 1 decode: the kernel without its token loop (faster on the H200: BENCHMARKS.md).
        let one_token = sequences.iter().all(|s| s.len() <= 1);
        let constants = tiles.step_constants(outputs.per_token_states.is_some(), one_token);
        let source = source(tiles.pass(pool.dtype()), inputs.q.dtype)?;

        // The pool's windows as views (the whole tensor when it is one window).
        let slot_elems = pool.tensor().len() / pool.slots();
        let pool_views = pool_windows
            .iter()
            .map(|r| {
                if pool_windows.len() == 1 {
                    return Ok(pool.tensor().clone());
                }
                let mut shape = pool.tensor().shape.clone();
                shape[0] = r.len();
                pool.tensor().view("pool", r.start * slot_elems, &shape)
            })
            .collect::<Result<Vec<_>>>()?;

        let mut plan = DecodePlan {
            passes: Vec::new(),
            token_windows,
            pool_windows,
            carry_slots,
            sequence_starts: sequences.iter().map(|s| s.start).collect(),
            gate_params,
            heads_v: hv,
            pool_slots: pool.slots(),
            slots: slots.to_vec(),
            tiles,
        };
        for (index, w) in plan.token_windows.iter().enumerate() {
            // The window's token-indexed tensors, bound from its base (whole when the call
            // is one window).
            let bound = |t: &GpuTensor, name: &str| -> Result<GpuTensor> {
                if one_token_window {
                    return Ok(t.clone());
                }
                // Bytes are what a binding sees: the view is [tokens, elements per token].
                let per_token = t.len() / problem.total_tokens();
                t.view(name, w.base * per_token, &[w.tokens, per_token])
            };
            let q = bound(inputs.q, "q")?;
            let k = bound(inputs.k, "k")?;
            let v = bound(inputs.v, "v")?;
            let g = bound(inputs.g, "g")?;
            let beta = bound(inputs.beta, "beta")?;
            let o = bound(outputs.o, "o")?;
            let token_states = match outputs.per_token_states {
                Some(t) => bound(t, "per_token_states")?,
                None => no_token_states.clone(),
            };
            // Token starts relative to the base, then slot codes (per pass), then A_log and
            // dt_bias (copied in by `record`).
            let n = w.seqs();
            let mut words = vec![0u32; TABLE_WORDS];
            let starts = w
                .pieces
                .iter()
                .map(|p| p.start)
                .chain([w.pieces.last().map_or(w.base, |p| p.end)]);
            for (word, start) in words.iter_mut().zip(starts) {
                *word = (start.max(w.base) - w.base) as u32;
            }
            let mut states_windows: Vec<StatesWindow> = (0..plan.pool_windows.len())
                .map(StatesWindow::Pool)
                .collect();
            if (0..n).any(|i| plan.carry_slots[w.first_seq + i].is_some()) {
                states_windows.push(StatesWindow::Carry);
            }
            for states in states_windows {
                let (view, rows) = match states {
                    StatesWindow::Pool(p) => (&pool_views[p], plan.pool_windows[p].len()),
                    StatesWindow::Carry => {
                        let c = carry
                            .as_ref()
                            .expect("a carry tensor where a sequence is cut");
                        (c, c.shape[0])
                    }
                };
                let mut params = Params::for_problem(problem, 0, n);
                params.rows = rows as u32;
                let params = params.upload(ctx);
                for (i, word) in words[n + 1..2 * n + 1].iter_mut().enumerate() {
                    *word = plan.code(w.first_seq + i, index, states) as u32;
                }
                let tables = init_buffer(
                    ctx,
                    "decode tables",
                    bytemuck::cast_slice(&words),
                    wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                );
                let pass = Launch {
                    name: tiles.entry(),
                    source,
                    entry: tiles.entry(),
                    constants: &constants,
                    bindings: Bindings::Ordered(&[
                        &params,
                        &tables,
                        &q,
                        &k,
                        &v,
                        &g,
                        &beta,
                        view,
                        &o,
                        &token_states,
                    ]),
                    grid: Grid([
                        (tiles.v_blocks(problem.value_dim), "V-blocks"),
                        (hv, "heads_v (HV)"),
                        (
                            n.div_ceil(tiles.seqs_per_workgroup as usize),
                            "sequences (slots)",
                        ),
                    ]),
                }
                .prepare(ctx)?;
                plan.passes.push(StepPass {
                    pass,
                    tables,
                    token_window: index,
                    states,
                    active: false,
                });
            }
        }
        plan.mark_active();
        Ok(plan)
    }

    /// The kernel's code for sequence `n` in the pass over token window `window` and
    /// `states`: a cut sequence starts fresh (if at all) in its first piece only and resumes
    /// after; a cut padding sequence runs in the carry slots.
    fn code(&self, n: usize, window: usize, states: StatesWindow) -> i32 {
        let w = &self.token_windows[window];
        let first_piece = w.pieces[n - w.first_seq].start == self.sequence_starts[n];
        let (in_carry, slot) = match (self.slots[n], self.carry_slots[n]) {
            (StateSlot::Padding, Some(c)) if first_piece => (true, StateSlot::Fresh(c)),
            (StateSlot::Padding, Some(c)) => (true, StateSlot::Resume(c)),
            (StateSlot::Fresh(s), _) if !first_piece => (false, StateSlot::Resume(s)),
            (s, _) => (false, s),
        };
        match states {
            StatesWindow::Carry if in_carry => slot.code(),
            StatesWindow::Pool(p) if !in_carry => window_code(slot, p, &self.pool_windows[p]),
            _ => SLOT_ELSEWHERE,
        }
    }

    /// The slot codes of a pass's sequences.
    fn codes(&self, pass: &StepPass) -> Vec<i32> {
        let w = &self.token_windows[pass.token_window];
        (0..w.seqs())
            .map(|i| self.code(w.first_seq + i, pass.token_window, pass.states))
            .collect()
    }

    /// Which passes hold a sequence of the current slots.
    fn mark_active(&mut self) {
        let active: Vec<bool> = self
            .passes
            .iter()
            .map(|p| self.codes(p).iter().any(|&c| c != SLOT_ELSEWHERE))
            .collect();
        for (p, a) in self.passes.iter_mut().zip(active) {
            p.active = a;
        }
    }

    /// Use other slots from the next submission on (`queue.write_buffer`: it lands before the
    /// next `queue.submit`'s commands, so steps with different slots need separate submits
    /// or separate plans). Validated like the plan; on error nothing changes.
    pub fn set_slots(&mut self, ctx: &Context, slots: &[StateSlot]) -> Result<()> {
        ctx.check_lost_noticed()?;
        check_slots(slots, self.slots.len(), self.pool_slots)?;
        if slots != self.slots {
            self.slots = slots.to_vec();
            for pass in &self.passes {
                let codes = self.codes(pass);
                ctx.queue.write_buffer(
                    &pass.tables,
                    4 * (codes.len() as u64 + 1),
                    bytemuck::cast_slice(&codes),
                );
            }
            self.mark_active();
        }
        Ok(())
    }

    /// The slots the plan's steps use.
    pub fn slots(&self) -> &[StateSlot] {
        &self.slots
    }

    /// The tile sizes the plan's pipeline is built with.
    pub fn tiles(&self) -> RecurrentStepTiles {
        self.tiles
    }

    /// Record one step: one compute pass per token window and pool window that holds a
    /// sequence of the call (one when everything fits a binding), plus, with
    /// `gate_in_kernel`, two small copies of A_log and dt_bias into each pass's uniform
    /// tables, since a ninth storage binding would exceed WebGPU's default of 8. Recording
    /// cannot fail: everything was checked and made by [`DecodePlan::new`]. A device lost
    /// since shows at the caller's submit and at the context's next call
    /// ([`Context::check`], [`Context::is_lost`]).
    pub fn record(&self, encoder: &mut wgpu::CommandEncoder) {
        for p in self.passes.iter().filter(|p| p.active) {
            if let Some((a_log, dt_bias)) = &self.gate_params {
                let word = 2 * self.token_windows[p.token_window].seqs() as u64 + 1;
                let bytes = 4 * self.heads_v as u64;
                encoder.copy_buffer_to_buffer(a_log, 0, &p.tables, 4 * word, bytes);
                encoder.copy_buffer_to_buffer(dt_bias, 0, &p.tables, 4 * word + bytes, bytes);
            }
            p.pass.record(encoder);
        }
    }

    /// Pool windows the plan binds: 1 unless the pool is larger than one storage binding or
    /// stored in several buffers.
    pub fn pool_windows(&self) -> usize {
        self.pool_windows.len()
    }

    /// Token windows the plan runs: 1 unless the call's token-indexed tensors are larger
    /// than one binding, stored in several buffers, or it has more sequences than one
    /// uniform table holds ([`max_sequences`]).
    pub fn token_windows(&self) -> usize {
        self.token_windows.len()
    }

    /// Compute passes one step records with the current slots.
    pub fn active_passes(&self) -> usize {
        self.passes.iter().filter(|p| p.active).count()
    }
}

/// The pool's windows: runs of whole slots inside one buffer, each within one binding.
fn pool_windows(ctx: &Context, pool: &StatePool) -> Result<Vec<Range<usize>>> {
    let slot_bytes = pool.slot_bytes();
    let limit = ctx.max_binding_bytes();
    let per_window = (limit / slot_bytes.max(1)) as usize;
    if per_window == 0 {
        return Err(Error::TooLarge {
            name: "pool slot".into(),
            bytes: slot_bytes,
            limit_name: "max_storage_buffer_binding_size",
            limit,
        });
    }
    let per_buffer = pool.slots_per_buffer();
    let align = ctx.limits().min_storage_buffer_offset_alignment as u64;
    if per_buffer > per_window && !slot_bytes.is_multiple_of(align) {
        return Err(Error::unsupported(
            "pool",
            format!(
                "windows over slots of {slot_bytes} bytes, not a multiple of the device's \
                 min_storage_buffer_offset_alignment ({align})"
            ),
        ));
    }
    let mut windows = Vec::new();
    for buffer_first in (0..pool.slots()).step_by(per_buffer) {
        let buffer_end = (buffer_first + per_buffer).min(pool.slots());
        for first in (buffer_first..buffer_end).step_by(per_window) {
            windows.push(first..(first + per_window).min(buffer_end));
        }
    }
    Ok(windows)
}

/// The call's token windows ([`plan_decode`]): the whole call when its token-indexed tensors
/// each fit one binding and one buffer and its sequences one uniform table.
fn token_windows(
    ctx: &Context,
    problem: &Problem,
    inputs: &ForwardInputs<&GpuTensor>,
    outputs: &DecodeOutputs<'_>,
) -> Result<Vec<TokenWindow>> {
    let (hv, total) = (problem.heads_v, problem.total_tokens());
    let qk = problem.heads_qk * problem.key_dim;
    let mut tensors = vec![
        TokenTensor {
            name: "q",
            tensor: inputs.q,
            token_elems: qk,
        },
        TokenTensor {
            name: "k",
            tensor: inputs.k,
            token_elems: qk,
        },
        TokenTensor {
            name: "v",
            tensor: inputs.v,
            token_elems: hv * problem.value_dim,
        },
        TokenTensor {
            name: "g",
            tensor: inputs.g,
            token_elems: hv,
        },
        TokenTensor {
            name: "beta",
            tensor: inputs.beta,
            token_elems: hv,
        },
        TokenTensor {
            name: "o",
            tensor: outputs.o,
            token_elems: hv * problem.value_dim,
        },
    ];
    if let Some(t) = outputs.per_token_states {
        let token_elems = hv * problem.key_dim * problem.value_dim;
        tensors.push(TokenTensor {
            name: "per_token_states",
            tensor: t,
            token_elems,
        });
    }
    let limit = ctx.max_binding_bytes();
    let most_sequences = max_sequences(hv);
    let fits = tensors
        .iter()
        .all(|t| t.tensor.rows_per_buffer().is_none() && t.tensor.binding_bytes() <= limit);
    if total == 0 || (fits && problem.num_sequences() <= most_sequences) {
        return Ok(vec![TokenWindow::whole(problem)]);
    }

    let align = ctx.limits().min_storage_buffer_offset_alignment as u64;
    let (mut granule, mut max_tokens, mut part_tokens) = (1usize, usize::MAX, None::<usize>);
    for t in &tensors {
        let token_bytes = (t.token_elems * t.tensor.dtype.size()) as u64;
        if !token_bytes.is_multiple_of(4) {
            return Err(Error::unsupported(
                t.name,
                format!("token windows over tokens of {token_bytes} bytes (not whole words)"),
            ));
        }
        granule = granule.max((align / gcd(align, token_bytes)) as usize);
        max_tokens = max_tokens.min((limit / token_bytes) as usize);
        if let Some(rows) = t.tensor.rows_per_buffer() {
            let rows_per_token = t.tensor.shape.iter().take(2).product::<usize>() / total;
            if !rows.is_multiple_of(rows_per_token) {
                return Err(Error::unsupported(
                    t.name,
                    format!(
                        "a tensor of several buffers whose buffers hold whole tokens ({rows} \
                         rows of {rows_per_token} per token per buffer: per-token states of \
                         several buffers need HV a power of two)"
                    ),
                ));
            }
            let tokens = rows / rows_per_token;
            part_tokens = Some(match part_tokens {
                Some(p) if p.max(tokens) % p.min(tokens) != 0 => {
                    return Err(Error::unsupported(
                        t.name,
                        format!(
                            "buffer boundaries every {tokens} tokens, which do not nest with \
                             another tensor's every {p}"
                        ),
                    ));
                }
                Some(p) => p.min(tokens),
                None => tokens,
            });
        }
    }
    if max_tokens < granule {
        // A window's base must keep every binding's offset aligned, so it holds at least
        // `granule` tokens of every tensor.
        let (worst, token_bytes) = tensors
            .iter()
            .map(|t| (t.name, (t.token_elems * t.tensor.dtype.size()) as u64))
            .max_by_key(|&(_, b)| b)
            .unwrap_or(("q", 0));
        return Err(Error::TooLarge {
            name: format!("{worst} of {granule} tokens (the least aligned token window)"),
            bytes: granule as u64 * token_bytes,
            limit_name: "max_storage_buffer_binding_size",
            limit,
        });
    }
    if let Some(p) = part_tokens
        && !p.is_multiple_of(granule)
    {
        return Err(Error::unsupported(
            "decode",
            format!(
                "buffers of {p} tokens, fewer than the {granule} tokens that keep a window's \
                 bindings aligned"
            ),
        ));
    }
    let sequences = problem.sequences();
    Ok(plan_decode(
        &sequences,
        max_tokens / granule * granule,
        granule,
        part_tokens,
        most_sequences,
    ))
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}
