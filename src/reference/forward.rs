use crate::error::Result;
use crate::problem::{ForwardInputs, ForwardOutputs, Problem};
use crate::tensor::HostTensor;

/// The forward recurrence in f64. Validates shapes like every backend; returns o `[B,T,HV,V]`
/// and the final state in the problem's state layout, both in f64.
pub fn forward(
    problem: &Problem,
    inputs: &ForwardInputs<&HostTensor>,
) -> Result<ForwardOutputs<Vec<f64>>> {
    let all: Vec<usize> = (0..problem.heads_v).collect();
    forward_heads(problem, inputs, &all)
}

/// [`forward`] restricted to the v-heads in `heads` (the others stay 0): checks large problems
/// on a sample of heads. Compare with [`select_heads`](super::select_heads).
pub fn forward_heads(
    problem: &Problem,
    inputs: &ForwardInputs<&HostTensor>,
    heads: &[usize],
) -> Result<ForwardOutputs<Vec<f64>>> {
    use crate::tensor::DType::*;
    problem.check_inputs(inputs, &[F32, F16, BF16])?;
    if let Some(&bad) = heads.iter().find(|&&h| h >= problem.heads_v) {
        return Err(crate::Error::value(
            "heads",
            format!("v-head indices below HV = {}", problem.heads_v),
            bad,
        ));
    }
    let p = problem;
    let (h_qk, hv_n, kd, vd) = (p.heads_qk, p.heads_v, p.key_dim, p.value_dim);
    let opt = p.options;
    let scale = p.scale() as f64;
    let mut o = vec![0.0f64; p.total_tokens() * hv_n * vd];
    let mut final_state = vec![0.0f64; p.num_sequences() * hv_n * kd * vd];
    let wide = |t: &HostTensor, start: usize, len: usize| -> Vec<f64> {
        t.data[start..start + len]
            .iter()
            .map(|&x| x as f64)
            .collect()
    };

    for (n, seq) in p.sequences().into_iter().enumerate() {
        for &hv in heads {
            let h = hv / p.group();
            // S is K×V row-major here whatever the external layout.
            let mut s = vec![0.0f64; kd * vd];
            if let Some(h0) = inputs.initial_state {
                for ki in 0..kd {
                    for vi in 0..vd {
                        s[ki * vd + vi] = h0.data[p.state_index(n, hv, ki, vi)] as f64;
                    }
                }
            }
            for t in seq.clone() {
                let mut q = wide(inputs.q, (t * h_qk + h) * kd, kd);
                let mut k = wide(inputs.k, (t * h_qk + h) * kd, kd);
                if opt.l2norm_qk {
                    q = super::l2norm(&q);
                    k = super::l2norm(&k);
                }
                let v = wide(inputs.v, (t * hv_n + hv) * vd, vd);
                let mut beta = inputs.beta.data[t * hv_n + hv] as f64;
                if opt.beta_sigmoid {
                    beta = super::sigmoid(beta);
                }
                if opt.allow_neg_eigval {
                    beta *= 2.0;
                }
                let mut g = inputs.g.data[t * hv_n + hv] as f64;
                if opt.gate_in_kernel {
                    let a_log = inputs.a_log.expect("validated").data[hv] as f64;
                    let dt_bias = inputs.dt_bias.expect("validated").data[hv] as f64;
                    g = super::gate(g, a_log, dt_bias);
                }
                let alpha = g.exp();
                s.iter_mut().for_each(|x| *x *= alpha);
                for vi in 0..vd {
                    let pred: f64 = (0..kd).map(|ki| s[ki * vd + vi] * k[ki]).sum();
                    let u = beta * (v[vi] - pred);
                    for ki in 0..kd {
                        s[ki * vd + vi] += k[ki] * u;
                    }
                }
                for vi in 0..vd {
                    let acc: f64 = (0..kd).map(|ki| s[ki * vd + vi] * q[ki]).sum();
                    o[(t * hv_n + hv) * vd + vi] = scale * acc;
                }
            }
            for ki in 0..kd {
                for vi in 0..vd {
                    final_state[p.state_index(n, hv, ki, vi)] = s[ki * vd + vi];
                }
            }
        }
    }
    Ok(ForwardOutputs { o, final_state })
}
