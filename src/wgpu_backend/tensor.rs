//! Typed GPU tensors: a storage buffer (or, past the largest buffer, several) with a shape
//! and a storage dtype.

use std::sync::Arc;

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
    /// `Some` for a tensor larger than the largest buffer ([`Context::max_buffer_bytes`]):
    /// its rows in several buffers, `buffer` being the first. Passes reach such a tensor only
    /// through views inside one buffer (token windows end at buffer boundaries).
    pub(crate) parts: Option<Arc<Parts>>,
}

/// The buffers of a tensor larger than one buffer: its rows (the two outermost dimensions
/// flattened — the packed token axis of `[B, T, ..]` tensors, `N·HV` of states) in buffers of
/// `rows` rows each (a power of two, so the boundaries of tensors with different row sizes
/// nest), the last buffer holding the rest.
#[derive(Debug)]
pub(crate) struct Parts {
    /// Rows per buffer.
    pub rows: usize,
    /// Elements per row.
    pub row_elems: usize,
    pub buffers: Vec<wgpu::Buffer>,
}

impl Parts {
    /// Elements per buffer (all but the last are full).
    fn elems(&self) -> usize {
        self.rows * self.row_elems
    }
}

/// Rows (the two outermost dimensions flattened) and elements per row of `shape`.
fn rows_of(shape: &[usize]) -> (usize, usize) {
    let rows: usize = shape.iter().take(2).product();
    let row_elems = shape.iter().skip(2).product::<usize>();
    if rows == 0 {
        (0, row_elems)
    } else {
        (rows, row_elems)
    }
}

/// Rows per buffer of a tensor of `shape` and `dtype` stored in buffers of at most
/// `max_buffer` bytes: `None` when it fits one buffer, else the largest power of two of rows
/// that fits (`Error::TooLarge` naming `name` when not even one row does).
pub(crate) fn part_rows(
    name: &str,
    shape: &[usize],
    dtype: DType,
    max_buffer: u64,
) -> Result<Option<usize>> {
    let len = crate::tensor::element_count(name, shape)?;
    let bytes = (len as u64).saturating_mul(dtype.size() as u64);
    if bytes.div_ceil(4).max(1) * 4 <= max_buffer {
        return Ok(None);
    }
    let (_, row_elems) = rows_of(shape);
    let row_bytes = (row_elems * dtype.size()) as u64;
    let fit = max_buffer / row_bytes.max(1);
    if fit == 0 {
        return Err(Error::TooLarge {
            name: name.into(),
            bytes: row_bytes,
            limit_name: "max_buffer_size",
            limit: max_buffer,
        });
    }
    Ok(Some(1usize << fit.ilog2()))
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
        let stored = self.stored_bytes();
        if stored < needed {
            return Err(Error::value(
                name,
                format!(
                    "a buffer of at least {needed} bytes ({:?} {})",
                    self.shape, self.dtype
                ),
                format!("{stored} bytes"),
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

/// The q/k heads of `k` (`[.., H, K]`), checked to divide `heads_v`: the passes with a
/// workgroup row per q/k head walk its GVA group's v-heads.
pub(crate) fn qk_heads_for(k: &GpuTensor, heads_v: usize) -> Result<usize> {
    let heads_qk = k.shape[k.shape.len() - 2];
    if heads_qk == 0 || !heads_v.is_multiple_of(heads_qk) {
        return Err(Error::value(
            "heads_v",
            format!("a multiple of the {heads_qk} q/k heads"),
            heads_v,
        ));
    }
    Ok(heads_qk)
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
        if let Some((other, _)) = others.into_iter().find(|(_, u)| u.shares_buffer_with(t)) {
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

    /// Every buffer of the tensor in order (one unless it is larger than the largest buffer).
    pub fn buffers(&self) -> Vec<&wgpu::Buffer> {
        match &self.parts {
            Some(parts) => parts.buffers.iter().collect(),
            None => vec![&self.buffer],
        }
    }

    /// Bytes of storage behind the tensor (all its buffers, or the view's range).
    fn stored_bytes(&self) -> u64 {
        match (&self.parts, self.range) {
            (Some(parts), None) => parts.buffers.iter().map(|b| b.size()).sum(),
            _ => self.binding_bytes(),
        }
    }

    /// The buffers of a new tensor: one, or for a tensor past [`Context::max_buffer_bytes`]
    /// several of whole rows. `make(label, first byte, bytes)` creates one buffer holding the
    /// tensor's unpadded bytes `first..first + bytes`.
    fn create(
        ctx: &Context,
        name: &str,
        shape: &[usize],
        dtype: DType,
        make: impl Fn(u64, u64) -> wgpu::Buffer,
    ) -> Result<Self> {
        let rows = part_rows(name, shape, dtype, ctx.max_buffer_bytes())?;
        Self::create_in(ctx, name, shape, dtype, rows, make)
    }

    /// [`GpuTensor::create`] with `rows` rows per buffer (`None`: one buffer).
    fn create_in(
        ctx: &Context,
        name: &str,
        shape: &[usize],
        dtype: DType,
        rows: Option<usize>,
        make: impl Fn(u64, u64) -> wgpu::Buffer,
    ) -> Result<Self> {
        let len = crate::tensor::element_count(name, shape)?;
        let total = (len as u64).saturating_mul(dtype.size() as u64);
        let tensor = |buffer, parts| GpuTensor {
            buffer,
            shape: shape.to_vec(),
            dtype,
            range: None,
            parts,
        };
        let scoped = |first: u64, bytes: u64| {
            let padded = bytes.div_ceil(4).max(1) * 4;
            ctx.scoped(name, Some(padded), || make(first, bytes))
        };
        let (all_rows, row_elems) = rows_of(shape);
        let Some(rows) = rows.filter(|&r| r < all_rows) else {
            return Ok(tensor(scoped(0, total)?, None));
        };
        let part_bytes = (rows * row_elems * dtype.size()) as u64;
        let buffers = (0..all_rows.div_ceil(rows))
            .map(|p| {
                let first = p as u64 * part_bytes;
                scoped(first, part_bytes.min(total - first))
            })
            .collect::<Result<Vec<_>>>()?;
        let parts = Parts {
            rows,
            row_elems,
            buffers,
        };
        Ok(tensor(parts.buffers[0].clone(), Some(Arc::new(parts))))
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
        Self::create(ctx, name, shape, dtype, |first, bytes| {
            let (first, bytes) = (first as usize, bytes as usize);
            init_buffer(ctx, name, &contents[first..first + bytes], USAGE)
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
        // Refuse what cannot be stored before drawing the host values.
        part_rows(name, shape, dtype, ctx.max_buffer_bytes())?;
        Self::from_values(ctx, name, shape, dtype, &vec![value; len])
    }

    /// An uninitialized (zeroed by wgpu) tensor.
    pub fn empty(ctx: &Context, name: &str, shape: &[usize], dtype: DType) -> Result<Self> {
        Self::create(ctx, name, shape, dtype, |_, bytes| {
            ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(name),
                size: bytes.div_ceil(4).max(1) * 4,
                usage: USAGE,
                mapped_at_creation: false,
            })
        })
    }

    /// An uninitialized (zeroed) tensor in buffers of `rows` rows each (the two outermost
    /// dimensions flattened; one buffer when it has no more rows): e.g. a state pool in
    /// buffers of whole slots. Each buffer must fit [`Context::max_buffer_bytes`].
    pub(crate) fn empty_in_rows(
        ctx: &Context,
        name: &str,
        shape: &[usize],
        dtype: DType,
        rows: usize,
    ) -> Result<Self> {
        let (_, row_elems) = rows_of(shape);
        let bytes = padded_bytes(rows.max(1) * row_elems, dtype);
        let limit = ctx.max_buffer_bytes();
        if bytes > limit {
            return Err(Error::TooLarge {
                name: name.into(),
                bytes,
                limit_name: "max_buffer_size",
                limit,
            });
        }
        Self::create_in(ctx, name, shape, dtype, Some(rows.max(1)), |_, bytes| {
            ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(name),
                size: bytes.div_ceil(4).max(1) * 4,
                usage: USAGE,
                mapped_at_creation: false,
            })
        })
    }

    /// Rows (the two outermost dimensions flattened) per buffer of a tensor of several
    /// buffers; `None` for one buffer (or a view).
    pub(crate) fn rows_per_buffer(&self) -> Option<usize> {
        self.parts.as_ref().map(|p| p.rows)
    }

    /// Whether any buffer of the tensor is one of `other`'s.
    pub(crate) fn shares_buffer_with(&self, other: &GpuTensor) -> bool {
        let theirs = other.buffers();
        self.buffers().iter().any(|b| theirs.contains(b))
    }

    /// The buffer holding flat element `element`, the element's byte offset in it and the
    /// elements from it to the end of that buffer's part of the tensor.
    fn locate(&self, element: usize) -> (&wgpu::Buffer, u64, usize) {
        match &self.parts {
            Some(parts) if self.range.is_none() => {
                let p = (element / parts.elems()).min(parts.buffers.len() - 1);
                let start = p * parts.elems();
                let end = (start + parts.elems()).min(self.len());
                let offset = ((element - start) * self.dtype.size()) as u64;
                (&parts.buffers[p], offset, end - element)
            }
            _ => {
                let offset = self.offset() + (element * self.dtype.size()) as u64;
                (&self.buffer, offset, self.len() - element)
            }
        }
    }

    /// The tensor cut into views a pass can bind: each inside one buffer, at most
    /// `max_bytes` bytes and starting at a multiple of `align` bytes from its buffer's start
    /// (a power of two ≥ 4), each with its first flat element. One view of everything for a
    /// tensor in one buffer that fits.
    pub(crate) fn binding_views(&self, max_bytes: u64, align: u64) -> Result<Vec<(usize, Self)>> {
        let size = self.dtype.size();
        let step = ((max_bytes / align * align) as usize / size).max(1);
        if self.parts.is_none() && self.binding_bytes() <= max_bytes {
            return Ok(vec![(0, self.clone())]);
        }
        let mut views = Vec::new();
        for (piece, _) in self.buffer_pieces(0..self.len()) {
            for first in (piece.start..piece.end).step_by(step) {
                let len = step.min(piece.end - first);
                views.push((first, self.view("tensor", first, &[len])?));
            }
        }
        Ok(views)
    }

    /// Scratch of the library's own passes: always one buffer (passes bind windows of it at
    /// raw offsets), up to the device's `max_buffer_size` (`Error::TooLarge` past it, before
    /// anything is allocated).
    pub(crate) fn scratch(
        ctx: &Context,
        name: &str,
        shape: &[usize],
        dtype: DType,
    ) -> Result<Self> {
        let len = crate::tensor::element_count(name, shape)?;
        let size = (len as u64)
            .checked_mul(dtype.size() as u64)
            .map_or(u64::MAX, |b| b.div_ceil(4).max(1) * 4);
        let limit = ctx.limits().max_buffer_size;
        if size > limit {
            return Err(Error::TooLarge {
                name: name.into(),
                bytes: size,
                limit_name: "max_buffer_size",
                limit,
            });
        }
        let buffer = ctx.scoped(name, Some(size), || {
            ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(name),
                size,
                usage: USAGE,
                mapped_at_creation: false,
            })
        })?;
        Ok(GpuTensor::from_buffer(buffer, shape, dtype))
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
            parts: None,
        }
    }

    /// Byte offset of element 0 in `buffer`.
    pub fn offset(&self) -> u64 {
        self.range.map_or(0, |(offset, _)| offset)
    }

    /// The view of `shape` starting `first` elements into this tensor, bound at exactly its
    /// bytes. The caller keeps the start offset a multiple of the device's
    /// `min_storage_buffer_offset_alignment` where the view is bound (windows choose starts
    /// that are, see `wgpu_backend::windows`), and, in a tensor of several buffers, the view
    /// inside one of them (windows end at buffer boundaries); a start that is not
    /// word-aligned or a view past the end or across buffers is a bug, reported as an
    /// `Error::Value`.
    pub(crate) fn view(&self, name: &str, first: usize, shape: &[usize]) -> Result<Self> {
        let len: usize = shape.iter().product();
        // The buffer the view lies in and the element range that buffer holds.
        let (buffer, held) = match &self.parts {
            Some(parts) => {
                let p = (first / parts.elems()).min(parts.buffers.len() - 1);
                let start = p * parts.elems();
                (
                    &parts.buffers[p],
                    start..(start + parts.elems()).min(self.len()),
                )
            }
            None => (&self.buffer, 0..self.len()),
        };
        let offset = self.offset() + ((first - held.start) * self.dtype.size()) as u64;
        if !offset.is_multiple_of(4) || first + len > held.end {
            let within = if self.parts.is_some() {
                format!("one of the tensor's buffers (elements {held:?})")
            } else {
                format!("the tensor's {} elements", self.len())
            };
            return Err(Error::value(
                name,
                format!("a word-aligned view inside {within}"),
                format!("{len} elements from element {first}"),
            ));
        }
        let size = padded_bytes(len, self.dtype);
        Ok(GpuTensor {
            buffer: buffer.clone(),
            shape: shape.to_vec(),
            dtype: self.dtype,
            range: Some((offset, size.min(buffer.size() - offset))),
            parts: None,
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
            parts: self.parts.clone(),
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

    /// Bytes a pass binds: the whole buffer, or the view's range. For a tensor of several
    /// buffers, all of them: more than any binding, so a pass that binds it whole (rather than
    /// through views) is refused before it runs.
    pub(crate) fn binding_bytes(&self) -> u64 {
        match (&self.parts, self.range) {
            (Some(parts), None) => parts.buffers.iter().map(|b| b.size()).sum(),
            (_, Some((_, size))) => size,
            (None, None) => self.buffer.size(),
        }
    }

    /// Copy the tensor back to the host (submits a copy and waits for it). Errors are typed:
    /// [`Error::DeviceLost`] on a lost device, [`Error::OutOfMemory`] when the staging buffer
    /// cannot be allocated.
    pub async fn download(&self, ctx: &Context) -> Result<HostTensor> {
        if self.parts.is_some() && self.range.is_none() {
            let mut host = self.download_range(ctx, 0..self.len()).await?;
            host.shape = self.shape.clone();
            return Ok(host);
        }
        self.download_one_buffer(ctx).await
    }

    /// `download` of a tensor in one buffer (or a view).
    async fn download_one_buffer(&self, ctx: &Context) -> Result<HostTensor> {
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
        let mut data = Vec::with_capacity(elements.len());
        for (piece, buffer_end) in self.buffer_pieces(elements.clone()) {
            // Copies move whole words: widen to them (within the buffer), then trim.
            let per_word = 4 / self.dtype.size();
            let first = piece.start / per_word * per_word;
            let last = (piece.end.div_ceil(per_word) * per_word)
                .min(self.len())
                .min(buffer_end);
            let host = self
                .view("elements", first, &[last - first])?
                .download_one_buffer(ctx)
                .await?;
            data.extend_from_slice(&host.data[piece.start - first..piece.end - first]);
        }
        Ok(HostTensor {
            shape: vec![elements.len()],
            dtype: self.dtype,
            data,
        })
    }

    /// Write `values` into the flat elements from `first` on (row-major, stored as the
    /// tensor's dtype), e.g. to fill a tensor too large to hold on the host in slabs. Goes
    /// through the queue (ordered before work submitted later); `first` and, unless the
    /// write reaches the tensor's end, `first + values.len()` must be word-aligned (even
    /// element indices for 16-bit dtypes).
    pub fn write_range(&self, ctx: &Context, first: usize, values: &[f32]) -> Result<()> {
        let per_word = 4 / self.dtype.size();
        let end = first.saturating_add(values.len());
        if end > self.len()
            || !first.is_multiple_of(per_word)
            || (!end.is_multiple_of(per_word) && end != self.len())
        {
            return Err(Error::value(
                "first",
                format!(
                    "a word-aligned range inside the tensor's {} elements",
                    self.len()
                ),
                format!("{} elements from element {first}", values.len()),
            ));
        }
        for (piece, _) in self.buffer_pieces(first..end) {
            let view = self.view("first", piece.start, &[piece.len()])?;
            let bytes = encode(&values[piece.start - first..piece.end - first], self.dtype);
            ctx.queue.write_buffer(&view.buffer, view.offset(), &bytes);
        }
        Ok(())
    }

    /// `elements` cut at the boundaries of the tensor's buffers: each piece with the end of
    /// the buffer it lies in (one piece for a tensor in one buffer).
    fn buffer_pieces(
        &self,
        elements: std::ops::Range<usize>,
    ) -> impl Iterator<Item = (std::ops::Range<usize>, usize)> {
        let per_buffer = self.parts.as_ref().map_or(usize::MAX, |p| p.elems());
        let mut at = elements.start;
        std::iter::from_fn(move || {
            (at < elements.end).then(|| {
                let buffer_end = (at / per_buffer + 1).saturating_mul(per_buffer);
                let piece = at..elements.end.min(buffer_end);
                at = piece.end;
                (piece, buffer_end)
            })
        })
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

/// Record a copy of `len` flat elements of `src` from `src_first` to `dst` from `dst_first`
/// (the same dtype), across the buffers of either: one buffer copy per piece that lies in one
/// buffer of each. Offsets and sizes must be multiples of 4 bytes (an `Error::Value` naming
/// `name` otherwise; nothing is recorded then).
pub(crate) fn copy_elements(
    encoder: &mut wgpu::CommandEncoder,
    name: &str,
    (src, src_first): (&GpuTensor, usize),
    (dst, dst_first): (&GpuTensor, usize),
    len: usize,
) -> Result<()> {
    if src_first + len > src.len() || dst_first + len > dst.len() || src.dtype != dst.dtype {
        return Err(Error::value(
            name,
            "a copy inside both tensors, of one dtype",
            format!("{len} elements from {src_first} to {dst_first}"),
        ));
    }
    let size = src.dtype.size();
    let mut pieces = Vec::new();
    let mut done = 0;
    while done < len {
        let (from, from_offset, from_left) = src.locate(src_first + done);
        let (to, to_offset, to_left) = dst.locate(dst_first + done);
        let n = (len - done).min(from_left).min(to_left);
        let bytes = (n * size) as u64;
        if !(from_offset | to_offset | bytes).is_multiple_of(4) {
            return Err(Error::value(
                name,
                "a copy of whole 4-byte words between buffers",
                format!("{bytes} bytes from byte {from_offset} to byte {to_offset}"),
            ));
        }
        pieces.push((from, from_offset, to, to_offset, bytes));
        done += n;
    }
    for (from, from_offset, to, to_offset, bytes) in pieces {
        encoder.copy_buffer_to_buffer(from, from_offset, to, to_offset, bytes);
    }
    Ok(())
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

/// Tokens per buffer of the problem's token-indexed tensors (q, k, v, o, g, β and their
/// gradients) that are larger than one buffer, the least over them; `None` when each fits one.
/// Windows end at multiples of it (`WindowCosts::part_tokens`).
pub(crate) fn token_part_rows(
    ctx: &Context,
    problem: &crate::problem::Problem,
    dtype: DType,
) -> Result<Option<usize>> {
    let max = ctx.max_buffer_bytes();
    let shapes: [(&str, &[usize], DType); 3] = [
        ("q", &problem.qk_shape(), dtype),
        ("v", &problem.v_shape(), dtype),
        ("g", &problem.gate_shape(), DType::F32),
    ];
    let mut least: Option<usize> = None;
    for (name, shape, dtype) in shapes {
        if let Some(rows) = part_rows(name, shape, dtype, max)? {
            least = Some(least.map_or(rows, |l| l.min(rows)));
        }
    }
    Ok(least)
}
