//! Launcher of `shaders/backward/value_grams_coop.wgsl`: `value_grams`'s dP and dAb on f16
//! cooperative matrices (f32 accumulators, Γ and the scale applied in f32).

use crate::error::{Error, Result};
use crate::wgpu_backend::Context;
use crate::wgpu_backend::backward::ValueGramsBuffers;
use crate::wgpu_backend::launch::{Bindings, Grid, Launch};
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::tuning::COOP_V_BLOCK;

/// Record the coop pass over `num_chunks` chunks × `heads_v` v-heads (V a multiple of
/// 32); the tensors are `value_grams`'.
pub fn value_grams_coop(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    bufs: &ValueGramsBuffers<'_>,
    num_chunks: usize,
    heads_v: usize,
) -> Result<()> {
    let value_dim = bufs.d_o.shape[bufs.d_o.shape.len() - 1];
    if !value_dim.is_multiple_of(COOP_V_BLOCK) {
        return Err(Error::unsupported(
            "compute path",
            format!(
                "the coop value_grams at V = {value_dim} (needs V a multiple of {COOP_V_BLOCK})"
            ),
        ));
    }
    Launch {
        name: "value_grams_coop",
        source: source(Pass::ValueGramsCoop, bufs.d_o.dtype)?,
        entry: "value_grams_coop",
        constants: &[],
        bindings: Bindings::Ordered(&bufs.ordered(params)),
        grid: Grid([(num_chunks, "chunks"), (heads_v, "v-heads"), (1, "")]),
    }
    .record(ctx, encoder)
}
