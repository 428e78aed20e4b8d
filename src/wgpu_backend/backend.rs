//! The wgpu [`Context`] as a [`Backend`]: the host-tensor entry points behind one interface.

use crate::tolerance::Arithmetic;
use crate::wgpu_backend::ComputePath;

impl ComputePath {
    /// What this path rounds before it sums, for the tolerance policy.
    pub fn arithmetic(self) -> Arithmetic {
        match self {
            ComputePath::Scalar => Arithmetic::F32,
            ComputePath::F16Math => Arithmetic::F16Math,
            ComputePath::CoopMatrix => Arithmetic::F16Operands,
        }
    }
}

// Host entry points block on the device: native targets only (the web is async).
#[cfg(not(target_arch = "wasm32"))]
mod host {
    use crate::backend::Backend;
    use crate::error::Result;
    use crate::problem::{ForwardInputs, ForwardOutputs, Gradients, Problem};
    use crate::tensor::{DType, HostTensor};
    use crate::tolerance::{Arithmetic, Op};
    use crate::wgpu_backend::{Context, ForwardAlgorithm, forward_algorithm};

    impl Backend for Context {
        fn name(&self) -> &'static str {
            "wgpu"
        }

        fn describe(&self) -> String {
            match &self.adapter_info {
                Some(info) => format!("wgpu ({}, {:?})", info.name, info.backend),
                None => "wgpu".into(),
            }
        }

        fn storage_dtypes(&self, op: Op) -> Vec<DType> {
            match op {
                Op::Forward => self.forward_storage_dtypes(),
                Op::Backward => crate::wgpu_backend::backward::storage_dtypes(self),
                Op::Decode => crate::wgpu_backend::decode::decode_storage_dtypes(self),
            }
        }

        fn arithmetic(&self, op: Op, problem: &Problem, dtype: DType) -> Arithmetic {
            // The chunked forward and the backward have compute paths; the recurrent kernel
            // and decode multiply in f32.
            match op {
                Op::Forward => match forward_algorithm(self, problem, dtype) {
                    Ok(c) if c.algorithm == ForwardAlgorithm::Recurrent => Arithmetic::F32,
                    _ => self
                        .forward_path(problem, dtype)
                        .map_or(Arithmetic::F32, |choice| choice.path.arithmetic()),
                },
                Op::Backward => crate::wgpu_backend::backward::backward_path(self, problem, dtype)
                    .map_or(Arithmetic::F32, |choice| choice.path.arithmetic()),
                Op::Decode => Arithmetic::F32,
            }
        }

        fn forward(
            &self,
            problem: &Problem,
            inputs: &ForwardInputs<&HostTensor>,
        ) -> Result<ForwardOutputs<HostTensor>> {
            crate::wgpu_backend::forward_host(self, problem, inputs)
        }

        fn forward_backward(
            &self,
            problem: &Problem,
            inputs: &ForwardInputs<&HostTensor>,
            d_o: &HostTensor,
            d_final_state: Option<&HostTensor>,
        ) -> Result<(ForwardOutputs<HostTensor>, Gradients<HostTensor>)> {
            crate::wgpu_backend::backward_host(self, problem, inputs, d_o, d_final_state)
        }

        fn decode(
            &self,
            problem: &Problem,
            inputs: &ForwardInputs<&HostTensor>,
            tokens_per_step: usize,
        ) -> Result<ForwardOutputs<HostTensor>> {
            crate::wgpu_backend::decode::decode_host(self, problem, inputs, tokens_per_step)
        }
    }
}
