//! Launcher of `shaders/forward/gate_q.wgsl`: γ ⊙ q per v-head in f16, the coop scan's Q operand.

use crate::error::{Error, Result};
use crate::problem::CHUNK;
use crate::tensor::DType;
use crate::wgpu_backend::launch::{Bindings, Grid, Launch};
use crate::wgpu_backend::shaders::{Pass, source};
use crate::wgpu_backend::{Context, GpuTensor};

/// Record `q_out[t, hv] = f16(exp(G[t, hv]) · q[t, hv / (HV/H)])` plus one chunk of zero rows:
/// `q` is `[B·T, H, K]` (any storage dtype), `gate_beta` `[B·T, HV, 2]`, `q_out`
/// `[B·T + 64, HV, K]` f16.
pub fn gate_q(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    params: &wgpu::Buffer,
    q: &GpuTensor,
    gate_beta: &GpuTensor,
    q_out: &GpuTensor,
) -> Result<()> {
    let n = q.shape.len();
    let tokens: usize = q.shape[..n - 2].iter().product();
    let heads_v = gate_beta.shape[1];
    let padded = [tokens + CHUNK, heads_v, q.shape[n - 1]];
    if q_out.dtype != DType::F16 || q_out.shape != padded {
        return Err(Error::shape("gate_q output (f16)", &padded, &q_out.shape));
    }
    Launch {
        name: "gate_q",
        source: source(Pass::GateQ, q.dtype)?,
        entry: "gate_q",
        constants: &[],
        bindings: Bindings::Ordered(&[params, q, gate_beta, q_out]),
        grid: Grid::items_64(q_out.len().div_ceil(4), "vec4s of q_out"),
    }
    .record(ctx, encoder)
}
