//! Device tensors: raw bytes in the storage dtype (f32, or the bits of f16/bf16).

use cudarc::driver::CudaSlice;

use super::context::{Context, driver_error};
use crate::error::{Error, Result};
use crate::tensor::{DType, HostTensor, TensorMeta};

/// A tensor in device memory on a [`Context`].
#[derive(Debug)]
pub struct CudaTensor {
    shape: Vec<usize>,
    dtype: DType,
    buf: CudaSlice<u8>,
}

impl TensorMeta for CudaTensor {
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn dtype(&self) -> DType {
        self.dtype
    }
}

fn encode(values: &[f32], dtype: DType) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(values.len() * dtype.size());
    for &x in values {
        match dtype {
            DType::F32 => bytes.extend_from_slice(&x.to_le_bytes()),
            DType::F16 => bytes.extend_from_slice(&half::f16::from_f32(x).to_bits().to_le_bytes()),
            DType::BF16 => {
                bytes.extend_from_slice(&half::bf16::from_f32(x).to_bits().to_le_bytes())
            }
        }
    }
    bytes
}

fn decode(bytes: &[u8], dtype: DType) -> Vec<f32> {
    match dtype {
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
            .collect(),
        DType::BF16 => bytes
            .chunks_exact(2)
            .map(|b| half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
            .collect(),
    }
}

impl CudaTensor {
    /// Copy `values` (rounded to `dtype`) to the device: enqueued on the context's stream.
    pub fn from_values(
        ctx: &Context,
        name: &str,
        shape: &[usize],
        dtype: DType,
        values: &[f32],
    ) -> Result<Self> {
        let len: usize = shape.iter().product();
        if values.len() != len {
            return Err(Error::shape(name, shape, &[values.len()]));
        }
        // A zero-byte allocation is refused by the driver; one spare byte is never read.
        let mut bytes = encode(values, dtype);
        if bytes.is_empty() {
            bytes.push(0);
        }
        let buf = ctx
            .stream()
            .clone_htod(&bytes)
            .map_err(|e| driver_error(&format!("upload of {name}"), e))?;
        Ok(CudaTensor {
            shape: shape.to_vec(),
            dtype,
            buf,
        })
    }

    /// Copy a host tensor to the device in its dtype.
    pub fn upload(ctx: &Context, name: &str, t: &HostTensor) -> Result<Self> {
        Self::from_values(ctx, name, &t.shape, t.dtype, &t.data)
    }

    /// A tensor with every element `value` (NaN poisons outputs in tests).
    pub fn filled(
        ctx: &Context,
        name: &str,
        shape: &[usize],
        dtype: DType,
        value: f32,
    ) -> Result<Self> {
        let len: usize = shape.iter().product();
        Self::from_values(ctx, name, shape, dtype, &vec![value; len])
    }

    /// A zero-filled tensor (an asynchronous memset on the context's stream).
    pub fn zeros(ctx: &Context, name: &str, shape: &[usize], dtype: DType) -> Result<Self> {
        let bytes = (shape.iter().product::<usize>() * dtype.size()).max(1);
        let buf = ctx
            .stream()
            .alloc_zeros::<u8>(bytes)
            .map_err(|e| driver_error(&format!("allocation of {name}"), e))?;
        Ok(CudaTensor {
            shape: shape.to_vec(),
            dtype,
            buf,
        })
    }

    /// Wait for the context's stream and copy the tensor back.
    pub fn download(&self, ctx: &Context) -> Result<HostTensor> {
        let bytes = ctx
            .stream()
            .clone_dtoh(&self.buf)
            .map_err(|e| driver_error("download", e))?;
        let len: usize = self.shape.iter().product();
        let data = decode(&bytes[..len * self.dtype.size()], self.dtype);
        Ok(HostTensor {
            shape: self.shape.clone(),
            dtype: self.dtype,
            data,
        })
    }

    /// The device buffer (bytes), for kernel arguments.
    pub fn buffer(&self) -> &CudaSlice<u8> {
        &self.buf
    }
}
