//! Launcher of `shaders/forward/chunk_output_coop.wgsl`: the split coop forward's o from the
//! chain's chunk-start states and V', every chunk at once.

use crate::error::Result;
use crate::wgpu_backend::launch::{Bindings, Grid, Launch};
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::tuning::COOP_V_BLOCK;
use crate::wgpu_backend::{Context, GpuTensor};

use crate::wgpu_backend::coop_scan::check_coop_shapes;

/// The tensors the output pass reads and writes.
pub struct ChunkOutputBuffers<'a> {
    /// `[B·T + 64, HV, K]` f16: γ ⊙ q per v-head.
    pub qg16: &'a GpuTensor,
    /// `[B·T + 64, HV, 128]` f16: Γ⊙A⊙β | Γ⊙QKᵀ rows.
    pub gated16: &'a GpuTensor,
    /// Chunk table: (start token, length) per chunk, in the chain's chunk order.
    pub chunks: &'a wgpu::Buffer,
    /// `[chunks, HV, K, V]` f16, from `state_chain_coop`.
    pub states16: &'a GpuTensor,
    /// `[B·T + 64, HV, V]` f16, from `state_chain_coop`.
    pub vprime16: &'a GpuTensor,
    /// `[B,T,HV,V]` (written), in the storage dtype.
    pub o: &'a GpuTensor,
}

/// Record o for `num_chunks` chunks.
pub fn chunk_output_coop(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    bufs: &ChunkOutputBuffers<'_>,
    num_chunks: usize,
    heads_v: usize,
) -> Result<()> {
    let value_dim = bufs.o.shape[bufs.o.shape.len() - 1];
    check_coop_shapes(
        "the coop scan",
        bufs.qg16,
        value_dim,
        &[
            ("qg16", bufs.qg16),
            ("gated16", bufs.gated16),
            ("states16", bufs.states16),
            ("vprime16", bufs.vprime16),
        ],
    )?;
    Launch {
        name: "chunk_output_coop",
        source: source(Pass::ChunkOutputCoop, bufs.o.dtype)?,
        entry: "chunk_output_coop",
        constants: &[],
        bindings: Bindings::Ordered(&[
            params,
            bufs.qg16,
            bufs.gated16,
            bufs.chunks,
            bufs.states16,
            bufs.vprime16,
            bufs.o,
        ]),
        grid: Grid([
            (value_dim / COOP_V_BLOCK, "V-blocks"),
            (heads_v, "v-heads"),
            (num_chunks, "chunks"),
        ]),
    }
    .record(ctx, encoder)
}
