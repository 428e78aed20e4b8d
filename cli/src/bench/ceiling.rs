//! The decode's bandwidth ceiling: a streaming vec4 compute-shader copy
//! ([`gdn_wgpu::wgpu_backend::timing::CopyCeiling`]) of the case's state pool (the bytes a
//! decode step over every slot reads and writes), one copy of each shape timed after every
//! decode repetition (`time_gpu`); this module holds its diagnosis.

use gdn_wgpu::tensor::DType;
use gdn_wgpu::wgpu_backend::{Context, GpuTensor, timing};

/// Diagnosis of the ceiling (`GDN_BENCH_CEILING_TRACE`), to stderr: the interleaved copies
/// per shape, then copies recorded back to back in one submission, of the pool and of a
/// fresh buffer of its size (the former ceiling), each with a wall-clock stamp.
pub fn trace(
    ctx: &Context,
    interleaved: &timing::CopyCeiling,
    pool: Option<(&wgpu::Buffer, u64)>,
    pool_bytes: u64,
) -> gdn_wgpu::Result<()> {
    let stamp = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64())
    };
    for (per, median, fastest, slowest, n) in interleaved.shapes_gbps() {
        eprintln!(
            "[{:.3}] ceiling interleaved pool per={per} median {median:.0} GB/s (fastest {fastest:.0}, slowest {slowest:.0}, {n} copies)",
            stamp()
        );
    }
    if let Some(c) = pool.and_then(|(buffer, bytes)| timing::CopyCeiling::new(ctx, buffer, bytes)) {
        for (per, g) in c.time_back_to_back(ctx, 50)? {
            eprintln!(
                "[{:.3}] ceiling back-to-back pool per={per} {g:.0} GB/s",
                stamp()
            );
        }
    }
    let floats = (pool_bytes / 4).max(4) as usize;
    let src = GpuTensor::filled(ctx, "copy source", &[floats], DType::F32, 1.0)?;
    if let Some(mut c) = timing::CopyCeiling::new(ctx, &src.buffer, src.bytes()) {
        for (per, g) in c.time_back_to_back(ctx, 50)? {
            eprintln!(
                "[{:.3}] ceiling back-to-back fresh per={per} {g:.0} GB/s",
                stamp()
            );
        }
        c.time_once(ctx, false)?;
        for _ in 0..20 {
            c.time_once(ctx, true)?;
        }
        for (per, median, fastest, slowest, n) in c.shapes_gbps() {
            eprintln!(
                "[{:.3}] ceiling one-per-submit fresh per={per} median {median:.0} GB/s (fastest {fastest:.0}, slowest {slowest:.0}, {n} copies)",
                stamp()
            );
        }
    }
    Ok(())
}
