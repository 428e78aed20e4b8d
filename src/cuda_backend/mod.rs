//! NVIDIA kernels (feature `cuda`): CUDA C++ sources in `shaders/cuda/`, compiled at run time by
//! NVRTC for the device's architecture (sm_90a on Hopper, sm_80 on Ampere/Ada, compute_80 PTX
//! on newer devices) and cached on disk; driven through cudarc's driver API.
//!
//! Driver and NVRTC are loaded dynamically when first needed, so the crate builds and runs
//! without CUDA; [`Context::new`] without a driver or device is an [`crate::Error::NoAdapter`].
//!
//! So far: the recurrent kernel (the forward for f32 storage and K > 128; every option and
//! storage dtype, f32 arithmetic), the chunked tensor-core forward for f16/bf16 storage with
//! K ≤ 128 ([`forward_path`] says which one a forward call runs; exact sequence parallelism
//! for few heads, [`Segments`]), the decode kernel
//! ([`decode`]: every decode step, bandwidth-bound) and the backward ([`backward`], every
//! gradient): chunked on tensor cores for f16/bf16 with K, V ≤ 128, the exact BPTT in f32
//! otherwise ([`backward_path`] says which).
//!
//! Interop (PyTorch, JAX, CUDA graphs): [`Context::from_raw_stream`] launches on a caller's
//! stream, [`CudaTensor::from_raw`] wraps caller-owned device memory without a copy; with a
//! [`ChunkPlan`] or a [`backward::BackwardWorkspace`] made beforehand, the launchers neither
//! allocate nor synchronise, so they can be captured in a CUDA graph (docs/cuda.md).
//!
//! ```no_run
//! use gdn_wgpu::{cuda_backend::Context, Backend, Options, Problem, RandomSpec};
//! let problem = Problem::new(1, 256, 2, 4, 64, 64, None, Options::default())?;
//! let inputs = RandomSpec::default().generate(&problem);
//! let ctx = Context::new()?;
//! let out = ctx.forward(&problem, &inputs.as_ref())?;
//! # Ok::<(), gdn_wgpu::Error>(())
//! ```

mod backend;
pub mod backward;
mod chunk_bwd;
mod chunk_bwd_chain;
mod chunk_bwd_grad;
mod chunk_combine;
pub mod chunked;
mod context;
pub mod decode;
pub mod kernels;
pub mod nvrtc;
pub mod recurrent;
mod segment_window;
mod tensor;

pub use backward::{BackwardPath, BackwardWorkspace, backward_path};
pub use chunk_bwd_chain::CHAIN_VALUE_BLOCKS;
pub use chunk_bwd_grad::MAX_CHUNKED_BWD_VALUE_DIM;
pub use chunked::{
    ChunkPlan, ChunkedPasses, ForwardPath, PlanOptions, Segments, forward_path, launch_chunked,
    launch_chunked_passes,
};
pub use context::Context;
pub use decode::{decode_host, decode_into};
pub use recurrent::{
    RecurrentIo, SeqBounds, Window, forward_host, forward_into, forward_recurrent_into,
    launch_recurrent,
};
pub use tensor::{CudaTensor, RAW_ALIGNMENT, upload_inputs};
