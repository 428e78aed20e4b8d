//! Tile choices from the device's limits, and the workgroup-memory layouts the kernels mirror
//! that the context needs to judge a device. Kernels receive their tiles as WGSL `override`
//! constants (the pipeline cache key includes them); shader text is never edited at run time.
//! The policies both the forward and the backward use (token slices, V-block narrowing) are
//! written once here; each launcher calls them with its own parameters.

use crate::error::{Error, Result};
use crate::problem::Problem;

/// Threads per workgroup of the chunk kernels (every WebGPU device allows 256).
pub const WORKGROUP: u32 = 256;
/// Storage buffers the widest pass (state_scan) binds.
pub const STORAGE_BUFFERS: u32 = 8;

/// V-block widths the forward and backward scans are written for, widest first.
pub const V_BLOCK_WIDTHS: [u32; 3] = [64, 32, 16];

/// Cooperative-matrix configuration the coop kernels use.
pub const COOP_TILE: u32 = 16;
/// Key dimension the coop scan is written for (its state tiles are named registers).
pub const COOP_KEY_DIM: usize = 128;
/// V-block width of the coop scan; V must be a multiple of it.
pub const COOP_V_BLOCK: usize = 32;
/// Workgroup memory of the coop scan in bytes (mirrors the shader's declarations: s16, x16,
/// stage, zero tile, γ and decay).
pub const STATE_SCAN_COOP_BYTES: u32 = 2 * (4096 + 2048) + 4 * (2048 + 256 + 64 + 64);

/// Workgroup memory of the coop scans with each chunk's K staged (`GDN_COOP_STAGE=on`,
/// `shaders/forward/coop_k_staged.wgsl`): the scan's, plus 64 rows of 136 f16 (38.5 KiB; the
/// backward's two coop scans declare the same layout). A device with less runs the direct reads.
pub const STATE_SCAN_COOP_STAGED_BYTES: u32 = STATE_SCAN_COOP_BYTES + 2 * 64 * 136;

/// Per-device tile choices.
#[derive(Debug, Clone)]
pub struct Tuning {
    /// Bytes of workgroup memory the device grants.
    pub workgroup_bytes: u32,
    /// V-block widths of `state_scan` that fit, widest first.
    pub v_blocks: Vec<u32>,
    /// A forced width (`GDN_V_BLOCK`, via the context's `Config`), used by each scan it fits.
    pub forced_v_block: Option<u32>,
    /// Which per-chunk passes the coop backward runs on cooperative matrices (the others run
    /// their scalar kernels); `GDN_COOP_GRADS` sets it (docs/backward.md).
    pub coop_grads: CoopGrads,
}

/// The coop backward's per-chunk passes that run on cooperative matrices (f16 operands, f32
/// accumulators); each false runs the scalar pass instead (an A/B switch and an override).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoopGrads {
    /// `value_grams_coop` instead of `value_grams`.
    pub value_grams: bool,
    /// `wy_grad_coop` instead of `wy_grad`.
    pub wy_grad: bool,
    /// `state_grad_coop` instead of `state_grad`.
    pub state_grad: bool,
    /// `qk_grad_coop` instead of `qk_grad`.
    pub qk_grad: bool,
}

impl CoopGrads {
    /// Every pass on cooperative matrices.
    pub const ALL: CoopGrads = CoopGrads {
        value_grams: true,
        wy_grad: true,
        state_grad: true,
        qk_grad: true,
    };
    /// Every pass scalar.
    pub const NONE: CoopGrads = CoopGrads {
        value_grams: false,
        wy_grad: false,
        state_grad: false,
        qk_grad: false,
    };
    /// The names `GDN_COOP_GRADS` takes, in pass order.
    pub const NAMES: [&'static str; 4] = ["value_grams", "wy_grad", "state_grad", "qk_grad"];

    /// The default: every pass on cooperative matrices except `qk_grad`. Measured on the H200
    /// (16/32 × 32768 bf16, BENCHMARKS.md), coop against scalar: value_grams 1.22 / 1.87 ms,
    /// wy_grad 1.31 / 2.46, state_grad 3.65 / 5.74, but qk_grad 4.00 / 3.41 (whole backward
    /// 23.97 ms with the scalar qk_grad, 24.71 with the coop one).
    pub const DEFAULT: CoopGrads = CoopGrads {
        value_grams: true,
        wy_grad: true,
        state_grad: true,
        qk_grad: false,
    };

    /// `GDN_COOP_GRADS`: `all`, `none`, `default`, or a comma-separated list of
    /// [`NAMES`](Self::NAMES) (those on cooperative matrices, the rest scalar).
    pub fn parse(variable: &str, text: &str) -> Result<CoopGrads> {
        match text.trim() {
            "all" => return Ok(CoopGrads::ALL),
            "none" => return Ok(CoopGrads::NONE),
            "default" | "" => return Ok(CoopGrads::DEFAULT),
            _ => {}
        }
        let mut grads = CoopGrads::NONE;
        for name in text.split(',').map(str::trim) {
            match name {
                "value_grams" => grads.value_grams = true,
                "wy_grad" => grads.wy_grad = true,
                "state_grad" => grads.state_grad = true,
                "qk_grad" => grads.qk_grad = true,
                _ => {
                    return Err(Error::value(
                        variable,
                        format!(
                            "all, none, default or a comma-separated list of {}",
                            CoopGrads::NAMES.join(", ")
                        ),
                        format!("{text:?}"),
                    ));
                }
            }
        }
        Ok(grads)
    }
}

impl Default for CoopGrads {
    fn default() -> Self {
        CoopGrads::DEFAULT
    }
}

/// f32 words of workgroup memory `state_scan` needs at V-block width `bv` (mirrors the
/// layout in `shaders/forward/state_scan.wgsl`): the 64 × bv W/V' tile, then one region reused
/// for the transposed K/Q slices (16 × 68 each) plus a 16 × bv state slice, the packed 64×64
/// lower triangle, and the token slices of the state update (T_SLICE·(K+4) ≤ 1280 words).
pub fn state_scan_arena_words(bv: u32) -> u32 {
    let slices = 2 * 16 * 68 + 16 * bv;
    let triangle = 64 * 65 / 2;
    let token_slices = 1024 + 4 * 64;
    64 * bv + slices.max(triangle).max(token_slices)
}

/// f16 slots of workgroup memory of the f16-math `state_scan` (`Pass::StateScanF16`): the
/// same layout as [`state_scan_arena_words`] in f16 slots, except that the packed-o exchange
/// (bf16 storage) keeps each f32 as two f16 slots, 64 × bv in the reused region: an arena of
/// 6.75, 9.25 and 16 KiB at bv = 16, 32, 64 (the f32 scan's: 13.5, 18.5, 28.5 KiB), so every
/// V-block that fits the scalar scan fits this one.
pub fn state_scan_f16_arena_slots(bv: u32) -> u32 {
    state_scan_arena_words(bv).max(64 * bv + 64 * bv)
}

/// Tokens per K slice in the scan's state update: the largest power of two with
/// `T_SLICE · K ≤ 1024` (one vec4 per invocation), at most a chunk.
pub fn state_scan_token_slice(key_dim: u32) -> u32 {
    token_slice(key_dim, 1024, 64)
}

/// The largest power of two `t` ≤ `max` with `t · k ≤ elems` (at least 1): tokens per K slice
/// of a scan's state update, for every scan (each passes its own budget and cap).
pub fn token_slice(k: u32, elems: u32, max: u32) -> u32 {
    let fit = (elems / k.max(1)).clamp(1, max.max(1));
    1 << (31 - fit.leading_zeros())
}

/// How a sequential scan (one workgroup per segment, v-head and V-block) narrows its V-block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VBlockPolicy {
    /// Narrow while sequences × v-heads × V-blocks is below this many workgroups: the scan is
    /// sequential per workgroup and a small grid leaves the GPU idle.
    pub min_workgroups: u32,
    /// The kernel masks columns past V, so a forced width need not divide V.
    pub masks_ragged_v: bool,
}

/// The forward's `state_scan`: 128 workgroups (on the H200, 16/64 heads at T = 32768 ran
/// 25.4 ms at V-block 64 with 128 workgroups vs 28.6 ms at 32); it masks columns past V.
pub const FORWARD_SCAN: VBlockPolicy = VBlockPolicy {
    min_workgroups: 128,
    masks_ragged_v: true,
};

/// The backward's `state_recompute` and `dh_scan` (one width for both, they share the
/// state slots): 256 workgroups, the threshold they were tuned with; their grids divide V.
pub const BACKWARD_SCANS: VBlockPolicy = VBlockPolicy {
    min_workgroups: 256,
    masks_ragged_v: false,
};

/// The V-block width of a scan: `forced` when it is among `fits` (and divides V unless the
/// kernel masks), else the widest of `fits` (widths the device fits, widest first) that
/// divides V, narrowed per `policy`. `None` when no width of `fits` divides V.
pub fn choose_v_block(
    fits: &[u32],
    forced: Option<u32>,
    problem: &Problem,
    policy: VBlockPolicy,
) -> Option<u32> {
    let v = problem.value_dim as u32;
    let dividing: Vec<u32> = fits
        .iter()
        .copied()
        .filter(|bv| v.is_multiple_of(*bv))
        .collect();
    let allowed = if policy.masks_ragged_v {
        fits
    } else {
        &dividing[..]
    };
    if let Some(f) = forced.filter(|f| allowed.contains(f)) {
        return Some(f);
    }
    let base = (problem.num_sequences() * problem.heads_v) as u32;
    let mut choice = *dividing.first()?;
    for &bv in &dividing {
        choice = bv;
        if base * (v / bv) >= policy.min_workgroups {
            break;
        }
    }
    Some(choice)
}

/// Total workgroup bytes of `state_scan` (arena + two 64-vectors).
pub fn state_scan_bytes(bv: u32) -> u32 {
    4 * (state_scan_arena_words(bv) + 2 * 64)
}

/// f32 words of workgroup memory of `wy_inverse` (mirrors the shader): ten 16×16 blocks, the
/// solve's sums of one block row (three blocks), G and β.
pub const WY_INVERSE_WORDS: u32 = 13 * 256 + 2 * 64;

/// Workgroup memory of `wy_inverse_coop` in bytes (mirrors the shader): wy_inverse's.
pub const WY_INVERSE_COOP_BYTES: u32 = 4 * WY_INVERSE_WORDS;

/// Workgroup memory of `state_grad_coop` in bytes (mirrors the shader: three 64 × 16 token
/// tiles and two 128 × 16 state slices in f16, eight 16 × 16 f32 output tiles, γ and decay):
/// 22.5 KiB, over the coop scan's; a device with less runs the scalar `state_grad`.
pub const STATE_GRAD_COOP_BYTES: u32 = 2 * (3 * 64 * 16 + 2 * 128 * 16) + 4 * (2048 + 2 * 64);

/// Workgroup memory the coop path's passes need: its scan's and its WY inverse's.
pub const COOP_PATH_BYTES: u32 = if STATE_SCAN_COOP_BYTES > WY_INVERSE_COOP_BYTES {
    STATE_SCAN_COOP_BYTES
} else {
    WY_INVERSE_COOP_BYTES
};

impl Tuning {
    /// The tile choices for a device with `limits`; `Error::Unsupported` when its workgroups or
    /// storage-buffer bindings are too few for the kernels.
    pub fn for_device(limits: &wgpu::Limits) -> Result<Self> {
        if limits.max_compute_invocations_per_workgroup < WORKGROUP
            || limits.max_compute_workgroup_size_x < WORKGROUP
        {
            return Err(Error::unsupported(
                "device",
                format!(
                    "fewer than {WORKGROUP} invocations per workgroup ({})",
                    limits.max_compute_invocations_per_workgroup
                ),
            ));
        }
        if limits.max_storage_buffers_per_shader_stage < STORAGE_BUFFERS {
            return Err(Error::unsupported(
                "device",
                format!(
                    "fewer than {STORAGE_BUFFERS} storage buffers per stage ({})",
                    limits.max_storage_buffers_per_shader_stage
                ),
            ));
        }
        let bytes = limits.max_compute_workgroup_storage_size;
        let v_blocks: Vec<u32> = V_BLOCK_WIDTHS
            .into_iter()
            .filter(|&bv| state_scan_bytes(bv) <= bytes)
            .collect();
        if v_blocks.is_empty() || 4 * WY_INVERSE_WORDS > bytes {
            return Err(Error::unsupported(
                "device",
                format!(
                    "{bytes} bytes of workgroup memory (need {})",
                    state_scan_bytes(16)
                ),
            ));
        }
        Ok(Tuning {
            workgroup_bytes: bytes,
            v_blocks,
            forced_v_block: None,
            coop_grads: CoopGrads::DEFAULT,
        })
    }

    /// V-block width for `state_scan` ([`FORWARD_SCAN`]): the widest that fits and divides V,
    /// narrowed while the grid is small; a forced width that fits is used even when it does
    /// not divide V (the kernel masks the columns past V).
    pub fn state_scan_v_block(&self, problem: &Problem) -> u32 {
        // V is a multiple of 16 (validated) and 16 fits (checked in `for_device`), so the
        // narrowest width is only a fallback for a hand-edited `Tuning`.
        let narrowest = self.v_blocks.last().copied().unwrap_or(16);
        choose_v_block(&self.v_blocks, self.forced_v_block, problem, FORWARD_SCAN)
            .unwrap_or(narrowest)
    }
}
