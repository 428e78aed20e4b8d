//! Launcher of `shaders/forward/prepare_qk.wgsl`: in-kernel l2norm of q or k.

use crate::error::Result;
use crate::wgpu_backend::launch::{Bindings, Grid, Launch};
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
    let rows = x_in.len() / x_in.shape[x_in.shape.len() - 1];
    Launch {
        name: "prepare_qk",
        source: source(Pass::PrepareQk, x_in.dtype)?,
        entry: "prepare_qk",
        constants: &[],
        bindings: Bindings::Ordered(&[params, x_in, x_out]),
        grid: Grid::items_64(rows, "head vectors"),
    }
    .record(ctx, encoder)
}
