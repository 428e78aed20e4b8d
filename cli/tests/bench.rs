//! `gdn bench`: the quick sweep's JSON on whatever adapter wgpu finds (lavapipe in CI), the
//! correctness gate refusing a wrong kernel result, and flag errors.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::process::Command;

use gdn_cli::bench::check::{
    check_backward, check_backward_on, check_decode, check_decode_on, check_forward,
    check_forward_on,
};
use gdn_cli::bench::{BenchError, Op, cases, memory, metrics, verify};
use gdn_wgpu::wgpu_backend::Context;
use gdn_wgpu::wgpu_backend::decode::RecurrentStepTiles;
use gdn_wgpu::{Backend, DType, Options, Oracle, Problem};
use serde_json::Value;

fn gdn() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gdn"));
    // lavapipe asks for a runtime dir it never uses.
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        cmd.env("XDG_RUNTIME_DIR", std::env::temp_dir());
    }
    cmd
}

fn temp_path(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("gdn-bench-test-{}-{name}", std::process::id()))
}

/// Run a `gdn bench` command that must succeed and return the report it wrote to `json`.
fn bench_report(cmd: &mut Command, json: &std::path::Path) -> Value {
    let out = cmd.arg("--json").arg(json).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap()
}

fn num(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("`{key}` is not a number in {v}"))
}

#[test]
fn quick_sweep_writes_json_with_the_documented_fields() {
    if common::gpu().is_none() {
        return;
    }
    let json = temp_path("quick.json");
    let svg = temp_path("quick.svg");
    let out = gdn()
        .args(["bench", "--quick", "--warmup-ms", "20", "--json"])
        .arg(&json)
        .arg("--plot")
        .arg(&svg)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "gdn bench --quick failed:\n{stdout}\n{stderr}"
    );
    eprintln!("{stdout}");
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    std::fs::remove_file(&json).ok();
    // The plot: one panel per op, one line per head config.
    let plot = std::fs::read_to_string(&svg).unwrap();
    std::fs::remove_file(&svg).ok();
    assert!(plot.starts_with("<svg"), "{}", &plot[..plot.len().min(200)]);
    for caption in [
        "forward: median latency",
        "backward: median latency",
        "decode: median latency",
        "heads 1/2",
        "heads 2/4",
    ] {
        assert!(plot.contains(caption), "{caption} missing from the plot");
    }
    assert_eq!(report["tool"], "gdn bench");
    for key in ["version", "date_utc", "command"] {
        assert!(report[key].is_string(), "{key} missing");
    }
    assert!(report["adapter"]["name"].is_string());
    let records = report["records"].as_array().unwrap();
    let mut ops: Vec<&str> = records.iter().map(|r| r["op"].as_str().unwrap()).collect();
    ops.sort_unstable();
    ops.dedup();
    assert_eq!(ops, ["backward", "decode", "forward"]);
    for r in records {
        assert_eq!(r["status"], "ok", "{r}");
        assert_eq!(r["backend"], "wgpu");
        assert_eq!(r["dtype"], "F32");
        assert!(r["adapter"].is_string());
        let shape = &r["shape"];
        for key in [
            "heads_qk",
            "heads_v",
            "key_dim",
            "value_dim",
            "batch",
            "sequences",
            "total_tokens",
        ] {
            assert!(num(shape, key) >= 1.0, "shape.{key} in {r}");
        }
        assert!(shape["label"].is_string() && shape["seqs"].is_string());
        // Times: positive, ordered; GPU times where the adapter has timestamps.
        let mut timed = Vec::new();
        for key in ["gpu_ms", "wall_ms", "host_ms"] {
            if r[key].is_null() {
                assert_ne!(key, "wall_ms", "wall time is always measured: {r}");
                continue;
            }
            let (med, min, max) = (
                num(&r[key], "median"),
                num(&r[key], "min"),
                num(&r[key], "max"),
            );
            assert!(min > 0.0 && min <= med && med <= max, "{key} in {r}");
            timed.push(key);
        }
        if report["adapter"]["timestamp_queries"] == true {
            assert!(timed.contains(&"gpu_ms"), "{r}");
            assert!(!r["passes"].as_array().unwrap().is_empty(), "{r}");
        }
        assert!(num(r, "reps") >= 3.0 && num(r, "input_sets") >= 1.0);
        assert!(num(r, "warmup") >= 1.0, "{r}");
        // Each timed repetition's GPU time, in order: as many as the reps, spanning min..max.
        let each: Vec<f64> = r["gpu_ms_reps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        if r["gpu_ms"].is_null() {
            assert!(each.is_empty(), "{r}");
        } else {
            assert_eq!(each.len() as f64, num(r, "reps"), "{r}");
            let lo = each.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = each.iter().copied().fold(0.0, f64::max);
            assert_eq!(
                (lo, hi),
                (num(&r["gpu_ms"], "min"), num(&r["gpu_ms"], "max")),
                "{r}"
            );
        }
        for key in [
            "flops",
            "bytes",
            "tflops",
            "gbps",
            "tokens_per_s",
            "peak_memory_bytes",
        ] {
            assert!(num(r, key) > 0.0, "{key} in {r}");
        }
        // Decode's copy ceiling is measured beside it where there are timestamps; only there.
        if r["op"] == "decode" && report["adapter"]["timestamp_queries"] == true {
            assert!(num(r, "copy_ceiling_gbps") > 0.0, "{r}");
        } else if r["op"] != "decode" {
            assert!(r["copy_ceiling_gbps"].is_null(), "{r}");
        }
        // Memory: measured by the allocator where wgpu has a report (Vulkan, DX12), and never
        // less than the op's own inputs and outputs.
        let backend = report["adapter"]["backend"].as_str().unwrap();
        if r["op"] == "backward" {
            // The backward's peak is the library's count of the buffers the call holds, with
            // its parts and the allocator's figure beside it where there is one.
            assert_eq!(r["memory_source"], "library", "{r}");
            let m = &r["backward_memory"];
            let parts = [
                "inputs_bytes",
                "saved_bytes",
                "workspace_bytes",
                "gradients_bytes",
            ];
            let sum: f64 = parts.iter().map(|k| num(m, k)).sum();
            assert_eq!(sum, num(r, "peak_memory_bytes"), "{r}");
            assert!(
                num(m, "windows") >= 1.0 && num(m, "workspace_bytes") > 0.0,
                "{r}"
            );
            if matches!(backend, "Vulkan" | "Dx12") {
                assert!(num(m, "allocator_bytes") >= sum, "{r}");
            }
        } else if matches!(backend, "Vulkan" | "Dx12") {
            assert_eq!(r["memory_source"], "allocator", "{r}");
        } else {
            assert!(
                r["memory_source"] == "allocator" || r["memory_source"] == "estimate",
                "{r}"
            );
        }
        let io = io_bytes(
            r["op"].as_str().unwrap(),
            &IoShape {
                tokens: num(shape, "total_tokens"),
                sequences: num(shape, "sequences"),
                heads_qk: num(shape, "heads_qk"),
                heads_v: num(shape, "heads_v"),
                key_dim: num(shape, "key_dim"),
                value_dim: num(shape, "value_dim"),
                dtype_size: 4.0,
            },
        );
        assert!(
            num(r, "peak_memory_bytes") >= io,
            "peak_memory_bytes below the {io} bytes of the op's inputs and outputs: {r}"
        );
        let check = &r["check"];
        assert!(num(check, "max_rel_l2") <= num(check, "tolerance"), "{r}");
        assert!(check["shape"].is_string() && r["variant"].is_string());
        // The forward names the algorithm it timed and why; other ops have none.
        if r["op"] == "forward" {
            assert!(
                r["algorithm"] == "chunked" || r["algorithm"] == "recurrent",
                "{r}"
            );
            assert!(r["algorithm_reason"].is_string(), "{r}");
        } else {
            assert!(r["algorithm"].is_null(), "{r}");
        }
    }
}

/// `--forward-algorithm` times the algorithm asked for (gated by the oracle first on the same
/// algorithm) and the record names it, with "forced" as the reason; `auto` records the
/// context's choice.
/// `--whole-op-timing` times the op between its first and last timestamp only: one span, no
/// per-pass times; without it a backward records each of its passes.
#[test]
fn whole_op_timing_records_one_span() {
    if common::gpu().is_none() {
        return;
    }
    let json = temp_path("whole.json");
    let mut spans = Vec::new();
    for whole in [false, true] {
        let mut cmd = gdn();
        cmd.args(["bench", "--quick", "--ops", "backward", "--heads", "1/2"])
            .args(["--seqs", "1x100", "--no-progress"]);
        if whole {
            cmd.arg("--whole-op-timing");
        }
        let report = bench_report(&mut cmd, &json);
        std::fs::remove_file(&json).ok();
        if report["adapter"]["timestamp_queries"] != true {
            return;
        }
        let record = &report["records"][0];
        assert_eq!(record["status"], "ok", "{record}");
        assert!(num(&record["gpu_ms"], "median") > 0.0, "{record}");
        spans.push(record["passes"].as_array().unwrap().len());
    }
    assert!(spans[0] > 1, "per-pass times: {spans:?}");
    assert_eq!(spans[1], 1, "one span with --whole-op-timing: {spans:?}");
}

#[test]
fn forward_algorithm_is_recorded_and_can_be_forced() {
    let Some(ctx) = common::gpu() else { return };
    let json = temp_path("algorithm.json");
    let p = Problem::new(1, 100, 1, 2, 32, 32, None, Options::default()).unwrap();
    let auto = gdn_wgpu::wgpu_backend::forward_algorithm(ctx, &p, DType::F32).unwrap();
    for (flag, want) in [
        ("chunked", "chunked"),
        ("recurrent", "recurrent"),
        ("auto", auto.algorithm.name()),
    ] {
        let report = bench_report(
            gdn()
                .args(["bench", "--quick", "--ops", "forward", "--heads", "1/2"])
                .args([
                    "--seqs",
                    "1x100",
                    "--no-progress",
                    "--forward-algorithm",
                    flag,
                ]),
            &json,
        );
        let record = &report["records"][0];
        assert_eq!(record["status"], "ok", "{record}");
        assert_eq!(record["algorithm"], want, "{flag}: {record}");
        let reason = record["algorithm_reason"].as_str().unwrap();
        assert_eq!(
            reason.contains("forced"),
            flag != "auto",
            "{flag}: {reason}"
        );
        let variant = record["variant"].as_str().unwrap();
        let named = if want == "chunked" {
            "chunked, "
        } else {
            "recurrent kernel, "
        };
        assert!(variant.starts_with(named), "{flag}: {variant}");
        assert!(
            record["check"]["shape"].as_str().unwrap().contains(named),
            "{record}"
        );
    }
    std::fs::remove_file(&json).ok();
}

/// A shape, as the test computes buffer sizes from it (independently of the library).
struct IoShape {
    tokens: f64,
    sequences: f64,
    heads_qk: f64,
    heads_v: f64,
    key_dim: f64,
    value_dim: f64,
    dtype_size: f64,
}

impl IoShape {
    fn of(p: &Problem, dtype: DType) -> Self {
        IoShape {
            tokens: p.total_tokens() as f64,
            sequences: p.num_sequences() as f64,
            heads_qk: p.heads_qk as f64,
            heads_v: p.heads_v as f64,
            key_dim: p.key_dim as f64,
            value_dim: p.value_dim as f64,
            dtype_size: dtype.size() as f64,
        }
    }
}

/// Bytes of the distinct buffers an op reads and writes, each counted once: q, k, v (storage
/// dtype), g, β (f32), the initial state; o and the final state (forward); plus do, dht and
/// dq, dk, dv, dg, dβ, dh0 (backward); decode's state pool is updated in place (once).
fn io_bytes(op: &str, z: &IoShape) -> f64 {
    let qk = z.tokens * z.heads_qk * z.key_dim * z.dtype_size;
    let v = z.tokens * z.heads_v * z.value_dim * z.dtype_size;
    let gates = z.tokens * z.heads_v * 4.0;
    let state = z.sequences * z.heads_v * z.key_dim * z.value_dim * 4.0;
    let inputs = 2.0 * qk + v + 2.0 * gates;
    match op {
        "forward" => inputs + state + v + state,
        "backward" => (inputs + state) + (v + state) + (inputs + state),
        "decode" => inputs + state + v,
        other => panic!("unknown op {other}"),
    }
}

#[test]
fn measured_memory_covers_inputs_and_outputs_and_matches_the_estimate() {
    // A device of the test's own: other tests allocating on a shared one would move the
    // allocator's total during the measurement.
    let Some(ctx) = own_context() else { return };
    let backend = ctx.adapter_info.as_ref().map(|i| i.backend);
    let p = Problem::new(1, 256, 1, 2, 32, 32, None, Options::default()).unwrap();
    let step = small(4, 1);
    for (op, p) in [(Op::Forward, &p), (Op::Backward, &p), (Op::Decode, &step)] {
        let measured = memory::measure(&ctx, op, p, DType::F32).unwrap();
        let Some(measured) = measured else {
            assert!(
                !matches!(backend, Some(wgpu::Backend::Vulkan | wgpu::Backend::Dx12)),
                "{backend:?} has an allocator report, yet {} measured nothing",
                op.name()
            );
            eprintln!(
                "{backend:?}: no allocator report; {} not measured",
                op.name()
            );
            continue;
        };
        let io = io_bytes(op.name(), &IoShape::of(p, DType::F32));
        assert!(
            measured as f64 >= io,
            "{}: measured {measured} B, below its {io} B of inputs and outputs",
            op.name()
        );
        if op == Op::Backward {
            // The library's count of the backward's buffers is the allocator's figure up to
            // its alignment padding.
            let host = cases::HostCase::new(p.clone(), DType::F32, 0);
            let case = cases::prepare(&ctx, op, &host, None, DType::F32, 1, 0).unwrap();
            let (counted, _, _) = case.backward_memory().unwrap();
            let counted = counted.total();
            assert!(
                counted <= measured && measured - counted <= measured / 50 + 64 * 1024,
                "backward: library {counted} B vs allocator {measured} B"
            );
            eprintln!("backward: allocator {measured} B, library {counted} B");
            continue;
        }
        // The estimate used where there is no allocator report must stay close to what the
        // launchers really allocate (only alignment padding apart); when this fails, the
        // launchers' scratch changed: update `metrics::peak_memory_estimate`.
        let algorithm = gdn_wgpu::wgpu_backend::forward_algorithm(&ctx, p, DType::F32)
            .unwrap()
            .algorithm;
        let estimate = metrics::peak_memory_estimate(op, p, DType::F32, algorithm);
        let gap = (measured as f64 - estimate as f64).abs();
        assert!(
            gap <= 0.02 * measured as f64 + 4096.0,
            "{}: estimate {estimate} B vs allocator {measured} B",
            op.name()
        );
        eprintln!(
            "{}: allocator {measured} B, estimate {estimate} B, inputs+outputs {io} B",
            op.name()
        );
    }
}

fn small(b: usize, t: usize) -> Problem {
    Problem::new(b, t, 1, 2, 32, 32, None, Options::default()).unwrap()
}

/// A context of the test's own: the gate forces kernel variants, so it needs `&mut`.
fn own_context() -> Option<Context> {
    common::gpu()?;
    Some(Context::new_blocking().unwrap())
}

fn assert_refused(result: Result<gdn_cli::bench::CheckSummary, BenchError>, output: &str) {
    match result {
        Err(e @ BenchError::CheckFailed { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("check failed before timing") && msg.contains(output),
                "{msg}"
            );
        }
        other => panic!("a corrupted {output} passed the check: {other:?}"),
    }
}

#[test]
fn the_gate_refuses_a_wrong_kernel_result() {
    let Some(mut ctx) = own_context() else { return };
    let p = small(1, 131);
    let vb = ctx.tuning().state_scan_v_block(&p);
    let case = check_forward(&mut ctx, &p, DType::F32, vb).unwrap();
    let summary = verify(&case).unwrap();
    assert!(summary.worst <= 1e-5, "{summary:?}");

    // One wrong element of o, a NaN in the final state, a zeroed output: all refused.
    let mut wrong = case.clone();
    wrong.compared[0].got[3] += 0.25;
    assert_refused(verify(&wrong), "o");
    let mut nan = case.clone();
    nan.compared[1].got[0] = f32::NAN;
    assert_refused(verify(&nan), "final_state");
    let mut zeros = case.clone();
    zeros.compared[0].got.iter_mut().for_each(|x| *x = 0.0);
    assert_refused(verify(&zeros), "o");

    let vb = gdn_wgpu::wgpu_backend::backward::scan_v_block(&ctx, &p).unwrap();
    let mut case = check_backward(&mut ctx, &p, DType::F32, vb).unwrap();
    verify(&case).unwrap();
    let dv = case.compared.iter_mut().find(|c| c.name == "dv").unwrap();
    dv.got.iter_mut().for_each(|x| *x *= 1.01);
    assert_refused(verify(&case), "dv");

    let step = small(3, 1);
    let tiles = RecurrentStepTiles::choose_for(&ctx, &step).unwrap();
    let mut case = check_decode(&ctx, &step, DType::F32, DType::F32, tiles).unwrap();
    verify(&case).unwrap();
    case.compared[1].got[5] = -case.compared[1].got[5];
    assert_refused(verify(&case), "state");
}

/// The gate as any backend gets it (through `gdn_wgpu::Backend`, without wgpu's forced
/// variants): the oracle itself and the wgpu context pass, a wrong output is refused.
#[test]
fn the_gate_through_the_backend_interface() {
    let mut backends: Vec<&dyn Backend> = vec![&Oracle];
    if let Some(ctx) = common::gpu() {
        backends.push(ctx);
    }
    for backend in backends {
        for case in [
            check_forward_on(backend, &small(1, 131), DType::F32, "trait").unwrap(),
            check_backward_on(backend, &small(1, 131), DType::F32, "trait").unwrap(),
            check_decode_on(backend, &small(3, 1), DType::F32, "trait").unwrap(),
        ] {
            let summary = verify(&case).unwrap();
            assert!(summary.worst <= summary.tolerance, "{summary:?}");
            let mut wrong = case.clone();
            wrong.compared[0].got[0] += 1.0;
            let name = wrong.compared[0].name.clone();
            assert_refused(verify(&wrong), &name);
        }
    }
}

#[test]
fn cpu_backend_times_the_oracle_without_a_gpu() {
    let json = temp_path("cpu.json");
    let out = gdn()
        .args([
            "bench",
            "--backend",
            "cpu",
            "--quick",
            "--ops",
            "forward,decode",
            "--heads",
            "1/2",
            "--seqs",
            "64",
            "--decode-batch",
            "2",
            "--reps",
            "2",
            "--no-progress",
            "--json",
        ])
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    std::fs::remove_file(&json).ok();
    let records = report["records"].as_array().unwrap();
    assert_eq!(records.len(), 2);
    for r in records {
        assert_eq!(r["backend"], "cpu");
        assert!(
            r["gpu_ms"].is_null() && num(&r["wall_ms"], "median") > 0.0,
            "{r}"
        );
        assert_eq!(r["rate_basis"], "wall");
    }
}

#[test]
fn bad_flags_exit_2_with_one_error_line() {
    for args in [
        &["bench", "--ops", "sideways"][..],
        &["bench", "--heads", "16"],
        &["bench", "--seqs", "0x8"],
        &["bench", "--decode-batch", "0"],
        &["bench", "--heads", "3/4"],
        &["bench", "--key-dim", "0"],
        &["bench", "--value-dim", "100"],
        &["bench", "--reps", "0"],
        &["bench", "--warmup-ms", "-1"],
        &["bench", "--warmup-ms", "inf"],
        &["bench", "--max-seconds", "0"],
        &["bench", "--json", "/nonexistent-dir/gdn.json"],
        &["bench", "--plot", "/nonexistent-dir/gdn.svg"],
        &["bench", "--decode-tiles", "64"],
        &["bench", "--cuda-graph", "10"],
    ] {
        let out = gdn().args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.trim().starts_with("error: ") && stderr.trim().lines().count() == 1,
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn a_shape_over_the_device_limits_is_refused_before_its_inputs_exist() {
    if common::gpu().is_none() {
        return;
    }
    // 2·10⁴ q/k heads × 10⁴ tokens × K = 32 in f32 is 25.6 GB per tensor: the preflight refuses
    // it from the limits, before the host would allocate it; nothing is left to time (exit 2).
    let out = gdn()
        .args([
            "bench",
            "--quick",
            "--ops",
            "forward",
            "--heads",
            "20000/20000",
            "--seqs",
            "10000",
            "--no-progress",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("nothing to time") && stderr.contains("exceeds the device's"),
        "{stderr}"
    );
}

#[test]
fn a_compute_path_that_cannot_run_is_refused_not_timed() {
    if common::gpu().is_none() {
        return;
    }
    // Without cooperative matrices the device refuses the flag; with them, the coop scan is
    // written for K = 128 and --quick's K = 32 forward cannot take it: nothing to time.
    let out = gdn()
        .args([
            "bench",
            "--quick",
            "--ops",
            "forward",
            "--heads",
            "1/2",
            "--seqs",
            "64",
            "--compute-path",
            "coop",
            "--no-progress",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("coop"), "{stderr}");
}

#[test]
fn a_dtype_the_kernels_lack_is_not_yet_supported_not_a_number() {
    if common::gpu().is_none() {
        return;
    }
    // Decode kernels take F32 only in this build; when f16 lands this case times instead.
    let out = gdn()
        .args([
            "bench",
            "--quick",
            "--dtype",
            "f16",
            "--ops",
            "decode",
            "--heads",
            "1/2",
            "--decode-batch",
            "1",
            "--no-progress",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(2) => assert!(stderr.contains("not yet supported"), "{stderr}"),
        Some(0) => assert!(
            String::from_utf8_lossy(&out.stdout).contains("F16"),
            "{stderr}"
        ),
        other => panic!("exit {other:?}: {stderr}"),
    }
}

/// `--decode-tiles` times the named tiling (checked by the gate first, named in the record's
/// variant); one the shape cannot take is an error naming the flag, not a number.
#[test]
fn decode_tiles_are_timed_as_named_or_refused() {
    if common::gpu().is_none() {
        return;
    }
    let json = temp_path("tiles.json");
    let run = |tiles: &str| {
        gdn()
            .args(["bench", "--quick", "--ops", "decode", "--heads", "1/2"])
            .args([
                "--decode-batch",
                "1",
                "--no-progress",
                "--decode-tiles",
                tiles,
            ])
            .arg("--json")
            .arg(&json)
            .output()
            .unwrap()
    };
    let out = run("16x2");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let record = &report["records"][0];
    assert_eq!(record["status"], "ok", "{record}");
    let variant = record["variant"].as_str().unwrap();
    assert!(variant.contains("v_block 16 vec4s 2 "), "{variant}");
    assert!(variant.contains("F32 pool"), "{variant}");
    let out = run("17x2");
    assert_ne!(out.status.code(), Some(0));
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    std::fs::remove_file(&json).ok();
    let note = report["records"][0]["note"].as_str().unwrap_or_default();
    assert!(note.contains("--decode-tiles"), "{note}");
}
