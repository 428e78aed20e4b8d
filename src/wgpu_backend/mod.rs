//! The wgpu backend: configuration, context, pipeline cache, tensors, shader assembly and one
//! launcher per WGSL pass. Launchers describe their pass (tiling, buffers, grid) and record it
//! through `launch` into a caller's `wgpu::CommandEncoder`; they never submit.

mod backend;
pub mod backward;
pub mod config;
mod context;
pub(crate) mod coop_scan;
pub mod decode;
pub mod forward;
pub(crate) mod launch;
pub mod params;
pub mod path;
pub(crate) mod pipelines;
pub mod shaders;
mod tensor;
pub mod timing;
pub mod tuning;
pub mod validate;
pub mod variants;
pub(crate) mod windows;

#[cfg(not(target_arch = "wasm32"))]
pub use backward::backward_host;
pub use backward::{
    BackwardPlan, BackwardWorkspace, MemoryBudget, Saved, backward, backward_into_workspace,
    backward_profiled, backward_with_workspace, forward_backward, forward_saved, forward_saved_for,
};
pub use config::{Config, SegmentChoice, SegmentWindow, ShaderChecks};
pub use context::{Context, list_adapters, list_adapters_matching};
pub use decode::{DecodeOutputs, DecodePlan, StateLayout, StatePool, StateSlot, decode_step};
#[cfg(not(target_arch = "wasm32"))]
pub use forward::forward_host;
pub use forward::{
    Forward, ForwardWorkspace, Intermediates, RecurrentForward, SegmentPaths, forward,
    forward_algorithm, forward_into, forward_into_profiled, forward_into_with_algorithm,
    forward_into_with_path, forward_into_workspace,
};
pub use path::{AlgorithmChoice, ComputePath, ForwardAlgorithm, PathChoice, PathSupport};
pub use tensor::{GpuTensor, upload_inputs};
pub use timing::GpuTimer;
pub use tuning::Tuning;
pub use validate::{FiniteCheck, Require};
#[cfg(not(target_arch = "wasm32"))]
pub use validate::{check_finite, check_inputs_finite};
