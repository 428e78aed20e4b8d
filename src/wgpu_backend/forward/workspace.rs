//! The forward's scratch, kept between calls. A forward without a workspace allocates its
//! scratch per call — at 16/64 heads × 32768 tokens on the coop path that is ~2.5 GB of
//! buffers, whose creation dominated the host time of a call (57 ms measured by `gdn bench`
//! on the H200). Serving loops and benchmarks make one workspace per problem shape and reuse
//! it.
//!
//! A workspace also plans the forward's token windows (`wgpu_backend::windows`): when a
//! tensor or the scratch of the whole problem would exceed one storage binding, the forward
//! runs window after window, and the scratch is sized for the largest window.

use crate::error::{Error, Result};
use crate::problem::{CHUNK, Problem};
use crate::tensor::DType;
use crate::wgpu_backend::config::{SegmentChoice, SegmentWindow};
use crate::wgpu_backend::params::{Params, upload_u32};
use crate::wgpu_backend::path::ComputePath;
use crate::wgpu_backend::tensor::token_part_rows;
use crate::wgpu_backend::tuning::COOP_V_BLOCK;
use crate::wgpu_backend::windows::{self, TokenWindow, WindowCosts};
use crate::wgpu_backend::{Context, GpuTensor};

/// Segments only where a sequence is longer than one (nothing to parallelize else).
fn effective_segments(problem: &Problem, segment_chunks: Option<usize>) -> Option<usize> {
    let longest = problem
        .sequences()
        .iter()
        .map(|s| s.len())
        .max()
        .unwrap_or(0);
    segment_chunks.filter(|&c| longest > c * CHUNK)
}

/// The token windows a forward workspace on `path` plans (with the context's segments, as
/// [`ForwardWorkspace::with_window_costs`] does), its bindings bounded by the context's
/// binding limit and by `extra` (whose `max_rows` may bound the chunks per window further):
/// how the backward's plan (`backward::BackwardPlan`) cuts the windows `forward_saved` runs.
pub(crate) fn planned_windows(
    ctx: &Context,
    problem: &Problem,
    dtype: DType,
    path: ComputePath,
    extra: &WindowCosts,
) -> Result<Vec<TokenWindow>> {
    let segment_chunks = effective_segments(problem, segment_chunks_for(ctx, problem, path));
    plan_windows(ctx, problem, dtype, path, segment_chunks, Some(extra))
}

fn plan_windows(
    ctx: &Context,
    problem: &Problem,
    dtype: DType,
    path: ComputePath,
    segment_chunks: Option<usize>,
    extra: Option<&WindowCosts>,
) -> Result<Vec<TokenWindow>> {
    let mut costs = window_costs(problem, dtype, path, segment_chunks, split_scan(ctx, path));
    if let Some(extra) = extra {
        costs = costs.union(extra);
    }
    costs.max_rows = costs
        .max_rows
        .min(ctx.limits().max_compute_workgroups_per_dimension as usize);
    costs.part_tokens = token_part_rows(ctx, problem, dtype)?;
    windows::plan(
        problem,
        &costs,
        ctx.max_binding_bytes(),
        ctx.limits().min_storage_buffer_offset_alignment as u64,
    )
}

/// The scan's scratch, per compute path.
#[derive(Debug)]
pub(crate) enum ScanScratch {
    /// `[B·T, HV, 128]` f32: Γ⊙A⊙β | Γ⊙QKᵀ rows for the scalar and f16-math scans.
    Scalar { gated: GpuTensor },
    /// The coop scan's f16 operands, each with one chunk of zero padding rows.
    Coop {
        gated16: GpuTensor,
        k16: GpuTensor,
        qg16: GpuTensor,
        /// The split forward's (`GDN_SCAN_SPLIT=on`): what the chain leaves for the output pass.
        split: Option<Box<SplitScratch>>,
    },
}

/// The split coop forward's chain outputs (f16), sized for the largest window.
#[derive(Debug, Clone)]
pub(crate) struct SplitScratch {
    /// `[chunks, HV, K, V]`: each chunk's start state.
    pub states16: GpuTensor,
    /// `[tokens + 64, HV, V]`: V' (one chunk of padding rows, as the other f16 operands).
    pub vprime16: GpuTensor,
}

/// Whether a forward on `path` runs the split coop scan (`GDN_SCAN_SPLIT`; devices whose
/// workgroup memory fits its chain).
pub(crate) fn split_scan(ctx: &Context, path: ComputePath) -> bool {
    path == ComputePath::CoopMatrix
        && ctx.config().scan_split
        && ctx.tuning.workgroup_bytes >= super::STATE_CHAIN_COOP_BYTES
}

/// Per row of a segment table (start, length, slot): the chunk ordinal of its first chunk,
/// chunks counted in table order (the chunk table's order: segments cut sequences at chunk
/// boundaries).
fn chunk_bases(segment_table: &[u32]) -> Vec<u32> {
    let mut next = 0u32;
    segment_table
        .chunks(3)
        .map(|row| {
            let base = next;
            next += row[1].div_ceil(CHUNK as u32);
            base
        })
        .collect()
}

/// Intra-device sequence parallelism: every sequence longer than `chunks` chunks is cut into
/// segments of that many chunks, scanned all at once from zero (end states) and from the
/// identity with v = 0 (transitions), combined in sequence order (`segment_combine`), then
/// scanned again from the right start states. Exact (the state update is affine in the
/// state), three scans' work instead of one, but parallel over segments. In a windowed
/// forward each window's pieces are cut into segments; these buffers are sized for the
/// largest window.
#[derive(Debug)]
pub(crate) struct Segmented {
    pub chunks: usize,
    /// The problem with K-first states (the internal slots), and its transition variant
    /// (value_dim = K).
    pub scan_problem: Problem,
    pub trans_problem: Problem,
    /// `[S, HV, K, K]`, `[S, HV, K, V]`, `[S, HV, K, V]` f32.
    pub trans: GpuTensor,
    /// `[S, HV, K, K]` f32 identities, written once: copied over `trans` before each
    /// transition scan (a copy, not a compute pass, so that no barrier on compute work sits
    /// between the end-state scan and the transition scan and the GPU may overlap them).
    pub identity: GpuTensor,
    pub ends: GpuTensor,
    pub starts: GpuTensor,
    /// `[tokens, HV, K]` zeros (never written) and the transition scan's discarded o.
    pub zero_v: GpuTensor,
    pub trans_o: GpuTensor,
    /// Windowed forwards: `[sequences, HV, ..]` f32, a copy of the window's states before
    /// the combine (its start states; the combine writes the states themselves).
    pub carry: Option<GpuTensor>,
}

/// A window's segment tables (sequence parallelism).
#[derive(Debug)]
pub(crate) struct SegmentTables {
    pub segments: wgpu::Buffer,
    /// Per segment: the ordinal of its first chunk (the split scan's chunk-state rows).
    pub chunk_base: wgpu::Buffer,
    pub num_segments: usize,
    pub seq_segments: wgpu::Buffer,
    pub scan_params: wgpu::Buffer,
    pub trans_params: wgpu::Buffer,
    /// The gate-driven window's: `[S]` last-of-its-sequence flags, its parameter block
    /// (`rows` = S · HV), and what `segment_window` writes: the end-state and transition
    /// scans' rows per (segment, v-head) and the warm-up lengths (read back by
    /// [`ForwardWorkspace::segment_paths`]).
    pub last_segment: wgpu::Buffer,
    pub window_params: wgpu::Buffer,
    pub end_rows: wgpu::Buffer,
    pub trans_rows: wgpu::Buffer,
    pub warmup: wgpu::Buffer,
}

/// Which path the (segment, v-head) pairs of a segmented forward took (every segment of
/// every token window, times the v-heads; `windowed + exact` is all of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SegmentPaths {
    /// Pairs on the gate-driven window: their gates decayed below the threshold within the
    /// maximum warm-up, so the next segment starts from the end state of a warm-up from
    /// zero over their last chunks and their transition is never scanned (a sequence's last
    /// segment then skips both scans; the final scan gives its final state).
    pub windowed: usize,
    /// Pairs on the exact path: the window off, or gates that did not decay below the
    /// threshold within the maximum warm-up (g = 0 heads always).
    pub exact: usize,
    /// The longest warm-up any windowed pair ran, in chunks (0 when none did).
    pub longest_warmup_chunks: usize,
}

/// One window of the forward: its tokens and sequences, parameter block (whose
/// `total_tokens` is the window's bound tokens), chunk and segment tables.
#[derive(Debug)]
pub(crate) struct WindowTables {
    pub window: TokenWindow,
    pub params: wgpu::Buffer,
    pub chunks: wgpu::Buffer,
    pub segments: wgpu::Buffer,
    /// Per segment: the ordinal of its first chunk (the split scan's chunk-state rows).
    pub chunk_base: wgpu::Buffer,
    pub num_chunks: usize,
    pub num_segments: usize,
    pub segmented: Option<SegmentTables>,
    /// Where a windowed `forward_saved` checkpoints the start state of the window's first
    /// piece when that piece continues a sequence (kept for the backward): the continuing
    /// windows before it. `None` when every piece starts its sequence (from h0).
    pub checkpoint: Option<usize>,
}

/// Every buffer a forward writes besides its outputs, for one problem and storage dtype on
/// one compute path. [`crate::wgpu_backend::forward_into_workspace`] records into it; the
/// [`crate::wgpu_backend::Intermediates`] it returns live here until the workspace's next use.
#[derive(Debug)]
pub struct ForwardWorkspace {
    pub(crate) problem: Problem,
    pub(crate) dtype: DType,
    pub(crate) path: ComputePath,
    /// The token windows, in order (one: the whole problem).
    pub(crate) windows: Vec<WindowTables>,
    /// A_log then dt_bias (`gate_in_kernel`), `[2 HV]` f32.
    pub(crate) gate_params: wgpu::Buffer,
    pub(crate) q_normed: Option<GpuTensor>,
    pub(crate) k_normed: Option<GpuTensor>,
    pub(crate) gate_beta: GpuTensor,
    pub(crate) a: GpuTensor,
    pub(crate) scan: ScanScratch,
    pub(crate) segmented: Option<Segmented>,
    /// The gate-driven window its segmented forwards take (`None`: exact only).
    pub(crate) segment_window: Option<SegmentWindow>,
    /// Whether the last forward recorded through it ran the window (what
    /// [`Self::segment_paths`] reads back).
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    pub(crate) last_windowed: std::sync::atomic::AtomicBool,
}

impl ForwardWorkspace {
    /// A workspace for `problem` with q, k, v stored as `dtype`, on the path the context
    /// would choose for it.
    ///
    /// Sequence parallelism (see [`Self::with_segments`]) as [`segment_chunks_for`] chooses:
    /// the context's `Config::segments` (`GDN_SEGMENT_CHUNKS`), automatic by default.
    pub fn new(ctx: &Context, problem: &Problem, dtype: DType) -> Result<Self> {
        let path = ctx.forward_path(problem, dtype)?.path;
        Self::with_path_and_config(ctx, problem, dtype, path)
    }

    /// [`Self::with_path`], with the segments [`segment_chunks_for`] chooses (what a forward
    /// without a workspace uses).
    pub(crate) fn with_path_and_config(
        ctx: &Context,
        problem: &Problem,
        dtype: DType,
        path: ComputePath,
    ) -> Result<Self> {
        let segments = segment_chunks_for(ctx, problem, path);
        Self::build(ctx, problem, dtype, path, segments, None)
    }

    /// [`Self::with_path_and_config`] whose windows also bound `extra` (the backward's costs,
    /// so a forward for training cuts the windows its backward will walk).
    pub(crate) fn with_window_costs(
        ctx: &Context,
        problem: &Problem,
        dtype: DType,
        path: ComputePath,
        extra: &WindowCosts,
    ) -> Result<Self> {
        Self::build(
            ctx,
            problem,
            dtype,
            path,
            segment_chunks_for(ctx, problem, path),
            Some(extra),
        )
    }

    /// The token windows, in order.
    pub(crate) fn token_windows(&self) -> Vec<TokenWindow> {
        self.windows.iter().map(|w| w.window.clone()).collect()
    }

    /// A workspace on `path` whose forward cuts every sequence longer than `segment_chunks`
    /// chunks into segments of that many chunks, scanned in parallel (intra-device sequence
    /// parallelism, exact: see `shaders/forward/segment_combine.wgsl`). It costs three scans'
    /// work instead of one and pays off only when sequences × v-heads leave the GPU idle.
    pub fn with_segments(
        ctx: &Context,
        problem: &Problem,
        dtype: DType,
        path: ComputePath,
        segment_chunks: usize,
    ) -> Result<Self> {
        if segment_chunks == 0 {
            return Err(Error::Value {
                name: "segment_chunks".into(),
                expected: "at least 1".into(),
                got: "0".into(),
            });
        }
        Self::build(ctx, problem, dtype, path, Some(segment_chunks), None)
    }

    /// Chunks per segment when the forward runs sequence-parallel.
    pub fn segment_chunks(&self) -> Option<usize> {
        self.segmented.as_ref().map(|s| s.chunks)
    }

    /// Token windows the forward runs in: 1 unless a tensor or the scratch of the whole
    /// problem would exceed one storage binding ([`Context::max_binding_bytes`]).
    pub fn windows(&self) -> usize {
        self.windows.len()
    }

    /// The tokens of the packed axis each window computes, in order: from its first chunk to
    /// the end of its last (empty sequences take no tokens).
    pub fn window_tokens(&self) -> Vec<std::ops::Range<usize>> {
        self.windows
            .iter()
            .map(|w| {
                let p = &w.window.pieces;
                let start = p
                    .iter()
                    .find(|r| !r.is_empty())
                    .map_or(w.window.base, |r| r.start);
                start..w.window.base + w.window.tokens
            })
            .collect()
    }

    /// A workspace on a given compute path (which the device and problem must support).
    pub fn with_path(
        ctx: &Context,
        problem: &Problem,
        dtype: DType,
        path: ComputePath,
    ) -> Result<Self> {
        Self::build(ctx, problem, dtype, path, None, None)
    }

    fn build(
        ctx: &Context,
        problem: &Problem,
        dtype: DType,
        path: ComputePath,
        segment_chunks: Option<usize>,
        extra: Option<&WindowCosts>,
    ) -> Result<Self> {
        // Validates the path for this device and problem (typed error otherwise).
        ctx.path_support().choose(problem, dtype, Some(path))?;
        let (hv, h, k) = (problem.heads_v, problem.heads_qk, problem.key_dim);
        let segment_chunks = effective_segments(problem, segment_chunks);
        let windows = plan_windows(ctx, problem, dtype, path, segment_chunks, extra)?;
        let tokens = windows.iter().map(|w| w.tokens).max().unwrap_or(0);
        let sequences = problem.sequences();
        let mut checkpoints = 0;
        let tables: Vec<WindowTables> = windows
            .into_iter()
            .map(|w| {
                let checkpoint = w.continues(&sequences).then(|| {
                    checkpoints += 1;
                    checkpoints - 1
                });
                WindowTables::new(ctx, problem, w, segment_chunks, checkpoint)
            })
            .collect();

        // The normalized copies keep q's own row shape ([.., H, K]): the backward reads them
        // as q.
        let qk_shape = if tables.len() == 1 {
            problem.qk_shape().to_vec()
        } else {
            vec![tokens, h, k]
        };
        let (q_normed, k_normed) = if problem.options.l2norm_qk {
            (
                Some(GpuTensor::scratch(ctx, "q_normed", &qk_shape, dtype)?),
                Some(GpuTensor::scratch(ctx, "k_normed", &qk_shape, dtype)?),
            )
        } else {
            (None, None)
        };
        let scan = match path {
            ComputePath::Scalar | ComputePath::F16Math => ScanScratch::Scalar {
                gated: GpuTensor::scratch(ctx, "gated", &[tokens, hv, 2 * CHUNK], DType::F32)?,
            },
            ComputePath::CoopMatrix => ScanScratch::Coop {
                gated16: GpuTensor::scratch(
                    ctx,
                    "gated16",
                    &[tokens + CHUNK, hv, 2 * CHUNK],
                    DType::F16,
                )?,
                k16: GpuTensor::scratch(ctx, "k16", &[tokens + CHUNK, h, k], DType::F16)?,
                qg16: GpuTensor::scratch(ctx, "qg16", &[tokens + CHUNK, hv, k], DType::F16)?,
                split: if split_scan(ctx, path) {
                    let chunks = tables.iter().map(|w| w.num_chunks).max().unwrap_or(0);
                    let v = problem.value_dim;
                    Some(Box::new(SplitScratch {
                        states16: GpuTensor::scratch(
                            ctx,
                            "chunk states16",
                            &[chunks.max(1), hv, k, v],
                            DType::F16,
                        )?,
                        vprime16: GpuTensor::scratch(
                            ctx,
                            "vprime16",
                            &[tokens + CHUNK, hv, v],
                            DType::F16,
                        )?,
                    }))
                } else {
                    None
                },
            },
        };
        let segmented = match segment_chunks {
            Some(chunks) => Some(Segmented::new(ctx, problem, dtype, chunks, &tables)?),
            None => None,
        };
        Ok(ForwardWorkspace {
            problem: problem.clone(),
            dtype,
            path,
            windows: tables,
            gate_params: ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("gate_params"),
                size: (8 * hv) as u64,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            q_normed,
            k_normed,
            gate_beta: GpuTensor::scratch(ctx, "gate_beta", &[tokens, hv, 2], DType::F32)?,
            a: GpuTensor::scratch(ctx, "wy_inverse", &[tokens, hv, CHUNK], DType::F32)?,
            scan,
            segmented,
            segment_window: ctx.config().segment_window,
            last_windowed: false.into(),
        })
    }

    /// The gate-driven window of its segmented forwards (`None`: exact only), from the
    /// context's `Config::segment_window` (`GDN_SEGMENT_WINDOW`) when it was made.
    pub fn segment_window(&self) -> Option<SegmentWindow> {
        self.segment_window
    }

    /// Set the gate-driven window of its segmented forwards (`None`: exact only;
    /// docs/sequence-parallelism.md). Without segments it changes nothing.
    pub fn set_segment_window(&mut self, window: Option<SegmentWindow>) {
        self.segment_window = window;
    }

    /// How the last forward recorded through this workspace got its segment boundaries
    /// (`None` when it has no segments): counted on the device by the window pass, so with
    /// the window on this reads its tables back (submit the forward first; this waits for
    /// the device). Without the window every boundary pair is exact.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn segment_paths(&self, ctx: &Context) -> Result<Option<SegmentPaths>> {
        if self.segmented.is_none() {
            return Ok(None);
        }
        let hv = self.problem.heads_v;
        let mut paths = SegmentPaths::default();
        for w in &self.windows {
            let Some(st) = &w.segmented else { continue };
            if !self
                .last_windowed
                .load(std::sync::atomic::Ordering::Relaxed)
            {
                paths.exact += st.num_segments * hv;
                continue;
            }
            let bytes = pollster::block_on(crate::wgpu_backend::tensor::read_buffer(
                ctx,
                &st.warmup,
                0,
                (4 * st.num_segments * hv).max(4) as u64,
            ))?;
            let warmup: &[u32] = bytemuck::cast_slice(&bytes);
            for &n in warmup.iter().take(st.num_segments * hv) {
                // 0: a sequence's last segment, whose scans were skipped (no warm-up).
                match n {
                    super::segment_window::FALLBACK => paths.exact += 1,
                    n => {
                        paths.windowed += 1;
                        paths.longest_warmup_chunks = paths.longest_warmup_chunks.max(n as usize);
                    }
                }
            }
        }
        Ok(Some(paths))
    }

    /// The compute path the workspace was made for.
    pub fn path(&self) -> ComputePath {
        self.path
    }

    /// Bytes of its buffers.
    pub fn bytes(&self) -> u64 {
        let mut tensors = vec![&self.gate_beta, &self.a];
        tensors.extend(self.q_normed.iter().chain(self.k_normed.iter()));
        match &self.scan {
            ScanScratch::Scalar { gated } => tensors.push(gated),
            ScanScratch::Coop {
                gated16,
                k16,
                qg16,
                split,
            } => {
                tensors.extend([gated16, k16, qg16]);
                if let Some(sp) = split {
                    tensors.extend([&sp.states16, &sp.vprime16]);
                }
            }
        }
        let mut small = self.gate_params.size();
        for w in &self.windows {
            small += w.params.size() + w.chunks.size() + w.segments.size() + w.chunk_base.size();
            if let Some(st) = &w.segmented {
                small += st.segments.size()
                    + st.chunk_base.size()
                    + st.seq_segments.size()
                    + st.scan_params.size()
                    + st.trans_params.size()
                    + st.last_segment.size()
                    + st.window_params.size()
                    + st.end_rows.size()
                    + st.trans_rows.size()
                    + st.warmup.size();
            }
        }
        if let Some(sp) = &self.segmented {
            tensors.extend([
                &sp.trans,
                &sp.identity,
                &sp.ends,
                &sp.starts,
                &sp.zero_v,
                &sp.trans_o,
            ]);
            tensors.extend(sp.carry.iter());
        }
        tensors.iter().map(|t| t.buffer.size()).sum::<u64>() + small
    }

    /// An error unless the workspace was made for `problem` and `dtype`.
    pub(crate) fn check(&self, problem: &Problem, dtype: DType) -> Result<()> {
        if self.problem != *problem || self.dtype != dtype {
            return Err(Error::Value {
                name: "workspace".into(),
                expected: format!(
                    "a workspace made for this problem with {dtype} storage ({problem:?})"
                ),
                got: format!("one made for {} storage and {:?}", self.dtype, self.problem),
            });
        }
        Ok(())
    }
}

/// The least segment the automatic choice cuts, in chunks: shorter segments spend more on the
/// two extra scans and the sequential combine than they gain.
pub const MIN_AUTO_SEGMENT_CHUNKS: usize = 16;

/// The automatic choice turns sequence parallelism on when the scan would run fewer than this
/// many workgroups (the forward scan's V-block policy aims at the same count).
pub const AUTO_SEGMENT_BELOW_WORKGROUPS: usize = 128;

/// ... and then aims at about this many workgroups per scan.
pub const AUTO_SEGMENT_TARGET_WORKGROUPS: usize = 512;

/// Chunks per segment for a forward of `problem` on `path`, or `None` (one segment per
/// sequence): the context's `Config::segments` (`GDN_SEGMENT_CHUNKS`), by default
/// [`auto_segment_chunks`] for this adapter and the scan's grid.
pub fn segment_chunks_for(ctx: &Context, problem: &Problem, path: ComputePath) -> Option<usize> {
    match ctx.config().segments {
        SegmentChoice::Off => None,
        SegmentChoice::Chunks(n) => Some(n.max(1)),
        SegmentChoice::Auto => {
            let cpu = ctx
                .adapter_info
                .as_ref()
                .is_none_or(|i| i.device_type == wgpu::DeviceType::Cpu);
            let v_block = match path {
                ComputePath::CoopMatrix => COOP_V_BLOCK,
                ComputePath::Scalar | ComputePath::F16Math => {
                    ctx.tuning.state_scan_v_block(problem) as usize
                }
            };
            let workgroups =
                problem.num_sequences() * problem.heads_v * problem.value_dim.div_ceil(v_block);
            auto_segment_chunks(!cpu, problem, workgroups)
        }
    }
}

/// The automatic segment length: on GPUs only (a CPU adapter has a few cores to fill), when
/// the scan's grid of `scan_workgroups` is below [`AUTO_SEGMENT_BELOW_WORKGROUPS`]; then the
/// length that gives about [`AUTO_SEGMENT_TARGET_WORKGROUPS`] workgroups, at least
/// [`MIN_AUTO_SEGMENT_CHUNKS`], and only if some sequence is longer than two segments.
pub fn auto_segment_chunks(gpu: bool, problem: &Problem, scan_workgroups: usize) -> Option<usize> {
    if !gpu || scan_workgroups == 0 || scan_workgroups >= AUTO_SEGMENT_BELOW_WORKGROUPS {
        return None;
    }
    let seqs = problem.sequences();
    let per_segment = scan_workgroups / seqs.len().max(1);
    let segments = (AUTO_SEGMENT_TARGET_WORKGROUPS / per_segment.max(1)).max(1);
    let total: usize = seqs.iter().map(|s| s.len().div_ceil(CHUNK)).sum();
    let n = total.div_ceil(segments).max(MIN_AUTO_SEGMENT_CHUNKS);
    let longest = seqs.iter().map(|s| s.len()).max().unwrap_or(0);
    (longest > 2 * n * CHUNK).then_some(n)
}

/// What a window of `problem`'s forward binds per token, per state and per segment.
fn window_costs(
    problem: &Problem,
    dtype: DType,
    path: ComputePath,
    segment_chunks: Option<usize>,
    split: bool,
) -> WindowCosts {
    let (h, hv) = (problem.heads_qk as u64, problem.heads_v as u64);
    let (k, v) = (problem.key_dim as u64, problem.value_dim as u64);
    let size = dtype.size() as u64;
    // q, k; v, o; g, β: the caller's, bound at offsets.
    let caller = vec![h * k * size, hv * v * size, hv * 4];
    let mut scratch = vec![hv * 8, hv * CHUNK as u64 * 4];
    if problem.options.l2norm_qk {
        scratch.push(h * k * size);
    }
    let pad_tokens = match path {
        ComputePath::Scalar | ComputePath::F16Math => {
            scratch.push(hv * 2 * CHUNK as u64 * 4);
            0
        }
        ComputePath::CoopMatrix => {
            scratch.extend([hv * 2 * CHUNK as u64 * 2, h * k * 2, hv * k * 2]);
            if split {
                scratch.push(hv * v * 2);
            }
            CHUNK
        }
    };
    if segment_chunks.is_some() {
        scratch.push(hv * k * size);
    }
    let slot_bytes = hv * k * v * 4;
    WindowCosts {
        token_bytes: caller.iter().chain(&scratch).copied().collect(),
        offset_token_bytes: caller,
        pad_tokens,
        slot_bytes,
        // The split scan's chunk-start states (their own binding; bounded with the slots).
        chunk_bytes: if split { hv * k * v * 2 } else { 0 },
        segments: segment_chunks.map(|c| (c * CHUNK, hv * k * k.max(v) * 4)),
        max_rows: usize::MAX,
        part_tokens: None,
    }
}

impl WindowTables {
    fn new(
        ctx: &Context,
        problem: &Problem,
        window: TokenWindow,
        segment_chunks: Option<usize>,
        checkpoint: Option<usize>,
    ) -> Self {
        let chunk_table = window.chunk_table();
        let segment_table = window.segment_table();
        let (num_chunks, num_segments) = (chunk_table.len() / 2, segment_table.len() / 3);
        let mut params = Params::for_problem(problem, num_chunks, num_segments);
        params.total_tokens = window.tokens as u32;
        let segmented = segment_chunks.map(|c| SegmentTables::new(ctx, problem, &window, c));
        WindowTables {
            params: params.upload(ctx),
            chunks: upload_u32(ctx, "chunks", &chunk_table),
            segments: upload_u32(ctx, "segments", &segment_table),
            chunk_base: upload_u32(ctx, "chunk bases", &chunk_bases(&segment_table)),
            num_chunks,
            num_segments,
            segmented,
            window,
            checkpoint,
        }
    }
}

/// The problem's K-first scan variant and its transition variant (value_dim = K).
fn segment_problems(problem: &Problem) -> (Problem, Problem) {
    let mut scan_problem = problem.clone();
    scan_problem.options.state_v_first = false;
    let mut trans_problem = scan_problem.clone();
    trans_problem.value_dim = problem.key_dim;
    (scan_problem, trans_problem)
}

impl SegmentTables {
    /// Every piece of `window` cut into segments of `chunks` chunks (one segment per empty
    /// piece keeps the tables in sequence order; it scans nothing).
    fn new(ctx: &Context, problem: &Problem, window: &TokenWindow, chunks: usize) -> Self {
        let span = chunks * CHUNK;
        let mut table = Vec::new();
        let mut seq_table = Vec::new();
        let mut last_segment = Vec::new();
        for piece in &window.pieces {
            seq_table.push((table.len() / 3) as u32);
            let mut count = 0u32;
            let mut start = piece.start;
            while start < piece.end {
                let len = span.min(piece.end - start);
                table.extend([
                    (start - window.base) as u32,
                    len as u32,
                    (table.len() / 3) as u32,
                ]);
                start += len;
                count += 1;
                last_segment.push(u32::from(start == piece.end));
            }
            seq_table.push(count);
        }

        let num_segments = table.len() / 3;
        let num_chunks = window.chunk_table().len() / 2;
        let (scan_problem, trans_problem) = segment_problems(problem);
        let params = |p: &Problem| {
            let mut params = Params::for_problem(p, num_chunks, num_segments);
            params.total_tokens = window.tokens as u32;
            params
        };
        let pairs = num_segments * problem.heads_v;
        let mut window_params = params(&scan_problem);
        window_params.rows = pairs as u32;
        let scratch = |label, words: usize| {
            ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: (4 * words).max(4) as u64,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            })
        };
        SegmentTables {
            last_segment: upload_u32(ctx, "cp last segments", &last_segment),
            window_params: window_params.upload(ctx),
            end_rows: scratch("cp window end rows", 3 * pairs),
            trans_rows: scratch("cp window transition rows", 3 * pairs),
            warmup: scratch("cp window warm-up", pairs),
            segments: upload_u32(ctx, "cp segments", &table),
            chunk_base: upload_u32(ctx, "cp chunk bases", &chunk_bases(&table)),
            num_segments,
            seq_segments: upload_u32(ctx, "cp sequence segments", &seq_table),
            scan_params: params(&scan_problem).upload(ctx),
            trans_params: params(&trans_problem).upload(ctx),
        }
    }
}

impl Segmented {
    /// Buffers for the largest window's segments and tokens.
    fn new(
        ctx: &Context,
        problem: &Problem,
        dtype: DType,
        chunks: usize,
        windows: &[WindowTables],
    ) -> Result<Self> {
        let most = |f: &dyn Fn(&WindowTables) -> usize| windows.iter().map(f).max().unwrap_or(0);
        let num_segments = most(&|w| w.segmented.as_ref().map_or(0, |s| s.num_segments)).max(1);
        let tokens = most(&|w| w.window.tokens);
        let (hv, k, v) = (problem.heads_v, problem.key_dim, problem.value_dim);
        let (scan_problem, trans_problem) = segment_problems(problem);
        let carry = if windows.len() > 1 {
            let seqs = most(&|w| w.window.seqs());
            let shape = [
                seqs,
                problem.state_shape()[1],
                problem.state_shape()[2],
                problem.state_shape()[3],
            ];
            Some(GpuTensor::scratch(
                ctx,
                "cp window start states",
                &shape,
                DType::F32,
            )?)
        } else {
            None
        };
        let identity =
            GpuTensor::scratch(ctx, "cp identities", &[num_segments, hv, k, k], DType::F32)?;
        let block: Vec<f32> = (0..k * k)
            .map(|e| if e / k == e % k { 1.0 } else { 0.0 })
            .collect();
        for slot in 0..num_segments * hv {
            let at = (slot * k * k * 4) as u64;
            ctx.queue
                .write_buffer(&identity.buffer, at, bytemuck::cast_slice(&block));
        }
        Ok(Segmented {
            chunks,
            trans: GpuTensor::scratch(
                ctx,
                "cp transitions",
                &[num_segments, hv, k, k],
                DType::F32,
            )?,
            identity,
            ends: GpuTensor::scratch(ctx, "cp ends", &[num_segments, hv, k, v], DType::F32)?,
            starts: GpuTensor::scratch(ctx, "cp starts", &[num_segments, hv, k, v], DType::F32)?,
            zero_v: GpuTensor::scratch(ctx, "cp zero v", &[tokens, hv, k], dtype)?,
            trans_o: GpuTensor::scratch(ctx, "cp transition o", &[tokens, hv, k], dtype)?,
            carry,
            scan_problem,
            trans_problem,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::chunk_bases;

    /// Chunk ordinals count whole and partial chunks in table order; a row of length 0 takes
    /// none.
    #[test]
    fn chunk_bases_count_each_rows_chunks() {
        let table = [0, 1, 0, 1, 1, 1, 2, 65, 2, 67, 0, 3, 67, 128, 4, 195, 64, 5];
        assert_eq!(chunk_bases(&table), vec![0, 1, 2, 4, 4, 6]);
    }
}
