//! Work and traffic formulas behind the TFLOP/s, GB/s and memory columns of `gdn bench`
//! (stated in BENCHMARKS.md, "Method"). They count the *algorithm's* work, the same for every
//! implementation, so the rates of two implementations compare like their times.
//!
//! Per token and v-head, chunk C = 64:
//! - forward (FlashQLA's count, gdn-algorithm.md §8.3): `4C(K + V) + 6KV` (= 2C(2K+2V) + 6KV;
//!   ≈ 164 KFLOP at K = V = 128), whichever algorithm runs it (the recurrent kernel does
//!   ~7KV, less, per token: its rates compare like its times, not like its arithmetic);
//! - backward (FlashQLA's 12X + 9Y generalized): `12C(K + V) + 18KV` (≈ 492 KFLOP at 128);
//! - decode (per token of each sequence): `7KV` — decay KV, Sᵀk 2KV, Sᵀq 2KV, rank-1 update 2KV.
//!
//! Bytes are compulsory traffic: every input read once and every output written once, at the
//! storage dtype (q, k, v, o, do, dq, dk, dv) or f32 (g, β, states, dg, dβ). Intermediates and
//! re-reads are not counted, so GB/s is a lower bound on the traffic an implementation moves.

use gdn_wgpu::problem::{CHUNK, Problem};
use gdn_wgpu::tensor::DType;
use gdn_wgpu::wgpu_backend::ForwardAlgorithm;
use gdn_wgpu::wgpu_backend::backward::{saved_bytes, workspace_bytes};

/// Which operation a record measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// The chunked forward (o and the final state).
    Forward,
    /// The chunked backward (dq, dk, dv, dg, dβ, dh0), timed without its forward.
    Backward,
    /// One recurrent decode step per sequence on a state pool.
    Decode,
}

impl Op {
    /// Every op, in the order a sweep runs them.
    pub const ALL: [Op; 3] = [Op::Forward, Op::Backward, Op::Decode];

    /// The op's name as `--ops` takes it and records show it.
    pub fn name(self) -> &'static str {
        match self {
            Op::Forward => "forward",
            Op::Backward => "backward",
            Op::Decode => "decode",
        }
    }

    /// The op named `s` (surrounding whitespace ignored), or a message listing the names.
    pub fn parse(s: &str) -> std::result::Result<Op, String> {
        Op::ALL
            .into_iter()
            .find(|op| op.name() == s.trim())
            .ok_or_else(|| format!("unknown op `{s}` (forward, backward, decode)"))
    }
}

struct Sizes {
    bt: f64,
    h: f64,
    hv: f64,
    k: f64,
    v: f64,
    n: f64,
    s: f64,
}

fn sizes(p: &Problem, dtype: DType) -> Sizes {
    Sizes {
        bt: p.total_tokens() as f64,
        h: p.heads_qk as f64,
        hv: p.heads_v as f64,
        k: p.key_dim as f64,
        v: p.value_dim as f64,
        n: p.num_sequences() as f64,
        s: dtype.size() as f64,
    }
}

/// FLOPs of one call of `op` on `p` (for decode, `p` is one step: B sequences × T tokens).
pub fn flops(op: Op, p: &Problem) -> f64 {
    let (bt, hv, k, v, c) = (
        p.total_tokens() as f64,
        p.heads_v as f64,
        p.key_dim as f64,
        p.value_dim as f64,
        CHUNK as f64,
    );
    let per_token = match op {
        Op::Forward => 4.0 * c * (k + v) + 6.0 * k * v,
        Op::Backward => 12.0 * c * (k + v) + 18.0 * k * v,
        Op::Decode => 7.0 * k * v,
    };
    bt * hv * per_token
}

/// Bytes of the state pool (stored as `pool`) a decode case steps: every sequence's
/// `HV·K·V` state.
pub fn pool_bytes(p: &Problem, pool: DType) -> u64 {
    (p.num_sequences() * p.heads_v * p.key_dim * p.value_dim * pool.size()) as u64
}

/// Compulsory bytes of one call (inputs read once, outputs written once). Forward and
/// backward count h0 / dh0 (the bench gives every sequence an initial state); the backward
/// counts dht. Decode reads and writes every sequence's state once per step: `2·4·K·V` per
/// sequence and v-head, plus q, k, v, g, β in and o out.
pub fn bytes(op: Op, p: &Problem, dtype: DType) -> f64 {
    bytes_with_pool(op, p, dtype, DType::F32)
}

/// [`bytes`] with the decode state pool stored as `pool` (its element size replaces f32's in
/// the decode's state traffic; the other ops ignore it).
pub fn bytes_with_pool(op: Op, p: &Problem, dtype: DType, pool: DType) -> f64 {
    let z = sizes(p, dtype);
    let qk = z.bt * z.h * z.k * z.s;
    let v = z.bt * z.hv * z.v * z.s;
    let gates = z.bt * z.hv * 4.0;
    let state = z.n * z.hv * z.k * z.v * 4.0;
    let pool_state = z.n * z.hv * z.k * z.v * pool.size() as f64;
    match op {
        // q, k, v, g, β, h0 in; o, final state out.
        Op::Forward => 2.0 * qk + v + 2.0 * gates + state + v + state,
        // q, k, v, g, β, h0, do, dht in; dq, dk, dv, dg, dβ, dh0 out.
        Op::Backward => {
            (2.0 * qk + v + 2.0 * gates + state + v + state) + (2.0 * qk + v + 2.0 * gates + state)
        }
        // state read + written; q, k, v, g, β in; o out.
        Op::Decode => 2.0 * pool_state + 2.0 * qk + v + 2.0 * gates + v,
    }
}

/// An *estimate* of the bytes of the buffers one call of `op` holds on the GPU at its peak:
/// inputs + outputs + scratch, from the sizes the launchers are known to allocate (small
/// uniform/table buffers included; allocator padding and driver overhead not). Used only where
/// the backend has no allocator report ([`crate::bench::memory`]); it goes stale when the
/// launchers' scratch changes — `cli/tests/bench.rs` compares it with the allocator's figure.
/// `algorithm` is the forward's (the recurrent kernel keeps no scratch); other ops ignore it.
pub fn peak_memory_estimate(op: Op, p: &Problem, dtype: DType, algorithm: ForwardAlgorithm) -> u64 {
    let z = sizes(p, dtype);
    let (bt, hv, n) = (z.bt as u64, z.hv as u64, z.n as u64);
    let (h, k, v, s) = (z.h as u64, z.k as u64, z.v as u64, z.s as u64);
    let qk = bt * h * k * s;
    let vv = bt * hv * v * s;
    let gates = bt * hv * 4;
    let state = n * hv * k * v * 4;
    let chunks = p.chunks().len() as u64;
    let tables = 8 * chunks + 16 * n + 256;
    let inputs = 2 * qk + vv + 2 * gates + state;
    match op {
        Op::Forward if algorithm == ForwardAlgorithm::Recurrent => {
            // o, final state (the kernel's pool), the 64 KiB tables, parameters.
            inputs + vv + state + 64 * 1024 + 256
        }
        Op::Forward => {
            // o, final state; (G, β) [BT,HV,2], A [BT,HV,64], the scan's gated matrices
            // [BT,HV,128] (all f32), q/k normalized copies with l2norm_qk, gate params.
            let normed = if p.options.l2norm_qk { 2 * qk } else { 0 };
            let scratch = bt * hv * 4 * (2 + CHUNK as u64 + 2 * CHUNK as u64) + normed + 8 * hv;
            inputs + vv + state + scratch + tables
        }
        Op::Backward => {
            // What the forward keeps, do and dht, the workspace, and dq dk dv dg dβ dh0.
            let outputs = 2 * qk + vv + 2 * gates + state;
            inputs
                + saved_bytes(p, dtype)
                + vv
                + state
                + workspace_bytes(p)
                + outputs
                + 16 * hv
                + tables
        }
        Op::Decode => {
            // The pool holds every sequence's state (updated in place); o; the 64 KiB tables.
            let step_inputs = 2 * qk + vv + 2 * gates;
            state + step_inputs + vv + 64 * 1024 + 256
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gdn_wgpu::Options;

    #[test]
    fn per_token_counts_match_the_algorithm_doc() {
        let p = Problem::new(1, 64, 1, 1, 128, 128, None, Options::default()).unwrap();
        assert_eq!(flops(Op::Forward, &p) / 64.0, 163_840.0);
        assert_eq!(flops(Op::Backward, &p) / 64.0, 491_520.0);
        assert_eq!(flops(Op::Decode, &p) / 64.0, 7.0 * 16384.0);
        // Decode at B = 1, T = 1, H = HV = 1: the state twice plus 3 vectors and 2 scalars, o.
        let d = Problem::new(1, 1, 1, 1, 128, 128, None, Options::default()).unwrap();
        assert_eq!(
            bytes(Op::Decode, &d, DType::F32),
            2.0 * 65536.0 + 4.0 * 512.0 + 8.0
        );
    }
}
