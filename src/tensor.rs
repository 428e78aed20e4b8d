//! Host tensors and element types shared by every backend.

use std::fmt;

/// Element type of a tensor in storage. Arithmetic is f32 (GPU) or f64 (oracle) whatever the
/// storage type; states, gate cumsums and accumulators are always f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE single precision, 4 bytes.
    F32,
    /// IEEE half precision, 2 bytes.
    F16,
    /// bfloat16 (f32's exponent, 8-bit mantissa), 2 bytes.
    BF16,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// The safetensors spelling (`F32`, `F16`, `BF16`), also what `Display` prints.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What validation needs to know about a tensor, on any backend.
pub trait TensorMeta {
    /// Dimensions, outermost first (row-major).
    fn shape(&self) -> &[usize];
    /// The storage element type.
    fn dtype(&self) -> DType;
    /// Check that the storage holds the elements the shape says (a host tensor's `data`, a GPU
    /// tensor's buffer): kernels and the oracle index by shape, so a short storage would be
    /// read or written out of bounds. `name` is the tensor as the error names it.
    fn check_storage(&self, name: &str) -> crate::Result<()> {
        let _ = name;
        Ok(())
    }
}

/// Elements of `shape`, or an error naming `name` when the product overflows `usize`.
pub fn element_count(name: &str, shape: &[usize]) -> crate::Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| {
            crate::Error::value(
                name,
                "a shape whose element count fits in usize",
                format!("{shape:?}"),
            )
        })
}

/// A tensor in host memory. Values are held as f32 (f16 and bf16 convert to f32 exactly);
/// `dtype` records the storage type the values came from or should be written as.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    /// Dimensions, outermost first; `data` is row-major in this shape.
    pub shape: Vec<usize>,
    /// The storage dtype the values came from or will be written as.
    pub dtype: DType,
    /// The values as f32, `shape.iter().product()` of them.
    pub data: Vec<f32>,
}

impl HostTensor {
    /// An f32 tensor; `data.len()` must equal the product of `shape`.
    pub fn new(shape: impl Into<Vec<usize>>, data: Vec<f32>) -> Self {
        let shape = shape.into();
        assert_eq!(
            shape.iter().product::<usize>(),
            data.len(),
            "HostTensor::new: shape and data length differ"
        );
        HostTensor {
            shape,
            dtype: DType::F32,
            data,
        }
    }

    /// Same values, recorded as stored in `dtype` (values are rounded to it).
    pub fn with_dtype(mut self, dtype: DType) -> Self {
        self.dtype = dtype;
        round_to_dtype(&mut self.data, dtype);
        self
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// True when the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}

impl TensorMeta for HostTensor {
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn check_storage(&self, name: &str) -> crate::Result<()> {
        let len = element_count(name, &self.shape)?;
        if self.data.len() != len {
            return Err(crate::Error::value(
                name,
                format!("{len} values (shape {:?})", self.shape),
                format!("{} values", self.data.len()),
            ));
        }
        Ok(())
    }
}

/// Round f32 values to what `dtype` can hold (round to nearest even), in place.
pub fn round_to_dtype(values: &mut [f32], dtype: DType) {
    match dtype {
        DType::F32 => {}
        DType::F16 => values
            .iter_mut()
            .for_each(|x| *x = half::f16::from_f32(*x).to_f32()),
        DType::BF16 => values
            .iter_mut()
            .for_each(|x| *x = half::bf16::from_f32(*x).to_f32()),
    }
}

/// Relative L2 error `‖actual − expected‖₂ / ‖expected‖₂`, in f64. When `expected` is all zeros
/// the absolute L2 norm of the difference is returned. NaN anywhere gives NaN (so tests fail).
pub fn relative_l2(actual: &[f32], expected: &[f64]) -> f64 {
    relative_l2_scaled(actual, expected, expected)
}

/// `‖actual − expected‖₂ / ‖scale‖₂`, in f64: the L2 error relative to a scale other than the
/// expected value. For a sum, pass the sums of its terms' magnitudes (Σ|terms| per element, as
/// the oracle's `da_log_magnitude` gives): a sum whose terms each carry a relative error ≤ ε is
/// within ε·Σ|terms| however much they cancel, so this measure bounds it by its terms' error,
/// where `relative_l2` grows with the cancellation Σ|terms| / |Σ terms|. When `scale` is all
/// zeros the absolute L2 norm of the difference is returned; NaN anywhere in `actual` gives NaN.
pub fn relative_l2_scaled(actual: &[f32], expected: &[f64], scale: &[f64]) -> f64 {
    assert_eq!(actual.len(), expected.len(), "relative_l2: lengths differ");
    assert_eq!(
        scale.len(),
        expected.len(),
        "relative_l2: scale length differs"
    );
    if actual.iter().any(|a| !a.is_finite()) {
        return f64::NAN;
    }
    let num: f64 = actual
        .iter()
        .zip(expected)
        .map(|(&a, &e)| (a as f64 - e).powi(2))
        .sum();
    let den: f64 = scale.iter().map(|s| s * s).sum();
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}
