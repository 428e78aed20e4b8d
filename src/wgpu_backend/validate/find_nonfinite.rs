//! Launcher of `shaders/validate/find_nonfinite.wgsl`: the first non-finite (or, for
//! log-decays, positive) element of a tensor.

use crate::error::{Error, Result};
use crate::tensor::DType;
use crate::wgpu_backend::launch::{Bindings, Grid, Launch};
use crate::wgpu_backend::params::Params;
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::{Context, GpuTensor};

/// The pipeline's override constants for a storage dtype (public so the shader tests
/// specialize every variant).
pub fn find_nonfinite_constants(dtype: DType, reject_positive: bool) -> [(&'static str, f64); 3] {
    let (bits, exponent) = match dtype {
        DType::F32 => (32.0, 0x7f80_0000),
        DType::F16 => (16.0, 0x7c00),
        DType::BF16 => (16.0, 0x7f80),
    };
    [
        ("ELEMENT_BITS", bits),
        ("EXPONENT_MASK", exponent as f64),
        ("REJECT_POSITIVE", if reject_positive { 1.0 } else { 0.0 }),
    ]
}

/// Record a search of `tensor` for its first NaN or ±Inf (and, with `reject_positive`, its
/// first value > 0): the flat index is atomically minimised into `first_bad`, one u32 the
/// caller sets to `u32::MAX` beforehand. One pass binds the tensor whole, so it must fit one
/// binding; [`FiniteCheck`](super::FiniteCheck) searches larger tensors view by view.
pub fn find_nonfinite(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    name: &str,
    tensor: &GpuTensor,
    reject_positive: bool,
    first_bad: &wgpu::Buffer,
) -> Result<()> {
    if tensor.is_empty() {
        return Ok(());
    }
    // The search binds the whole tensor (its view's range): one binding's worth at most (a
    // tensor in several buffers is always larger than that).
    if tensor.buffers().len() > 1 {
        return Err(Error::TooLarge {
            name: name.into(),
            bytes: tensor.bytes(),
            limit_name: "max_storage_buffer_binding_size",
            limit: ctx.max_binding_bytes(),
        });
    }
    let elements = u32::try_from(tensor.len())
        .map_err(|_| Error::value(name, "at most 2³² − 1 elements", tensor.len()))?;
    let params = Params {
        rows: elements,
        ..Params::default()
    }
    .upload(ctx);
    let words = (tensor.bytes() as usize).div_ceil(4);
    Launch {
        name: "find_nonfinite",
        source: source(Pass::FindNonfinite, DType::F32)?,
        entry: "find_nonfinite",
        constants: &find_nonfinite_constants(tensor.dtype, reject_positive),
        bindings: Bindings::Ordered(&[&params, tensor, first_bad]),
        grid: Grid::items_64(words, "words of the tensor"),
    }
    .record(ctx, encoder)
}
