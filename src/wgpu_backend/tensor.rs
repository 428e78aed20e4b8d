//! Typed GPU tensors: a storage buffer with a shape and a storage dtype.

use crate::error::{Error, Result};
use crate::problem::ForwardInputs;
use crate::tensor::{DType, HostTensor, TensorMeta};
use crate::wgpu_backend::Context;
use crate::wgpu_backend::params::init_buffer;

/// A tensor in a GPU storage buffer. Creating one never submits work; `download` is the only
/// readback and is explicit.
#[derive(Debug, Clone)]
pub struct GpuTensor {
    /// The storage buffer, padded to a multiple of 4 bytes.
    pub buffer: wgpu::Buffer,
    /// Dimensions, outermost first (row-major).
    pub shape: Vec<usize>,
    /// The element type in `buffer`.
    pub dtype: DType,
    /// `Some((offset, size))` for a view of part of `buffer` (a window of a larger tensor),
    /// bound at that byte range; `None`: the tensor is the whole buffer from byte 0.
    pub(crate) range: Option<(u64, u64)>,
}

impl TensorMeta for GpuTensor {
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn check_storage(&self, name: &str) -> Result<()> {
        let len = crate::tensor::element_count(name, &self.shape)?;
        let needed = (len as u64).saturating_mul(self.dtype.size() as u64);
        if self.buffer.size() < needed {
            return Err(Error::value(
                name,
                format!(
                    "a buffer of at least {needed} bytes ({:?} {})",
                    self.shape, self.dtype
                ),
                format!("{} bytes", self.buffer.size()),
            ));
        }
        Ok(())
    }
}

/// The inputs of a forward by name, optional ones only when given.
pub(crate) fn named_inputs<'a>(
    inputs: &ForwardInputs<&'a GpuTensor>,
) -> Vec<(&'static str, &'a GpuTensor)> {
    let optional = [
        ("initial_state", inputs.initial_state),
        ("A_log", inputs.a_log),
        ("dt_bias", inputs.dt_bias),
    ];
    let mut named = vec![
        ("q", inputs.q),
        ("k", inputs.k),
        ("v", inputs.v),
        ("g", inputs.g),
        ("beta", inputs.beta),
    ];
    named.extend(optional.into_iter().filter_map(|(n, t)| Some((n, t?))));
    named
}

/// Refuse a call whose output shares its buffer with an input or another output: a pass that
/// reads one binding while writing the other races (and wgpu refuses the usage conflict at
/// submit, after the call has returned). `outputs` are checked against each other and against
/// `inputs`.
pub(crate) fn check_distinct_buffers(
    outputs: &[(&str, &GpuTensor)],
    inputs: &[(&str, &GpuTensor)],
) -> Result<()> {
    for (i, (out, t)) in outputs.iter().enumerate() {
        let others = outputs[..i].iter().chain(inputs);
        if let Some((other, _)) = others.into_iter().find(|(_, u)| u.buffer == t.buffer) {
            return Err(Error::value(
                out,
                format!("a buffer of its own (not the buffer of {other})"),
                format!("the buffer of {other}"),
            ));
        }
    }
    Ok(())
}

const USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

/// Bytes of `len` elements of `dtype`, rounded up to 4 (storage bindings are word-sized).
fn padded_bytes(len: usize, dtype: DType) -> u64 {
    ((len * dtype.size()) as u64).div_ceil(4).max(1) * 4
}

fn encode(values: &[f32], dtype: DType) -> Vec<u8> {
    let mut bytes: Vec<u8> = match dtype {
        DType::F32 => bytemuck::cast_slice(values).to_vec(),
        DType::F16 => values
            .iter()
            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
            .collect(),
        DType::BF16 => values
            .iter()
            .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
            .collect(),
    };
    bytes.resize(padded_bytes(values.len(), dtype) as usize, 0);
    bytes
}

fn decode(bytes: &[u8], len: usize, dtype: DType) -> Vec<f32> {
    match dtype {
        DType::F32 => bytemuck::cast_slice(&bytes[..len * 4]).to_vec(),
        DType::F16 => bytes[..len * 2]
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        DType::BF16 => bytes[..len * 2]
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
    }
}

impl GpuTensor {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// True when the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Size in bytes of the data (without padding).
    pub fn bytes(&self) -> u64 {
        (self.len() * self.dtype.size()) as u64
    }

    /// A buffer may be larger than one storage binding (passes bind windows of it), but not
    /// larger than the device's largest buffer.
    fn check_size(ctx: &Context, name: &str, bytes: u64) -> Result<()> {
        let limits = ctx.limits();
        if bytes > limits.max_buffer_size {
            return Err(Error::TooLarge {
                name: name.into(),
                bytes,
                limit_name: "max_buffer_size",
                limit: limits.max_buffer_size,
            });
        }
        Ok(())
    }

    /// Upload a host tensor, stored as `host.dtype` (values round to it).
    pub fn upload(ctx: &Context, name: &str, host: &HostTensor) -> Result<Self> {
        Self::from_values(ctx, name, &host.shape, host.dtype, &host.data)
    }

    /// A tensor of `shape` holding `values` stored as `dtype`.
    pub fn from_values(
        ctx: &Context,
        name: &str,
        shape: &[usize],
        dtype: DType,
        values: &[f32],
    ) -> Result<Self> {
        let len = crate::tensor::element_count(name, shape)?;
        if values.len() != len {
            return Err(Error::value(
                name,
                format!("{len} values for shape {shape:?}"),
                values.len(),
            ));
        }
        let contents = encode(values, dtype);
        Self::check_size(ctx, name, contents.len() as u64)?;
        let buffer = ctx.scoped(name, Some(contents.len() as u64), || {
            init_buffer(ctx, name, &contents, USAGE)
        })?;
        Ok(GpuTensor {
            buffer,
            shape: shape.to_vec(),
            dtype,
            range: None,
        })
    }

    /// A tensor with every element set to `value` (NaN poisons outputs in tests).
    pub fn filled(
        ctx: &Context,
        name: &str,
        shape: &[usize],
        dtype: DType,
        value: f32,
    ) -> Result<Self> {
        let len = crate::tensor::element_count(name, shape)?;
        Self::check_size(ctx, name, (len as u64).saturating_mul(dtype.size() as u64))?;
        Self::from_values(ctx, name, shape, dtype, &vec![value; len])
    }

    /// An uninitialized (zeroed by wgpu) tensor.
    pub fn empty(ctx: &Context, name: &str, shape: &[usize], dtype: DType) -> Result<Self> {
        let len = crate::tensor::element_count(name, shape)?;
        let size = (len as u64)
            .checked_mul(dtype.size() as u64)
            .map_or(u64::MAX, |b| b.div_ceil(4).max(1) * 4);
        Self::check_size(ctx, name, size)?;
        let buffer = ctx.scoped(name, Some(size), || {
            ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(name),
                size,
                usage: USAGE,
                mapped_at_creation: false,
            })
        })?;
        Ok(GpuTensor {
            buffer,
            shape: shape.to_vec(),
            dtype,
            range: None,
        })
    }

    /// A tensor over a whole buffer: e.g. a caller's own buffer (`STORAGE | COPY_SRC |
    /// COPY_DST` usage) that holds `shape` elements of `dtype` from byte 0. Buffers larger
    /// than one storage binding are fine: the launchers bind windows of them. Whether the
    /// buffer is large enough is checked where the tensor is used (a typed error).
    pub fn from_buffer(buffer: wgpu::Buffer, shape: &[usize], dtype: DType) -> Self {
        GpuTensor {
            buffer,
            shape: shape.to_vec(),
            dtype,
            range: None,
        }
    }

    /// Byte offset of element 0 in `buffer`.
    pub fn offset(&self) -> u64 {
        self.range.map_or(0, |(offset, _)| offset)
    }

    /// The view of `shape` starting `first` elements into this tensor, bound at exactly its
    /// bytes. The caller keeps the start offset a multiple of the device's
    /// `min_storage_buffer_offset_alignment` where the view is bound (windows choose starts
    /// that are, see `wgpu_backend::windows`); a start that is not word-aligned or a view
    /// past the end is a bug, reported as an `Error::Value`.
    pub(crate) fn view(&self, name: &str, first: usize, shape: &[usize]) -> Result<Self> {
        let len: usize = shape.iter().product();
        let offset = self.offset() + (first * self.dtype.size()) as u64;
        let size = padded_bytes(len, self.dtype);
        if !offset.is_multiple_of(4) || first + len > self.len() {
            return Err(Error::value(
                name,
                format!(
                    "a word-aligned view inside the tensor's {} elements",
                    self.len()
                ),
                format!("{len} elements from element {first}"),
            ));
        }
        Ok(GpuTensor {
            buffer: self.buffer.clone(),
            shape: shape.to_vec(),
            dtype: self.dtype,
            range: Some((offset, size.min(self.buffer.size() - offset))),
        })
    }

    /// The same bytes seen as `shape` elements of `dtype` (e.g. scratch shared by two uses),
    /// bound as this tensor is.
    pub(crate) fn reinterpret(&self, shape: &[usize], dtype: DType) -> Self {
        GpuTensor {
            buffer: self.buffer.clone(),
            shape: shape.to_vec(),
            dtype,
            range: self.range,
        }
    }

    /// How a pass binds the tensor: the whole buffer, or the view's byte range.
    pub(crate) fn binding(&self) -> wgpu::BindingResource<'_> {
        match self.range {
            None => self.buffer.as_entire_binding(),
            Some((offset, size)) => wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &self.buffer,
                offset,
                size: wgpu::BufferSize::new(size),
            }),
        }
    }

    /// Bytes a pass binds: the whole buffer, or the view's range.
    pub(crate) fn binding_bytes(&self) -> u64 {
        self.range.map_or(self.buffer.size(), |(_, size)| size)
    }

    /// Copy the tensor back to the host (submits a copy and waits for it). Errors are typed:
    /// [`Error::DeviceLost`] on a lost device, [`Error::OutOfMemory`] when the staging buffer
    /// cannot be allocated.
    pub async fn download(&self, ctx: &Context) -> Result<HostTensor> {
        let size = match self.range {
            None => padded_bytes(self.len(), self.dtype),
            Some((_, size)) => size,
        };
        let bytes = read_buffer(ctx, &self.buffer, self.offset(), size).await?;
        Ok(HostTensor {
            shape: self.shape.clone(),
            dtype: self.dtype,
            data: decode(&bytes, self.len(), self.dtype),
        })
    }

    /// [`GpuTensor::download`], blocking (native only).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn download_blocking(&self, ctx: &Context) -> Result<HostTensor> {
        pollster::block_on(self.download(ctx))
    }

    /// Copy the flat elements `elements` (row-major) back to the host as a 1-D tensor, e.g. a
    /// window of a tensor too large to hold on the host at once. Submits a copy and waits.
    pub async fn download_range(
        &self,
        ctx: &Context,
        elements: std::ops::Range<usize>,
    ) -> Result<HostTensor> {
        if elements.start > elements.end || elements.end > self.len() {
            return Err(Error::value(
                "elements",
                format!("a range inside the tensor's {} elements", self.len()),
                format!("{elements:?}"),
            ));
        }
        // Copies move whole words: widen to them, then trim.
        let per_word = 4 / self.dtype.size();
        let first = elements.start / per_word * per_word;
        let last = elements.end.div_ceil(per_word) * per_word;
        let len = last.min(self.len()) - first;
        let mut host = self.view("elements", first, &[len])?.download(ctx).await?;
        let skip = elements.start - first;
        host.data = host.data[skip..skip + elements.len()].to_vec();
        host.shape = vec![elements.len()];
        Ok(host)
    }

    /// [`GpuTensor::download_range`], blocking (native only).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn download_range_blocking(
        &self,
        ctx: &Context,
        elements: std::ops::Range<usize>,
    ) -> Result<HostTensor> {
        pollster::block_on(self.download_range(ctx, elements))
    }
}

/// Copy `size` bytes of `buffer` from `offset` (both multiples of 4) to the host: submits a
/// copy and waits for it. Errors are typed: [`Error::DeviceLost`] on a lost device,
/// [`Error::OutOfMemory`] when the staging buffer cannot be allocated.
pub(crate) async fn read_buffer(
    ctx: &Context,
    buffer: &wgpu::Buffer,
    offset: u64,
    size: u64,
) -> Result<Vec<u8>> {
    ctx.check_lost()?;
    let staging = ctx.scoped("download staging", Some(size), || {
        let staging = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("gdn download"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder = ctx.create_encoder("gdn download");
        encoder.copy_buffer_to_buffer(buffer, offset, &staging, 0, size);
        ctx.queue.submit(Some(encoder.finish()));
        staging
    })?;
    let (tx, rx) = futures::channel::oneshot::channel();
    staging.slice(..).map_async(wgpu::MapMode::Read, move |r| {
        let _ = tx.send(r);
    });
    #[cfg(not(target_arch = "wasm32"))]
    ctx.poll(wgpu::PollType::Wait {
        submission_index: None,
        timeout: None,
    })?;
    let mapped = rx
        .await
        .map_err(|_| Error::Gpu("buffer mapping was cancelled".into()))
        .and_then(|r| r.map_err(|e| Error::Gpu(e.to_string())));
    if let Err(e) = mapped {
        return Err(ctx.lost_or(e));
    }
    ctx.check()?;
    let bytes = staging
        .slice(..)
        .get_mapped_range()
        .map_err(|e| ctx.lost_or(Error::Gpu(e.to_string())))?
        .to_vec();
    staging.unmap();
    Ok(bytes)
}

/// Upload every tensor of a problem's inputs (each in its own dtype).
pub fn upload_inputs(
    ctx: &Context,
    inputs: &ForwardInputs<&HostTensor>,
) -> Result<ForwardInputs<GpuTensor>> {
    let up = |name: &str, t: &HostTensor| GpuTensor::upload(ctx, name, t);
    let up_opt = |name: &str, t: Option<&HostTensor>| t.map(|t| up(name, t)).transpose();
    Ok(ForwardInputs {
        q: up("q", inputs.q)?,
        k: up("k", inputs.k)?,
        v: up("v", inputs.v)?,
        g: up("g", inputs.g)?,
        beta: up("beta", inputs.beta)?,
        initial_state: up_opt("initial_state", inputs.initial_state)?,
        a_log: up_opt("A_log", inputs.a_log)?,
        dt_bias: up_opt("dt_bias", inputs.dt_bias)?,
    })
}
