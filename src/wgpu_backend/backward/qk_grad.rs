//! Launcher of `shaders/backward/qk_grad.wgsl`: dq and dk per v-head, and the gate gradient
//! of each chunk after its reverse chunk-local cumsum.

use crate::error::Result;
use crate::wgpu_backend::params::{bind, dispatch};
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::{Context, GpuTensor};

/// Record the pass over every chunk and v-head. `dqk_parts` holds the state terms on entry and
/// dq, dk per v-head on exit; `dg_dbeta` holds (dG, dβ) on entry and (dg, dβ) on exit.
#[allow(clippy::too_many_arguments)]
pub fn qk_grad(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    q: &GpuTensor,
    k: &GpuTensor,
    mats: &GpuTensor,
    chunks: &wgpu::Buffer,
    num_chunks: usize,
    heads_v: usize,
    dqk_parts: &GpuTensor,
    dg_dbeta: &GpuTensor,
) -> Result<()> {
    let key_dim = k.shape[k.shape.len() - 1];
    let pipeline = ctx.pipelines.get(
        source(Pass::QkGrad, k.dtype)?,
        "qk_grad",
        &[("K_DIM", key_dim as f64)],
    );
    let bg = bind(
        ctx,
        &pipeline,
        "qk_grad",
        &[
            params,
            &q.buffer,
            &k.buffer,
            &mats.buffer,
            chunks,
            &dqk_parts.buffer,
            &dg_dbeta.buffer,
        ],
    );
    dispatch(
        encoder,
        "qk_grad",
        &pipeline,
        &bg,
        (num_chunks as u32, heads_v as u32, 1),
    );
    Ok(())
}
