//! Launcher of `shaders/backward/wy_grad_coop.wgsl`: `wy_grad`'s four products on f16
//! cooperative matrices (f32 accumulators), the rest in f32 as before.

use crate::error::{Error, Result};
use crate::wgpu_backend::Context;
use crate::wgpu_backend::backward::WyGradBuffers;
use crate::wgpu_backend::launch::{Bindings, Grid, Launch};
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::tuning::COOP_KEY_DIM;

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
    let key_dim = k.shape[k.shape.len() - 1];
    if key_dim != COOP_KEY_DIM {
        return Err(Error::unsupported(
            "compute path",
            format!("the coop wy_grad at K = {key_dim} (needs K = {COOP_KEY_DIM})"),
        ));
    }
    Launch {
        name: "wy_grad_coop",
        source: source(Pass::WyGradCoop, k.dtype)?,
        entry: "wy_grad_coop",
        constants: &[],
        bindings: Bindings::Ordered(&[
            params,
            bufs.q,
            k,
            bufs.a,
            bufs.gate_beta,
            bufs.chunks,
            bufs.mats,
            bufs.dg_dbeta,
        ]),
        grid: Grid([(num_chunks, "chunks"), (heads_v, "v-heads"), (1, "")]),
    }
    .record(ctx, encoder)
}
