//! Launcher of `shaders/forward/wy_inverse.wgsl`: the gate-free WY inverse per chunk and v-head.

use crate::error::{Error, Result};
use crate::tensor::DType;
use crate::wgpu_backend::params::{bind, dispatch};
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::{Context, GpuTensor};

/// Record `A = (I + strict_lower(diag(β) K Kᵀ))⁻¹` for every chunk (`a`: `[B·T, HV, 64]` f32)
/// and the scan's gated matrices (`gated`: `[B·T, HV, 128]`, rows of Γ⊙A⊙β then Γ⊙QKᵀ): f32
/// for the scalar scan, f16 for the coop scan (which may give it padding rows past B·T).
#[allow(clippy::too_many_arguments)]
pub fn wy_inverse(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    k: &GpuTensor,
    q: &GpuTensor,
    gate_beta: &GpuTensor,
    chunks: &wgpu::Buffer,
    num_chunks: usize,
    heads_v: usize,
    a: &GpuTensor,
    gated: &GpuTensor,
) -> Result<()> {
    let max = ctx.limits().max_compute_workgroups_per_dimension as usize;
    if num_chunks > max {
        return Err(Error::TooLarge {
            name: "chunks".into(),
            bytes: num_chunks as u64,
            limit_name: "max_compute_workgroups_per_dimension (chunks)",
            limit: max as u64,
        });
    }
    let key_dim = k.shape[k.shape.len() - 1];
    let pass = match gated.dtype {
        DType::F32 => Pass::WyInverse,
        DType::F16 => Pass::WyInverseCoop,
        other => {
            return Err(Error::DType {
                name: "gated".into(),
                expected: "F32 or F16".into(),
                got: other.to_string(),
            });
        }
    };
    let pipeline = ctx.pipelines.get(
        source(pass, k.dtype)?,
        "wy_inverse",
        &[("K_DIM", key_dim as f64)],
    );
    let bg = bind(
        ctx,
        &pipeline,
        "wy_inverse",
        &[
            params,
            &k.buffer,
            &q.buffer,
            &gate_beta.buffer,
            chunks,
            &a.buffer,
            &gated.buffer,
        ],
    );
    dispatch(
        encoder,
        "wy_inverse",
        &pipeline,
        &bg,
        (num_chunks as u32, heads_v as u32, 1),
    );
    Ok(())
}
