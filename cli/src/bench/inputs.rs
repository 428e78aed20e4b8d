//! Random inputs for the bench (never zeros) and their upload.

use rand::{SeedableRng, rngs::SmallRng};
use rand_distr::{Distribution, StandardNormal};

use gdn_wgpu::tensor::{DType, HostTensor};
use gdn_wgpu::wgpu_backend::decode::RecurrentStepTiles;
use gdn_wgpu::wgpu_backend::{Context, GpuTensor};
use gdn_wgpu::{ForwardInputs, Problem, RandomSpec};

/// Inputs of `problem` from [`RandomSpec`] (q ~ N(0,1), unit-norm k, v ~ N(0,1),
/// g = logsigmoid(N(0,1)), β ~ U(0,1), h0 ~ 0.5·N(0,1)), q/k/v stored as `dtype`.
pub fn host_inputs(problem: &Problem, dtype: DType, seed: u64) -> ForwardInputs<HostTensor> {
    let mut inputs = RandomSpec {
        seed,
        initial_state: true,
        ..RandomSpec::default()
    }
    .generate(problem);
    if dtype != DType::F32 {
        inputs.q = inputs.q.with_dtype(dtype);
        inputs.k = inputs.k.with_dtype(dtype);
        inputs.v = inputs.v.with_dtype(dtype);
    }
    inputs
}

/// `scale`·N(0,1) entries (gradients of the loss for the backward).
pub fn normal(shape: &[usize], scale: f32, seed: u64) -> HostTensor {
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

/// Upload every input.
pub fn gpu_inputs(
    ctx: &Context,
    inputs: &ForwardInputs<HostTensor>,
) -> gdn_wgpu::Result<ForwardInputs<GpuTensor>> {
    gdn_wgpu::wgpu_backend::upload_inputs(ctx, &inputs.as_ref())
}

/// A decode tiling in words, for records and messages (its `--decode-tiles` name first).
pub fn tiles_name(t: &RecurrentStepTiles) -> String {
    format!(
        "{} {}: v_block {} vec4s {} row_lanes {} workgroup {}",
        t.entry(),
        t.name(),
        t.v_block,
        t.vec4s_per_thread,
        t.row_lanes,
        t.workgroup()
    )
}

/// How many copies of a case's inputs to rotate through so that consecutive repetitions do
/// not find them in the GPU's last-level cache: enough copies to exceed `cache_bytes`, at
/// most `max_sets`, 1 when one copy already does.
pub fn input_sets(bytes_per_set: f64, cache_bytes: f64, max_sets: usize) -> usize {
    if bytes_per_set <= 0.0 || bytes_per_set >= cache_bytes {
        return 1;
    }
    ((cache_bytes / bytes_per_set).ceil() as usize).clamp(1, max_sets.max(1))
}

#[cfg(test)]
mod tests {
    #[test]
    fn input_sets() {
        assert_eq!(super::input_sets(1e9, 128e6, 64), 1);
        assert_eq!(super::input_sets(40e6, 128e6, 64), 4);
        assert_eq!(super::input_sets(1e3, 128e6, 64), 64);
    }
}
