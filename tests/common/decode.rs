//! Decode scaffolding: problems, seeds and random state pools.

use gdn_wgpu::{HostTensor, Problem, RandomSpec};

use super::problem;

/// Random inputs without an initial state (a decode's states come from the pool).
pub fn spec(seed: u64) -> RandomSpec {
    RandomSpec {
        seed,
        initial_state: false,
        ..RandomSpec::default()
    }
}

/// A pool of `slots` random states (N(0, 0.25) entries) in `p`'s layout.
pub fn random_pool(p: &Problem, slots: usize, seed: u64) -> HostTensor {
    let pool_problem = problem(
        slots,
        1,
        p.heads_qk,
        p.heads_v,
        p.key_dim,
        p.value_dim,
        None,
        p.options,
    );
    RandomSpec {
        seed: seed + 1000,
        initial_state: true,
        ..RandomSpec::default()
    }
    .generate(&pool_problem)
    .initial_state
    .unwrap()
}
