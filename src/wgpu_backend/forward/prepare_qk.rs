//! Launcher of `shaders/forward/prepare_qk.wgsl`: in-kernel l2norm of q or k.

use crate::error::Result;
use crate::wgpu_backend::params::{bind, dispatch, grid_1d};
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::{Context, GpuTensor};

/// Record `x_out = l2norm(x_in)` per head vector.
pub fn prepare_qk(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    x_in: &GpuTensor,
    x_out: &GpuTensor,
) -> Result<()> {
    let pipeline = ctx
        .pipelines
        .get(source(Pass::PrepareQk, x_in.dtype)?, "prepare_qk", &[]);
    let bg = bind(
        ctx,
        &pipeline,
        "prepare_qk",
        &[params, &x_in.buffer, &x_out.buffer],
    );
    let rows = (x_in.len() / x_in.shape[x_in.shape.len() - 1]) as u32;
    dispatch(encoder, "prepare_qk", &pipeline, &bg, grid_1d(rows));
    Ok(())
}
