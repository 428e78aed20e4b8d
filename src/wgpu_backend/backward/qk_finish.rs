//! Launcher of `shaders/backward/qk_finish.wgsl`: GVA group sums of dq, dk and the l2norm
//! backward onto the raw q, k; and its `dv_finish` entry point, dv into the storage dtype.

use crate::error::Result;
use crate::wgpu_backend::launch::{Bindings, Grid, Launch};
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::{Context, GpuTensor};

/// The tensors `qk_finish` reads and writes.
pub struct QkFinishBuffers<'a> {
    /// The forward's raw q `[B,T,H,K]` (read only with `l2norm_qk`).
    pub q_raw: &'a GpuTensor,
    /// The forward's raw k `[B,T,H,K]` (read only with `l2norm_qk`).
    pub k_raw: &'a GpuTensor,
    /// dq, dk per v-head from `qk_grad`.
    pub dqk_parts: &'a GpuTensor,
    /// `[B,T,H,K]` in the dtype of q (written).
    pub dq: &'a GpuTensor,
    /// `[B,T,H,K]` in the dtype of k (written).
    pub dk: &'a GpuTensor,
}

/// Record `dq`, `dk` from the per-v-head `dqk_parts`.
pub fn qk_finish(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    bufs: &QkFinishBuffers<'_>,
) -> Result<()> {
    let dq = bufs.dq;
    let rows = dq.len() / dq.shape[dq.shape.len() - 1];
    Launch {
        name: "qk_finish",
        source: source(Pass::QkFinish, bufs.q_raw.dtype)?,
        entry: "qk_finish",
        constants: &[],
        // The entry point uses bindings 0–5 of its module.
        bindings: Bindings::At(&[
            (0, params),
            (1, bufs.q_raw),
            (2, bufs.k_raw),
            (3, bufs.dqk_parts),
            (4, dq),
            (5, bufs.dk),
        ]),
        // Four head vectors per workgroup.
        grid: Grid::folded(rows.div_ceil(4), "groups of four head vectors"),
    }
    .record(ctx, encoder)
}

/// Record `dv` (`[B,T,HV,V]`, its own dtype) from the second half of the f32 `dvnew_dv`
/// workspace (`[2, B·T, HV, V]`).
pub fn dv_finish(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    dvnew_dv: &GpuTensor,
    dv: &GpuTensor,
) -> Result<()> {
    Launch {
        name: "dv_finish",
        source: source(Pass::QkFinish, dv.dtype)?,
        entry: "dv_finish",
        constants: &[],
        // The entry point uses bindings 0, 6 and 7 of its module.
        bindings: Bindings::At(&[(0, params), (6, dvnew_dv), (7, dv)]),
        // Two elements per invocation.
        grid: Grid::items_64(dv.len() / 2, "element pairs of dv"),
    }
    .record(ctx, encoder)
}
