//! Launcher of `shaders/backward/gate_finish.wgsl`: β and gate activation chain rules, and
//! dA_log, ddt_bias summed over all tokens.

use crate::error::Result;
use crate::wgpu_backend::params::{bind, dispatch};
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::{Context, GpuTensor};

/// Record the pass, one workgroup per v-head. `gate_params` holds `[A_log (HV), dt_bias (HV)]`
/// (any small buffer without the in-kernel gate); `dgate_params` receives `[dA_log, ddt_bias]`.
#[allow(clippy::too_many_arguments)]
pub fn gate_finish(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    g: &GpuTensor,
    beta: &GpuTensor,
    gate_params: &wgpu::Buffer,
    dg_dbeta: &GpuTensor,
    dg: &GpuTensor,
    dbeta: &GpuTensor,
    dgate_params: &wgpu::Buffer,
    heads_v: usize,
) -> Result<()> {
    let pipeline = ctx.pipelines.get(
        source(Pass::GateFinish, crate::DType::F32)?,
        "gate_finish",
        &[],
    );
    let bg = bind(
        ctx,
        &pipeline,
        "gate_finish",
        &[
            params,
            &g.buffer,
            &beta.buffer,
            gate_params,
            &dg_dbeta.buffer,
            &dg.buffer,
            &dbeta.buffer,
            dgate_params,
        ],
    );
    dispatch(
        encoder,
        "gate_finish",
        &pipeline,
        &bg,
        (heads_v as u32, 1, 1),
    );
    Ok(())
}
