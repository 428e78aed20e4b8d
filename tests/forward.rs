//! The GPU chunked forward against the f64 oracle, over the hard cases and every option.

mod common;

use common::{check_forward, dense};
use gdn_wgpu::{Options, Problem, RandomSpec};

fn spec(seed: u64) -> RandomSpec {
    RandomSpec { seed, ..RandomSpec::default() }
}

#[test]
fn t_around_the_chunk_size() {
    for (i, t) in [1, 63, 64, 65].into_iter().enumerate() {
        check_forward(&dense(1, t, 1, 2, 32, 32), &spec(i as u64));
    }
}
