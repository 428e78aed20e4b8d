//! `gdn run backward` end to end: the gradients file against the f64 oracle on both backends,
//! and a malformed upstream gradient named on one line with exit code 2.

#[path = "../../tests/common/mod.rs"]
mod common;

use common::backward::{normal, upstream};
use common::{dense, problem};
use gdn_wgpu::tolerance::{Case, Op, Quantity};
use gdn_wgpu::{
    DType, ForwardInputs, HostTensor, Options, Problem, RandomSpec, reference, relative_l2_scaled,
};

/// The policy's bound for gradient `name` with f32 storage.
fn grad_tol(name: &str, l2norm_qk: bool) -> f64 {
    let quantity = match name {
        "dq" | "dk" | "dv" => Quantity::GradQkv,
        "dA_log" | "ddt_bias" => Quantity::GradSums,
        _ => Quantity::GradGates,
    };
    Case::new(Op::Backward, DType::F32)
        .with_l2norm(l2norm_qk)
        .tolerance(quantity)
}

fn spec(seed: u64) -> RandomSpec {
    RandomSpec {
        seed,
        ..RandomSpec::default()
    }
}

/// A scratch directory unique to this process and test, removed when dropped.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(test: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("gdn-backward-test-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn path(&self, file: &str) -> String {
        self.0.join(file).display().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn gdn(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_gdn"))
        .args(args)
        .output()
        .expect("run the gdn binary")
}

/// Write the forward's inputs (with `cu_seqlens` as I32 when the problem has them) plus the
/// given extra tensors.
fn write_backward_inputs(
    path: &str,
    problem: &Problem,
    inputs: &ForwardInputs<HostTensor>,
    extra: &[(&'static str, &HostTensor)],
) {
    use gdn_wgpu::io::{IntDType, IntTensor, TensorRef};
    let cu = problem.cu_seqlens.as_ref().map(|cu| IntTensor {
        shape: vec![cu.len()],
        dtype: IntDType::I32,
        data: cu.iter().map(|&x| x as i64).collect(),
    });
    let mut tensors: Vec<(&str, TensorRef)> = vec![
        ("q", (&inputs.q).into()),
        ("k", (&inputs.k).into()),
        ("v", (&inputs.v).into()),
        ("g", (&inputs.g).into()),
        ("beta", (&inputs.beta).into()),
    ];
    for (name, t) in [
        ("initial_state", &inputs.initial_state),
        ("A_log", &inputs.a_log),
        ("dt_bias", &inputs.dt_bias),
    ] {
        if let Some(t) = t {
            tensors.push((name, t.into()));
        }
    }
    if let Some(cu) = &cu {
        tensors.push(("cu_seqlens", cu.into()));
    }
    tensors.extend(extra.iter().map(|&(n, t)| (n, t.into())));
    gdn_wgpu::io::write(path, tensors).unwrap();
}

#[test]
fn cli_backward_matches_the_oracle_on_both_backends() {
    let o = Options {
        l2norm_qk: true,
        beta_sigmoid: true,
        gate_in_kernel: true,
        ..Options::default()
    };
    let problem = problem(1, 80, 1, 2, 16, 32, Some(vec![0, 9, 80]), o);
    let inputs = spec(140).generate(&problem);
    let (d_o, dht) = upstream(&problem, 140, true);
    let dht = dht.unwrap();
    let expected = reference::backward(&problem, &inputs.as_ref(), &d_o, Some(&dht)).unwrap();
    let dir = Scratch::new("cli");
    let input = dir.path("in.safetensors");
    write_backward_inputs(&input, &problem, &inputs, &[("do", &d_o), ("dht", &dht)]);
    let mut backends = vec!["cpu"];
    if common::gpu().is_some() {
        backends.push("wgpu");
    }
    for backend in backends {
        let output = dir.path(&format!("out-{backend}.safetensors"));
        let args = [
            "run",
            "backward",
            "--input",
            &input,
            "--output",
            &output,
            "--backend",
            backend,
            "--l2norm-qk",
            "--beta-sigmoid",
            "--gate-in-kernel",
        ];
        let out = gdn(&args);
        assert!(
            out.status.success(),
            "{backend}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let file = gdn_wgpu::io::TensorFile::open(&output).unwrap();
        assert_eq!(
            file.names(),
            ["dA_log", "dbeta", "ddt_bias", "dg", "dh0", "dk", "dq", "dv"]
        );
        // (name, expected, scale of the error: the sums over tokens against their terms'
        // magnitudes, `Quantity::GradSums`)
        let pairs: [(&str, &Vec<f64>, &Vec<f64>); 8] = [
            ("dq", &expected.dq, &expected.dq),
            ("dk", &expected.dk, &expected.dk),
            ("dv", &expected.dv, &expected.dv),
            ("dg", &expected.dg, &expected.dg),
            ("dbeta", &expected.dbeta, &expected.dbeta),
            (
                "dh0",
                expected.dh0.as_ref().unwrap(),
                expected.dh0.as_ref().unwrap(),
            ),
            (
                "dA_log",
                expected.da_log.as_ref().unwrap(),
                expected.da_log_magnitude.as_ref().unwrap(),
            ),
            (
                "ddt_bias",
                expected.ddt_bias.as_ref().unwrap(),
                expected.ddt_bias_magnitude.as_ref().unwrap(),
            ),
        ];
        for (name, e, scale) in pairs {
            let t = file.float(name).unwrap().unwrap();
            assert_eq!(t.dtype, DType::F32, "{name}");
            let err = relative_l2_scaled(&t.data, e, scale);
            let tol = grad_tol(name, problem.options.l2norm_qk);
            assert!(err <= tol, "{backend} {name}: rel-L2 {err:e}");
        }
    }
}

#[test]
fn cli_backward_names_a_malformed_gradient_and_exits_2() {
    let problem = dense(1, 8, 1, 2, 16, 16);
    let inputs = spec(150).generate(&problem);
    let dir = Scratch::new("cli-bad");
    let wrong = normal(3, &[1, 8, 2, 32], 1.0);
    type Extra<'a> = Vec<(&'static str, &'a HostTensor)>;
    let cases: [(&str, Extra, &str); 2] = [
        ("missing", vec![], "error: do: required"),
        (
            "shape",
            vec![("do", &wrong)],
            "error: do: expected shape [1, 8, 2, 16]",
        ),
    ];
    for (label, extra, message) in cases {
        let input = dir.path(&format!("{label}.safetensors"));
        write_backward_inputs(&input, &problem, &inputs, &extra);
        let out = gdn(&[
            "run",
            "backward",
            "--input",
            &input,
            "--output",
            &dir.path("out.safetensors"),
            "--backend",
            "cpu",
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{label}: {stderr}");
        assert!(
            stderr.starts_with(message) && stderr.lines().count() == 1,
            "{label}: {stderr}"
        );
    }
}
