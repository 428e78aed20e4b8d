//! Launcher of `shaders/forward/to_half.wgsl`: q or k as f16 GEMM operands for the coop scan.

use crate::error::{Error, Result};
use crate::problem::CHUNK;
use crate::tensor::DType;
use crate::wgpu_backend::launch::{Bindings, Grid, Launch};
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::{Context, GpuTensor};

/// Record `x_out = f16(x_in)` plus one chunk of zero rows: `x_in` is `[B·T, H, K]`, `x_out`
/// `[B·T + 64, H, K]` f16.
pub fn to_half(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    x_in: &GpuTensor,
    x_out: &GpuTensor,
) -> Result<()> {
    let n = x_in.shape.len();
    let tokens: usize = x_in.shape[..n - 2].iter().product();
    let padded = [tokens + CHUNK, x_in.shape[n - 2], x_in.shape[n - 1]];
    if x_out.dtype != DType::F16 || x_out.shape != padded {
        return Err(Error::shape("to_half output (f16)", &padded, &x_out.shape));
    }
    Launch {
        name: "to_half",
        source: source(Pass::ToHalf, x_in.dtype)?,
        entry: "to_half",
        constants: &[],
        bindings: Bindings::Ordered(&[params, x_in, x_out]),
        grid: Grid::items_64(x_out.len().div_ceil(4), "vec4s of the output"),
    }
    .record(ctx, encoder)
}
