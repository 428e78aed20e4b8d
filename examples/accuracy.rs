//! Accuracy per storage dtype against the f64 oracle, on FLA's accuracy problem class:
//! B=1, T=2048, H=2, HV=4, K=V=128, unit-norm k, g = logsigmoid(randn), β = sigmoid(rand).
//!
//!     cargo run --release --example accuracy
//!
//! "vs exact" compares with the oracle on the unrounded f32 inputs (what a user of a bf16
//! model sees; FLA reports rel-L2 3.3e-3 for o and 2.6e-3 for the final state in bf16 on
//! this class); "vs rounded" uses the same rounded inputs as the kernel (the kernel's own error).
//! One forward row per storage dtype × compute path available on the adapter, then the
//! backward's gradients per storage dtype (do standard normal; oracle on the rounded inputs).

use gdn_wgpu::wgpu_backend::{self, ComputePath, Context, GpuTensor};
use gdn_wgpu::{
    DType, ForwardOutputs, HostTensor, Options, Problem, RandomSpec, reference, relative_l2,
};
use rand::{SeedableRng, rngs::SmallRng};
use rand_distr::{Distribution, StandardNormal};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let problem = Problem::new(1, 2048, 2, 4, 128, 128, None, Options::default())?;
    // sigmoid(U[0, 1)) lies in [0.5, 0.731).
    let spec = RandomSpec {
        seed: 42,
        initial_state: false,
        beta: (0.5, 0.731),
        ..RandomSpec::default()
    };
    let exact = spec.generate(&problem);
    let expected_exact = reference::forward(&problem, &exact.as_ref())?;
    let ctx = Context::new_blocking()?;
    let adapter = ctx
        .adapter_info
        .as_ref()
        .map(|i| i.name.clone())
        .unwrap_or_default();
    println!("adapter: {adapter}\n\nforward (rel-L2 vs the f64 oracle)\n");
    println!("| dtype | path | o vs exact | state vs exact | o vs rounded | state vs rounded |");
    println!("|---|---|---|---|---|---|");
    let rounded = |dtype: DType| {
        let mut inputs = exact.clone();
        for t in [&mut inputs.q, &mut inputs.k, &mut inputs.v] {
            *t = t.clone().with_dtype(dtype);
        }
        inputs
    };
    for dtype in ctx.forward_storage_dtypes() {
        let inputs = rounded(dtype);
        let expected_rounded = reference::forward(&problem, &inputs.as_ref())?;
        for path in ComputePath::ALL {
            // Every path this adapter can run for the problem (forcing one it cannot is an error).
            if ctx
                .path_support()
                .choose(&problem, dtype, Some(path))
                .is_err()
            {
                continue;
            }
            let up = wgpu_backend::upload_inputs(&ctx, &inputs.as_ref())?;
            let o = GpuTensor::empty(&ctx, "o", &problem.v_shape(), dtype)?;
            let s = GpuTensor::empty(&ctx, "state", &problem.state_shape(), DType::F32)?;
            let mut encoder = ctx.create_encoder("accuracy");
            let outputs = ForwardOutputs {
                o: &o,
                final_state: &s,
            };
            wgpu_backend::forward_into_with_path(
                &ctx,
                &mut encoder,
                &problem,
                &up.as_ref(),
                &outputs,
                path,
            )?;
            ctx.submit_and_wait(encoder)?;
            let (o, s) = (o.download_blocking(&ctx)?, s.download_blocking(&ctx)?);
            println!(
                "| {dtype} | {path} | {:.2e} | {:.2e} | {:.2e} | {:.2e} |",
                relative_l2(&o.data, &expected_exact.o),
                relative_l2(&s.data, &expected_exact.final_state),
                relative_l2(&o.data, &expected_rounded.o),
                relative_l2(&s.data, &expected_rounded.final_state),
            );
        }
    }

    println!("\nbackward (scalar path; rel-L2 vs the f64 BPTT oracle on the rounded inputs)\n");
    println!("| dtype | dq | dk | dv | dg | dbeta |");
    println!("|---|---|---|---|---|---|");
    let mut rng = SmallRng::seed_from_u64(7);
    let d_o: Vec<f32> = (0..problem.v_shape().iter().product::<usize>())
        .map(|_| StandardNormal.sample(&mut rng))
        .collect();
    for dtype in wgpu_backend::backward::storage_dtypes(&ctx) {
        let inputs = rounded(dtype);
        let d_o = HostTensor::new(problem.v_shape(), d_o.clone()).with_dtype(dtype);
        let expected = reference::backward(&problem, &inputs.as_ref(), &d_o, None)?;
        let (_, grads) = wgpu_backend::backward_host(&ctx, &problem, &inputs.as_ref(), &d_o, None)?;
        println!(
            "| {dtype} | {:.2e} | {:.2e} | {:.2e} | {:.2e} | {:.2e} |",
            relative_l2(&grads.dq.data, &expected.dq),
            relative_l2(&grads.dk.data, &expected.dk),
            relative_l2(&grads.dv.data, &expected.dv),
            relative_l2(&grads.dg.data, &expected.dg),
            relative_l2(&grads.dbeta.data, &expected.dbeta),
        );
    }
    Ok(())
}
