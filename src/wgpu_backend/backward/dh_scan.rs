//! Launcher of `shaders/backward/dh_scan.wgsl`: the reverse inter-chunk scan of the state
//! gradient, writing dh per chunk, dh0, dV' and dv.

use crate::error::Result;
use crate::wgpu_backend::backward::dh_scan_tiling;
use crate::wgpu_backend::forward::ScanDims;
use crate::wgpu_backend::launch::{Bindings, Grid, Launch};
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::{Context, GpuTensor};

/// The tensors the reverse scan reads and writes.
pub struct DhScanBuffers<'a> {
    /// `[B,T,H,K]` q in the storage dtype (normalized with `l2norm_qk`).
    pub q: &'a GpuTensor,
    /// `[B,T,H,K]` k in the storage dtype (normalized with `l2norm_qk`).
    pub k: &'a GpuTensor,
    /// `[B·T, HV, 2]` f32: the forward's (G, β).
    pub gate_beta: &'a GpuTensor,
    /// `[B·T, HV, 128]` f32: rows of Γ⊙A⊙β, then Γ⊙QKᵀ (the forward's `wy_inverse` output).
    pub gated: &'a GpuTensor,
    /// `[B,T,HV,V]`: the upstream gradient of o, in the dtype of v.
    pub d_o: &'a GpuTensor,
    /// Segment table: (start token, length, first chunk, sequence) per segment.
    pub segments: &'a wgpu::Buffer,
    /// `[chunks + N, HV, K, V]`: dht (or 0) in the tail slots on entry, dh0 there on exit, and
    /// the gradient w.r.t. each chunk's end state in its slot.
    pub dstates: &'a GpuTensor,
    /// `[2, B·T, HV, V]` f32: dV', then dv.
    pub dvnew_dv: &'a GpuTensor,
}

/// Record the reverse scan (`dims.v_block` from [`scan_v_block`](super::scan_v_block)).
pub fn dh_scan(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    bufs: &DhScanBuffers<'_>,
    dims: ScanDims,
) -> Result<()> {
    let (key_dim, v_block) = (dims.key_dim, dims.v_block);
    let (t_slice, arena) = dh_scan_tiling(v_block, key_dim as u32, ctx.tuning().workgroup_bytes);
    Launch {
        name: "dh_scan",
        source: source(Pass::DhScan, bufs.q.dtype)?,
        entry: "dh_scan",
        constants: &[
            ("K_DIM", key_dim as f64),
            ("V_BLOCK", v_block as f64),
            ("ARENA", arena as f64),
            ("T_SLICE", t_slice as f64),
        ],
        bindings: Bindings::Ordered(&[
            params,
            bufs.q,
            bufs.k,
            bufs.gate_beta,
            bufs.gated,
            bufs.d_o,
            bufs.segments,
            bufs.dstates,
            bufs.dvnew_dv,
        ]),
        // The V-block divides V (`scan_v_block`).
        grid: Grid([
            (dims.num_segments, "segments"),
            (dims.heads_v, "v-heads"),
            (dims.value_dim / v_block as usize, "V-blocks"),
        ]),
    }
    .record(ctx, encoder)
}
