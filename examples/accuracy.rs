//! Accuracy per storage dtype against the f64 oracle, on FLA's accuracy problem class:
//! B=1, T=2048, H=2, HV=4, K=V=128, unit-norm k, g = logsigmoid(randn), β = sigmoid(rand).
//!
//!     cargo run --release --example accuracy
//!
//! "vs exact" compares with the oracle on the unrounded f32 inputs (what a user of a bf16
//! model sees; FLA reports rel-L2 3.3e-3 for o and 2.6e-3 for the final state in bf16 on
//! this class); "vs rounded" uses the same rounded inputs as the kernel (the kernel's own error).

use gdn_wgpu::gpu::{self, Context};
use gdn_wgpu::{Options, Problem, RandomSpec, reference, relative_l2};

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
    println!("adapter: {adapter}");
    println!("| dtype | path | o vs exact | state vs exact | o vs rounded | state vs rounded |");
    println!("|---|---|---|---|---|---|");
    for dtype in ctx.forward_storage_dtypes() {
        let mut inputs = exact.clone();
        for t in [&mut inputs.q, &mut inputs.k, &mut inputs.v] {
            *t = t.clone().with_dtype(dtype);
        }
        let expected_rounded = reference::forward(&problem, &inputs.as_ref())?;
        let out = gpu::forward_host(&ctx, &problem, &inputs.as_ref())?;
        println!(
            "| {dtype} | f32 scalar | {:.2e} | {:.2e} | {:.2e} | {:.2e} |",
            relative_l2(&out.o.data, &expected_exact.o),
            relative_l2(&out.final_state.data, &expected_exact.final_state),
            relative_l2(&out.o.data, &expected_rounded.o),
            relative_l2(&out.final_state.data, &expected_rounded.final_state),
        );
    }
    Ok(())
}
