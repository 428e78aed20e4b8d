//! The forward's scratch, kept between calls. A forward without a workspace allocates its
//! scratch per call — at 16/64 heads × 32768 tokens on the coop path that is ~2.5 GB of
//! buffers, whose creation dominated the host time of a call (57 ms measured by `gdn bench`
//! on the H200). Serving loops and benchmarks make one workspace per problem shape and reuse
//! it.

use crate::error::{Error, Result};
use crate::gpu::params::{Params, upload_u32};
use crate::gpu::path::ComputePath;
use crate::gpu::{Context, GpuTensor};
use crate::problem::{CHUNK, Problem};
use crate::tensor::DType;

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

/// Every buffer a forward writes besides its outputs, for one problem and storage dtype on
/// one compute path. [`crate::gpu::forward_into_workspace`] records into it; the
/// [`crate::gpu::Intermediates`] it returns live here until the workspace's next use.
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
}

impl ForwardWorkspace {
    /// A workspace for `problem` with q, k, v stored as `dtype`, on the path the context
    /// would choose for it.
    pub fn new(ctx: &Context, problem: &Problem, dtype: DType) -> Result<Self> {
        let path = ctx.forward_path(problem, dtype)?.path;
        Self::with_path(ctx, problem, dtype, path)
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
        let small = self.params.size()
            + self.chunks.size()
            + self.segments.size()
            + self.gate_params.size();
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
