//! The uniform parameter block shared by every pass (mirrors `shaders/common/params.wgsl`),
//! and the small u32 tables the passes read. Binding and dispatch are in `launch`.

use crate::problem::Problem;
use crate::wgpu_backend::Context;

/// [`Params::flags`] bit: `Options::l2norm_qk`.
pub const FLAG_L2NORM: u32 = 1;
/// [`Params::flags`] bit: `Options::beta_sigmoid`.
pub const FLAG_BETA_SIGMOID: u32 = 2;
/// [`Params::flags`] bit: `Options::allow_neg_eigval`.
pub const FLAG_NEG_EIGVAL: u32 = 4;
/// [`Params::flags`] bit: `Options::gate_in_kernel`.
pub const FLAG_GATE_IN_KERNEL: u32 = 8;
/// [`Params::flags`] bit: `Options::state_v_first`.
pub const FLAG_STATE_V_FIRST: u32 = 16;

/// The uniform block every pass reads: `Params` in `shaders/common/params.wgsl`, 48 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Params {
    /// B·T, the tokens of all batch rows.
    pub total_tokens: u32,
    /// H, the q/k heads.
    pub heads_qk: u32,
    /// HV, the v heads.
    pub heads_v: u32,
    /// K, the key head dimension.
    pub key_dim: u32,
    /// V, the value head dimension.
    pub value_dim: u32,
    /// Rows of the chunk table.
    pub num_chunks: u32,
    /// Rows of the segment table.
    pub num_segments: u32,
    /// The options as `FLAG_*` bits.
    pub flags: u32,
    /// The output scale (`Problem::scale`).
    pub scale: f32,
    /// A pass-specific count (pool slots for `recurrent_step`, identity entries for
    /// `segment_combine`); 0 otherwise.
    pub rows: u32,
    /// Pads the block to a multiple of 16 bytes, as uniform layout requires.
    pub _pad: [u32; 2],
}

impl Params {
    /// The block for `problem` with chunk and segment tables of these lengths; `rows` is 0.
    pub fn for_problem(problem: &Problem, num_chunks: usize, num_segments: usize) -> Self {
        let o = problem.options;
        let flags = [
            (o.l2norm_qk, FLAG_L2NORM),
            (o.beta_sigmoid, FLAG_BETA_SIGMOID),
            (o.allow_neg_eigval, FLAG_NEG_EIGVAL),
            (o.gate_in_kernel, FLAG_GATE_IN_KERNEL),
            (o.state_v_first, FLAG_STATE_V_FIRST),
        ]
        .into_iter()
        .filter(|(on, _)| *on)
        .fold(0, |acc, (_, bit)| acc | bit);
        Params {
            total_tokens: problem.total_tokens() as u32,
            heads_qk: problem.heads_qk as u32,
            heads_v: problem.heads_v as u32,
            key_dim: problem.key_dim as u32,
            value_dim: problem.value_dim as u32,
            num_chunks: num_chunks as u32,
            num_segments: num_segments as u32,
            flags,
            scale: problem.scale(),
            rows: 0,
            _pad: [0; 2],
        }
    }

    /// A new uniform buffer holding the block.
    pub fn upload(&self, ctx: &Context) -> wgpu::Buffer {
        init_buffer(
            ctx,
            "gdn params",
            bytemuck::bytes_of(self),
            wgpu::BufferUsages::UNIFORM,
        )
    }
}

/// A read-only storage buffer of u32 words (chunk and segment tables).
pub fn upload_u32(ctx: &Context, label: &str, words: &[u32]) -> wgpu::Buffer {
    let contents: &[u8] = if words.is_empty() {
        &[0u8; 4]
    } else {
        bytemuck::cast_slice(words)
    };
    init_buffer(ctx, label, contents, wgpu::BufferUsages::STORAGE)
}

/// A buffer holding `contents` (padded to 4 bytes): `create_buffer_init` without its panic.
/// wgpu's version panics when the device cannot make the buffer (its mapping fails); here a
/// buffer that failed is returned unwritten, its error goes to the enclosing error scope (or
/// the context's handler), and it fails validation wherever it is bound. Callers that must
/// report the failure at once wrap the call in `Context::scoped`.
pub(crate) fn init_buffer(
    ctx: &Context,
    label: &str,
    contents: &[u8],
    usage: wgpu::BufferUsages,
) -> wgpu::Buffer {
    let size = (contents.len() as u64).div_ceil(4).max(1) * 4;
    let buffer = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size,
        usage,
        mapped_at_creation: true,
    });
    if let Ok(mut view) = buffer.get_mapped_range_mut(..) {
        view.slice(..contents.len()).copy_from_slice(contents);
    }
    buffer.unmap();
    buffer
}
