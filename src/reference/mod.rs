//! The f64 oracle: the token-by-token GDN recurrence, independent of every GPU code path.
//!
//! Per v-head and token (FLA's order): `S ← exp(g)·S; u = β(v − Sᵀk); S ← S + k uᵀ;
//! o = scale·Sᵀq`. It is public so users can debug their own inputs with it, and it is the
//! `cpu` backend of the `gdn` CLI. Inputs are read as f32 (what any storage dtype widens to)
//! and every operation runs in f64.

mod backward;
mod forward;

pub use backward::{Gradients, backward, backward_f64, backward_heads, forward_f64};
pub use forward::{forward, forward_heads};

use crate::problem::L2NORM_EPS;

/// `x / sqrt(Σx² + 1e-6)`.
pub fn l2norm(x: &[f64]) -> Vec<f64> {
    let r = 1.0 / (x.iter().map(|a| a * a).sum::<f64>() + L2NORM_EPS).sqrt();
    x.iter().map(|a| a * r).collect()
}

/// The logistic function `1 / (1 + e⁻ˣ)`.
pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// FLA's softplus: `x` above 20, else `ln(1 + eˣ)`.
pub fn softplus(x: f64) -> f64 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

/// The in-kernel gate: `−exp(A_log)·softplus(g + dt_bias)`.
pub fn gate(g_raw: f64, a_log: f64, dt_bias: f64) -> f64 {
    -a_log.exp() * softplus(g_raw + dt_bias)
}

/// The elements of the v-heads in `heads` from a tensor laid out `[outer, HV, inner]` (o is
/// `[B·T, HV, V]`, states `[N, HV, K·V]`), in order.
pub fn select_heads<T: Copy>(data: &[T], heads_v: usize, inner: usize, heads: &[usize]) -> Vec<T> {
    let outer = data.len() / (heads_v * inner);
    let mut out = Vec::with_capacity(outer * heads.len() * inner);
    for o in 0..outer {
        for &h in heads {
            let start = (o * heads_v + h) * inner;
            out.extend_from_slice(&data[start..start + inner]);
        }
    }
    out
}
