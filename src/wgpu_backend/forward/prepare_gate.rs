//! Launcher of `shaders/forward/prepare_gate.wgsl`: β and gate activations and the chunk-local
//! gate cumsum, packed as (G, β) per token and v-head.

use crate::error::Result;
use crate::tensor::DType;
use crate::wgpu_backend::launch::{Bindings, Grid, Launch};
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::{Context, GpuTensor};

/// The buffers the pass reads and writes.
pub struct PrepareGateBuffers<'a> {
    /// `[B,T,HV]` f32: the log-decay, or the raw gate with `gate_in_kernel`.
    pub g: &'a GpuTensor,
    /// `[B,T,HV]` f32: β, or its logits with `beta_sigmoid`.
    pub beta: &'a GpuTensor,
    /// `[A_log (HV), dt_bias (HV)]` (any small buffer when the gate is not computed in the
    /// kernel).
    pub gate_params: &'a wgpu::Buffer,
    /// The chunk table (start, length).
    pub chunks: &'a wgpu::Buffer,
    /// `[B·T, HV, 2]` f32 (written).
    pub gate_beta: &'a GpuTensor,
}

/// Record the pass over `num_chunks` chunks × `heads_v` v-heads.
pub fn prepare_gate(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    bufs: &PrepareGateBuffers<'_>,
    num_chunks: usize,
    heads_v: usize,
) -> Result<()> {
    Launch {
        name: "prepare_gate",
        // The pass reads and writes only f32; the storage dtype of q/k/v does not enter it.
        source: source(Pass::PrepareGate, DType::F32)?,
        entry: "prepare_gate",
        constants: &[],
        bindings: Bindings::Ordered(&[
            params,
            bufs.g,
            bufs.beta,
            bufs.gate_params,
            bufs.chunks,
            bufs.gate_beta,
        ]),
        grid: Grid::items_64(num_chunks * heads_v, "chunks × v-heads"),
    }
    .record(ctx, encoder)
}
