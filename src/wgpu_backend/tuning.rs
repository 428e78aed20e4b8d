//! Tile choices from the device's limits. Kernels receive them as WGSL `override` constants
//! (the pipeline cache key includes them); shader text is never edited at run time.

use crate::error::{Error, Result};
use crate::problem::Problem;

/// Threads per workgroup of the chunk kernels (every WebGPU device allows 256).
pub const WORKGROUP: u32 = 256;
/// Storage buffers the widest pass (state_scan) binds.
pub const STORAGE_BUFFERS: u32 = 8;

/// Per-device tile choices.
#[derive(Debug, Clone)]
pub struct Tuning {
    /// Bytes of workgroup memory the device grants.
    pub workgroup_bytes: u32,
    /// V-block widths of `state_scan` that fit, widest first.
    pub v_blocks: Vec<u32>,
    /// `GDN_V_BLOCK` forces a width (when it fits and divides V).
    pub forced_v_block: Option<u32>,
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
    let fit = (1024 / key_dim).min(64);
    1 << (31 - fit.leading_zeros())
}

/// Total workgroup bytes of `state_scan` (arena + two 64-vectors).
pub fn state_scan_bytes(bv: u32) -> u32 {
    4 * (state_scan_arena_words(bv) + 2 * 64)
}

/// f32 words of workgroup memory of `wy_inverse`: ten 16×16 blocks plus one scratch block.
pub const WY_INVERSE_WORDS: u32 = 11 * 256;

impl Tuning {
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
        let v_blocks: Vec<u32> = [64, 32, 16]
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
        let forced_v_block = std::env::var("GDN_V_BLOCK")
            .ok()
            .and_then(|s| s.parse().ok());
        Ok(Tuning {
            workgroup_bytes: bytes,
            v_blocks,
            forced_v_block,
        })
    }

    /// V-block width for `state_scan`: the widest that fits and divides V, narrowed while the
    /// grid (sequences × v-heads × V-blocks) has fewer than 128 workgroups (on the H200, 16/64 heads at T = 32768 ran 25.4 ms at V-block 64 with 128 workgroups vs 28.6 ms at 32), since the scan is
    /// sequential per workgroup and a small grid leaves the GPU idle. A forced width that fits
    /// is used even when it does not divide V (the kernel masks the columns past V).
    pub fn state_scan_v_block(&self, problem: &Problem) -> u32 {
        let v = problem.value_dim as u32;
        if let Some(f) = self.forced_v_block.filter(|f| self.v_blocks.contains(f)) {
            return f;
        }
        let dividing: Vec<u32> = self
            .v_blocks
            .iter()
            .copied()
            .filter(|bv| v.is_multiple_of(*bv))
            .collect();
        let base = (problem.num_sequences() * problem.heads_v) as u32;
        let mut choice = dividing[0];
        for &bv in &dividing {
            choice = bv;
            if base * (v / bv) >= 128 {
                break;
            }
        }
        choice
    }
}
