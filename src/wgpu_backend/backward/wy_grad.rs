//! Launcher of `shaders/backward/wy_grad.wgsl`: gradients through A·diag(β) and the gate-free
//! WY inverse — dβ, the Γ-mask part of dG, and dAt for dk.

use crate::error::Result;
use crate::wgpu_backend::params::{bind, dispatch};
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::{Context, GpuTensor};

/// Record the pass over every chunk and v-head. `mats` holds dP and dAb on entry, dP and dAt
/// on exit; `dg_dbeta` is `[B·T, HV, 2]` f32.
#[allow(clippy::too_many_arguments)]
pub fn wy_grad(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    q: &GpuTensor,
    k: &GpuTensor,
    a: &GpuTensor,
    gate_beta: &GpuTensor,
    chunks: &wgpu::Buffer,
    num_chunks: usize,
    heads_v: usize,
    mats: &GpuTensor,
    dg_dbeta: &GpuTensor,
) -> Result<()> {
    let key_dim = k.shape[k.shape.len() - 1];
    let pipeline = ctx.pipelines.get(
        source(Pass::WyGrad, k.dtype)?,
        "wy_grad",
        &[("K_DIM", key_dim as f64)],
    );
    let bg = bind(
        ctx,
        &pipeline,
        "wy_grad",
        &[
            params,
            &q.buffer,
            &k.buffer,
            &a.buffer,
            &gate_beta.buffer,
            chunks,
            &mats.buffer,
            &dg_dbeta.buffer,
        ],
    );
    dispatch(
        encoder,
        "wy_grad",
        &pipeline,
        &bg,
        (num_chunks as u32, heads_v as u32, 1),
    );
    Ok(())
}
