//! The forward's scratch, kept between calls. A forward without a workspace allocates its
//! scratch per call — at 16/64 heads × 32768 tokens on the coop path that is ~2.5 GB of
//! buffers, whose creation dominated the host time of a call (57 ms measured by `gdn bench`
//! on the H200). Serving loops and benchmarks make one workspace per problem shape and reuse
//! it.

use crate::error::{Error, Result};
use crate::problem::{CHUNK, Problem};
use crate::tensor::DType;
use crate::wgpu_backend::params::{Params, upload_u32};
use crate::wgpu_backend::path::ComputePath;
use crate::wgpu_backend::{Context, GpuTensor};

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
    },
}

/// Intra-device sequence parallelism: every sequence longer than `chunks` chunks is cut into
/// segments of that many chunks, scanned all at once from zero (end states) and from the
/// identity with v = 0 (transitions), combined in sequence order (`segment_combine`), then
/// scanned again from the right start states. Exact (the state update is affine in the
/// state), three scans' work instead of one, but parallel over segments.
#[derive(Debug)]
pub(crate) struct Segmented {
    pub chunks: usize,
    /// The problem with K-first states (the internal slots), and its transition variant
    /// (value_dim = K).
    pub scan_problem: Problem,
    pub trans_problem: Problem,
    pub segments: wgpu::Buffer,
    pub num_segments: usize,
    pub seq_segments: wgpu::Buffer,
    pub scan_params: wgpu::Buffer,
    pub trans_params: wgpu::Buffer,
    pub identity_params: wgpu::Buffer,
    /// `[S, HV, K, K]`, `[S, HV, K, V]`, `[S, HV, K, V]` f32.
    pub trans: GpuTensor,
    pub ends: GpuTensor,
    pub starts: GpuTensor,
    /// `[B·T, HV, K]` zeros (never written) and the transition scan's discarded o.
    pub zero_v: GpuTensor,
    pub trans_o: GpuTensor,
}

/// Every buffer a forward writes besides its outputs, for one problem and storage dtype on
/// one compute path. [`crate::wgpu_backend::forward_into_workspace`] records into it; the
/// [`crate::wgpu_backend::Intermediates`] it returns live here until the workspace's next use.
#[derive(Debug)]
pub struct ForwardWorkspace {
    pub(crate) problem: Problem,
    pub(crate) dtype: DType,
    pub(crate) path: ComputePath,
    pub(crate) params: wgpu::Buffer,
    pub(crate) chunks: wgpu::Buffer,
    pub(crate) segments: wgpu::Buffer,
    pub(crate) num_chunks: usize,
    pub(crate) num_segments: usize,
    /// A_log then dt_bias (`gate_in_kernel`), `[2 HV]` f32.
    pub(crate) gate_params: wgpu::Buffer,
    pub(crate) q_normed: Option<GpuTensor>,
    pub(crate) k_normed: Option<GpuTensor>,
    pub(crate) gate_beta: GpuTensor,
    pub(crate) a: GpuTensor,
    pub(crate) scan: ScanScratch,
    pub(crate) segmented: Option<Segmented>,
}

impl ForwardWorkspace {
    /// A workspace for `problem` with q, k, v stored as `dtype`, on the path the context
    /// would choose for it.
    ///
    /// The context's `Config::segment_chunks` (`GDN_SEGMENT_CHUNKS=N`) turns on intra-device
    /// sequence parallelism with segments of N chunks (see [`Self::with_segments`]); off by
    /// default until measured.
    pub fn new(ctx: &Context, problem: &Problem, dtype: DType) -> Result<Self> {
        let path = ctx.forward_path(problem, dtype)?.path;
        Self::with_path_and_config(ctx, problem, dtype, path)
    }

    /// [`Self::with_path`], honouring the context's `Config::segment_chunks` (what a forward
    /// without a workspace uses).
    pub(crate) fn with_path_and_config(
        ctx: &Context,
        problem: &Problem,
        dtype: DType,
        path: ComputePath,
    ) -> Result<Self> {
        let segments = ctx.config().segment_chunks;
        let mut ws = Self::with_path(ctx, problem, dtype, path)?;
        if let Some(n) = segments {
            ws.segmented = Segmented::new(ctx, problem, dtype, n)?;
        }
        Ok(ws)
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
        let mut ws = Self::with_path(ctx, problem, dtype, path)?;
        ws.segmented = Segmented::new(ctx, problem, dtype, segment_chunks)?;
        Ok(ws)
    }

    /// Chunks per segment when the forward runs sequence-parallel.
    pub fn segment_chunks(&self) -> Option<usize> {
        self.segmented.as_ref().map(|s| s.chunks)
    }

    /// A workspace on a given compute path (which the device and problem must support).
    pub fn with_path(
        ctx: &Context,
        problem: &Problem,
        dtype: DType,
        path: ComputePath,
    ) -> Result<Self> {
        // Validates the path for this device and problem (typed error otherwise).
        ctx.path_support().choose(problem, dtype, Some(path))?;
        let (bt, hv) = (problem.total_tokens(), problem.heads_v);
        let (h, k) = (problem.heads_qk, problem.key_dim);
        let (chunk_table, segment_table) = super::tables(problem);
        let num_chunks = chunk_table.len() / 2;
        let num_segments = segment_table.len() / 3;
        // The normalized copies keep q's own shape ([B,T,H,K]): the backward reads them as q.
        let qk_shape = problem.qk_shape();
        let (q_normed, k_normed) = if problem.options.l2norm_qk {
            (
                Some(GpuTensor::empty(ctx, "q_normed", &qk_shape, dtype)?),
                Some(GpuTensor::empty(ctx, "k_normed", &qk_shape, dtype)?),
            )
        } else {
            (None, None)
        };
        let scan = match path {
            ComputePath::Scalar | ComputePath::F16Math => ScanScratch::Scalar {
                gated: GpuTensor::empty(ctx, "gated", &[bt, hv, 2 * CHUNK], DType::F32)?,
            },
            ComputePath::CoopMatrix => ScanScratch::Coop {
                gated16: GpuTensor::empty(
                    ctx,
                    "gated16",
                    &[bt + CHUNK, hv, 2 * CHUNK],
                    DType::F16,
                )?,
                k16: GpuTensor::empty(ctx, "k16", &[bt + CHUNK, h, k], DType::F16)?,
                qg16: GpuTensor::empty(ctx, "qg16", &[bt + CHUNK, hv, k], DType::F16)?,
            },
        };
        Ok(ForwardWorkspace {
            problem: problem.clone(),
            dtype,
            path,
            params: Params::for_problem(problem, num_chunks, num_segments).upload(ctx),
            chunks: upload_u32(ctx, "chunks", &chunk_table),
            segments: upload_u32(ctx, "segments", &segment_table),
            num_chunks,
            num_segments,
            gate_params: ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("gate_params"),
                size: (8 * hv) as u64,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            q_normed,
            k_normed,
            gate_beta: GpuTensor::empty(ctx, "gate_beta", &[bt, hv, 2], DType::F32)?,
            a: GpuTensor::empty(ctx, "wy_inverse", &[bt, hv, CHUNK], DType::F32)?,
            scan,
            segmented: None,
        })
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
            ScanScratch::Coop { gated16, k16, qg16 } => tensors.extend([gated16, k16, qg16]),
        }
        let mut small = self.params.size()
            + self.chunks.size()
            + self.segments.size()
            + self.gate_params.size();
        if let Some(sp) = &self.segmented {
            tensors.extend([&sp.trans, &sp.ends, &sp.starts, &sp.zero_v, &sp.trans_o]);
            small += sp.segments.size()
                + sp.seq_segments.size()
                + sp.scan_params.size()
                + sp.trans_params.size()
                + sp.identity_params.size();
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

impl Segmented {
    /// `None` when no sequence is longer than one segment (nothing to parallelize).
    fn new(ctx: &Context, problem: &Problem, dtype: DType, chunks: usize) -> Result<Option<Self>> {
        let span = chunks * CHUNK;
        let mut table = Vec::new();
        let mut seq_table = Vec::new();
        let mut longest = 0;
        for s in problem.sequences() {
            seq_table.push((table.len() / 3) as u32);
            let mut count = 0u32;
            let mut start = s.start;
            while start < s.end {
                let len = span.min(s.end - start);
                table.extend([start as u32, len as u32, (table.len() / 3) as u32]);
                start += len;
                count += 1;
            }
            seq_table.push(count);
            longest = longest.max(count);
        }
        if longest <= 1 {
            return Ok(None);
        }
        let num_segments = table.len() / 3;
        let num_chunks = problem.chunks().len();
        let (bt, hv, k, v) = (
            problem.total_tokens(),
            problem.heads_v,
            problem.key_dim,
            problem.value_dim,
        );
        let mut scan_problem = problem.clone();
        scan_problem.options.state_v_first = false;
        let mut trans_problem = scan_problem.clone();
        trans_problem.value_dim = k;
        let mut identity = Params::for_problem(&trans_problem, num_chunks, num_segments);
        identity.rows = (num_segments * hv * k * k) as u32;
        Ok(Some(Segmented {
            chunks,
            segments: upload_u32(ctx, "cp segments", &table),
            num_segments,
            seq_segments: upload_u32(ctx, "cp sequence segments", &seq_table),
            scan_params: Params::for_problem(&scan_problem, num_chunks, num_segments).upload(ctx),
            trans_params: Params::for_problem(&trans_problem, num_chunks, num_segments).upload(ctx),
            identity_params: identity.upload(ctx),
            trans: GpuTensor::empty(ctx, "cp transitions", &[num_segments, hv, k, k], DType::F32)?,
            ends: GpuTensor::empty(ctx, "cp ends", &[num_segments, hv, k, v], DType::F32)?,
            starts: GpuTensor::empty(ctx, "cp starts", &[num_segments, hv, k, v], DType::F32)?,
            zero_v: GpuTensor::empty(ctx, "cp zero v", &[bt, hv, k], dtype)?,
            trans_o: GpuTensor::empty(ctx, "cp transition o", &[bt, hv, k], dtype)?,
            scan_problem,
            trans_problem,
        }))
    }
}
