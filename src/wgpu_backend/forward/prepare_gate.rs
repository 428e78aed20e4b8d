//! Launcher of `shaders/forward/prepare_gate.wgsl`: β and gate activations and the chunk-local
//! gate cumsum, packed as (G, β) per token and v-head.

use crate::error::Result;
use crate::tensor::DType;
use crate::wgpu_backend::params::{bind, dispatch, grid_1d};
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::{Context, GpuTensor};

/// Record the pass. `gate_params` holds `[A_log (HV), dt_bias (HV)]` (any small buffer when the
/// gate is not computed in the kernel); `chunks` is the chunk table (start, length).
#[allow(clippy::too_many_arguments)]
pub fn prepare_gate(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    g: &GpuTensor,
    beta: &GpuTensor,
    gate_params: &wgpu::Buffer,
    chunks: &wgpu::Buffer,
    num_chunks: usize,
    heads_v: usize,
    gate_beta: &GpuTensor,
) -> Result<()> {
    // The pass reads and writes only f32; the storage dtype of q/k/v does not enter it.
    let pipeline = ctx
        .pipelines
        .get(source(Pass::PrepareGate, DType::F32)?, "prepare_gate", &[]);
    let bg = bind(
        ctx,
        &pipeline,
        "prepare_gate",
        &[
            params,
            &g.buffer,
            &beta.buffer,
            gate_params,
            chunks,
            &gate_beta.buffer,
        ],
    );
    dispatch(
        encoder,
        "prepare_gate",
        &pipeline,
        &bg,
        grid_1d((num_chunks * heads_v) as u32),
    );
    Ok(())
}
