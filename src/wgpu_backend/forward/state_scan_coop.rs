//! Launcher of `shaders/forward/state_scan_coop.wgsl`: the sequential scan with its chunk GEMMs
//! on f16 cooperative matrices (f32 accumulators), writing o and each segment's end state.

use crate::error::Result;
use crate::wgpu_backend::coop_scan::{
    check_coop_shapes, coop_scan_grid, head_constants, k_variant,
};
use crate::wgpu_backend::launch::{Bindings, Launch};
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::{Context, GpuTensor};

/// The tensors the coop scan reads and writes.
pub struct CoopScanBuffers<'a> {
    /// `[B·T + 64, HV, K]` f16: γ ⊙ q per v-head (see `gate_q`).
    pub qg16: &'a GpuTensor,
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
    /// Whether `segments` has a row per (segment, v-head) (the gate-driven window's tables:
    /// a row of length 0 skips its workgroups).
    pub segments_per_head: bool,
    /// Start states on entry, end states on exit.
    pub state: &'a GpuTensor,
    /// `[B,T,HV,V]` (written), in the dtype of v.
    pub o: &'a GpuTensor,
}

/// Record the coop scan over `num_segments` segments (K = 128, V a multiple of 32).
pub fn state_scan_coop(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    bufs: &CoopScanBuffers<'_>,
    num_segments: usize,
    heads_v: usize,
) -> Result<()> {
    let value_dim = bufs.v.shape[bufs.v.shape.len() - 1];
    check_coop_shapes(
        "the coop scan",
        bufs.k16,
        value_dim,
        &[
            ("qg16", bufs.qg16),
            ("k16", bufs.k16),
            ("gated16", bufs.gated16),
        ],
    )?;
    Launch {
        name: "state_scan_coop",
        source: source(k_variant(ctx, Pass::StateScanCoop), bufs.v.dtype)?,
        entry: "state_scan_coop",
        constants: &[
            head_constants(ctx, bufs.k16, heads_v).as_slice(),
            if bufs.segments_per_head {
                &[("SEGMENTS_PER_HEAD", 1.0)]
            } else {
                &[]
            },
        ]
        .concat(),
        bindings: Bindings::Ordered(&[
            params,
            bufs.qg16,
            bufs.k16,
            bufs.v,
            bufs.gate_beta,
            bufs.gated16,
            bufs.segments,
            bufs.state,
            bufs.o,
        ]),
        grid: coop_scan_grid(num_segments, heads_v, value_dim),
    }
    .record(ctx, encoder)
}
