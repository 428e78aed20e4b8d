//! Launcher of `shaders/backward/state_grad_coop.wgsl`: `state_grad`'s products through the
//! chunk-start states and the state gradients on f16 cooperative matrices (f32 accumulators).

use crate::error::{Error, Result};
use crate::wgpu_backend::Context;
use crate::wgpu_backend::backward::StateGradBuffers;
use crate::wgpu_backend::launch::{Bindings, Grid, Launch};
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::tuning::{COOP_KEY_DIM, COOP_V_BLOCK};

/// Record the coop pass over `num_chunks` chunks × `heads_v` v-heads (K = 128, V a multiple
/// of 32), one workgroup per (chunk, v-head); the tensors are `state_grad`'s.
pub fn state_grad_coop(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    bufs: &StateGradBuffers<'_>,
    num_chunks: usize,
    heads_v: usize,
    key_dim: usize,
) -> Result<()> {
    let value_dim = bufs.d_o.shape[bufs.d_o.shape.len() - 1];
    if key_dim != COOP_KEY_DIM || !value_dim.is_multiple_of(COOP_V_BLOCK) {
        return Err(Error::unsupported(
            "compute path",
            format!(
                "the coop backward at K = {key_dim}, V = {value_dim} (needs K = {COOP_KEY_DIM}, V a multiple of {COOP_V_BLOCK})"
            ),
        ));
    }
    Launch {
        name: "state_grad_coop",
        source: source(Pass::StateGradCoop, bufs.d_o.dtype)?,
        entry: "state_grad_coop",
        constants: &[],
        bindings: Bindings::Ordered(&bufs.ordered(params)),
        grid: Grid([(num_chunks, "chunks"), (heads_v, "v-heads"), (1, "")]),
    }
    .record(ctx, encoder)
}
