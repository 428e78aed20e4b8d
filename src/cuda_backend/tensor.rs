//! Device tensors: raw bytes in the storage dtype (f32, or the bits of f16/bf16), in memory
//! this crate allocated or, zero-copy, in a caller's ([`CudaTensor::from_raw`]).

use std::mem::ManuallyDrop;

use cudarc::driver::{CudaSlice, DevicePtr, sys};

use super::context::{Context, driver_error};
use crate::error::{Error, Result};
use crate::problem::ForwardInputs;
use crate::tensor::{DType, HostTensor, TensorMeta};

/// A tensor in device memory on a [`Context`]: contiguous, row-major, in memory it owns
/// ([`CudaTensor::zeros`], [`CudaTensor::upload`], …) or borrows ([`CudaTensor::from_raw`]).
#[derive(Debug)]
pub struct CudaTensor {
    shape: Vec<usize>,
    dtype: DType,
    /// Dropped in `Drop`: freed when owned, released without freeing when borrowed.
    buf: ManuallyDrop<CudaSlice<u8>>,
    /// The address of `buf` (cudarc hands it out only with event bookkeeping).
    ptr: sys::CUdeviceptr,
    borrowed: bool,
}

impl Drop for CudaTensor {
    fn drop(&mut self) {
        // SAFETY: `buf` is taken once, here, and never used again.
        let buf = unsafe { ManuallyDrop::take(&mut self.buf) };
        if self.borrowed {
            // The caller owns the memory: drop the wrapper, never free.
            let _ = buf.leak();
        } else {
            drop(buf);
        }
    }
}

/// Device memory a borrowed tensor starts at must be aligned like this: the chunked kernels
/// copy 16-byte vectors (`cp.async`).
pub const RAW_ALIGNMENT: u64 = 16;

fn pointer_attribute<T: Default>(
    attribute: sys::CUpointer_attribute,
    ptr: sys::CUdeviceptr,
) -> std::result::Result<T, cudarc::driver::DriverError> {
    let mut value = T::default();
    // SAFETY: `value` is the type the driver writes for the attributes asked below (an int
    // or a device pointer / size, 8 bytes); a bad `ptr` is an error, not undefined behaviour.
    unsafe { sys::cuPointerGetAttribute((&mut value as *mut T).cast(), attribute, ptr) }
        .result()?;
    Ok(value)
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

/// `bytes` bytes from `ptr` lie in one device allocation on `ctx`'s device.
fn check_device_range(ctx: &Context, ptr: sys::CUdeviceptr, bytes: usize) -> Result<()> {
    use sys::CUpointer_attribute as A;
    ctx.cuda_context()
        .bind_to_thread()
        .map_err(|e| driver_error("context binding", e))?;
    let not_device = |e| {
        Error::value(
            "device pointer",
            "device memory of the CUDA driver",
            format!("{ptr:#x} ({e:?})"),
        )
    };
    let ordinal: i32 =
        pointer_attribute(A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr).map_err(not_device)?;
    if usize::try_from(ordinal).ok() != Some(ctx.ordinal()) {
        return Err(Error::value(
            "device pointer",
            format!("memory of CUDA device {}", ctx.ordinal()),
            format!("memory of device {ordinal}"),
        ));
    }
    let start: u64 =
        pointer_attribute(A::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, ptr).map_err(not_device)?;
    let size: u64 =
        pointer_attribute(A::CU_POINTER_ATTRIBUTE_RANGE_SIZE, ptr).map_err(not_device)?;
    let end = ptr.checked_add(bytes as u64);
    if end.is_none_or(|end| end > start.saturating_add(size)) {
        return Err(Error::value(
            "device memory",
            format!("{bytes} bytes from {ptr:#x}"),
            format!(
                "an allocation of {size} bytes from {start:#x} ({} bytes left)",
                (start + size).saturating_sub(ptr)
            ),
        ));
    }
    Ok(())
}

impl CudaTensor {
    fn owning(ctx: &Context, shape: &[usize], dtype: DType, buf: CudaSlice<u8>) -> Self {
        let ptr = {
            let (ptr, _record) = buf.device_ptr(ctx.stream());
            ptr
        };
        CudaTensor {
            shape: shape.to_vec(),
            dtype,
            buf: ManuallyDrop::new(buf),
            ptr,
            borrowed: false,
        }
    }

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
        Ok(Self::owning(ctx, shape, dtype, buf))
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
        Ok(Self::owning(ctx, shape, dtype, buf))
    }

    /// Wait for the context's stream and copy the tensor back.
    pub fn download(&self, ctx: &Context) -> Result<HostTensor> {
        let bytes = ctx
            .stream()
            .clone_dtoh(&*self.buf)
            .map_err(|e| driver_error("download", e))?;
        let len: usize = self.shape.iter().product();
        let data = decode(&bytes[..len * self.dtype.size()], self.dtype);
        Ok(HostTensor {
            shape: self.shape.clone(),
            dtype: self.dtype,
            data,
        })
    }

    /// The device buffer (bytes), for kernel arguments. For a borrowed tensor a wrapper of the
    /// caller's memory that never frees it.
    pub fn buffer(&self) -> &CudaSlice<u8> {
        &self.buf
    }

    /// Whether the memory is the caller's ([`CudaTensor::from_raw`]).
    pub fn is_borrowed(&self) -> bool {
        self.borrowed
    }

    /// The device address of the first element.
    pub fn device_ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// A tensor over caller-owned device memory, zero copy: `shape` elements of `dtype`,
    /// contiguous and row-major from `ptr` (PyTorch: `t.data_ptr()` of a contiguous tensor,
    /// `t.shape`, and `torch.float32`/`float16`/`bfloat16` as [`DType::F32`]/`F16`/`BF16`).
    /// Launchers take it wherever they take a [`CudaTensor`]; dropping it frees nothing.
    ///
    /// Checked (typed errors, never undefined behaviour): `ptr` is a multiple of
    /// [`RAW_ALIGNMENT`] and lies in device memory of `ctx`'s device with room for the
    /// tensor's bytes.
    ///
    /// # Safety
    /// The memory must stay allocated, and not be reused for anything else, until the work
    /// enqueued on it has run and this tensor is dropped; it must hold `shape` elements of
    /// `dtype` (writes go through as they are). Work of the caller on other streams touching
    /// it must be ordered with `ctx`'s stream by the caller.
    pub unsafe fn from_raw(
        ctx: &Context,
        ptr: sys::CUdeviceptr,
        shape: &[usize],
        dtype: DType,
    ) -> Result<Self> {
        let bytes = shape.iter().product::<usize>() * dtype.size();
        if !ptr.is_multiple_of(RAW_ALIGNMENT) {
            return Err(Error::value(
                "device pointer",
                format!("a multiple of {RAW_ALIGNMENT}"),
                format!("{ptr:#x}"),
            ));
        }
        if bytes > 0 {
            check_device_range(ctx, ptr, bytes)?;
        }
        let stream = ctx.stream();
        // cudarc creates events for the wrapper when the context tracks them, and unwraps their
        // creation: a failure there is a typed error here.
        let buf = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: the caller promises `bytes` bytes of live device memory at `ptr`; the
            // wrapper is released with `leak` in Drop, never freed.
            unsafe { stream.upgrade_device_ptr::<u8>(ptr, bytes) }
        }))
        .map_err(|_| Error::Gpu("CUDA event creation for a borrowed tensor failed".into()))?;
        Ok(CudaTensor {
            shape: shape.to_vec(),
            dtype,
            buf: ManuallyDrop::new(buf),
            ptr,
            borrowed: true,
        })
    }
}

/// Upload every host input of a forward (copies; a caller's own device memory needs none:
/// [`CudaTensor::from_raw`]).
pub fn upload_inputs(
    ctx: &Context,
    inputs: &ForwardInputs<&HostTensor>,
) -> Result<ForwardInputs<CudaTensor>> {
    let up = |name: &str, t: &HostTensor| CudaTensor::upload(ctx, name, t);
    Ok(ForwardInputs {
        q: up("q", inputs.q)?,
        k: up("k", inputs.k)?,
        v: up("v", inputs.v)?,
        g: up("g", inputs.g)?,
        beta: up("beta", inputs.beta)?,
        initial_state: inputs
            .initial_state
            .map(|t| up("initial_state", t))
            .transpose()?,
        a_log: inputs.a_log.map(|t| up("A_log", t)).transpose()?,
        dt_bias: inputs.dt_bias.map(|t| up("dt_bias", t)).transpose()?,
    })
}
