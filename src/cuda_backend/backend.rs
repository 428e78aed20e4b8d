//! The CUDA [`Context`] as a [`Backend`] (`--backend cuda`).

use crate::backend::Backend;
use crate::error::Result;
use crate::problem::{ForwardInputs, ForwardOutputs, Gradients, Problem};
use crate::tensor::{DType, HostTensor};
use crate::tolerance::{Arithmetic, Op};

use super::Context;
use super::recurrent::{self, STORAGE_DTYPES};

impl Backend for Context {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn describe(&self) -> String {
        let (major, minor) = self.capability();
        format!(
            "cuda (device {}: {}, compute capability {major}.{minor}, kernels for {})",
            self.ordinal(),
            self.device_name(),
            self.target().arch()
        )
    }

    fn storage_dtypes(&self, op: Op) -> Vec<DType> {
        match op {
            Op::Forward | Op::Decode | Op::Backward => STORAGE_DTYPES.to_vec(),
        }
    }

    fn arithmetic(&self, op: Op, problem: &Problem, dtype: DType) -> Arithmetic {
        // The recurrent kernel (decode, and the forward where the chunked path does not run)
        // and the exact backward multiply in f32 whatever the storage dtype; the chunked
        // forward and backward round their MMA operands to the storage dtype.
        let rounded = match op {
            Op::Decode => false,
            Op::Forward => matches!(
                super::forward_path(self, problem, dtype),
                Ok(super::ForwardPath::Chunked)
            ),
            Op::Backward => matches!(
                super::backward_path(self, problem, dtype),
                Ok(super::BackwardPath::Chunked)
            ),
        };
        match (rounded, dtype) {
            (false, _) | (_, DType::F32) => Arithmetic::F32,
            (true, DType::BF16) => Arithmetic::Bf16Operands,
            (true, DType::F16) => Arithmetic::F16Operands,
        }
    }

    fn forward(
        &self,
        problem: &Problem,
        inputs: &ForwardInputs<&HostTensor>,
    ) -> Result<ForwardOutputs<HostTensor>> {
        recurrent::forward_host(self, problem, inputs)
    }

    fn forward_backward(
        &self,
        problem: &Problem,
        inputs: &ForwardInputs<&HostTensor>,
        d_o: &HostTensor,
        d_final_state: Option<&HostTensor>,
    ) -> Result<(ForwardOutputs<HostTensor>, Gradients<HostTensor>)> {
        super::backward::forward_backward_host(self, problem, inputs, d_o, d_final_state)
    }

    fn decode(
        &self,
        problem: &Problem,
        inputs: &ForwardInputs<&HostTensor>,
        tokens_per_step: usize,
    ) -> Result<ForwardOutputs<HostTensor>> {
        super::decode::decode_host(self, problem, inputs, tokens_per_step)
    }
}
