//! # gdn-wgpu
//!
//! Gated DeltaNet (GDN) linear-attention kernels for every GPU: WGSL compute shaders driven
//! through wgpu (Vulkan, Metal, DX12, WebGPU), checked against an f64 CPU oracle.
//!
//! Per v-head the recurrence is `S ← exp(g)·S; u = β(v − Sᵀk); S ← S + k uᵀ; o = scale·Sᵀq`;
//! the GPU runs FlashQLA's chunked form (chunk 64): gate cumsum → gate-free WY inverse →
//! sequential inter-chunk scan producing o and the final state.
//!
//! ```no_run
//! use gdn_wgpu::{wgpu_backend, Options, Problem, RandomSpec};
//! let problem = Problem::new(1, 256, 2, 4, 64, 64, None, Options::default())?;
//! let inputs = RandomSpec::default().generate(&problem);
//! let ctx = wgpu_backend::Context::new_blocking()?;
//! let out = wgpu_backend::forward_host(&ctx, &problem, &inputs.as_ref())?;
//! let oracle = gdn_wgpu::reference::forward(&problem, &inputs.as_ref())?;
//! println!("rel-L2 of o: {:e}", gdn_wgpu::relative_l2(&out.o.data, &oracle.o));
//! # Ok::<(), gdn_wgpu::Error>(())
//! ```

#![warn(missing_docs)]

pub mod backend;
#[cfg(feature = "cuda")]
pub mod cuda_backend;
pub mod error;
pub mod io;
pub mod problem;
pub mod random;
pub mod reference;
pub mod tensor;
pub mod tolerance;
pub mod wgpu_backend;

pub use backend::{Backend, Oracle};
pub use error::{Error, Result};
pub use problem::{
    CHUNK, ForwardInputs, ForwardOutputs, Gradients, Options, Problem, check_host_values,
};
pub use random::RandomSpec;
pub use tensor::{DType, HostTensor, TensorMeta, relative_l2, relative_l2_scaled};

/// The README's Rust example is compiled as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
