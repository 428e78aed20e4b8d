//! Launcher of `shaders/backward/gate_finish.wgsl`: β and gate activation chain rules, and
//! dA_log, ddt_bias summed over the tokens (of a window, from `params.rows` on) and added to
//! the running sums.

use crate::error::Result;
use crate::tensor::DType;
use crate::wgpu_backend::launch::{Bindings, Grid, Launch};
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::{Context, GpuTensor};

/// The buffers the pass reads and writes.
pub struct GateFinishBuffers<'a> {
    /// `[B,T,HV]` f32: the forward's g input (the raw gate with `gate_in_kernel`).
    pub g: &'a GpuTensor,
    /// `[B,T,HV]` f32: the forward's beta input (logits with `beta_sigmoid`).
    pub beta: &'a GpuTensor,
    /// `[A_log (HV), dt_bias (HV)]` (any small buffer without the in-kernel gate).
    pub gate_params: &'a wgpu::Buffer,
    /// `[B·T, HV, 2]` f32: (dg, dβ) w.r.t. the activated values, from `qk_grad`.
    pub dg_dbeta: &'a GpuTensor,
    /// `[B,T,HV]` f32 (written): the gradient w.r.t. the g input.
    pub dg: &'a GpuTensor,
    /// `[B,T,HV]` f32 (written): the gradient w.r.t. the beta input.
    pub dbeta: &'a GpuTensor,
    /// `[dA_log, ddt_bias]`: the pass adds its sums (clear it before the first window).
    pub dgate_params: &'a wgpu::Buffer,
}

/// Record the pass, one workgroup per v-head.
pub fn gate_finish(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    bufs: &GateFinishBuffers<'_>,
    heads_v: usize,
) -> Result<()> {
    Launch {
        name: "gate_finish",
        source: source(Pass::GateFinish, DType::F32)?,
        entry: "gate_finish",
        constants: &[],
        bindings: Bindings::Ordered(&[
            params,
            bufs.g,
            bufs.beta,
            bufs.gate_params,
            bufs.dg_dbeta,
            bufs.dg,
            bufs.dbeta,
            bufs.dgate_params,
        ]),
        grid: Grid([(heads_v, "v-heads"), (1, ""), (1, "")]),
    }
    .record(ctx, encoder)
}
