//! Backward scaffolding: random upstream gradients.

use gdn_wgpu::{HostTensor, Problem};
use rand::{SeedableRng, rngs::SmallRng};
use rand_distr::{Distribution, StandardNormal};

/// A tensor of N(0, `scale`²) entries.
pub fn normal(seed: u64, shape: &[usize], scale: f32) -> HostTensor {
    let mut rng = SmallRng::seed_from_u64(seed);
    let n = shape.iter().product();
    let data = (0..n)
        .map(|_| {
            let z: f32 = StandardNormal.sample(&mut rng);
            scale * z
        })
        .collect();
    HostTensor::new(shape.to_vec(), data)
}

/// The upstream gradients of a test: `do` ~ N(0, 1), `dht` ~ N(0, 0.5²) when asked for.
pub fn upstream(problem: &Problem, seed: u64, with_dht: bool) -> (HostTensor, Option<HostTensor>) {
    let d_o = normal(seed ^ 0xd0, &problem.v_shape(), 1.0);
    let dht = with_dht.then(|| normal(seed ^ 0xd7, &problem.state_shape(), 0.5));
    (d_o, dht)
}
