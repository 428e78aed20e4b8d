//! Launcher of `shaders/forward/state_chain_coop.wgsl`: the split coop forward's sequential
//! chain — V' and the chunk-start states (f16, for `chunk_output_coop`), and each segment's
//! end state; no o.

use crate::error::Result;
use crate::wgpu_backend::coop_scan::{check_coop_shapes, coop_scan_grid, head_constants};
use crate::wgpu_backend::launch::{Bindings, Launch};
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::{Context, GpuTensor};

/// Workgroup bytes the chain declares (s16, x16 in f16 and the whole-state staging tile in f32,
/// rows padded to 40 elements; the zero tile, γ and the decays in f32): a device with less
/// runs the one-pass coop scan.
pub const STATE_CHAIN_COOP_BYTES: u32 = 2 * (128 + 64) * 40 + 4 * (128 * 40 + 256 + 64 + 64);

/// The tensors the chain reads and writes.
pub struct CoopChainBuffers<'a> {
    /// `[B·T + 64, H, K]` f16 (see `to_half`).
    pub k16: &'a GpuTensor,
    /// `[B,T,HV,V]` in the storage dtype.
    pub v: &'a GpuTensor,
    /// `[B·T, HV, 2]` f32: (G, β) from `prepare_gate`.
    pub gate_beta: &'a GpuTensor,
    /// `[B·T + 64, HV, 128]` f16: Γ⊙A⊙β | Γ⊙QKᵀ rows from wy_inverse, padding rows zero.
    pub gated16: &'a GpuTensor,
    /// Segment table: (start token, length, state slot) per segment, or per (segment, v-head)
    /// with `segments_per_head`.
    pub segments: &'a wgpu::Buffer,
    /// Whether `segments` has a row per (segment, v-head).
    pub segments_per_head: bool,
    /// Start states on entry, end states on exit.
    pub state: &'a GpuTensor,
    /// Per segment: the ordinal (row of the chunk table) of its first chunk; `None`: a scan
    /// whose o is not wanted, which stores only the end states (`states16` and `vprime16`
    /// are bound but not written).
    pub chunk_base: Option<&'a wgpu::Buffer>,
    /// `[chunks, HV, K, V]` f16: each chunk's start state.
    pub states16: &'a GpuTensor,
    /// `[B·T + 64, HV, V]` f16: V'.
    pub vprime16: &'a GpuTensor,
}

/// Record the chain over `num_segments` segments (K = 128, V a multiple of 32).
pub fn state_chain_coop(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    bufs: &CoopChainBuffers<'_>,
    num_segments: usize,
    heads_v: usize,
) -> Result<()> {
    let value_dim = bufs.v.shape[bufs.v.shape.len() - 1];
    check_coop_shapes(
        "the coop scan",
        bufs.k16,
        value_dim,
        &[("k16", bufs.k16), ("gated16", bufs.gated16)],
    )?;
    let per_head = if bufs.segments_per_head { 1.0 } else { 0.0 };
    let store = if bufs.chunk_base.is_some() { 1.0 } else { 0.0 };
    Launch {
        name: "state_chain_coop",
        source: source(Pass::StateChainCoop, bufs.v.dtype)?,
        entry: "state_chain_coop",
        constants: &[
            head_constants(ctx, bufs.k16, heads_v).as_slice(),
            &[("SEGMENTS_PER_HEAD", per_head), ("STORE_CHUNKS", store)],
        ]
        .concat(),
        bindings: Bindings::Ordered(&[
            params,
            bufs.k16,
            bufs.v,
            bufs.gate_beta,
            bufs.gated16,
            bufs.segments,
            bufs.state,
            bufs.chunk_base.unwrap_or(bufs.segments),
            bufs.states16,
            bufs.vprime16,
        ]),
        grid: coop_scan_grid(num_segments, heads_v, value_dim),
    }
    .record(ctx, encoder)
}
