//! The decode's bandwidth ceiling, measured in the same process as the decode case: a
//! streaming vec4 compute-shader copy ([`gdn_wgpu::wgpu_backend::timing::copy_gbps`]) of a
//! buffer the size of the case's state pool (the same bytes a decode step over every slot
//! reads and writes).

use gdn_wgpu::tensor::DType;
use gdn_wgpu::wgpu_backend::{Context, GpuTensor, timing};

/// GB/s (read + write, 10⁹ B/s) of a copy of `pool_bytes`, each the median of `reps` copies;
/// `None` without timestamp queries.
pub fn copy_gbps(ctx: &Context, pool_bytes: u64, reps: usize) -> gdn_wgpu::Result<Option<f64>> {
    let floats = (pool_bytes / 4).max(4) as usize;
    let src = GpuTensor::filled(ctx, "copy source", &[floats], DType::F32, 1.0)?;
    timing::copy_gbps(ctx, &src.buffer, src.bytes(), reps)
}
