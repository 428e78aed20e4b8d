//! Launcher of `shaders/backward/wy_grad_coop.wgsl`: `wy_grad`'s four products on f16
//! cooperative matrices (f32 accumulators), the rest in f32 as before.

use crate::error::Result;
use crate::wgpu_backend::Context;
use crate::wgpu_backend::backward::WyGradBuffers;
use crate::wgpu_backend::coop_scan::check_coop_key_dim;
use crate::wgpu_backend::launch::{Bindings, Grid, Launch};
use crate::wgpu_backend::shaders::{Pass, source};

/// Record the coop pass over `num_chunks` chunks × `heads_v` v-heads (K = 128); the
/// tensors are `wy_grad`'s.
pub fn wy_grad_coop(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    bufs: &WyGradBuffers<'_>,
    num_chunks: usize,
    heads_v: usize,
) -> Result<()> {
    let k = bufs.k;
    check_coop_key_dim("the coop wy_grad", k)?;
    Launch {
        name: "wy_grad_coop",
        source: source(Pass::WyGradCoop, k.dtype)?,
        entry: "wy_grad_coop",
        constants: &[],
        bindings: Bindings::Ordered(&bufs.ordered(params)),
        grid: Grid([(num_chunks, "chunks"), (heads_v, "v-heads"), (1, "")]),
    }
    .record(ctx, encoder)
}
