//! The `gdn` binary end to end: outputs against the f64 oracle on both backends, one exit-2
//! `error:` line per kind of bad input, and `gdn info`.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gdn_wgpu::io::{self, IntDType, IntTensor, TensorFile, TensorRef};
use gdn_wgpu::{
    DType, ForwardInputs, HostTensor, Options, Problem, RandomSpec, reference, relative_l2,
};

/// A scratch directory unique to this process and test, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("gdn-cli-test-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn path(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn gdn(args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gdn"));
    // Mesa's drivers print a warning line when XDG_RUNTIME_DIR is unset; it is not ours.
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        cmd.env("XDG_RUNTIME_DIR", std::env::temp_dir());
    }
    cmd.args(args).output().expect("run the gdn binary")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The tensors of `inputs` under the names the CLI reads, plus `cu_seqlens` if given.
fn input_tensors<'a>(
    inputs: &'a ForwardInputs<HostTensor>,
    cu_seqlens: Option<&'a IntTensor>,
) -> Vec<(&'static str, TensorRef<'a>)> {
    let optional = [
        ("initial_state", &inputs.initial_state),
        ("A_log", &inputs.a_log),
        ("dt_bias", &inputs.dt_bias),
    ];
    let mut tensors: Vec<(&str, TensorRef)> = vec![
        ("q", (&inputs.q).into()),
        ("k", (&inputs.k).into()),
        ("v", (&inputs.v).into()),
        ("g", (&inputs.g).into()),
        ("beta", (&inputs.beta).into()),
    ];
    tensors.extend(
        optional
            .into_iter()
            .filter_map(|(name, t)| Some((name, t.as_ref()?.into()))),
    );
    tensors.extend(cu_seqlens.map(|cu| ("cu_seqlens", cu.into())));
    tensors
}

fn write_inputs(path: &Path, inputs: &ForwardInputs<HostTensor>, cu_seqlens: Option<&IntTensor>) {
    io::write(path, input_tensors(inputs, cu_seqlens)).unwrap();
}

fn cu_seqlens_tensor(problem: &Problem, dtype: IntDType) -> Option<IntTensor> {
    let cu = problem.cu_seqlens.as_ref()?;
    Some(IntTensor {
        shape: vec![cu.len()],
        dtype,
        data: cu.iter().map(|&x| x as i64).collect(),
    })
}

/// The CLI flags that select `options`.
fn option_flags(options: &Options) -> Vec<String> {
    let mut flags = Vec::new();
    if let Some(scale) = options.scale {
        flags.extend(["--scale".to_string(), scale.to_string()]);
    }
    let switches = [
        (options.l2norm_qk, "--l2norm-qk"),
        (options.beta_sigmoid, "--beta-sigmoid"),
        (options.allow_neg_eigval, "--allow-neg-eigval"),
        (options.gate_in_kernel, "--gate-in-kernel"),
        (options.state_v_first, "--state-v-first"),
    ];
    flags.extend(
        switches
            .into_iter()
            .filter(|&(on, _)| on)
            .map(|(_, flag)| flag.to_string()),
    );
    flags
}

fn run_forward(input: &Path, output: &Path, backend: &str, flags: &[String]) -> Output {
    let mut args = vec![
        "run",
        "forward",
        "--input",
        input.to_str().unwrap(),
        "--output",
        output.to_str().unwrap(),
    ];
    args.extend(["--backend", backend]);
    args.extend(flags.iter().map(String::as_str));
    gdn(&args)
}

/// Run `gdn run forward` on random inputs for `problem` and compare o and final_state with the
/// oracle run in this process.
fn check_cli_forward(
    test: &str,
    problem: &Problem,
    backend: &str,
    cu_dtype: IntDType,
    tolerance: f64,
) {
    let scratch = Scratch::new(test);
    let (input, output) = (
        scratch.path("in.safetensors"),
        scratch.path("out.safetensors"),
    );
    let inputs = RandomSpec {
        seed: 7,
        ..Default::default()
    }
    .generate(problem);
    write_inputs(
        &input,
        &inputs,
        cu_seqlens_tensor(problem, cu_dtype).as_ref(),
    );

    let out = run_forward(&input, &output, backend, &option_flags(&problem.options));
    assert!(
        out.status.success(),
        "{test}: gdn failed ({}): {}",
        out.status,
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("gdn run forward:"),
        "{test}: no summary line: {}",
        stderr(&out)
    );

    let expected = reference::forward(problem, &inputs.as_ref()).unwrap();
    let file = TensorFile::open(&output).unwrap();
    let o = file.float("o").unwrap().expect("o in the output");
    let state = file
        .float("final_state")
        .unwrap()
        .expect("final_state in the output");
    assert_eq!(
        (o.shape.as_slice(), o.dtype),
        (&problem.v_shape()[..], DType::F32)
    );
    assert_eq!(
        (state.shape.as_slice(), state.dtype),
        (&problem.state_shape()[..], DType::F32)
    );
    let (err_o, err_state) = (
        relative_l2(&o.data, &expected.o),
        relative_l2(&state.data, &expected.final_state),
    );
    eprintln!("{test} ({backend}): rel-L2 o {err_o:.3e}, final_state {err_state:.3e}");
    assert!(
        err_o <= tolerance,
        "{test}: o rel-L2 {err_o:e} > {tolerance:e}"
    );
    assert!(
        err_state <= tolerance,
        "{test}: final_state rel-L2 {err_state:e} > {tolerance:e}"
    );
}

/// The option combinations and layouts the CLI must pass through to the kernels.
fn cases() -> Vec<(&'static str, Problem, IntDType)> {
    let every_flag = Options {
        scale: Some(0.3),
        l2norm_qk: true,
        beta_sigmoid: true,
        allow_neg_eigval: true,
        gate_in_kernel: true,
        state_v_first: false,
    };
    let v_first = Options {
        state_v_first: true,
        ..Options::default()
    };
    let varlen = Some(vec![0, 5, 70, 100]);
    vec![
        (
            "dense",
            Problem::new(2, 70, 2, 4, 32, 32, None, Options::default()).unwrap(),
            IntDType::I64,
        ),
        (
            "varlen_i64",
            Problem::new(1, 100, 1, 2, 32, 16, varlen.clone(), Options::default()).unwrap(),
            IntDType::I64,
        ),
        (
            "varlen_i32_v_first",
            Problem::new(1, 100, 1, 2, 16, 32, varlen.clone(), v_first).unwrap(),
            IntDType::I32,
        ),
        (
            "gate_in_kernel_every_flag",
            Problem::new(1, 100, 2, 4, 32, 32, varlen, every_flag).unwrap(),
            IntDType::I32,
        ),
    ]
}

#[test]
fn cpu_backend_matches_oracle() {
    for (name, problem, cu_dtype) in cases() {
        check_cli_forward(&format!("cpu_{name}"), &problem, "cpu", cu_dtype, 1e-6);
    }
}

#[test]
fn wgpu_backend_matches_oracle() {
    if common::gpu().is_none() {
        return;
    }
    for (name, problem, cu_dtype) in cases() {
        check_cli_forward(
            &format!("wgpu_{name}"),
            &problem,
            "wgpu",
            cu_dtype,
            common::F32_TOL,
        );
    }
}

#[test]
fn unknown_tensors_are_ignored_with_a_warning() {
    let scratch = Scratch::new("unknown_tensor");
    let (input, output) = (
        scratch.path("in.safetensors"),
        scratch.path("out.safetensors"),
    );
    let problem = Problem::new(1, 8, 1, 1, 16, 16, None, Options::default()).unwrap();
    let inputs = RandomSpec::default().generate(&problem);
    let extra = HostTensor::new([2], vec![1.0, 2.0]);
    let mut tensors = input_tensors(&inputs, None);
    tensors.push(("extra", (&extra).into()));
    io::write(&input, tensors).unwrap();

    let out = run_forward(&input, &output, "cpu", &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("warning: ignoring tensor `extra`"),
        "{}",
        stderr(&out)
    );
}

/// A valid problem small enough for the oracle; bad-input tests break one thing in it.
fn valid_problem() -> Problem {
    Problem::new(1, 64, 2, 4, 32, 32, None, Options::default()).unwrap()
}

/// Assert that `gdn` exits 2 with exactly one stderr line, `error: <expected_start>…`.
fn assert_input_error(out: &Output, expected_start: &str) {
    let err = stderr(out);
    assert_eq!(
        out.status.code(),
        Some(2),
        "expected exit 2, got {}; stderr: {err}",
        out.status
    );
    assert!(!err.contains("panicked"), "panicked: {err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "expected one stderr line, got: {err}");
    let expected = format!("error: {expected_start}");
    assert!(
        lines[0].starts_with(&expected),
        "expected a line starting `{expected}`, got: {err}"
    );
}

/// Write `inputs` (and `cu_seqlens`) to a scratch file, run the forward on it, and expect an
/// input error naming `expected_start`.
fn expect_input_error(
    test: &str,
    inputs: &ForwardInputs<HostTensor>,
    cu_seqlens: Option<&IntTensor>,
    expected_start: &str,
) -> String {
    let scratch = Scratch::new(test);
    let (input, output) = (
        scratch.path("in.safetensors"),
        scratch.path("out.safetensors"),
    );
    write_inputs(&input, inputs, cu_seqlens);
    let out = run_forward(&input, &output, "auto", &[]);
    assert_input_error(&out, expected_start);
    assert!(
        !output.exists(),
        "{test}: an output was written despite the error"
    );
    stderr(&out)
}

fn valid_inputs() -> ForwardInputs<HostTensor> {
    RandomSpec {
        seed: 3,
        ..Default::default()
    }
    .generate(&valid_problem())
}

#[test]
fn missing_beta() {
    let scratch = Scratch::new("missing_beta");
    let (input, output) = (
        scratch.path("in.safetensors"),
        scratch.path("out.safetensors"),
    );
    let inputs = valid_inputs();
    let without_beta = input_tensors(&inputs, None)
        .into_iter()
        .filter(|&(name, _)| name != "beta");
    io::write(&input, without_beta).unwrap();
    assert_input_error(&run_forward(&input, &output, "auto", &[]), "beta: required");
}

#[test]
fn q_of_rank_3() {
    let mut inputs = valid_inputs();
    let [b, t, h, k] = valid_problem().qk_shape();
    inputs.q.shape = vec![b, t, h * k];
    expect_input_error("q_rank_3", &inputs, None, "q: expected shape [B, T, H, K]");
}

#[test]
fn v_heads_not_a_multiple_of_q_heads() {
    let mut inputs = valid_inputs();
    let [b, t, _, v] = valid_problem().v_shape();
    inputs.v = HostTensor::new([b, t, 3, v], vec![0.5; b * t * 3 * v]);
    expect_input_error("v_wrong_hv", &inputs, None, "heads_v (HV) of v:");
}

#[test]
fn g_of_dtype_f16() {
    let mut inputs = valid_inputs();
    inputs.g = inputs.g.with_dtype(DType::F16);
    let err = expect_input_error("g_f16", &inputs, None, "g: expected dtype F32");
    assert!(err.contains("F16"), "{err}");
}

#[test]
fn cu_seqlens_with_batch_2() {
    let problem = Problem::new(2, 64, 2, 4, 32, 32, None, Options::default()).unwrap();
    let inputs = RandomSpec::default().generate(&problem);
    let cu = IntTensor {
        shape: vec![3],
        dtype: IntDType::I64,
        data: vec![0, 30, 64],
    };
    expect_input_error("cu_batch_2", &inputs, Some(&cu), "cu_seqlens:");
}

#[test]
fn cu_seqlens_not_ending_at_t() {
    let cu = IntTensor {
        shape: vec![3],
        dtype: IntDType::I32,
        data: vec![0, 30, 60],
    };
    let err = expect_input_error("cu_end", &valid_inputs(), Some(&cu), "cu_seqlens:");
    assert!(err.contains("T = 64"), "{err}");
}

#[test]
fn positive_g() {
    let mut inputs = valid_inputs();
    inputs.g.data[5] = 0.25;
    expect_input_error("positive_g", &inputs, None, "g:");
}

#[test]
fn nan_in_v() {
    let mut inputs = valid_inputs();
    inputs.v.data[17] = f32::NAN;
    expect_input_error("nan_v", &inputs, None, "v:");
}

#[test]
fn q_k_v_of_mixed_dtypes() {
    let mut inputs = valid_inputs();
    inputs.q = inputs.q.with_dtype(DType::F16);
    let err = expect_input_error("mixed_qkv", &inputs, None, "k:");
    assert!(err.contains("F16"), "{err}");
}

/// f16 and bf16 files: o comes back in the dtype of v and matches the oracle on the same
/// (rounded) inputs within one rounding; the final state stays f32.
#[test]
fn half_precision_files() {
    let problem = valid_problem();
    for (dtype, tol_o) in [(DType::BF16, 3e-3), (DType::F16, 5e-4)] {
        let mut inputs = valid_inputs();
        for t in [&mut inputs.q, &mut inputs.k, &mut inputs.v] {
            *t = t.clone().with_dtype(dtype);
        }
        let expected = reference::forward(&problem, &inputs.as_ref()).unwrap();
        let mut backends = vec!["cpu"];
        if common::gpu().is_some_and(|ctx| ctx.forward_storage_dtypes().contains(&dtype)) {
            backends.push("wgpu");
        }
        for backend in backends {
            let scratch = Scratch::new(&format!("half_{dtype}_{backend}"));
            let (input, output) = (
                scratch.path("in.safetensors"),
                scratch.path("out.safetensors"),
            );
            write_inputs(&input, &inputs, None);
            let out = run_forward(&input, &output, backend, &[]);
            assert!(out.status.success(), "{dtype} {backend}: {}", stderr(&out));
            let file = TensorFile::open(&output).unwrap();
            let o = file.float("o").unwrap().unwrap();
            let state = file.float("final_state").unwrap().unwrap();
            assert_eq!((o.dtype, state.dtype), (dtype, DType::F32));
            let (eo, es) = (
                relative_l2(&o.data, &expected.o),
                relative_l2(&state.data, &expected.final_state),
            );
            eprintln!("{dtype} {backend}: rel-L2 o {eo:.3e}, final_state {es:.3e}");
            assert!(
                eo <= tol_o && es <= 1e-5,
                "{dtype} {backend}: o {eo:e}, state {es:e}"
            );
        }
    }
}

/// A bf16 file through `gdn run backward --backend wgpu`: dq, dk, dv come back in BF16 (one
/// rounding from the oracle on the same inputs), the other gradients in F32.
#[test]
fn bf16_backward_on_wgpu() {
    if common::gpu().is_none() {
        return;
    }
    let problem = valid_problem();
    let mut inputs = valid_inputs();
    for t in [&mut inputs.q, &mut inputs.k, &mut inputs.v] {
        *t = t.clone().with_dtype(DType::BF16);
    }
    let scratch = Scratch::new("bf16_backward");
    let (input, output) = (
        scratch.path("in.safetensors"),
        scratch.path("out.safetensors"),
    );
    let d_o = HostTensor::new(
        problem.v_shape(),
        vec![0.5; problem.v_shape().iter().product()],
    )
    .with_dtype(DType::BF16);
    let mut tensors = input_tensors(&inputs, None);
    tensors.push(("do", (&d_o).into()));
    gdn_wgpu::io::write(&input, tensors).unwrap();
    let out = gdn(&[
        "run",
        "backward",
        "--input",
        input.to_str().unwrap(),
        "--output",
        output.to_str().unwrap(),
        "--backend",
        "wgpu",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let expected = reference::backward(&problem, &inputs.as_ref(), &d_o, None).unwrap();
    let file = TensorFile::open(&output).unwrap();
    let cases: [(&str, &Vec<f64>, DType, f64); 6] = [
        ("dq", &expected.dq, DType::BF16, 3e-3),
        ("dk", &expected.dk, DType::BF16, 3e-3),
        ("dv", &expected.dv, DType::BF16, 3e-3),
        ("dg", &expected.dg, DType::F32, 1e-4),
        ("dbeta", &expected.dbeta, DType::F32, 1e-4),
        ("dh0", expected.dh0.as_ref().unwrap(), DType::F32, 1e-4),
    ];
    for (name, want, dtype, tol) in cases {
        let t = file.float(name).unwrap().unwrap();
        assert_eq!(t.dtype, dtype, "{name}");
        let err = relative_l2(&t.data, want);
        assert!(err <= tol, "{name}: rel-L2 {err:e} > {tol:e}");
    }
}

#[test]
fn nonexistent_input_file() {
    let scratch = Scratch::new("nonexistent");
    let input = scratch.path("missing.safetensors");
    let out = run_forward(&input, &scratch.path("out.safetensors"), "auto", &[]);
    assert_input_error(&out, input.to_str().unwrap());
}

#[test]
fn garbage_input_file() {
    let scratch = Scratch::new("garbage");
    let input = scratch.path("garbage.safetensors");
    std::fs::write(&input, b"this is not a safetensors file at all").unwrap();
    let out = run_forward(&input, &scratch.path("out.safetensors"), "auto", &[]);
    assert_input_error(&out, input.to_str().unwrap());
    assert!(
        stderr(&out).contains("not a valid safetensors file"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn info_exits_0() {
    let out = gdn(&["info"]);
    assert!(
        out.status.success(),
        "gdn info failed ({}): {}",
        out.status,
        stderr(&out)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("adapter"), "{stdout}");
}
