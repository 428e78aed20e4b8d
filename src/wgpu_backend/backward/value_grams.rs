//! Launcher of `shaders/backward/value_grams.wgsl`: dP = scale·Γ⊙(dO V'ᵀ) and
//! dAb = Γ⊙(dV' Wᵀ) per chunk and v-head.

use crate::error::Result;
use crate::wgpu_backend::params::{bind, dispatch};
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::{Context, GpuTensor};

/// Record the pass over every chunk (`chunks`: the chunk table) and v-head; `mats` is
/// `[2, B·T, HV, 64]` f32.
#[allow(clippy::too_many_arguments)]
pub fn value_grams(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    d_o: &GpuTensor,
    w_vnew: &GpuTensor,
    dvnew_dv: &GpuTensor,
    gate_beta: &GpuTensor,
    chunks: &wgpu::Buffer,
    num_chunks: usize,
    heads_v: usize,
    mats: &GpuTensor,
) -> Result<()> {
    let pipeline = ctx
        .pipelines
        .get(source(Pass::ValueGrams, d_o.dtype)?, "value_grams", &[]);
    let bg = bind(
        ctx,
        &pipeline,
        "value_grams",
        &[
            params,
            &d_o.buffer,
            &w_vnew.buffer,
            &dvnew_dv.buffer,
            &gate_beta.buffer,
            chunks,
            &mats.buffer,
        ],
    );
    dispatch(
        encoder,
        "value_grams",
        &pipeline,
        &bg,
        (num_chunks as u32, heads_v as u32, 1),
    );
    Ok(())
}
