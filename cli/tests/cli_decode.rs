//! `gdn run decode` end to end: it agrees with `gdn run forward` and the f64 oracle, in f32 and
//! on a bf16 file.

use std::path::PathBuf;
use std::process::Command;

#[path = "../../tests/common/mod.rs"]
mod common;

use common::problem;
use gdn_wgpu::io::{self, TensorFile};
use gdn_wgpu::tolerance::{Case, Op, Quantity};
use gdn_wgpu::{DType, ForwardOutputs, Options, RandomSpec, reference, relative_l2};

fn spec(seed: u64) -> RandomSpec {
    RandomSpec {
        seed,
        initial_state: false,
        ..RandomSpec::default()
    }
}

/// The policy's decode bound for `quantity` with `dtype` storage.
fn tol(dtype: DType, quantity: Quantity) -> f64 {
    Case::new(Op::Decode, dtype).tolerance(quantity)
}

fn gdn(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_gdn"))
        .args(args)
        .output()
        .expect("run the gdn binary")
}

#[test]
fn cli_run_decode_agrees_with_forward() {
    if common::gpu().is_none() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("gdn-decode-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = |f: &str| -> PathBuf { dir.join(f) };
    let o = Options {
        beta_sigmoid: true,
        state_v_first: true,
        ..Options::default()
    };
    let p = problem(1, 11, 1, 2, 16, 32, Some(vec![0, 1, 4, 11]), o);
    let inputs = spec(140).generate(&p);
    let cu = io::IntTensor {
        shape: vec![4],
        dtype: io::IntDType::I32,
        data: vec![0i64, 1, 4, 11],
    };
    let tensors: Vec<(&str, io::TensorRef)> = vec![
        ("q", (&inputs.q).into()),
        ("k", (&inputs.k).into()),
        ("v", (&inputs.v).into()),
        ("g", (&inputs.g).into()),
        ("beta", (&inputs.beta).into()),
        ("cu_seqlens", (&cu).into()),
    ];
    io::write(path("in.safetensors"), tensors).unwrap();
    let input = path("in.safetensors").display().to_string();
    let mut outputs = Vec::new();
    for kernel in ["decode", "forward"] {
        let output = path(&format!("{kernel}.safetensors")).display().to_string();
        let out = gdn(&[
            "run",
            kernel,
            "--input",
            &input,
            "--output",
            &output,
            "--backend",
            "wgpu",
            "--beta-sigmoid",
            "--state-v-first",
        ]);
        assert!(
            out.status.success(),
            "gdn run {kernel}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let file = TensorFile::open(&output).unwrap();
        outputs.push(ForwardOutputs {
            o: file.float("o").unwrap().unwrap(),
            final_state: file.float("final_state").unwrap().unwrap(),
        });
    }
    let expected = reference::forward(&p, &inputs.as_ref()).unwrap();
    let (decode, forward) = (&outputs[0], &outputs[1]);
    assert_eq!(decode.o.shape, forward.o.shape);
    assert_eq!(decode.final_state.shape, forward.final_state.shape);
    let as_f64 = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<f64>>();
    let errors = [
        relative_l2(&decode.o.data, &as_f64(&forward.o.data)),
        relative_l2(&decode.final_state.data, &as_f64(&forward.final_state.data)),
        relative_l2(&decode.o.data, &expected.o),
        relative_l2(&decode.final_state.data, &expected.final_state),
    ];
    eprintln!("gdn run decode vs forward (o, state), vs oracle (o, state): {errors:?}");
    let (tol_o, tol_s) = (
        tol(DType::F32, Quantity::Output),
        tol(DType::F32, Quantity::State),
    );
    let bounds = [tol_o, tol_s, tol_o, tol_s];
    assert!(
        errors.iter().zip(bounds).all(|(&e, b)| e <= b),
        "{errors:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `gdn run decode` on a bf16 file: o comes back as bf16 and agrees with `gdn run forward`
/// on the same file and with the oracle on the rounded inputs; the f32 final state to 1e-5.
#[test]
fn cli_run_decode_bf16_file() {
    if common::gpu().is_none() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("gdn-decode-cli-bf16-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = |f: &str| -> PathBuf { dir.join(f) };
    let o = Options {
        beta_sigmoid: true,
        ..Options::default()
    };
    let p = problem(2, 5, 1, 2, 32, 32, None, o);
    let mut inputs = spec(150).generate(&p);
    for t in [&mut inputs.q, &mut inputs.k, &mut inputs.v] {
        *t = t.clone().with_dtype(DType::BF16);
    }
    let tensors: Vec<(&str, io::TensorRef)> = vec![
        ("q", (&inputs.q).into()),
        ("k", (&inputs.k).into()),
        ("v", (&inputs.v).into()),
        ("g", (&inputs.g).into()),
        ("beta", (&inputs.beta).into()),
    ];
    io::write(path("in.safetensors"), tensors).unwrap();
    let input = path("in.safetensors").display().to_string();
    let mut outputs = Vec::new();
    for kernel in ["decode", "forward"] {
        let output = path(&format!("{kernel}.safetensors")).display().to_string();
        let out = gdn(&[
            "run",
            kernel,
            "--input",
            &input,
            "--output",
            &output,
            "--backend",
            "wgpu",
            "--beta-sigmoid",
        ]);
        assert!(
            out.status.success(),
            "gdn run {kernel}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let file = TensorFile::open(&output).unwrap();
        let o = file.float("o").unwrap().unwrap();
        assert_eq!(
            o.dtype,
            DType::BF16,
            "gdn run {kernel}: o in the dtype of v"
        );
        outputs.push(ForwardOutputs {
            o,
            final_state: file.float("final_state").unwrap().unwrap(),
        });
    }
    let expected = reference::forward(&p, &inputs.as_ref()).unwrap();
    let (decode, forward) = (&outputs[0], &outputs[1]);
    let as_f64 = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<f64>>();
    let e_o = relative_l2(&decode.o.data, &expected.o);
    let e_s = relative_l2(&decode.final_state.data, &expected.final_state);
    let e_fwd = relative_l2(&decode.o.data, &as_f64(&forward.o.data));
    eprintln!(
        "gdn run decode bf16: o {e_o:.3e}, state {e_s:.3e} vs oracle; o {e_fwd:.3e} vs forward"
    );
    let (tol_o, tol_s) = (
        tol(DType::BF16, Quantity::Output),
        tol(DType::BF16, Quantity::State),
    );
    assert!(e_o <= tol_o, "o vs oracle {e_o:e}");
    assert!(e_s <= tol_s, "final state vs oracle {e_s:e}");
    // Both round an f32 o to bf16 once: they differ only where the two f32 results straddle
    // a rounding boundary (one bf16 ulp, 2⁻⁸ relative, at a few elements).
    assert!(e_fwd <= tol_o, "o vs gdn run forward {e_fwd:e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `gdn run decode --pool bf16`: the states live in a bf16 pool (rounded after every step);
/// o and the final state agree with the oracle within the 64-step bound of
/// tests/decode.rs's bf16_pool_over_64_decode_steps (2e-2, here 5 steps); the final state
/// comes back as F32. A backend other than wgpu refuses the flag (exit 2, one line).
#[test]
fn cli_run_decode_bf16_pool() {
    if common::gpu().is_none() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("gdn-decode-cli-pool-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = |f: &str| -> PathBuf { dir.join(f) };
    let p = problem(2, 5, 1, 2, 32, 32, None, Options::default());
    let inputs = spec(160).generate(&p);
    let tensors: Vec<(&str, io::TensorRef)> = vec![
        ("q", (&inputs.q).into()),
        ("k", (&inputs.k).into()),
        ("v", (&inputs.v).into()),
        ("g", (&inputs.g).into()),
        ("beta", (&inputs.beta).into()),
    ];
    io::write(path("in.safetensors"), tensors).unwrap();
    let input = path("in.safetensors").display().to_string();
    let output = path("out.safetensors").display().to_string();
    let run = |backend: &str| {
        gdn(&[
            "run",
            "decode",
            "--input",
            &input,
            "--output",
            &output,
            "--backend",
            backend,
            "--pool",
            "bf16",
        ])
    };
    let out = run("wgpu");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file = TensorFile::open(&output).unwrap();
    let (o, state) = (
        file.float("o").unwrap().unwrap(),
        file.float("final_state").unwrap().unwrap(),
    );
    assert_eq!(state.dtype, DType::F32);
    let expected = reference::forward(&p, &inputs.as_ref()).unwrap();
    let (e_o, e_s) = (
        relative_l2(&o.data, &expected.o),
        relative_l2(&state.data, &expected.final_state),
    );
    eprintln!("gdn run decode --pool bf16: o {e_o:.3e}, state {e_s:.3e}");
    assert!(e_o <= 2e-2 && e_s <= 2e-2, "o {e_o:e}, state {e_s:e}");
    // The state really went through bf16: an f32 pool is ~1e-7 from the oracle.
    assert!(e_s > 1e-4, "state {e_s:e}: no bf16 rounding seen");
    let out = run("cpu");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--pool"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
