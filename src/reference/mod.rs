//! The f64 oracle: the token-by-token GDN recurrence, independent of every GPU code path.
//!
//! Per v-head and token (FLA's order): `S ← exp(g)·S; u = β(v − Sᵀk); S ← S + k uᵀ;
//! o = scale·Sᵀq`. It is public so users can debug their own inputs with it, and it is the
//! `cpu` backend of the `gdn` CLI. Inputs are read as f32 (what any storage dtype widens to)
//! and every operation runs in f64.

mod forward;

pub use forward::forward;

use crate::problem::L2NORM_EPS;

/// `x / sqrt(Σx² + 1e-6)`.
pub fn l2norm(x: &[f64]) -> Vec<f64> {
    let r = 1.0 / (x.iter().map(|a| a * a).sum::<f64>() + L2NORM_EPS).sqrt();
    x.iter().map(|a| a * r).collect()
}

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
