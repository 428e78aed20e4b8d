//! The f64 oracle backward: exact reverse-mode through the token recurrence (BPTT).
//!
//! For each sequence and v-head the forward is replayed and every token is differentiated by
//! hand, newest first:
//!
//! ```text
//! forward (one token)             reverse (dS holds ∂L/∂S_t on entry, ∂L/∂S_{t−1} on exit)
//! S_a = α·S_{t−1}, α = exp(g)     dq = scale·S_t·do;           dS += scale·q·doᵀ
//! p   = S_aᵀk                     dk = dS·u;  du = dSᵀk
//! u   = β(v − p)                  dβ = du·(v − p);  dv = β·du;  dp = −β·du
//! S_t = S_a + k·uᵀ                dk += S_a·dp;  dS += k·dpᵀ
//! o   = scale·S_tᵀq               dg = α·Σ(dS ⊙ S_{t−1});  dS ← α·dS
//! ```
//!
//! then the input activations (l2norm, sigmoid / ×2, the in-kernel gate) are chained on, and
//! dq / dk are summed over each GVA group. States are checkpointed every [`CHECKPOINT`] tokens
//! and each segment is recomputed in the reverse sweep, so memory stays
//! O((T/64 + 64)·K·V) per head rather than O(T·K·V).
//!
//! [`forward_f64`] is the same forward on f64 inputs (identical operation order to
//! [`super::forward`]), for finite differences at f64 precision.

use crate::error::{Error, Result};
use crate::problem::{ForwardInputs, ForwardOutputs, Problem};
use crate::tensor::{DType, HostTensor};

/// Tokens between stored states in the reverse sweep.
const CHECKPOINT: usize = 64;

/// Gradients of a scalar loss w.r.t. the raw inputs of a forward pass, in f64.
#[derive(Debug, Clone, PartialEq)]
pub struct Gradients {
    /// `[B,T,H,K]`: summed over each GVA group, through the l2norm with `l2norm_qk`.
    pub dq: Vec<f64>,
    /// `[B,T,H,K]`: summed over each GVA group, through the l2norm with `l2norm_qk`.
    pub dk: Vec<f64>,
    /// `[B,T,HV,V]`.
    pub dv: Vec<f64>,
    /// `[B,T,HV]`, w.r.t. the raw g (through the gate activation with `gate_in_kernel`).
    pub dg: Vec<f64>,
    /// `[B,T,HV]`, w.r.t. the raw beta (through the sigmoid and ×2 when enabled).
    pub dbeta: Vec<f64>,
    /// The problem's state shape; only when an initial state was given.
    pub dh0: Option<Vec<f64>>,
    /// `[HV]`, with `gate_in_kernel`: summed over all tokens and sequences.
    pub da_log: Option<Vec<f64>>,
    /// `[HV]`, with `gate_in_kernel`: summed over all tokens and sequences.
    pub ddt_bias: Option<Vec<f64>>,
    /// `[HV]`, with `gate_in_kernel`: Σ_t |∂L/∂g_t · g_t|, the magnitudes of dA_log's terms.
    /// dA_log can cancel to far less than this (its terms have random signs); an error in it
    /// is measured against this scale (`tolerance::Quantity::GradSums`,
    /// [`crate::relative_l2_scaled`]).
    pub da_log_magnitude: Option<Vec<f64>>,
    /// `[HV]`, with `gate_in_kernel`: Σ_t |∂L/∂g_raw,t|, the magnitudes of ddt_bias's terms.
    pub ddt_bias_magnitude: Option<Vec<f64>>,
}

/// The gradients of `L = Σ o ⊙ d_o + Σ final_state ⊙ dht` w.r.t. the raw inputs.
///
/// `d_o` has the shape of o, `[B,T,HV,V]`; `dht`, when given, the problem's state shape (a
/// missing `dht` means no loss on the final state). Inputs are validated like the forward;
/// values are read as f32 and everything else runs in f64.
pub fn backward(
    problem: &Problem,
    inputs: &ForwardInputs<&HostTensor>,
    d_o: &HostTensor,
    dht: Option<&HostTensor>,
) -> Result<Gradients> {
    let all: Vec<usize> = (0..problem.heads_v).collect();
    backward_impl(problem, inputs, d_o, dht, &all)
}

/// [`backward`] restricted to the v-heads in `heads`: dv, dg, dbeta, dh0, dA_log and ddt_bias
/// are computed for those heads only (0 elsewhere), and dq, dk hold only those heads'
/// contributions — equal to the full gradient at q/k heads whose whole GVA group is listed.
/// Checks large problems on a sample of heads.
pub fn backward_heads(
    problem: &Problem,
    inputs: &ForwardInputs<&HostTensor>,
    d_o: &HostTensor,
    dht: Option<&HostTensor>,
    heads: &[usize],
) -> Result<Gradients> {
    if let Some(&bad) = heads.iter().find(|&&h| h >= problem.heads_v) {
        return Err(Error::value(
            "heads",
            format!("v-head indices below HV = {}", problem.heads_v),
            bad,
        ));
    }
    backward_impl(problem, inputs, d_o, dht, heads)
}

fn backward_impl(
    problem: &Problem,
    inputs: &ForwardInputs<&HostTensor>,
    d_o: &HostTensor,
    dht: Option<&HostTensor>,
    heads: &[usize],
) -> Result<Gradients> {
    use DType::*;
    problem.check_inputs(inputs, &[F32, F16, BF16])?;
    check_shape("d_o", &d_o.shape, &problem.v_shape())?;
    crate::TensorMeta::check_storage(d_o, "d_o")?;
    if let Some(dht) = dht {
        check_shape("dht", &dht.shape, &problem.state_shape())?;
        crate::TensorMeta::check_storage(dht, "dht")?;
    }
    let wide = |t: &HostTensor| -> Vec<f64> { t.data.iter().map(|&x| x as f64).collect() };
    let inputs = ForwardInputs {
        q: wide(inputs.q),
        k: wide(inputs.k),
        v: wide(inputs.v),
        g: wide(inputs.g),
        beta: wide(inputs.beta),
        initial_state: inputs.initial_state.map(wide),
        a_log: inputs.a_log.map(wide),
        dt_bias: inputs.dt_bias.map(wide),
    };
    backward_f64_heads(
        problem,
        &inputs,
        &wide(d_o),
        dht.map(wide).as_deref(),
        heads,
    )
}

/// [`backward`] on flat f64 inputs (row-major, the same shapes). Lengths are validated.
pub fn backward_f64<T: AsRef<[f64]>>(
    problem: &Problem,
    inputs: &ForwardInputs<T>,
    d_o: &[f64],
    dht: Option<&[f64]>,
) -> Result<Gradients> {
    let all: Vec<usize> = (0..problem.heads_v).collect();
    backward_f64_heads(problem, inputs, d_o, dht, &all)
}

fn backward_f64_heads<T: AsRef<[f64]>>(
    problem: &Problem,
    inputs: &ForwardInputs<T>,
    d_o: &[f64],
    dht: Option<&[f64]>,
    heads: &[usize],
) -> Result<Gradients> {
    let p = problem;
    check_lengths(p, inputs)?;
    check_len("d_o", d_o, &p.v_shape())?;
    if let Some(dht) = dht {
        check_len("dht", dht, &p.state_shape())?;
    }
    let (h_qk, hv_n, kd, vd) = (p.heads_qk, p.heads_v, p.key_dim, p.value_dim);
    let (bt, opt) = (p.total_tokens(), p.options);
    let scale = p.scale() as f64;
    let mut grads = Gradients {
        dq: vec![0.0; bt * h_qk * kd],
        dk: vec![0.0; bt * h_qk * kd],
        dv: vec![0.0; bt * hv_n * vd],
        dg: vec![0.0; bt * hv_n],
        dbeta: vec![0.0; bt * hv_n],
        dh0: inputs
            .initial_state
            .as_ref()
            .map(|_| vec![0.0; p.state_shape().iter().product()]),
        da_log: opt.gate_in_kernel.then(|| vec![0.0; hv_n]),
        ddt_bias: opt.gate_in_kernel.then(|| vec![0.0; hv_n]),
        da_log_magnitude: opt.gate_in_kernel.then(|| vec![0.0; hv_n]),
        ddt_bias_magnitude: opt.gate_in_kernel.then(|| vec![0.0; hv_n]),
    };

    for (n, seq) in p.sequences().into_iter().enumerate() {
        for &hv in heads {
            let h = hv / p.group();
            let tokens: Vec<Token> = seq.clone().map(|t| Token::new(p, inputs, t, hv)).collect();
            let s0 = load_state(p, inputs.initial_state.as_ref().map(AsRef::as_ref), n, hv);
            let ds_final = load_state(p, dht, n, hv);
            let d_o_head: Vec<f64> = seq
                .clone()
                .flat_map(|t| &d_o[(t * hv_n + hv) * vd..][..vd])
                .copied()
                .collect();
            let head = head_backward(&tokens, &s0, &d_o_head, ds_final, scale);

            // Chain the activations onto the raw inputs.
            for (i, t) in seq.clone().enumerate() {
                let qk = (t * h_qk + h) * kd;
                let (dq, dk) = (&head.dq[i * kd..][..kd], &head.dk[i * kd..][..kd]);
                let (dq, dk) = if opt.l2norm_qk {
                    let q_raw = &inputs.q.as_ref()[qk..][..kd];
                    let k_raw = &inputs.k.as_ref()[qk..][..kd];
                    (l2norm_backward(q_raw, dq), l2norm_backward(k_raw, dk))
                } else {
                    (dq.to_vec(), dk.to_vec())
                };
                add_into(&mut grads.dq[qk..][..kd], &dq);
                add_into(&mut grads.dk[qk..][..kd], &dk);
                grads.dv[(t * hv_n + hv) * vd..][..vd].copy_from_slice(&head.dv[i * vd..][..vd]);

                let th = t * hv_n + hv;
                let beta_raw = inputs.beta.as_ref()[th];
                grads.dbeta[th] = head.dbeta[i] * beta_derivative(beta_raw, p);
                if opt.gate_in_kernel {
                    let a_log = inputs.a_log.as_ref().expect("validated").as_ref()[hv];
                    let dt_bias = inputs.dt_bias.as_ref().expect("validated").as_ref()[hv];
                    let g_raw = inputs.g.as_ref()[th];
                    let dg_raw = head.dg[i] * gate_derivative(g_raw, a_log, dt_bias);
                    grads.dg[th] = dg_raw;
                    // ∂g/∂A_log = g (g = −exp(A_log)·softplus), ∂g/∂dt_bias = ∂g/∂g_raw.
                    let da_log_term = head.dg[i] * tokens[i].g;
                    grads.da_log.as_mut().expect("allocated")[hv] += da_log_term;
                    grads.ddt_bias.as_mut().expect("allocated")[hv] += dg_raw;
                    grads.da_log_magnitude.as_mut().expect("allocated")[hv] += da_log_term.abs();
                    grads.ddt_bias_magnitude.as_mut().expect("allocated")[hv] += dg_raw.abs();
                } else {
                    grads.dg[th] = head.dg[i];
                }
            }
            if let Some(dh0) = grads.dh0.as_mut() {
                for ki in 0..kd {
                    for vi in 0..vd {
                        dh0[p.state_index(n, hv, ki, vi)] = head.ds0[ki * vd + vi];
                    }
                }
            }
        }
    }
    Ok(grads)
}

/// The forward recurrence on flat f64 inputs (row-major, the shapes of [`ForwardInputs`]).
/// Same operations in the same order as [`super::forward`]; returns o `[B,T,HV,V]` and the
/// final state in the problem's state layout.
pub fn forward_f64<T: AsRef<[f64]>>(
    problem: &Problem,
    inputs: &ForwardInputs<T>,
) -> Result<ForwardOutputs<Vec<f64>>> {
    let p = problem;
    check_lengths(p, inputs)?;
    let (hv_n, kd, vd) = (p.heads_v, p.key_dim, p.value_dim);
    let scale = p.scale() as f64;
    let mut o = vec![0.0f64; p.total_tokens() * hv_n * vd];
    let mut final_state = vec![0.0f64; p.num_sequences() * hv_n * kd * vd];
    for (n, seq) in p.sequences().into_iter().enumerate() {
        for hv in 0..hv_n {
            let mut s = load_state(p, inputs.initial_state.as_ref().map(AsRef::as_ref), n, hv);
            for t in seq.clone() {
                let tok = Token::new(p, inputs, t, hv);
                tok.step(&mut s);
                for vi in 0..vd {
                    let acc: f64 = (0..kd).map(|ki| s[ki * vd + vi] * tok.q[ki]).sum();
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

/// One token of one v-head, after the input activations.
struct Token {
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    beta: f64,
    /// The log-decay actually applied (after the in-kernel gate).
    g: f64,
}

impl Token {
    fn new<T: AsRef<[f64]>>(p: &Problem, x: &ForwardInputs<T>, t: usize, hv: usize) -> Token {
        let (kd, vd, opt) = (p.key_dim, p.value_dim, p.options);
        let qk = (t * p.heads_qk + hv / p.group()) * kd;
        let th = t * p.heads_v + hv;
        let mut q = x.q.as_ref()[qk..][..kd].to_vec();
        let mut k = x.k.as_ref()[qk..][..kd].to_vec();
        if opt.l2norm_qk {
            q = super::l2norm(&q);
            k = super::l2norm(&k);
        }
        let v = x.v.as_ref()[th * vd..][..vd].to_vec();
        let mut beta = x.beta.as_ref()[th];
        if opt.beta_sigmoid {
            beta = super::sigmoid(beta);
        }
        if opt.allow_neg_eigval {
            beta *= 2.0;
        }
        let mut g = x.g.as_ref()[th];
        if opt.gate_in_kernel {
            let a_log = x.a_log.as_ref().expect("validated").as_ref()[hv];
            let dt_bias = x.dt_bias.as_ref().expect("validated").as_ref()[hv];
            g = super::gate(g, a_log, dt_bias);
        }
        Token { q, k, v, beta, g }
    }

    /// `S ← exp(g)·S; u = β(v − Sᵀk); S ← S + k uᵀ` on a K×V row-major state.
    fn step(&self, s: &mut [f64]) {
        let (kd, vd) = (self.k.len(), self.v.len());
        let alpha = self.g.exp();
        s.iter_mut().for_each(|x| *x *= alpha);
        for vi in 0..vd {
            let pred: f64 = (0..kd).map(|ki| s[ki * vd + vi] * self.k[ki]).sum();
            let u = self.beta * (self.v[vi] - pred);
            for ki in 0..kd {
                s[ki * vd + vi] += self.k[ki] * u;
            }
        }
    }
}

/// Gradients of one v-head of one sequence w.r.t. the activated per-token inputs.
struct HeadGradients {
    /// `[T,K]`
    dq: Vec<f64>,
    /// `[T,K]`
    dk: Vec<f64>,
    /// `[T,V]`
    dv: Vec<f64>,
    /// `[T]`
    dbeta: Vec<f64>,
    /// `[T]`, w.r.t. the applied log-decay.
    dg: Vec<f64>,
    /// `[K,V]`, w.r.t. the initial state.
    ds0: Vec<f64>,
}

/// Reverse pass of one head: `s0` the initial K×V state, `d_o` `[T,V]`, `ds` ∂L/∂(final state)
/// (K×V). Replays the forward from checkpoints and walks the tokens newest first.
fn head_backward(
    tokens: &[Token],
    s0: &[f64],
    d_o: &[f64],
    mut ds: Vec<f64>,
    scale: f64,
) -> HeadGradients {
    let n = tokens.len();
    let kd = tokens.first().map_or(0, |t| t.k.len());
    let vd = tokens.first().map_or(0, |t| t.v.len());
    let mut grads = HeadGradients {
        dq: vec![0.0; n * kd],
        dk: vec![0.0; n * kd],
        dv: vec![0.0; n * vd],
        dbeta: vec![0.0; n],
        dg: vec![0.0; n],
        ds0: Vec::new(),
    };

    // The state before tokens 0, CHECKPOINT, 2·CHECKPOINT, ...
    let mut checkpoints = Vec::new();
    let mut s = s0.to_vec();
    for (t, tok) in tokens.iter().enumerate() {
        if t % CHECKPOINT == 0 {
            checkpoints.push(s.clone());
        }
        tok.step(&mut s);
    }

    for (segment, checkpoint) in checkpoints.into_iter().enumerate().rev() {
        let start = segment * CHECKPOINT;
        let end = (start + CHECKPOINT).min(n);
        // The state before each token of the segment.
        let mut before = Vec::with_capacity(end - start);
        let mut s = checkpoint;
        for tok in &tokens[start..end] {
            before.push(s.clone());
            tok.step(&mut s);
        }
        for t in (start..end).rev() {
            let g = token_backward(
                &tokens[t],
                &before[t - start],
                &d_o[t * vd..][..vd],
                &mut ds,
                scale,
            );
            grads.dq[t * kd..][..kd].copy_from_slice(&g.dq);
            grads.dk[t * kd..][..kd].copy_from_slice(&g.dk);
            grads.dv[t * vd..][..vd].copy_from_slice(&g.dv);
            grads.dbeta[t] = g.dbeta;
            grads.dg[t] = g.dg;
        }
    }
    grads.ds0 = ds;
    grads
}

/// Gradients of one token w.r.t. its activated inputs.
struct TokenGradients {
    dq: Vec<f64>,
    dk: Vec<f64>,
    dv: Vec<f64>,
    dbeta: f64,
    dg: f64,
}

/// Reverse of one token. `s_prev` is the state before the token; `ds` holds ∂L/∂S_t on entry
/// and ∂L/∂S_{t−1} on return. All states K×V row-major.
fn token_backward(
    tok: &Token,
    s_prev: &[f64],
    d_o: &[f64],
    ds: &mut [f64],
    scale: f64,
) -> TokenGradients {
    let (kd, vd) = (tok.k.len(), tok.v.len());
    let (q, k) = (&tok.q, &tok.k);
    // Replay the token's forward.
    let alpha = tok.g.exp();
    let s_a: Vec<f64> = s_prev.iter().map(|x| alpha * x).collect();
    let err: Vec<f64> = (0..vd)
        .map(|vi| tok.v[vi] - (0..kd).map(|ki| s_a[ki * vd + vi] * k[ki]).sum::<f64>())
        .collect();
    let u: Vec<f64> = err.iter().map(|e| tok.beta * e).collect();
    let s_t = |ki: usize, vi: usize| s_a[ki * vd + vi] + k[ki] * u[vi];

    // o = scale·S_tᵀq
    let dq: Vec<f64> = (0..kd)
        .map(|ki| scale * (0..vd).map(|vi| s_t(ki, vi) * d_o[vi]).sum::<f64>())
        .collect();
    for ki in 0..kd {
        for vi in 0..vd {
            ds[ki * vd + vi] += scale * q[ki] * d_o[vi];
        }
    }
    // S_t = S_a + k·uᵀ
    let mut dk: Vec<f64> = (0..kd)
        .map(|ki| (0..vd).map(|vi| ds[ki * vd + vi] * u[vi]).sum())
        .collect();
    let du: Vec<f64> = (0..vd)
        .map(|vi| (0..kd).map(|ki| ds[ki * vd + vi] * k[ki]).sum())
        .collect();
    // u = β(v − p)
    let dbeta: f64 = du.iter().zip(&err).map(|(a, b)| a * b).sum();
    let dv: Vec<f64> = du.iter().map(|d| tok.beta * d).collect();
    let dp: Vec<f64> = du.iter().map(|d| -tok.beta * d).collect();
    // p = S_aᵀk
    for ki in 0..kd {
        dk[ki] += (0..vd).map(|vi| s_a[ki * vd + vi] * dp[vi]).sum::<f64>();
        for vi in 0..vd {
            ds[ki * vd + vi] += k[ki] * dp[vi];
        }
    }
    // S_a = exp(g)·S_{t−1}
    let dalpha: f64 = ds.iter().zip(s_prev).map(|(a, b)| a * b).sum();
    ds.iter_mut().for_each(|x| *x *= alpha);
    TokenGradients {
        dq,
        dk,
        dv,
        dbeta,
        dg: alpha * dalpha,
    }
}

/// Reverse of `y = x / sqrt(Σx² + eps)`: `dx = (dy − (dy·y)·y) / sqrt(Σx² + eps)`.
fn l2norm_backward(x: &[f64], dy: &[f64]) -> Vec<f64> {
    let r = 1.0 / (x.iter().map(|a| a * a).sum::<f64>() + crate::problem::L2NORM_EPS).sqrt();
    let y: Vec<f64> = x.iter().map(|a| a * r).collect();
    let dot: f64 = dy.iter().zip(&y).map(|(a, b)| a * b).sum();
    dy.iter()
        .zip(&y)
        .map(|(d, yi)| (d - dot * yi) * r)
        .collect()
}

/// ∂β/∂beta_raw: 1, σ(1 − σ) with `beta_sigmoid`, ×2 with `allow_neg_eigval`.
fn beta_derivative(beta_raw: f64, p: &Problem) -> f64 {
    let mut d = 1.0;
    if p.options.beta_sigmoid {
        let s = super::sigmoid(beta_raw);
        d = s * (1.0 - s);
    }
    if p.options.allow_neg_eigval {
        d *= 2.0;
    }
    d
}

/// ∂g/∂g_raw of `g = −exp(A_log)·softplus(g_raw + dt_bias)` (softplus' = 1 above 20, else σ).
fn gate_derivative(g_raw: f64, a_log: f64, dt_bias: f64) -> f64 {
    let x = g_raw + dt_bias;
    let softplus_d = if x > 20.0 { 1.0 } else { super::sigmoid(x) };
    -a_log.exp() * softplus_d
}

/// One head's K×V state (row-major) from a state tensor in the problem's layout, or zeros.
fn load_state(p: &Problem, state: Option<&[f64]>, n: usize, hv: usize) -> Vec<f64> {
    let (kd, vd) = (p.key_dim, p.value_dim);
    let mut s = vec![0.0f64; kd * vd];
    if let Some(state) = state {
        for ki in 0..kd {
            for vi in 0..vd {
                s[ki * vd + vi] = state[p.state_index(n, hv, ki, vi)];
            }
        }
    }
    s
}

fn add_into(acc: &mut [f64], x: &[f64]) {
    acc.iter_mut().zip(x).for_each(|(a, b)| *a += b);
}

fn check_shape(name: &str, got: &[usize], expected: &[usize]) -> Result<()> {
    if got != expected {
        Err(Error::shape(name, expected, got))
    } else {
        Ok(())
    }
}

fn check_len(name: &str, x: &[f64], shape: &[usize]) -> Result<()> {
    let n: usize = shape.iter().product();
    if x.len() != n {
        return Err(Error::value(
            name,
            format!("{n} values (shape {shape:?}, flattened)"),
            format!("{} values", x.len()),
        ));
    }
    Ok(())
}

/// Lengths of flat f64 inputs against the problem, and A_log / dt_bias present exactly with
/// `gate_in_kernel` (the f64 counterpart of [`Problem::check_inputs`]).
fn check_lengths<T: AsRef<[f64]>>(p: &Problem, x: &ForwardInputs<T>) -> Result<()> {
    let (qk, v, gate, state, hv) = (
        p.qk_shape(),
        p.v_shape(),
        p.gate_shape(),
        p.state_shape(),
        [p.heads_v],
    );
    check_len("q", x.q.as_ref(), &qk)?;
    check_len("k", x.k.as_ref(), &qk)?;
    check_len("v", x.v.as_ref(), &v)?;
    check_len("g", x.g.as_ref(), &gate)?;
    check_len("beta", x.beta.as_ref(), &gate)?;
    if let Some(h0) = &x.initial_state {
        check_len("initial_state", h0.as_ref(), &state)?;
    }
    for (name, t) in [("A_log", &x.a_log), ("dt_bias", &x.dt_bias)] {
        match (p.options.gate_in_kernel, t) {
            (true, Some(t)) => check_len(name, t.as_ref(), &hv)?,
            (true, None) => {
                return Err(Error::Missing {
                    name: name.into(),
                    why: "with gate_in_kernel, shape [HV]".into(),
                });
            }
            (false, Some(_)) => {
                return Err(Error::value(
                    name,
                    format!("no {name} unless gate_in_kernel is set"),
                    "a tensor",
                ));
            }
            (false, None) => {}
        }
    }
    Ok(())
}
