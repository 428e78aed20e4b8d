//! Launcher of `shaders/backward/qk_finish.wgsl`: GVA group sums of dq, dk and the l2norm
//! backward onto the raw q, k.

use crate::error::Result;
use crate::gpu::params::{bind, dispatch, grid_1d};
use crate::gpu::shaders::{Pass, source};
use crate::gpu::{Context, GpuTensor};

/// Record `dq`, `dk` `[B,T,H,K]` from the per-v-head `dqk_parts`; `q_raw`, `k_raw` are the
/// forward's raw inputs (read only with `l2norm_qk`).
#[allow(clippy::too_many_arguments)]
pub fn qk_finish(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    q_raw: &GpuTensor,
    k_raw: &GpuTensor,
    dqk_parts: &GpuTensor,
    dq: &GpuTensor,
    dk: &GpuTensor,
) -> Result<()> {
    let pipeline = ctx
        .pipelines
        .get(source(Pass::QkFinish, q_raw.dtype)?, "qk_finish", &[]);
    let bg = bind(
        ctx,
        &pipeline,
        "qk_finish",
        &[
            params,
            &q_raw.buffer,
            &k_raw.buffer,
            &dqk_parts.buffer,
            &dq.buffer,
            &dk.buffer,
        ],
    );
    let rows = (dq.len() / dq.shape[dq.shape.len() - 1]) as u32;
    dispatch(encoder, "qk_finish", &pipeline, &bg, grid_1d(rows));
    Ok(())
}
