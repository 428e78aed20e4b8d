//! safetensors files ↔ host tensors.
//!
//! Float tensors (F32, F16, BF16) read into [`HostTensor`]s holding f32 values with the stored
//! dtype recorded, and are written back in their recorded dtype. Integer tensors (I32, I64:
//! `cu_seqlens`) read into [`IntTensor`]s. Tensors are converted on request, so a tensor of an
//! unsupported dtype is only an error when asked for, and the error names it.

use std::path::Path;

use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::{Dtype, SafeTensors, View};

use crate::error::{Error, Result};
use crate::tensor::{DType, HostTensor};

/// Bytes of the little-endian header length that opens every safetensors file.
const HEADER_LEN_BYTES: usize = 8;

/// Element type of an integer tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntDType {
    /// 32-bit signed; widened to i64 on read, narrowed back on write.
    I32,
    /// 64-bit signed.
    I64,
}

/// An integer tensor (e.g. `cu_seqlens`), values widened to i64.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntTensor {
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// The stored integer type, kept so the tensor is written back as it was read.
    pub dtype: IntDType,
    /// The values, row-major, widened to i64.
    pub data: Vec<i64>,
}

/// A safetensors file in memory, its header parsed and checked.
#[derive(Debug)]
pub struct TensorFile {
    path: String,
    bytes: Vec<u8>,
    metadata: Metadata,
    /// Offset of the data section (tensor offsets are relative to it).
    data_start: usize,
}

impl TensorFile {
    /// Read and parse `path`. The header (names, dtypes, shapes, offsets) is validated here;
    /// tensor data is converted by [`TensorFile::float`] and [`TensorFile::int`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().display().to_string();
        let bytes = std::fs::read(&path).map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?;
        let (header_len, metadata) =
            SafeTensors::read_metadata(&bytes).map_err(|e| Error::Safetensors {
                path: path.clone(),
                msg: e.to_string(),
            })?;
        Ok(TensorFile {
            path,
            bytes,
            metadata,
            data_start: HEADER_LEN_BYTES + header_len,
        })
    }

    /// The path the file was opened from, as error messages show it.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Tensor names, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.metadata.tensors().into_keys().collect();
        names.sort_unstable();
        names
    }

    /// The float tensor `name` (F32, F16 or BF16), or `None` when the file has no such tensor.
    pub fn float(&self, name: &str) -> Result<Option<HostTensor>> {
        let Some((info, bytes)) = self.raw(name) else {
            return Ok(None);
        };
        let (dtype, data) = match info.dtype {
            Dtype::F32 => (DType::F32, words(bytes).map(f32::from_le_bytes).collect()),
            Dtype::F16 => (
                DType::F16,
                words(bytes)
                    .map(|b| half::f16::from_le_bytes(b).to_f32())
                    .collect(),
            ),
            Dtype::BF16 => (
                DType::BF16,
                words(bytes)
                    .map(|b| half::bf16::from_le_bytes(b).to_f32())
                    .collect(),
            ),
            other => return Err(dtype_error(name, "F32, F16 or BF16", other)),
        };
        Ok(Some(HostTensor {
            shape: info.shape.clone(),
            dtype,
            data,
        }))
    }

    /// The integer tensor `name` (I32 or I64), or `None` when the file has no such tensor.
    pub fn int(&self, name: &str) -> Result<Option<IntTensor>> {
        let Some((info, bytes)) = self.raw(name) else {
            return Ok(None);
        };
        let (dtype, data) = match info.dtype {
            Dtype::I32 => (
                IntDType::I32,
                words(bytes).map(|b| i32::from_le_bytes(b) as i64).collect(),
            ),
            Dtype::I64 => (
                IntDType::I64,
                words(bytes).map(i64::from_le_bytes).collect(),
            ),
            other => return Err(dtype_error(name, "I32 or I64", other)),
        };
        Ok(Some(IntTensor {
            shape: info.shape.clone(),
            dtype,
            data,
        }))
    }

    fn raw(&self, name: &str) -> Option<(&TensorInfo, &[u8])> {
        let info = self.metadata.info(name)?;
        let (start, end) = info.data_offsets;
        // read_metadata checked that the offsets tile the data section exactly.
        Some((
            info,
            &self.bytes[self.data_start + start..self.data_start + end],
        ))
    }
}

/// Little-endian words of `N` bytes (the data section need not be aligned for the type).
fn words<const N: usize>(bytes: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
    bytes
        .chunks_exact(N)
        .map(|w| w.try_into().expect("chunks_exact yields N bytes"))
}

fn dtype_error(name: &str, expected: &str, got: Dtype) -> Error {
    Error::DType {
        name: name.into(),
        expected: expected.into(),
        got: got.to_string(),
    }
}

/// A tensor to write: float (in its recorded dtype) or integer.
#[derive(Debug, Clone, Copy)]
pub enum TensorRef<'a> {
    /// A float tensor, written in its recorded dtype.
    Float(&'a HostTensor),
    /// An integer tensor, written in its recorded integer dtype.
    Int(&'a IntTensor),
}

impl<'a> From<&'a HostTensor> for TensorRef<'a> {
    fn from(t: &'a HostTensor) -> Self {
        TensorRef::Float(t)
    }
}

impl<'a> From<&'a IntTensor> for TensorRef<'a> {
    fn from(t: &'a IntTensor) -> Self {
        TensorRef::Int(t)
    }
}

/// A tensor encoded for safetensors.
struct Encoded {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl View for &Encoded {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        (&self.bytes[..]).into()
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

fn encode(name: &str, tensor: TensorRef<'_>) -> Result<Encoded> {
    let (shape, len) = match tensor {
        TensorRef::Float(t) => (&t.shape, t.data.len()),
        TensorRef::Int(t) => (&t.shape, t.data.len()),
    };
    let expected_len: usize = shape.iter().product();
    if len != expected_len {
        return Err(Error::value(
            name,
            format!("{expected_len} values for shape {shape:?}"),
            len,
        ));
    }
    let (dtype, bytes): (Dtype, Vec<u8>) = match tensor {
        TensorRef::Float(t) => match t.dtype {
            DType::F32 => (
                Dtype::F32,
                t.data.iter().flat_map(|x| x.to_le_bytes()).collect(),
            ),
            DType::F16 => (
                Dtype::F16,
                t.data
                    .iter()
                    .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                    .collect(),
            ),
            DType::BF16 => (
                Dtype::BF16,
                t.data
                    .iter()
                    .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
                    .collect(),
            ),
        },
        TensorRef::Int(t) => match t.dtype {
            IntDType::I64 => (
                Dtype::I64,
                t.data.iter().flat_map(|x| x.to_le_bytes()).collect(),
            ),
            IntDType::I32 => {
                let narrow = |&x: &i64| {
                    i32::try_from(x).map_err(|_| Error::value(name, "values that fit I32", x))
                };
                let values = t.data.iter().map(narrow).collect::<Result<Vec<i32>>>()?;
                (
                    Dtype::I32,
                    values.iter().flat_map(|x| x.to_le_bytes()).collect(),
                )
            }
        },
    };
    Ok(Encoded {
        dtype,
        shape: shape.clone(),
        bytes,
    })
}

/// Write `tensors` to `path` as a safetensors file, floats in their recorded dtype (values
/// round to nearest even for F16/BF16). The file appears whole or not at all: it is written
/// beside `path` under a temporary name and renamed, so a failed write (a full disk, a
/// missing folder) leaves no partial file and an existing file at `path` as it was. Devices
/// and pipes (`/dev/null`) are written in place.
pub fn write<'a>(
    path: impl AsRef<Path>,
    tensors: impl IntoIterator<Item = (&'a str, TensorRef<'a>)>,
) -> Result<()> {
    let path = path.as_ref().display().to_string();
    let encoded = tensors
        .into_iter()
        .map(|(name, t)| Ok((name, encode(name, t)?)))
        .collect::<Result<Vec<_>>>()?;
    let bytes =
        safetensors::serialize(encoded.iter().map(|(name, e)| (*name, e)), None).map_err(|e| {
            Error::Safetensors {
                path: path.clone(),
                msg: e.to_string(),
            }
        })?;
    // A device or pipe (`/dev/null`, `/dev/stdout`) is written in place: renaming over it
    // would replace it with a regular file.
    if std::fs::metadata(&path).is_ok_and(|m| !m.is_file() && !m.is_dir()) {
        return std::fs::write(&path, bytes).map_err(|source| Error::Io { path, source });
    }
    let temporary = temporary_sibling(Path::new(&path));
    let written =
        std::fs::write(&temporary, bytes).and_then(|()| std::fs::rename(&temporary, &path));
    if let Err(source) = written {
        let _ = std::fs::remove_file(&temporary);
        return Err(Error::Io { path, source });
    }
    Ok(())
}

/// `dir/.name.tmp-PID` beside `path`: the same file system, so the rename is atomic.
fn temporary_sibling(path: &Path) -> std::path::PathBuf {
    let name = path
        .file_name()
        .map_or_else(|| "output".into(), |n| n.to_string_lossy().into_owned());
    path.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}
