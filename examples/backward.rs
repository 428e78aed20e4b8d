//! Training: the forward and the gradients of `L = Σ o ⊙ do + Σ final_state ⊙ dht` on the GPU
//! in one call, each gradient compared with the f64 BPTT oracle under the crate's tolerance
//! policy.
//!
//!     cargo run --release --example backward
//!
//! For timings (per-pass GPU spans of forward and backward, host time, memory) use
//! `gdn bench --ops backward`.

use gdn_wgpu::tolerance::{Case, Op, Quantity};
use gdn_wgpu::wgpu_backend::Context;
use gdn_wgpu::{Backend, DType, HostTensor, Options, Problem, RandomSpec, reference, relative_l2};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Two packed sequences of 100 and 60 tokens (cu_seqlens), H = 2, HV = 4, K = V = 32.
    let problem = Problem::new(
        1,
        160,
        2,
        4,
        32,
        32,
        Some(vec![0, 100, 160]),
        Options::default(),
    )?;
    let inputs = RandomSpec::default().generate(&problem);
    // Upstream gradients: any values do; here a smooth pattern.
    let pattern = |shape: [usize; 4], scale: f32| {
        let n = shape.iter().product::<usize>();
        HostTensor::new(
            shape,
            (0..n).map(|i| scale * (i as f32 * 0.37).sin()).collect(),
        )
    };
    let d_o = pattern(problem.v_shape(), 1.0);
    let dht = pattern(problem.state_shape(), 0.5);

    let ctx = Context::new_blocking()?;
    println!("{}", ctx.describe());
    let (_, got) = ctx.forward_backward(&problem, &inputs.as_ref(), &d_o, Some(&dht))?;
    let want = reference::backward(&problem, &inputs.as_ref(), &d_o, Some(&dht))?;

    let case = Case::new(Op::Backward, DType::F32);
    let dh0 = (got.dh0.as_ref(), want.dh0.as_ref());
    let (Some(got_dh0), Some(want_dh0)) = dh0 else {
        return Err("an initial state has a gradient".into());
    };
    let mut pass = true;
    for (name, got, want, quantity) in [
        ("dq", &got.dq.data, &want.dq, Quantity::GradQkv),
        ("dk", &got.dk.data, &want.dk, Quantity::GradQkv),
        ("dv", &got.dv.data, &want.dv, Quantity::GradQkv),
        ("dg", &got.dg.data, &want.dg, Quantity::GradGates),
        ("dbeta", &got.dbeta.data, &want.dbeta, Quantity::GradGates),
        ("dh0", &got_dh0.data, want_dh0, Quantity::GradGates),
    ] {
        let (err, tol) = (relative_l2(got, want), case.tolerance(quantity));
        println!("{name:>5}: rel-L2 {err:.2e} against the oracle (tolerance {tol:.0e})");
        pass &= err <= tol; // NaN fails too
    }
    println!("{}", if pass { "PASS" } else { "FAIL" });
    if !pass {
        std::process::exit(1);
    }
    Ok(())
}
