//! The library in one page: a random GDN problem, the chunked forward on the best GPU adapter,
//! and the f64 oracle's verdict under the crate's tolerance policy.
//!
//!     cargo run --release --example quickstart
//!
//! For timings (per-pass GPU spans, host time, GB/s, tokens/s) use `gdn bench`.

use gdn_wgpu::tolerance::{Case, Op, Quantity};
use gdn_wgpu::wgpu_backend::Context;
use gdn_wgpu::{Backend, DType, Options, Problem, RandomSpec, reference, relative_l2};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // B = 1 sequence of T = 256 tokens, H = 2 q/k heads shared by HV = 4 v-heads, K = V = 64.
    let problem = Problem::new(1, 256, 2, 4, 64, 64, None, Options::default())?;
    let dtype = DType::BF16;
    let mut inputs = RandomSpec::default().generate(&problem);
    // Storing q, k, v in bf16 rounds them: the oracle then sees exactly what the GPU sees.
    for t in [&mut inputs.q, &mut inputs.k, &mut inputs.v] {
        *t = t.clone().with_dtype(dtype);
    }

    let ctx = Context::new_blocking()?;
    println!("{}", ctx.describe());
    let got = ctx.forward(&problem, &inputs.as_ref())?;
    // The f64 oracle on the same (rounded) inputs.
    let want = reference::forward(&problem, &inputs.as_ref())?;

    // The bound depends on how this device multiplies (its compute path) and the storage.
    let case =
        Case::new(Op::Forward, dtype).with_arithmetic(ctx.arithmetic(Op::Forward, &problem, dtype));
    let mut pass = true;
    for (name, got, want, quantity) in [
        ("o", &got.o, &want.o, Quantity::Output),
        (
            "final_state",
            &got.final_state,
            &want.final_state,
            Quantity::State,
        ),
    ] {
        let (err, tol) = (relative_l2(&got.data, want), case.tolerance(quantity));
        println!("{name}: rel-L2 {err:.2e} against the oracle (tolerance {tol:.0e})");
        pass &= err <= tol; // NaN fails too
    }
    println!("{}", if pass { "PASS" } else { "FAIL" });
    if !pass {
        std::process::exit(1);
    }
    Ok(())
}
