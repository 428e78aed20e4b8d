//! Launcher of `shaders/backward/qk_finish.wgsl`: GVA group sums of dq, dk and the l2norm
//! backward onto the raw q, k; and its `dv_finish` entry point, dv into the storage dtype.

use crate::error::Result;
use crate::wgpu_backend::params::{dispatch, grid_1d};
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::{Context, GpuTensor};

/// One bind group from `(binding, buffer)` pairs of group 0 of `pipeline` (an entry point
/// that uses some of its module's bindings).
fn bind_at(
    ctx: &Context,
    pipeline: &wgpu::ComputePipeline,
    label: &str,
    buffers: &[(u32, &wgpu::Buffer)],
) -> wgpu::BindGroup {
    let entries: Vec<wgpu::BindGroupEntry> = buffers
        .iter()
        .map(|&(binding, b)| wgpu::BindGroupEntry {
            binding,
            resource: b.as_entire_binding(),
        })
        .collect();
    ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some(label),
        layout: &pipeline.get_bind_group_layout(0),
        entries: &entries,
    })
}

/// Workgroups for `groups` workgroups of a 1-D pass, folded into two dimensions past 65535.
fn fold(groups: u32) -> (u32, u32, u32) {
    let groups = groups.max(1);
    if groups <= 65535 {
        (groups, 1, 1)
    } else {
        (65535, groups.div_ceil(65535), 1)
    }
}

/// Record `dq`, `dk` `[B,T,H,K]` (the dtype of q) from the per-v-head `dqk_parts`; `q_raw`,
/// `k_raw` are the forward's raw inputs (read only with `l2norm_qk`).
#[allow(clippy::too_many_arguments)]
pub fn qk_finish(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    q_raw: &GpuTensor,
    k_raw: &GpuTensor,
    dqk_parts: &GpuTensor,
    dq: &GpuTensor,
    dk: &GpuTensor,
) -> Result<()> {
    let pipeline = ctx
        .pipelines
        .get(source(Pass::QkFinish, q_raw.dtype)?, "qk_finish", &[]);
    let bg = bind_at(
        ctx,
        &pipeline,
        "qk_finish",
        &[
            (0, params),
            (1, &q_raw.buffer),
            (2, &k_raw.buffer),
            (3, &dqk_parts.buffer),
            (4, &dq.buffer),
            (5, &dk.buffer),
        ],
    );
    // Four head vectors per workgroup.
    let rows = (dq.len() / dq.shape[dq.shape.len() - 1]) as u32;
    dispatch(encoder, "qk_finish", &pipeline, &bg, fold(rows.div_ceil(4)));
    Ok(())
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
    let pipeline = ctx
        .pipelines
        .get(source(Pass::QkFinish, dv.dtype)?, "dv_finish", &[]);
    let bg = bind_at(
        ctx,
        &pipeline,
        "dv_finish",
        &[(0, params), (6, &dvnew_dv.buffer), (7, &dv.buffer)],
    );
    dispatch(
        encoder,
        "dv_finish",
        &pipeline,
        &bg,
        grid_1d((dv.len() / 2) as u32),
    );
    Ok(())
}
