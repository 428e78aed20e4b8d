//! Random GDN problems for tests, examples and benchmarks (never all zeros), reproducible by seed.

use rand::{Rng, SeedableRng, rngs::SmallRng};
use rand_distr::{Distribution, StandardNormal};

use crate::problem::{ForwardInputs, Problem};
use crate::tensor::HostTensor;

/// How to draw a problem's inputs.
#[derive(Debug, Clone)]
pub struct RandomSpec {
    /// Seed of the generator: the same spec on the same problem draws the same inputs.
    pub seed: u64,
    /// Give the problem an initial state (standard normal entries × 0.5).
    pub initial_state: bool,
    /// β range (post-activation values; with `beta_sigmoid` the logits are drawn so the
    /// activated β falls in the same range).
    pub beta: (f32, f32),
    /// The first this many v-heads get g = 0 (no decay: DeltaNet).
    pub zero_gate_heads: usize,
    /// The last this many v-heads get g ≈ −20 per token (the state is erased every token).
    pub strong_gate_heads: usize,
}

impl Default for RandomSpec {
    fn default() -> Self {
        RandomSpec {
            seed: 0,
            initial_state: true,
            beta: (0.0, 1.0),
            zero_gate_heads: 0,
            strong_gate_heads: 0,
        }
    }
}

fn normal(rng: &mut SmallRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| StandardNormal.sample(rng)).collect()
}

fn logit(p: f32) -> f32 {
    (p / (1.0 - p)).ln()
}

impl RandomSpec {
    /// Draw inputs for `problem`: q ~ N(0,1); k unit-norm per head vector (raw N(0,1) when the
    /// problem normalizes in the kernel); v ~ N(0,1); g = logsigmoid(N(0,1)) except the special
    /// heads; β uniform in `self.beta`.
    pub fn generate(&self, problem: &Problem) -> ForwardInputs<HostTensor> {
        let mut rng = SmallRng::seed_from_u64(self.seed);
        let p = problem;
        let opt = p.options;
        let (bt, h, hv, kd) = (p.total_tokens(), p.heads_qk, p.heads_v, p.key_dim);
        let q = normal(&mut rng, bt * h * kd);
        let mut k = normal(&mut rng, bt * h * kd);
        if !opt.l2norm_qk {
            for row in k.chunks_mut(kd) {
                let r = 1.0 / row.iter().map(|x| x * x).sum::<f32>().sqrt();
                row.iter_mut().for_each(|x| *x *= r);
            }
        }
        let v = normal(&mut rng, bt * hv * p.value_dim);

        let special = |head: usize| -> Option<f32> {
            if head < self.zero_gate_heads {
                Some(0.0)
            } else if head + self.strong_gate_heads >= hv {
                Some(-20.0)
            } else {
                None
            }
        };
        let mut g = vec![0.0f32; bt * hv];
        let (mut a_log, mut dt_bias) = (None, None);
        if opt.gate_in_kernel {
            // Raw gate pre-activations; per-head A_log sets the decay strength.
            let dt: Vec<f32> = (0..hv).map(|_| rng.random_range(-1.0..1.0)).collect();
            let al: Vec<f32> = (0..hv)
                .map(|head| match special(head) {
                    Some(0.0) => -30.0, // exp(−30)·softplus ≈ 0: effectively no decay
                    Some(_) => 16f32.ln(),
                    _ => rng.random_range(-2.0..0.5),
                })
                .collect();
            for (i, x) in g.iter_mut().enumerate() {
                let head = i % hv;
                *x = if special(head) == Some(-20.0) {
                    rng.random_range(0.5..1.5)
                } else {
                    StandardNormal.sample(&mut rng)
                };
            }
            a_log = Some(HostTensor::new([hv], al));
            dt_bias = Some(HostTensor::new([hv], dt));
        } else {
            for (i, x) in g.iter_mut().enumerate() {
                let z: f32 = StandardNormal.sample(&mut rng);
                *x = match special(i % hv) {
                    Some(0.0) => 0.0,
                    Some(s) => s + rng.random_range(-0.5..0.5),
                    None => -(1.0 + (-z).exp()).ln(), // logsigmoid(z)
                };
            }
        }
        let (lo, hi) = self.beta;
        let beta: Vec<f32> = (0..bt * hv)
            .map(|_| {
                let b = if lo == hi {
                    lo
                } else {
                    rng.random_range(lo..hi)
                };
                if opt.beta_sigmoid {
                    let target = if opt.allow_neg_eigval { b / 2.0 } else { b };
                    logit(target.clamp(1e-6, 1.0 - 1e-6))
                } else {
                    b
                }
            })
            .collect();
        let initial_state = self.initial_state.then(|| {
            let shape = p.state_shape();
            let n = shape.iter().product();
            HostTensor::new(
                shape,
                normal(&mut rng, n).into_iter().map(|x| 0.5 * x).collect(),
            )
        });
        ForwardInputs {
            q: HostTensor::new(p.qk_shape(), q),
            k: HostTensor::new(p.qk_shape(), k),
            v: HostTensor::new(p.v_shape(), v),
            g: HostTensor::new(p.gate_shape(), g),
            beta: HostTensor::new(p.gate_shape(), beta),
            initial_state,
            a_log,
            dt_bias,
        }
    }
}
