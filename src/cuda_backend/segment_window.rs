//! The gate-driven window of sequence parallelism (`shaders/cuda/segment_window.cu`,
//! docs/sequence-parallelism.md): per (unit, v-head), the warm-up in chunks after which the
//! unit's gates have decayed the state below the window's threshold, or −1 (exact). Launched
//! by [`launch_chunked`](super::launch_chunked) after the prep (it reads the prep's decays),
//! before the local pass and the combine, which read the table.

use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg};

use super::context::{Context, driver_error};
use super::kernels::SEGMENT_WINDOW;
use crate::error::Result;
use crate::wgpu_backend::SegmentWindow;

/// Threads per block (segment_window.cu `THREADS`).
const THREADS: usize = 128;

/// Mirrors `gdn::window::WindowParams` in segment_window.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct WindowParams {
    heads_v: i32,
    num_units: i32,
    max_warmup: i32,
    threshold: f32,
}

// SAFETY: plain old data of 4-byte fields, laid out like the C struct the kernel takes by value.
unsafe impl DeviceRepr for WindowParams {}

/// Enqueue the window pass: `units` is the plan's unit table (4 i32 per unit), `decays` the
/// prep's γ, γ_C/γ per (chunk, v-head), `warmup` receives `num_units × heads_v` i32.
pub(crate) fn launch_segment_window(
    ctx: &Context,
    window: SegmentWindow,
    heads_v: usize,
    num_units: usize,
    units: &CudaSlice<i32>,
    decays: &CudaSlice<u8>,
    warmup: &CudaSlice<i32>,
) -> Result<()> {
    let rows = num_units * heads_v;
    if rows == 0 {
        return Ok(());
    }
    let name = "gdn_segment_window";
    let func = ctx.function(&SEGMENT_WINDOW, name)?;
    let params = WindowParams {
        heads_v: heads_v as i32,
        num_units: num_units as i32,
        // Capped at i32::MAX: no unit is longer (the plan checks the chunk count).
        max_warmup: window
            .max_warmup_chunks()
            .map_or(0, |n| n.min(i32::MAX as usize) as i32),
        threshold: window.threshold(),
    };
    let cfg = LaunchConfig {
        grid_dim: (rows.div_ceil(THREADS) as u32, 1, 1),
        block_dim: (THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut l = ctx.stream().launch_builder(&func);
    l.arg(&params).arg(units).arg(decays).arg(warmup);
    // SAFETY: matches gdn_segment_window in segment_window.cu; the unit table indexes the
    // chunks the decays were written for, and `warmup` holds `rows` i32 (the plan sized both).
    unsafe { l.launch(cfg) }.map_err(|e| driver_error(&format!("launch of {name}"), e))?;
    Ok(())
}
