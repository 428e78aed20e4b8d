//! The one interface through which the CLI, `gdn bench`'s correctness gate and the shared
//! oracle tests reach a backend: the wgpu kernels ([`crate::wgpu_backend`]), the CUDA kernels
//! (feature `cuda`) or the f64 oracle itself ([`Oracle`]).
//!
//! It works on host tensors: upload, run, wait, download. Hot paths (workspaces, decode plans,
//! caller-owned buffers and streams) stay in each backend's own API, which this trait does not
//! hide.

use crate::error::Result;
use crate::problem::{ForwardInputs, ForwardOutputs, Gradients, Problem};
use crate::tensor::{DType, HostTensor};
use crate::tolerance::{Arithmetic, Op};

/// A way to run GDN on host tensors.
pub trait Backend {
    /// Short name, as `--backend` takes it: `wgpu`, `cuda`, `cpu`.
    fn name(&self) -> &'static str;

    /// One line naming the device (adapter, architecture, driver) for reports.
    fn describe(&self) -> String;

    /// Storage dtypes of q, k, v (and o) that `op` takes on this device.
    fn storage_dtypes(&self, op: Op) -> Vec<DType>;

    /// How the backend's kernels for `op` multiply for `problem` with `dtype` storage: picks
    /// the tolerance the oracle comparison uses ([`crate::tolerance`]).
    fn arithmetic(&self, op: Op, problem: &Problem, dtype: DType) -> Arithmetic;

    /// The forward: o and the final states.
    fn forward(
        &self,
        problem: &Problem,
        inputs: &ForwardInputs<&HostTensor>,
    ) -> Result<ForwardOutputs<HostTensor>>;

    /// The forward and the gradients of `L = Σ o ⊙ d_o + Σ final_state ⊙ d_final_state`.
    fn forward_backward(
        &self,
        problem: &Problem,
        inputs: &ForwardInputs<&HostTensor>,
        d_o: &HostTensor,
        d_final_state: Option<&HostTensor>,
    ) -> Result<(ForwardOutputs<HostTensor>, Gradients<HostTensor>)>;

    /// The forward through the recurrent (decode) kernel, `tokens_per_step` tokens per
    /// sequence per step over a state pool seeded with the initial states.
    fn decode(
        &self,
        problem: &Problem,
        inputs: &ForwardInputs<&HostTensor>,
        tokens_per_step: usize,
    ) -> Result<ForwardOutputs<HostTensor>>;
}

/// The f64 oracle as a backend (`--backend cpu`): results narrowed to f32 (o in the storage
/// dtype of v).
#[derive(Debug, Clone, Copy, Default)]
pub struct Oracle;

fn narrow(x: Vec<f64>) -> Vec<f32> {
    x.into_iter().map(|x| x as f32).collect()
}

impl Backend for Oracle {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn describe(&self) -> String {
        "cpu (f64 oracle)".into()
    }

    fn storage_dtypes(&self, _op: Op) -> Vec<DType> {
        vec![DType::F32, DType::F16, DType::BF16]
    }

    fn arithmetic(&self, _op: Op, _problem: &Problem, _dtype: DType) -> Arithmetic {
        Arithmetic::F32
    }

    fn forward(
        &self,
        problem: &Problem,
        inputs: &ForwardInputs<&HostTensor>,
    ) -> Result<ForwardOutputs<HostTensor>> {
        // The same refusals as the GPU backends' host entry points: finite values, g ≤ 0.
        problem.check_inputs(inputs, &self.storage_dtypes(Op::Forward))?;
        crate::problem::check_host_values(problem, inputs)?;
        let out = crate::reference::forward(problem, inputs)?;
        let mut o = narrow(out.o);
        crate::tensor::round_to_dtype(&mut o, inputs.v.dtype);
        Ok(ForwardOutputs {
            o: HostTensor::new(problem.v_shape(), o).with_dtype(inputs.v.dtype),
            final_state: HostTensor::new(problem.state_shape(), narrow(out.final_state)),
        })
    }

    fn forward_backward(
        &self,
        problem: &Problem,
        inputs: &ForwardInputs<&HostTensor>,
        d_o: &HostTensor,
        d_final_state: Option<&HostTensor>,
    ) -> Result<(ForwardOutputs<HostTensor>, Gradients<HostTensor>)> {
        problem.check_inputs(inputs, &self.storage_dtypes(Op::Backward))?;
        crate::wgpu_backend::backward::check_host_gradients(
            problem,
            inputs.v.dtype,
            d_o,
            d_final_state,
        )?;
        let outputs = self.forward(problem, inputs)?;
        let g = crate::reference::backward(problem, inputs, d_o, d_final_state)?;
        let qk = |x: Vec<f64>, dtype: DType| {
            let mut x = narrow(x);
            crate::tensor::round_to_dtype(&mut x, dtype);
            HostTensor::new(problem.qk_shape(), x).with_dtype(dtype)
        };
        let heads = problem.heads_v;
        let grads = Gradients {
            dq: qk(g.dq, inputs.q.dtype),
            dk: qk(g.dk, inputs.k.dtype),
            dv: {
                let mut x = narrow(g.dv);
                crate::tensor::round_to_dtype(&mut x, inputs.v.dtype);
                HostTensor::new(problem.v_shape(), x).with_dtype(inputs.v.dtype)
            },
            dg: HostTensor::new(problem.gate_shape(), narrow(g.dg)),
            dbeta: HostTensor::new(problem.gate_shape(), narrow(g.dbeta)),
            dh0: g
                .dh0
                .map(|x| HostTensor::new(problem.state_shape(), narrow(x))),
            da_log: g.da_log.map(|x| HostTensor::new([heads], narrow(x))),
            ddt_bias: g.ddt_bias.map(|x| HostTensor::new([heads], narrow(x))),
        };
        Ok((outputs, grads))
    }

    fn decode(
        &self,
        problem: &Problem,
        inputs: &ForwardInputs<&HostTensor>,
        tokens_per_step: usize,
    ) -> Result<ForwardOutputs<HostTensor>> {
        if tokens_per_step == 0 {
            return Err(crate::Error::value("tokens_per_step", "at least 1", 0));
        }
        // The recurrence is the same token by token: the oracle has one path.
        self.forward(problem, inputs)
    }
}
