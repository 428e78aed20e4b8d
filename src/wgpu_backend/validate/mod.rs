//! Opt-in checks of GPU tensors for values the kernels do not take: NaN, ±Inf and (without
//! `gate_in_kernel`) log-decays g > 0. The policy is in docs/accuracy.md ("Non-finite
//! numbers"): host entry points always check their host inputs on the host
//! ([`crate::check_host_values`]); the recording entry points take GPU tensors as they are,
//! since a check there needs a readback, a hidden sync that launchers never do. Callers who
//! want the check ask for it here: [`FiniteCheck`] records a search pass per tensor into
//! their encoder and reads back one u32 per tensor, so checking a 2 GiB tensor costs one read
//! of it at device bandwidth rather than a download.

mod find_nonfinite;

pub use find_nonfinite::{find_nonfinite, find_nonfinite_constants};

use crate::error::{Error, Result};
#[cfg(not(target_arch = "wasm32"))]
use crate::problem::{ForwardInputs, Problem};
use crate::tensor::DType;
use crate::wgpu_backend::params::init_buffer;
use crate::wgpu_backend::tensor::read_buffer;
use crate::wgpu_backend::{Context, GpuTensor};

/// What a tensor's values must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Require {
    /// No NaN, no ±Inf.
    Finite,
    /// Finite and ≤ 0: the log-space decays g without `gate_in_kernel`.
    FiniteNonPositive,
}

/// A recorded search of named tensors for values they must not hold; submit the encoder, then
/// [`FiniteCheck::read`] gives the verdict: `Ok(())`, or [`Error::Value`] naming the first
/// tensor (in the order given) with a bad value, the value and its flat index.
///
/// Tensors of any size: one larger than a binding, or stored in several buffers, is searched
/// in views (each inside one buffer, within one binding), one pass each; the index reported
/// is the flat index in the whole tensor.
pub struct FiniteCheck {
    /// Per tensor its name and views, each with its first flat element.
    tensors: Vec<(String, Vec<(usize, GpuTensor)>)>,
    /// One u32 per view: the first bad flat index in it, `u32::MAX` when none.
    results: wgpu::Buffer,
}

impl FiniteCheck {
    /// Record one search pass per tensor into `encoder` (nothing is submitted).
    pub fn record(
        ctx: &Context,
        encoder: &mut wgpu::CommandEncoder,
        tensors: &[(&str, &GpuTensor, Require)],
    ) -> Result<Self> {
        ctx.check_lost()?;
        let align = ctx.limits().min_storage_buffer_offset_alignment as u64;
        let views = tensors
            .iter()
            .map(|(name, t, _)| {
                if t.is_empty() {
                    return Ok((name.to_string(), Vec::new()));
                }
                Ok((
                    name.to_string(),
                    t.binding_views(ctx.max_binding_bytes(), align)?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let searches: Vec<(&str, &GpuTensor, bool)> = views
            .iter()
            .zip(tensors)
            .flat_map(|((name, views), (_, _, require))| {
                let reject_positive = *require == Require::FiniteNonPositive;
                views
                    .iter()
                    .map(move |(_, v)| (name.as_str(), v, reject_positive))
            })
            .collect();
        let n = searches.len().max(1) as u64;
        let (results, per_view) = ctx.scoped("finite check results", None, || {
            let results = ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("finite check results"),
                size: 4 * n,
                usage: wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            });
            let per_view: Vec<wgpu::Buffer> = searches
                .iter()
                .map(|_| {
                    init_buffer(
                        ctx,
                        "first bad index",
                        bytemuck::bytes_of(&u32::MAX),
                        wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
                    )
                })
                .collect();
            (results, per_view)
        })?;
        ctx.scoped("finite check", None, || -> Result<()> {
            for (i, ((name, view, reject_positive), first_bad)) in
                searches.iter().zip(&per_view).enumerate()
            {
                find_nonfinite(ctx, encoder, name, view, *reject_positive, first_bad)?;
                encoder.copy_buffer_to_buffer(first_bad, 0, &results, 4 * i as u64, 4);
            }
            Ok(())
        })??;
        Ok(FiniteCheck {
            tensors: views,
            results,
        })
    }

    /// The verdict, once the encoder holding the search has been submitted (waits for it).
    pub async fn read(&self, ctx: &Context) -> Result<()> {
        let views = self
            .tensors
            .iter()
            .flat_map(|(name, views)| views.iter().map(move |(first, v)| (name, *first, v)));
        let count = views.clone().count();
        if count == 0 {
            return Ok(());
        }
        let bytes = read_buffer(ctx, &self.results, 0, 4 * count as u64).await?;
        let first_bad: &[u32] = bytemuck::cast_slice(&bytes);
        let Some(((name, first, tensor), &local)) =
            views.zip(first_bad).find(|(_, i)| **i != u32::MAX)
        else {
            return Ok(());
        };
        let index = first + local as usize;
        // The bad value itself, for the message: the word holding it.
        let per_word = 4 / tensor.dtype.size() as u32;
        let at = tensor.offset() + 4 * (local / per_word) as u64;
        let word = read_buffer(ctx, &tensor.buffer, at, 4).await?;
        let word = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
        let half = (word >> (16 * (local % per_word))) as u16;
        let value = match tensor.dtype {
            DType::F32 => f32::from_bits(word),
            DType::F16 => half::f16::from_bits(half).to_f32(),
            DType::BF16 => half::bf16::from_bits(half).to_f32(),
        };
        let expected = if value.is_finite() {
            "log-space decays ≤ 0"
        } else {
            "finite values"
        };
        Err(Error::value(
            name,
            expected,
            format!("{value} at flat index {index}"),
        ))
    }

    /// [`FiniteCheck::read`], blocking (native only).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read_blocking(&self, ctx: &Context) -> Result<()> {
        pollster::block_on(self.read(ctx))
    }
}

/// Check that every named tensor is finite: records the search, submits it, waits and reads
/// the verdict. A debugging and validation aid, not for hot paths (it waits for the device).
#[cfg(not(target_arch = "wasm32"))]
pub fn check_finite(ctx: &Context, tensors: &[(&str, &GpuTensor)]) -> Result<()> {
    let tensors: Vec<(&str, &GpuTensor, Require)> = tensors
        .iter()
        .map(|&(name, t)| (name, t, Require::Finite))
        .collect();
    run(ctx, &tensors)
}

/// Check a forward's GPU inputs against the values the kernels rely on — the GPU twin of
/// [`crate::check_host_values`]: every tensor finite and, without `gate_in_kernel`, every
/// g ≤ 0. Submits and waits, like [`check_finite`].
#[cfg(not(target_arch = "wasm32"))]
pub fn check_inputs_finite(
    ctx: &Context,
    problem: &Problem,
    inputs: &ForwardInputs<&GpuTensor>,
) -> Result<()> {
    let g = if problem.options.gate_in_kernel {
        Require::Finite
    } else {
        Require::FiniteNonPositive
    };
    let named = [
        ("q", Some(inputs.q), Require::Finite),
        ("k", Some(inputs.k), Require::Finite),
        ("v", Some(inputs.v), Require::Finite),
        ("g", Some(inputs.g), g),
        ("beta", Some(inputs.beta), Require::Finite),
        ("initial_state", inputs.initial_state, Require::Finite),
        ("A_log", inputs.a_log, Require::Finite),
        ("dt_bias", inputs.dt_bias, Require::Finite),
    ];
    let tensors: Vec<(&str, &GpuTensor, Require)> = named
        .into_iter()
        .filter_map(|(name, t, r)| t.map(|t| (name, t, r)))
        .collect();
    run(ctx, &tensors)
}

#[cfg(not(target_arch = "wasm32"))]
fn run(ctx: &Context, tensors: &[(&str, &GpuTensor, Require)]) -> Result<()> {
    let mut encoder = ctx.create_encoder("gdn finite check");
    let check = FiniteCheck::record(ctx, &mut encoder, tensors)?;
    ctx.submit_and_wait(encoder)?;
    check.read_blocking(ctx)
}
