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

/// A valid problem small enough for the oracle; bad-input cases break one thing in it.
fn valid_problem() -> Problem {
    Problem::new(1, 64, 2, 4, 32, 32, None, Options::default()).unwrap()
}

fn valid_inputs() -> ForwardInputs<HostTensor> {
    RandomSpec {
        seed: 3,
        ..Default::default()
    }
    .generate(&valid_problem())
}

/// A tensor of the input file, owned so a case can replace it.
#[derive(Clone)]
enum Owned {
    Float(HostTensor),
    Int(IntTensor),
}

/// What one `gdn run` of the catalogue is given: the input's tensors (or raw bytes in their
/// place), the flags, and where the output goes (relative to the scratch folder).
#[derive(Clone)]
struct RunFiles {
    tensors: Vec<(&'static str, Owned)>,
    raw: Option<Vec<u8>>,
    /// Bytes cut from the end of the file.
    truncate: usize,
    no_input: bool,
    flags: Vec<&'static str>,
    output: &'static str,
}

impl RunFiles {
    /// The valid problem's tensors with h0, plus `do` for the backward.
    fn valid() -> Self {
        let inputs = valid_inputs();
        let d_o = HostTensor::new(
            valid_problem().v_shape(),
            vec![0.5; valid_problem().v_shape().iter().product()],
        );
        let mut tensors: Vec<(&'static str, Owned)> = input_tensors(&inputs, None)
            .into_iter()
            .map(|(name, t)| match t {
                TensorRef::Float(t) => (name, Owned::Float(t.clone())),
                TensorRef::Int(t) => (name, Owned::Int(t.clone())),
            })
            .collect();
        tensors.push(("do", Owned::Float(d_o)));
        RunFiles {
            tensors,
            raw: None,
            truncate: 0,
            no_input: false,
            flags: Vec::new(),
            output: "out.safetensors",
        }
    }

    fn float(&mut self, name: &str) -> &mut HostTensor {
        match self.tensors.iter_mut().find(|(n, _)| *n == name) {
            Some((_, Owned::Float(t))) => t,
            _ => panic!("no float tensor {name}"),
        }
    }

    fn set(&mut self, name: &'static str, t: Owned) {
        self.remove(name);
        self.tensors.push((name, t));
    }

    fn remove(&mut self, name: &str) {
        self.tensors.retain(|(n, _)| *n != name);
    }

    fn cu_seqlens(&mut self, dtype: IntDType, shape: &[usize], data: &[i64]) {
        let cu = IntTensor {
            shape: shape.to_vec(),
            dtype,
            data: data.to_vec(),
        };
        self.set("cu_seqlens", Owned::Int(cu));
    }

    fn bytes(&self, dir: &Scratch) -> Vec<u8> {
        if let Some(raw) = &self.raw {
            return raw.clone();
        }
        let path = dir.path("valid.safetensors");
        let refs = self.tensors.iter().map(|(n, t)| {
            let r: TensorRef = match t {
                Owned::Float(t) => t.into(),
                Owned::Int(t) => t.into(),
            };
            (*n, r)
        });
        io::write(&path, refs).unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        bytes.truncate(bytes.len() - self.truncate);
        bytes
    }
}

/// The commands a case runs with.
const ALL: &[&str] = &["forward", "decode", "backward"];
const BACKWARD: &[&str] = &["backward"];

/// One bad input for `gdn run`: its class (a slug of docs/errors.md), the commands, how the
/// valid files are spoiled, and how the one error line must start after `error: ` (`{input}`
/// and `{output}` stand for the paths).
struct BadRun {
    case: &'static str,
    class: &'static str,
    commands: &'static [&'static str],
    spoil: fn(&mut RunFiles),
    expected: &'static str,
}

fn bad_runs() -> Vec<BadRun> {
    let case = |case, class, commands, spoil: fn(&mut RunFiles), expected| BadRun {
        case,
        class,
        commands,
        spoil,
        expected,
    };
    vec![
        // Files.
        case(
            "input missing",
            "file-missing",
            ALL,
            |f| f.no_input = true,
            "{input}:",
        ),
        case(
            "text, not safetensors",
            "file-not-safetensors",
            ALL,
            |f| f.raw = Some(b"this is not a safetensors file at all".to_vec()),
            "{input}: not a valid safetensors file",
        ),
        case(
            "truncated by 100 bytes",
            "file-truncated",
            ALL,
            |f| f.truncate = 100,
            "{input}: not a valid safetensors file",
        ),
        case(
            "header not JSON",
            "file-corrupt-header",
            ALL,
            |f| {
                let header = b"{\"q\": {\"dtype\": ";
                let mut b = (header.len() as u64).to_le_bytes().to_vec();
                b.extend(header);
                f.raw = Some(b);
            },
            "{input}: not a valid safetensors file",
        ),
        case(
            "beta missing",
            "tensor-missing",
            ALL,
            |f| f.remove("beta"),
            "beta: required",
        ),
        case(
            "v missing",
            "tensor-missing",
            ALL,
            |f| f.remove("v"),
            "v: required",
        ),
        case(
            "output folder missing",
            "output-unwritable",
            ALL,
            |f| f.output = "no such folder/out.safetensors",
            "--output: expected a path in an existing folder",
        ),
        case(
            "output is a folder",
            "output-unwritable",
            ALL,
            |f| f.output = ".",
            "--output: expected a file path, not a folder",
        ),
        // Flags.
        case(
            "unknown flag",
            "cli-flags",
            ALL,
            |f| f.flags.push("--frobnicate"),
            "unexpected argument '--frobnicate'",
        ),
        case(
            "unknown backend",
            "cli-flags",
            ALL,
            |f| f.flags.extend(["--backend", "sideways"]),
            "invalid value 'sideways' for '--backend",
        ),
        case(
            "scale not a number",
            "cli-flags",
            ALL,
            |f| f.flags.extend(["--scale", "half"]),
            "invalid value 'half' for '--scale",
        ),
        case(
            "scale NaN",
            "scale",
            ALL,
            |f| f.flags.extend(["--scale", "NaN"]),
            "scale: expected a finite number, got NaN",
        ),
        case(
            "scale inf",
            "scale",
            ALL,
            |f| f.flags.extend(["--scale", "inf"]),
            "scale: expected a finite number, got inf",
        ),
        case(
            "--allow-neg-eigval alone",
            "neg-eigval-without-sigmoid",
            ALL,
            |f| f.flags.push("--allow-neg-eigval"),
            "allow_neg_eigval: expected use together with beta_sigmoid",
        ),
        // Sizes read from q and v.
        case(
            "q of rank 3",
            "tensor-rank",
            ALL,
            |f| f.float("q").shape = vec![1, 64, 64],
            "q: expected shape [B, T, H, K] (4-D), got [1, 64, 64]",
        ),
        case(
            "v of rank 5",
            "tensor-rank",
            ALL,
            |f| f.float("v").shape = vec![1, 64, 4, 2, 16],
            "v: expected shape [B, T, HV, V] (4-D)",
        ),
        case(
            "T = 0",
            "zero-size",
            ALL,
            |f| *f.float("q") = HostTensor::new([1, 0, 2, 32], vec![]),
            "tokens (T) of q: expected at least 1, got 0",
        ),
        case(
            "HV = 3 with H = 2",
            "gva-ratio",
            ALL,
            |f| *f.float("v") = HostTensor::new([1, 64, 3, 32], vec![0.5; 64 * 3 * 32]),
            "heads_v (HV) of v: expected a positive multiple of H = 2",
        ),
        case(
            "K = 24",
            "head-dim",
            ALL,
            |f| *f.float("q") = HostTensor::new([1, 64, 2, 24], vec![0.5; 64 * 2 * 24]),
            "key_dim (K) of q: expected a multiple of 16 in 16..=256, got 24",
        ),
        case(
            "V = 272",
            "head-dim",
            ALL,
            |f| *f.float("v") = HostTensor::new([1, 64, 4, 272], vec![0.5; 64 * 4 * 272]),
            "value_dim (V) of v: expected a multiple of 16 in 16..=256, got 272",
        ),
        // cu_seqlens.
        case(
            "cu_seqlens with B = 2",
            "cu-seqlens-batch",
            ALL,
            |f| {
                for name in ["q", "k", "v", "g", "beta", "do"] {
                    let t = f.float(name);
                    t.shape[0] = 2;
                    t.shape[1] = 32;
                }
                f.remove("initial_state");
                f.cu_seqlens(IntDType::I64, &[3], &[0, 30, 64]);
            },
            "cu_seqlens: expected batch (B) == 1",
        ),
        case(
            "cu_seqlens [64]",
            "cu-seqlens-short",
            ALL,
            |f| f.cu_seqlens(IntDType::I32, &[1], &[64]),
            "cu_seqlens: expected at least 2 entries",
        ),
        case(
            "cu_seqlens from 2",
            "cu-seqlens-start",
            ALL,
            |f| f.cu_seqlens(IntDType::I32, &[2], &[2, 64]),
            "cu_seqlens: expected first entry 0, got 2",
        ),
        case(
            "cu_seqlens 40 then 20",
            "cu-seqlens-unsorted",
            ALL,
            |f| f.cu_seqlens(IntDType::I64, &[4], &[0, 40, 20, 64]),
            "cu_seqlens: expected non-decreasing entries, got 40 followed by 20",
        ),
        case(
            "cu_seqlens ends at 60",
            "cu-seqlens-end",
            ALL,
            |f| f.cu_seqlens(IntDType::I32, &[3], &[0, 30, 60]),
            "cu_seqlens: expected last entry equal to T = 64, got 60",
        ),
        case(
            "cu_seqlens ends at 100",
            "cu-seqlens-end",
            ALL,
            |f| f.cu_seqlens(IntDType::I64, &[3], &[0, 30, 100]),
            "cu_seqlens: expected last entry equal to T = 64, got 100",
        ),
        case(
            "cu_seqlens as F32",
            "cu-seqlens-dtype",
            ALL,
            |f| {
                f.set(
                    "cu_seqlens",
                    Owned::Float(HostTensor::new([2], vec![0.0, 64.0])),
                )
            },
            "cu_seqlens: expected dtype I32 or I64, got F32",
        ),
        case(
            "cu_seqlens with -5",
            "cu-seqlens-negative",
            ALL,
            |f| f.cu_seqlens(IntDType::I64, &[3], &[0, -5, 64]),
            "cu_seqlens: expected non-negative entries, got -5",
        ),
        case(
            "cu_seqlens of rank 2",
            "cu-seqlens-rank",
            ALL,
            |f| f.cu_seqlens(IntDType::I32, &[1, 2], &[0, 64]),
            "cu_seqlens: expected shape [N + 1] (1-D), got [1, 2]",
        ),
        // Tensors against the problem.
        case(
            "k with K = 16",
            "tensor-shape",
            ALL,
            |f| *f.float("k") = HostTensor::new([1, 64, 2, 16], vec![0.5; 64 * 2 * 16]),
            "k: expected shape [1, 64, 2, 32], got [1, 64, 2, 16]",
        ),
        case(
            "beta per q-head",
            "tensor-shape",
            ALL,
            |f| *f.float("beta") = HostTensor::new([1, 64, 2], vec![0.5; 128]),
            "beta: expected shape [1, 64, 4], got [1, 64, 2]",
        ),
        case(
            "initial_state with K = 16",
            "tensor-shape",
            ALL,
            |f| f.float("initial_state").shape = vec![1, 4, 64, 16],
            "initial_state: expected shape [1, 4, 32, 32]",
        ),
        case(
            "q F16, k and v F32",
            "qkv-dtype-mixed",
            ALL,
            |f| {
                let q = f.float("q");
                *q = q.clone().with_dtype(DType::F16);
            },
            "k: expected dtype F16 (the dtype of q), got F32",
        ),
        case(
            "g F16",
            "f32-only-dtype",
            ALL,
            |f| {
                let g = f.float("g");
                *g = g.clone().with_dtype(DType::F16);
            },
            "g: expected dtype F32, got F16",
        ),
        case(
            "initial_state BF16",
            "f32-only-dtype",
            ALL,
            |f| {
                let h0 = f.float("initial_state");
                *h0 = h0.clone().with_dtype(DType::BF16);
            },
            "initial_state: expected dtype F32, got BF16",
        ),
        case(
            "q stored as I32",
            "non-float-tensor",
            ALL,
            |f| {
                let n = 64 * 2 * 32;
                let q = IntTensor {
                    shape: vec![1, 64, 2, 32],
                    dtype: IntDType::I32,
                    data: vec![1; n],
                };
                f.set("q", Owned::Int(q));
            },
            "q: expected dtype F32, F16 or BF16, got I32",
        ),
        case(
            "--gate-in-kernel without A_log",
            "gate-params-missing",
            ALL,
            |f| {
                f.flags.push("--gate-in-kernel");
                f.set("dt_bias", Owned::Float(HostTensor::new([4], vec![0.0; 4])));
            },
            "A_log: required with gate_in_kernel",
        ),
        case(
            "A_log without --gate-in-kernel",
            "gate-params-unexpected",
            ALL,
            |f| f.set("A_log", Owned::Float(HostTensor::new([4], vec![0.0; 4]))),
            "A_log: expected no A_log unless gate_in_kernel is set",
        ),
        case(
            "dt_bias per q-head",
            "gate-params-shape",
            ALL,
            |f| {
                f.flags.push("--gate-in-kernel");
                f.set("A_log", Owned::Float(HostTensor::new([4], vec![0.0; 4])));
                f.set("dt_bias", Owned::Float(HostTensor::new([2], vec![0.0; 2])));
            },
            "dt_bias: expected shape [4], got [2]",
        ),
        // Values.
        case(
            "NaN in v",
            "non-finite",
            ALL,
            |f| f.float("v").data[17] = f32::NAN,
            "v: expected finite values, got NaN at flat index 17",
        ),
        case(
            "inf in g",
            "non-finite",
            ALL,
            |f| f.float("g").data[3] = f32::NEG_INFINITY,
            "g: expected finite values, got -inf at flat index 3",
        ),
        case(
            "NaN in initial_state",
            "non-finite",
            ALL,
            |f| f.float("initial_state").data[0] = f32::NAN,
            "initial_state: expected finite values",
        ),
        case(
            "g = 0.25",
            "positive-log-decay",
            ALL,
            |f| f.float("g").data[5] = 0.25,
            "g: expected log-space decays ≤ 0, got 0.25 at flat index 5",
        ),
        // The backward's upstream gradients.
        case(
            "do missing",
            "upstream-gradient",
            BACKWARD,
            |f| f.remove("do"),
            "do: required",
        ),
        case(
            "do of the shape of q",
            "upstream-gradient",
            BACKWARD,
            |f| f.float("do").shape = vec![1, 64, 2, 64],
            "do: expected shape [1, 64, 4, 32], got [1, 64, 2, 64]",
        ),
        case(
            "do BF16 while v F32",
            "upstream-gradient",
            BACKWARD,
            |f| {
                let d_o = f.float("do");
                *d_o = d_o.clone().with_dtype(DType::BF16);
            },
            "do: expected dtype F32 (the dtype of v), got BF16",
        ),
        case(
            "NaN in do",
            "upstream-gradient",
            BACKWARD,
            |f| f.float("do").data[1] = f32::NAN,
            "do: expected finite values",
        ),
        case(
            "dht per batch row of another K",
            "upstream-gradient",
            BACKWARD,
            |f| {
                f.set(
                    "dht",
                    Owned::Float(HostTensor::new([1, 4, 16, 32], vec![0.0; 2048])),
                )
            },
            "dht: expected shape [1, 4, 32, 32]",
        ),
        case(
            "dht F16",
            "upstream-gradient",
            BACKWARD,
            |f| {
                let dht = HostTensor::new([1, 4, 32, 32], vec![0.0; 4096]).with_dtype(DType::F16);
                f.set("dht", Owned::Float(dht));
            },
            "dht: expected dtype F32, got F16",
        ),
        case(
            "backward budget not a size",
            "backward-budget",
            BACKWARD,
            |f| f.flags.extend(["--backward-budget", "lots"]),
            "--backward-budget: expected a byte count",
        ),
        case(
            "backward budget of 0 bytes",
            "backward-budget",
            BACKWARD,
            |f| f.flags.extend(["--backward-budget", "0"]),
            "--backward-budget: expected a byte count",
        ),
    ]
}

/// Every case of the catalogue with each of its commands: exit code 2, one stderr line
/// `error: <expected>…`, and nothing written (the scratch folder holds what it held before).
/// The cpu backend is named so an input wrongly accepted would still finish without a GPU.
#[test]
fn bad_input_catalogue() {
    let scratch = Scratch::new("catalogue");
    let input = scratch.path("in.safetensors");
    let mut failures = Vec::new();
    for run in bad_runs() {
        let mut files = RunFiles::valid();
        (run.spoil)(&mut files);
        if files.no_input {
            let _ = std::fs::remove_file(&input);
        } else {
            std::fs::write(&input, files.bytes(&scratch)).unwrap();
        }
        let output = scratch.path(files.output);
        let listing = || {
            let mut names: Vec<String> = std::fs::read_dir(&scratch.0)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names
        };
        let before = listing();
        for command in run.commands {
            let mut args = vec![
                "run",
                command,
                "--input",
                input.to_str().unwrap(),
                "--output",
                output.to_str().unwrap(),
            ];
            if !files.flags.contains(&"--backend") {
                args.extend(["--backend", "cpu"]);
            }
            args.extend(files.flags.iter().copied());
            let out = gdn(&args);
            let err = stderr(&out);
            let expected = format!(
                "error: {}",
                run.expected
                    .replace("{input}", input.to_str().unwrap())
                    .replace("{output}", output.to_str().unwrap())
            );
            let what = format!("[{}] {} (gdn run {command})", run.class, run.case);
            if out.status.code() != Some(2) {
                failures.push(format!("{what}: exit {}, stderr: {err}", out.status));
            } else if err.lines().count() != 1 || !err.starts_with(&expected) {
                failures.push(format!(
                    "{what}: expected one line `{expected}…`, got: {err}"
                ));
            }
            if listing() != before {
                failures.push(format!("{what}: files were written: {:?}", listing()));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failure(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
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
