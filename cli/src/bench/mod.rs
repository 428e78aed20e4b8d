//! `gdn bench`: sweeps of forward, backward and decode on one backend and storage dtype.
//!
//! Method (BENCHMARKS.md, "Method"): every op is first checked against the f64 oracle on a
//! small shape with the timed shape's heads, K, V, dtype and kernel variant — a wrong kernel
//! is an error, not a number; then per shape: buffers prepared once, warm-up runs (the first
//! compiles the pipelines, which stay cached), repetitions rotating among copies of the inputs
//! when one copy would fit in the GPU's cache, and the median, minimum and maximum of the GPU
//! time (timestamp queries, with a per-pass breakdown) and of the wall clock (encode, submit,
//! wait). Rates (TFLOP/s, GB/s, tokens/s) use the formulas of [`metrics`]; each decode case
//! also times a copy of a buffer its state pool's size, in the same process, as its bandwidth
//! ceiling. Memory is measured by the device's allocator where wgpu has a report, else
//! estimated ([`memory`]). The backend comes from [`crate::backend`]: wgpu is timed as above;
//! any other backend by the wall clock of its host entry points, without a gate.

pub mod cases;
mod ceiling;
pub mod check;
#[cfg(feature = "cuda")]
mod cuda;
mod inputs;
pub mod memory;
pub mod metrics;
mod plot;
pub mod report;
pub mod shapes;

use std::collections::HashMap;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};

pub use check::{CheckCase, CheckSummary, Compared, verify};
pub use memory::MemorySource;
pub use metrics::Op;
pub use report::{Record, Report, Stats, Status};
pub use shapes::{HeadConfig, SeqSet};

use crate::backend::{BackendKind, Engine};
use cases::{GpuCase, HostCase};
use gdn_wgpu::error::Error;
use gdn_wgpu::tensor::DType;
use gdn_wgpu::wgpu_backend::backward::MemoryBudget;
use gdn_wgpu::wgpu_backend::decode::RecurrentStepTiles;
use gdn_wgpu::wgpu_backend::{
    ComputePath, Context, ForwardAlgorithm, GpuTimer, forward_algorithm, timing,
};
use gdn_wgpu::{Options, Problem};
use report::{AdapterRecord, CheckRecord, PassTime, ShapeRecord};

/// Everything `gdn bench` can fail with.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// An error from the library (bad shape, device failure, …).
    #[error(transparent)]
    Gdn(#[from] Error),
    /// The correctness gate: a kernel's output on the check shape is off.
    #[error(
        "{op} check failed before timing, on {shape}: {output} has relative L2 error {error:.3e} against the f64 oracle (tolerance {tolerance:.0e}); the kernel is wrong, so it is not timed"
    )]
    CheckFailed {
        /// The op checked: `forward`, `backward` or `decode`.
        op: &'static str,
        /// The check shape and kernel variant.
        shape: String,
        /// The first output over its tolerance.
        output: String,
        /// Its relative L2 error against the f64 oracle (NaN fails too).
        error: f64,
        /// The tolerance it exceeded.
        tolerance: f64,
    },
    /// Bad flags.
    #[error("{0}")]
    Usage(String),
    /// Nothing of what was asked can run in this build or on this device.
    #[error("{0}")]
    Unsupported(String),
    /// Writing `--json` or `--plot`.
    #[error("{path}: {msg}")]
    Output {
        /// The file being written.
        path: String,
        /// What went wrong.
        msg: String,
    },
    /// A case's host inputs would not fit this machine's memory (not generated).
    #[error("{0}")]
    HostMemory(String),
}

impl BenchError {
    /// Exit code: 2 for bad flags and unsupported requests, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            BenchError::Usage(_) | BenchError::Unsupported(_) => 2,
            BenchError::Gdn(e) if e.is_input_error() => 2,
            _ => 1,
        }
    }

    /// The kernels of this build do not take the dtype or option (the check said so).
    fn is_unsupported(&self) -> bool {
        matches!(
            self,
            BenchError::Gdn(Error::Unsupported { .. } | Error::DType { .. })
        )
    }

    fn is_too_large(&self) -> bool {
        matches!(
            self,
            BenchError::Gdn(Error::TooLarge { .. }) | BenchError::HostMemory(_)
        )
    }
}

/// Storage dtype of q, k, v and o.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BenchDType {
    /// 32-bit floats, 4 bytes per element.
    F32,
    /// IEEE half precision, 2 bytes (arithmetic stays f32).
    F16,
    /// bfloat16, 2 bytes (arithmetic stays f32).
    Bf16,
}

impl BenchDType {
    /// The library's [`DType`] for this flag value.
    pub fn dtype(self) -> DType {
        match self {
            BenchDType::F32 => DType::F32,
            BenchDType::F16 => DType::F16,
            BenchDType::Bf16 => DType::BF16,
        }
    }
}

/// Storage dtype of the decode state pool (`--decode-pool`, `gdn run decode --pool`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PoolDType {
    /// 32-bit floats (the default).
    F32,
    /// bfloat16: half the bytes per step; the state is rounded once per step, to nearest
    /// even, and the arithmetic stays f32.
    Bf16,
}

impl PoolDType {
    /// The library's [`DType`] for this flag value.
    pub fn dtype(self) -> DType {
        match self {
            PoolDType::F32 => DType::F32,
            PoolDType::Bf16 => DType::BF16,
        }
    }
}

/// The forward's compute path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BenchPath {
    /// The context's choice (f32 storage: scalar; f16/bf16: coop where the device has it), or
    /// `GDN_COMPUTE_PATH` when set.
    Auto,
    /// f32 multiply-adds.
    Scalar,
    /// The scalar scan on f16 operands with f32 accumulation (refused without SHADER_F16).
    F16,
    /// f16 cooperative matrices with f32 accumulators (refused where the device lacks them).
    Coop,
}

impl BenchPath {
    /// The path to force, or `None` for `Auto` (the context's choice).
    pub fn path(self) -> Option<ComputePath> {
        match self {
            BenchPath::Auto => None,
            BenchPath::Scalar => Some(ComputePath::Scalar),
            BenchPath::F16 => Some(ComputePath::F16Math),
            BenchPath::Coop => Some(ComputePath::CoopMatrix),
        }
    }
}

/// The forward's algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BenchAlgorithm {
    /// The context's choice (`wgpu_backend::forward_algorithm`), or `GDN_FORWARD_ALGORITHM`
    /// when set.
    Auto,
    /// The chunked scan.
    Chunked,
    /// The recurrent kernel, token by token (refused where it cannot run the shape).
    Recurrent,
}

impl BenchAlgorithm {
    /// The algorithm to force, or `None` for `Auto`.
    pub fn algorithm(self) -> Option<ForwardAlgorithm> {
        match self {
            BenchAlgorithm::Auto => None,
            BenchAlgorithm::Chunked => Some(ForwardAlgorithm::Chunked),
            BenchAlgorithm::Recurrent => Some(ForwardAlgorithm::Recurrent),
        }
    }
}

/// Flags of `gdn bench`.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// A tiny sweep of all three ops (K = V = 32, heads 1/2 and 2/4, ≤ 256 tokens, decode
    /// B = 1, 4; 1 warm-up, 5 repetitions): seconds on a software GPU.
    #[arg(long)]
    pub quick: bool,
    /// Ops to run, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "forward,backward,decode")]
    pub ops: Vec<String>,
    /// Head configs H/HV, comma-separated [default: 16/64,16/32,8/32,4/16,2/8].
    #[arg(long, value_delimiter = ',')]
    pub heads: Vec<String>,
    /// Sequence sets, comma-separated: LEN or 1xLEN (one sequence), LENxCOUNT (a dense batch),
    /// L1+L2+… (packed with cu_seqlens) [default: 1x32768,1x8192,1x2048,4096x8,1024x8,
    /// 28672+4096,16384+16384].
    #[arg(long, value_delimiter = ',')]
    pub seqs: Vec<String>,
    /// Decode batch sizes (sequences per step, one token each) [default: 1,64,256].
    #[arg(long, value_delimiter = ',')]
    pub decode_batch: Vec<usize>,
    /// K [default: 128; --quick: 32].
    #[arg(long)]
    pub key_dim: Option<usize>,
    /// V [default: 128; --quick: 32].
    #[arg(long)]
    pub value_dim: Option<usize>,
    /// Where the kernels run: GPU timestamps and the correctness gate on wgpu; the host
    /// entry points by wall clock elsewhere (cpu: the f64 oracle, slow: small shapes).
    #[arg(long, value_enum, default_value_t = BackendKind::Wgpu)]
    pub backend: BackendKind,
    /// Storage dtype of q, k, v, o.
    #[arg(long, value_enum, default_value_t = BenchDType::F32)]
    pub dtype: BenchDType,
    /// Use the first adapter whose name contains this (case-insensitive; like GDN_ADAPTER).
    #[arg(long)]
    pub adapter: Option<String>,
    /// The forward's compute path (the record's `variant` names the one timed).
    #[arg(long, value_enum, default_value_t = BenchPath::Auto)]
    pub compute_path: BenchPath,
    /// The forward's algorithm (the record's `algorithm` names the one timed).
    #[arg(long, value_enum, default_value_t = BenchAlgorithm::Auto)]
    pub forward_algorithm: BenchAlgorithm,
    /// Untimed runs per case before timing, at least 1 (it compiles the pipelines) [default:
    /// 3; --quick: 1].
    #[arg(long)]
    pub warmup: Option<usize>,
    /// Keep warming up until the untimed runs after the first (which compiles the pipelines)
    /// have taken this many ms: an idle GPU's clock falls (an H200's SM clock to 345 MHz in the
    /// seconds an oracle check takes) and needs ~100–200 ms of work to ramp back [default: 200;
    /// --quick: 0].
    #[arg(long)]
    pub warmup_ms: Option<f64>,
    /// Timed repetitions per case [default: 20; --quick: 5].
    #[arg(long)]
    pub reps: Option<usize>,
    /// Fewer repetitions (at least 3) when they would take longer than this per case.
    #[arg(long, default_value_t = 10.0)]
    pub max_seconds: f64,
    /// Rotate among copies of a case's inputs until they exceed this many MiB (above the
    /// last-level cache: 50 MiB on an H200); 0 times one copy.
    #[arg(long, default_value_t = 128.0)]
    pub rotate_mib: f64,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Write the records as JSON.
    #[arg(long, value_name = "PATH")]
    pub json: Option<String>,
    /// Draw latency against tokens per head config (SVG).
    #[arg(long, value_name = "PATH.svg")]
    pub plot: Option<String>,
    /// No progress bar (plain progress lines go to stderr when it is not a terminal anyway).
    #[arg(long)]
    pub no_progress: bool,
    /// Open a new device for every case, so no case runs in memory earlier cases left behind.
    /// On the H200, decode cases timed after a large earlier case in the same process ran ~3×
    /// slower than alone (BENCHMARKS.md); whether a fresh device avoids it is not yet measured.
    #[arg(long)]
    pub fresh_device: bool,
    /// Time only the whole op (its first and last timestamp), no timestamp between its passes.
    /// A timestamp between two passes waits for the first to finish, so passes that could run
    /// at once on the GPU (no dependency between them) are timed one after the other; this
    /// shows what they cost together. The record then has no per-pass times.
    #[arg(long)]
    pub whole_op_timing: bool,
    /// Time decode with this tiling instead of the default: `VxN` for the workgroup kernel
    /// (value columns per workgroup × vec4 registers of state per invocation, e.g. `64x16`),
    /// `sgV` for the subgroup kernel (V columns per workgroup, e.g. `sg32`), for tiling sweeps
    /// — run each tiling in its own process and alternate them (a sweep inside one process
    /// once picked a default that made decode 33 % slower).
    #[arg(long, value_name = "VxN|sgV")]
    pub decode_tiles: Option<String>,
    /// Storage dtype of the decode state pool: f32, or bf16 (half the traffic; the state is
    /// rounded once per step, arithmetic stays f32; wgpu only).
    #[arg(long, value_enum, default_value_t = PoolDType::F32)]
    pub decode_pool: PoolDType,
    /// The backward's memory budget (as `GDN_BACKWARD_BUDGET`, which it overrides): bytes with
    /// an optional KiB/MiB/GiB suffix, `Nx` (N times the backward's inputs) or
    /// `unbounded` [default: 2x] (docs/backward.md, "Memory").
    #[arg(long, value_name = "BYTES|Nx|unbounded")]
    pub backward_budget: Option<String>,
    /// Sequence parallelism's gate-driven window (as `GDN_SEGMENT_WINDOW`, which it
    /// overrides): `exact` (the exact transitions), `on` (threshold -10) or a log-decay
    /// threshold below 0 such as `-15`; the record's `variant` names it and
    /// `segment_paths` counts the (segment, v-head) pairs on each path
    /// (docs/sequence-parallelism.md) [default: GDN_SEGMENT_WINDOW, else exact].
    #[arg(long, value_name = "exact|on|THRESHOLD", allow_hyphen_values = true)]
    pub segment_window: Option<String>,
    /// The window's longest warm-up in chunks, or `segment` (as `GDN_SEGMENT_WARMUP`)
    /// [default: segment].
    #[arg(long, value_name = "CHUNKS|segment")]
    pub segment_warmup: Option<String>,
    /// `--backend cuda`: time replays of a CUDA graph holding this many calls (per-call time =
    /// replay time / N, as FLA's `do_bench_cudagraph` measures) instead of eager launches; 0
    /// times eager launches.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub cuda_graph: usize,
}

/// A resolved sweep.
#[derive(Debug, Clone)]
pub struct Config {
    /// The ops to run (`--ops`).
    pub ops: Vec<Op>,
    /// Where the kernels run (`--backend`).
    pub backend: BackendKind,
    /// Storage dtype of q, k, v, o (`--dtype`).
    pub dtype: DType,
    /// Use the first adapter whose name contains this, case-insensitive (`--adapter`).
    pub adapter: Option<String>,
    /// A forced forward compute path (`None`: the context's choice).
    pub compute_path: Option<ComputePath>,
    /// A forced forward algorithm (`None`: the context's choice).
    pub forward_algorithm: Option<ForwardAlgorithm>,
    /// Head configurations to sweep (`--heads`).
    pub heads: Vec<HeadConfig>,
    /// Sequence sets of the forward and backward cases (`--seqs`).
    pub seqs: Vec<SeqSet>,
    /// Decode batch sizes: sequences per step, one token each (`--decode-batch`).
    pub decode_batches: Vec<usize>,
    /// K, the key head dimension.
    pub key_dim: usize,
    /// V, the value head dimension.
    pub value_dim: usize,
    /// Untimed runs per case before timing (at least 1: it compiles the pipelines).
    pub warmup: usize,
    /// More untimed runs until they have taken this many ms of wall clock (`--warmup-ms`).
    pub warmup_ms: f64,
    /// Timed repetitions per case (fewer past `max_seconds`).
    pub reps: usize,
    /// Per-case time budget in seconds: fewer repetitions (at least 3) beyond it.
    pub max_seconds: f64,
    /// Bytes of input copies to rotate through (`--rotate-mib` × 2²⁰; 0: one copy).
    pub rotate_bytes: f64,
    /// At most this many input copies.
    pub max_sets: usize,
    /// Seed of the random inputs.
    pub seed: u64,
    /// Draw a progress bar on a terminal (off with `--no-progress`).
    pub progress: bool,
    /// A new device (Context) per case.
    pub fresh_device: bool,
    /// No timestamps between an op's passes (`--whole-op-timing`).
    pub whole_op_timing: bool,
    /// A forced decode tiling's name (`--decode-tiles`: `VxN` or `sgV`).
    pub decode_tiles: Option<String>,
    /// Storage dtype of the decode state pool (`--decode-pool`).
    pub decode_pool: DType,
    /// Calls per captured CUDA graph; 0: eager launches (`--cuda-graph`).
    pub cuda_graph: usize,
    /// The backward's memory budget (`--backward-budget`; `None`: the context's).
    pub backward_budget: Option<MemoryBudget>,
    /// Sequence parallelism's gate-driven window (`--segment-window`, `--segment-warmup`):
    /// `None` keeps the context's (`GDN_SEGMENT_WINDOW`).
    pub segment_window: Option<Option<gdn_wgpu::wgpu_backend::SegmentWindow>>,
}

impl BenchArgs {
    /// Resolve defaults and parse the shape lists.
    pub fn config(&self) -> Result<Config, BenchError> {
        let usage = BenchError::Usage;
        let mut ops = Vec::new();
        for s in &self.ops {
            let op = Op::parse(s).map_err(usage)?;
            if !ops.contains(&op) {
                ops.push(op);
            }
        }
        let heads = if self.heads.is_empty() {
            if self.quick {
                shapes::quick_heads()
            } else {
                shapes::default_heads()
            }
        } else {
            self.heads
                .iter()
                .map(|s| HeadConfig::parse(s))
                .collect::<Result<_, _>>()
                .map_err(usage)?
        };
        let seqs = if self.seqs.is_empty() {
            if self.quick {
                shapes::quick_seqs()
            } else {
                shapes::default_seqs()
            }
        } else {
            self.seqs
                .iter()
                .map(|s| SeqSet::parse(s))
                .collect::<Result<_, _>>()
                .map_err(usage)?
        };
        let decode_batches = match (self.decode_batch.is_empty(), self.quick) {
            (false, _) => self.decode_batch.clone(),
            (true, true) => shapes::QUICK_DECODE_BATCHES.to_vec(),
            (true, false) => shapes::DEFAULT_DECODE_BATCHES.to_vec(),
        };
        if decode_batches.contains(&0) {
            return Err(usage(
                "--decode-batch: batch sizes must be at least 1".into(),
            ));
        }
        let dim = if self.quick {
            shapes::QUICK_HEAD_DIM
        } else {
            128
        };
        let (key_dim, value_dim) = (self.key_dim.unwrap_or(dim), self.value_dim.unwrap_or(dim));
        for h in &heads {
            Problem::new(
                1,
                1,
                h.heads_qk,
                h.heads_v,
                key_dim,
                value_dim,
                None,
                Options::default(),
            )
            .map_err(|e| {
                usage(format!(
                    "--heads {h} with K = {key_dim}, V = {value_dim}: {e}"
                ))
            })?;
        }
        #[cfg(feature = "cuda")]
        let cuda = matches!(self.backend, BackendKind::Cuda);
        #[cfg(not(feature = "cuda"))]
        let cuda = false;
        if self.cuda_graph > 0 && !cuda {
            return Err(usage("--cuda-graph needs --backend cuda".into()));
        }
        let backward_budget = self
            .backward_budget
            .as_deref()
            .map(|b| MemoryBudget::parse("--backward-budget", b))
            .transpose()
            .map_err(|e| usage(e.to_string()))?;
        if self.segment_warmup.is_some() && self.segment_window.is_none() {
            return Err(usage("--segment-warmup needs --segment-window".into()));
        }
        let segment_window = match &self.segment_window {
            Some(w) => Some(
                gdn_wgpu::wgpu_backend::SegmentWindow::parse(
                    ("--segment-window", Some(w)),
                    ("--segment-warmup", self.segment_warmup.as_deref()),
                )
                .map_err(|e| usage(e.to_string()))?,
            ),
            None => None,
        };
        if self.warmup_ms.is_some_and(|ms| !ms.is_finite() || ms < 0.0) {
            return Err(usage("--warmup-ms must be a finite number ≥ 0".into()));
        }
        if self.reps == Some(0) {
            return Err(usage("--reps must be at least 1".into()));
        }
        if self.max_seconds.is_nan()
            || self.max_seconds <= 0.0
            || self.rotate_mib.is_nan()
            || self.rotate_mib < 0.0
        {
            return Err(usage(
                "--max-seconds must be positive and --rotate-mib non-negative".into(),
            ));
        }
        Ok(Config {
            ops,
            backend: self.backend,
            dtype: self.dtype.dtype(),
            adapter: self.adapter.clone(),
            compute_path: self.compute_path.path(),
            forward_algorithm: self.forward_algorithm.algorithm(),
            heads,
            seqs,
            decode_batches,
            key_dim,
            value_dim,
            warmup: self.warmup.unwrap_or(if self.quick { 1 } else { 3 }),
            warmup_ms: self
                .warmup_ms
                .unwrap_or(if self.quick { 0.0 } else { 200.0 }),
            reps: self.reps.unwrap_or(if self.quick { 5 } else { 20 }),
            max_seconds: if self.quick {
                self.max_seconds.min(2.0)
            } else {
                self.max_seconds
            },
            rotate_bytes: self.rotate_mib * 1024.0 * 1024.0,
            max_sets: 64,
            seed: self.seed,
            progress: !self.no_progress,
            fresh_device: self.fresh_device,
            whole_op_timing: self.whole_op_timing,
            decode_tiles: self
                .decode_tiles
                .as_deref()
                .map(check_decode_tiles_name)
                .transpose()
                .map_err(usage)?,
            decode_pool: self.decode_pool.dtype(),
            cuda_graph: self.cuda_graph,
            backward_budget,
            segment_window,
        })
    }
}

/// `gdn bench`: run, print the table, write `--json` / `--plot`. Errors are one
/// `error: …` line on stderr; exit code 2 for bad flags or requests this build cannot run,
/// 1 for device errors and failed correctness checks (the other cases are still reported).
pub fn main(args: &BenchArgs) -> ExitCode {
    match main_inner(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", one_line(&e.to_string()));
            ExitCode::from(e.exit_code())
        }
    }
}

/// Fail before a long sweep, not after it, when an output file cannot be written (a file
/// created by the probe is removed again).
fn check_writable(flag: &str, path: &str) -> Result<(), BenchError> {
    let existed = std::path::Path::new(path).exists();
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| BenchError::Usage(format!("{flag} {path}: {e}")))?;
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

fn one_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

fn main_inner(args: &BenchArgs) -> Result<ExitCode, BenchError> {
    let config = args.config()?;
    let command = std::env::args()
        .map(|a| if a.contains(' ') { format!("'{a}'") } else { a })
        .collect::<Vec<_>>()
        .join(" ");
    for (flag, path) in [("--json", &args.json), ("--plot", &args.plot)] {
        if let Some(path) = path {
            check_writable(flag, path)?;
        }
    }
    let report = run(&config, &command)?;
    println!("{}", report::table(&report));
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report).map_err(|e| BenchError::Output {
            path: path.clone(),
            msg: e.to_string(),
        })?;
        std::fs::write(path, text + "\n").map_err(|e| BenchError::Output {
            path: path.clone(),
            msg: e.to_string(),
        })?;
        eprintln!("wrote {path}");
    }
    if let Some(path) = &args.plot {
        plot::write_svg(&report, path).map_err(|msg| BenchError::Output {
            path: path.clone(),
            msg,
        })?;
        eprintln!("wrote {path}");
    }
    let count = |s: Status| report.records.iter().filter(|r| r.status == s).count();
    let (failed, errors, ok) = (
        count(Status::CheckFailed),
        count(Status::Error),
        count(Status::Ok),
    );
    if failed + errors > 0 {
        eprintln!(
            "error: {failed} case(s) failed the correctness check and {errors} hit errors (see the table); their numbers are not reported"
        );
        return Ok(ExitCode::from(1));
    }
    if ok == 0 && count(Status::Unsupported) + count(Status::Skipped) > 0 {
        let notes: Vec<String> = report
            .records
            .iter()
            .filter_map(|r| r.note.clone())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        return Err(BenchError::Unsupported(format!(
            "nothing to time: {}",
            notes.join("; ")
        )));
    }
    Ok(ExitCode::SUCCESS)
}

/// The commit the binary was built from (`GDN_GIT_COMMIT`, set by build.rs, `+dirty` for
/// uncommitted changes), else `git rev-parse --short HEAD` where it runs. The build-time value
/// comes first: binaries are copied to benchmark machines, whose directory may hold any
/// checkout (on the H200 this once named a commit hours older than the binary).
fn commit() -> Option<String> {
    if let Some(c) = option_env!("GDN_GIT_COMMIT") {
        return Some(c.to_string());
    }
    let git = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .stderr(std::process::Stdio::null())
        .output();
    match git {
        Ok(out) if out.status.success() => {
            Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
        }
        _ => None,
    }
}

/// The backend of `c.backend` (on `c.adapter`), on `c.compute_path` and
/// `c.forward_algorithm` when forced (wgpu).
fn open_engine(c: &Config) -> Result<Engine, BenchError> {
    let mut engine = Engine::open(c.backend, c.adapter.as_deref())?;
    if let (Some(budget), Some(ctx)) = (c.backward_budget, engine.wgpu_mut()) {
        ctx.set_backward_budget(Some(budget));
    }
    if let (Some(window), Some(ctx)) = (c.segment_window, engine.wgpu_mut()) {
        ctx.set_segment_window(window);
    }
    if let (Some(algorithm), Some(ctx)) = (c.forward_algorithm, engine.wgpu_mut()) {
        ctx.set_forward_algorithm(Some(algorithm));
    }
    if let (Some(path), Some(ctx)) = (c.compute_path, engine.wgpu_mut()) {
        let support = ctx.path_support();
        if path == ComputePath::CoopMatrix && !support.coop_f16 {
            return Err(BenchError::Unsupported(format!(
                "--compute-path coop: this device has no coop path ({})",
                support.coop_missing
            )));
        }
        if path == ComputePath::F16Math && !support.f16_math {
            return Err(BenchError::Unsupported(format!(
                "--compute-path f16: this device has no f16-math path ({})",
                support.f16_missing
            )));
        }
        ctx.set_compute_path(Some(path))?;
    }
    Ok(engine)
}

/// Refuse a case before its host inputs are generated when they could not be used: a tensor
/// over the device's largest buffer (the same error the upload would give, after allocating
/// gigabytes on the host), or host inputs larger than half this machine's available memory.
fn preflight(ctx: Option<&Context>, op: Op, p: &Problem, dtype: DType) -> Result<(), BenchError> {
    let (bt, n) = (p.total_tokens() as u128, p.num_sequences() as u128);
    let (h, hv, k, v) = (
        p.heads_qk as u128,
        p.heads_v as u128,
        p.key_dim as u128,
        p.value_dim as u128,
    );
    let elems = [
        ("q", bt * h * k),
        ("v", bt * hv * v),
        ("g", bt * hv),
        ("initial_state", n * hv * k * v),
    ];
    if let Some(ctx) = ctx {
        let limits = ctx.limits();
        for (name, count) in elems {
            let size = if name == "q" || name == "v" {
                dtype.size() as u128
            } else {
                4
            };
            let bytes = u64::try_from(count * size).unwrap_or(u64::MAX);
            // Larger than a binding is fine (the library binds windows of it), larger than
            // a buffer is not.
            if bytes > limits.max_buffer_size {
                return Err(Error::TooLarge {
                    name: name.into(),
                    bytes,
                    limit_name: "max_buffer_size",
                    limit: limits.max_buffer_size,
                }
                .into());
            }
        }
    }
    // Host inputs are f32 whatever the storage dtype: q, k, v, g, β, h0 (+ do, dht).
    let [(_, qk), (_, vv), (_, gates), (_, state)] = elems;
    let mut host = 2 * qk + vv + 2 * gates + state;
    if op == Op::Backward {
        host += vv + state;
    }
    let host_bytes = 4 * host;
    if let Some(available) = available_memory()
        && host_bytes > available as u128 / 2
    {
        return Err(BenchError::HostMemory(format!(
            "its host inputs need {} (f32), more than half of the {} this machine has available",
            report::fmt_bytes(host_bytes as f64),
            report::fmt_bytes(available as f64)
        )));
    }
    Ok(())
}

/// `MemAvailable` from /proc/meminfo (Linux), in bytes.
fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// One case of the sweep, before it runs.
struct Planned {
    op: Op,
    heads: HeadConfig,
    /// Forward/backward: the sequence set; decode: None (see `batch`).
    seqs: Option<SeqSet>,
    batch: usize,
}

impl Planned {
    fn problem(&self, c: &Config) -> gdn_wgpu::Result<Problem> {
        match &self.seqs {
            Some(s) => s.problem(self.heads, c.key_dim, c.value_dim),
            None => Problem::new(
                self.batch,
                1,
                self.heads.heads_qk,
                self.heads.heads_v,
                c.key_dim,
                c.value_dim,
                None,
                Options::default(),
            ),
        }
    }

    /// The sequences of this case's check shape: each sequence cut to `CHECK_TOKENS`, which
    /// keeps the structure (one sequence, a dense batch, packed with cu_seqlens); decode: up
    /// to `CHECK_DECODE_BATCH` sequences of one token.
    fn check_seqs(&self) -> SeqSet {
        match &self.seqs {
            Some(s) => s.truncated(check::CHECK_TOKENS),
            None => SeqSet::Uniform {
                len: 1,
                count: self.batch.min(check::CHECK_DECODE_BATCH),
            },
        }
    }

    fn seqs_label(&self) -> String {
        match &self.seqs {
            Some(s) => s.to_string(),
            None => format!("B={}", self.batch),
        }
    }

    fn label(&self) -> String {
        format!("{} {}", self.heads, self.seqs_label())
    }
}

fn plan(c: &Config) -> Vec<Planned> {
    let mut out = Vec::new();
    for &heads in &c.heads {
        for seqs in &c.seqs {
            for op in [Op::Forward, Op::Backward]
                .into_iter()
                .filter(|op| c.ops.contains(op))
            {
                out.push(Planned {
                    op,
                    heads,
                    seqs: Some(seqs.clone()),
                    batch: 1,
                });
            }
        }
    }
    if c.ops.contains(&Op::Decode) {
        for &heads in &c.heads {
            for &batch in &c.decode_batches {
                out.push(Planned {
                    op: Op::Decode,
                    heads,
                    seqs: None,
                    batch,
                });
            }
        }
    }
    out
}

/// Measured times of one case.
#[derive(Default)]
struct Timing {
    gpu: Vec<f64>,
    wall: Vec<f64>,
    host: Vec<f64>,
    passes: Vec<(String, Vec<f64>)>,
    warmup: usize,
    reps: usize,
}

/// Runs `warm` until it has run `runs` times (at least once) and the runs after the first
/// (which compiles the pipelines: a GPU idle meanwhile) have taken `ms` of wall clock; returns
/// how many runs that took and the last run's wall ms.
fn warm_up<E>(
    runs: usize,
    ms: f64,
    mut warm: impl FnMut() -> Result<f64, E>,
) -> Result<(usize, f64), E> {
    let mut last = warm()?;
    let mut n = 1;
    let start = Instant::now();
    while n < runs || start.elapsed().as_secs_f64() * 1e3 < ms {
        last = warm()?;
        n += 1;
    }
    Ok((n, last))
}

/// Timestamps per repetition: a start mark, one per pass, and the closing mark ("tail", or
/// the last pass's name: `GpuCase::closing_label`).
const TIMER_MARKS: u32 = 64;

/// Warm up, then time `reps` repetitions (fewer when they would exceed `max_seconds`).
fn time_gpu(
    ctx: &Context,
    case: &dyn GpuCase,
    c: &Config,
    mut ceiling: Option<&mut timing::CopyCeiling>,
) -> gdn_wgpu::Result<Timing> {
    let timer = GpuTimer::new(ctx, TIMER_MARKS);
    let mut t = Timing::default();
    let mut i = 0usize;
    let mut reps = c.reps;
    let run = |i: usize, record: bool, t: &mut Timing| -> gdn_wgpu::Result<f64> {
        let set = i % case.sets();
        let start = Instant::now();
        let mut encoder = ctx.create_encoder("gdn bench");
        if let Some(timer) = &timer {
            timer.reset();
            timer.mark(&mut encoder, "start");
        }
        let pass_timer = if c.whole_op_timing {
            None
        } else {
            timer.as_ref()
        };
        case.record(&mut encoder, set, pass_timer)?;
        if let Some(timer) = &timer {
            timer.mark(&mut encoder, case.closing_label());
            timer.resolve(&mut encoder);
        }
        let index = ctx.queue.submit([encoder.finish()]);
        let submitted = Instant::now();
        ctx.device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(index),
                timeout: None,
            })
            .map_err(|e| Error::Gpu(e.to_string()))?;
        ctx.check()?;
        let done = Instant::now();
        let wall = (done - start).as_secs_f64() * 1e3;
        if record {
            t.wall.push(wall);
            t.host.push((submitted - start).as_secs_f64() * 1e3);
            if let Some(timer) = &timer {
                let spans = timer.read_spans(ctx)?;
                // The timer drops marks past its capacity: a GPU time without the closing
                // mark would silently miss the last passes.
                if spans.last().map(|(l, _)| *l) != Some(case.closing_label()) {
                    return Err(Error::Gpu(format!(
                        "the op wrote more than the bench timer's {TIMER_MARKS} timestamps; its GPU time would miss passes (raise TIMER_MARKS)"
                    )));
                }
                t.gpu.push(spans.iter().map(|(_, ms)| ms).sum());
                if t.passes.is_empty() {
                    t.passes = spans
                        .iter()
                        .map(|(l, _)| (l.to_string(), Vec::new()))
                        .collect();
                }
                for (slot, (_, ms)) in t.passes.iter_mut().zip(&spans) {
                    slot.1.push(*ms);
                }
            }
        }
        Ok(wall)
    };
    // The copy ceiling (decode) times one copy of each shape after every repetition, so that
    // both see the same clocks and submission pattern.
    let mut copy = |keep: bool| match ceiling.as_deref_mut() {
        Some(ceiling) => ceiling.time_once(ctx, keep),
        None => Ok(()),
    };
    let (warmed, last_wall) = warm_up(c.warmup, c.warmup_ms, || {
        let wall = run(i, false, &mut t)?;
        copy(false)?;
        i += 1;
        Ok(wall)
    })?;
    t.warmup = warmed;
    if last_wall > 0.0 {
        let fit = (c.max_seconds * 1e3 / last_wall).floor() as usize;
        reps = reps.min(fit.max(3));
    }
    for _ in 0..reps {
        run(i, true, &mut t)?;
        copy(true)?;
        i += 1;
    }
    t.reps = reps;
    Ok(t)
}

/// Wall-clock timing of the host entry points (upload, run, wait, download) of a backend
/// without GPU timing here.
fn time_host(
    backend: &dyn gdn_wgpu::Backend,
    c: &Config,
    op: Op,
    host: &HostCase,
) -> gdn_wgpu::Result<Timing> {
    let mut t = Timing::default();
    let start = Instant::now();
    cases::run_host(backend, op, host, c.seed)?;
    let first = start.elapsed().as_secs_f64() * 1e3;
    t.warmup = 1;
    let reps = c
        .reps
        .min(((c.max_seconds * 1e3 / first.max(1e-3)).floor() as usize).max(1));
    for _ in 0..reps {
        let start = Instant::now();
        cases::run_host(backend, op, host, c.seed)?;
        t.wall.push(start.elapsed().as_secs_f64() * 1e3);
    }
    t.reps = reps;
    Ok(t)
}

/// The kernel variant the timed shape uses (the check runs the same one).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Variant {
    VBlock(u32),
    Tiles(String),
    /// The chunked forward's compute path and its scan's V-block.
    Forward(ComputePath, u32),
    /// The forward through the recurrent kernel at this tiling.
    RecurrentForward(String),
    /// Whatever a backend without wgpu's variants runs for the shape.
    Host,
}

/// The form of a `--decode-tiles` name (`VxN`, `VxNsS`, `VxNtS` or `sgV` / `sgVw`), checked before any work;
/// whether the shape and device have that tiling is the case's question.
fn check_decode_tiles_name(s: &str) -> Result<String, String> {
    let s = s.trim();
    let number = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    let ok = match s.strip_prefix("sg") {
        Some(rest) => number(rest.strip_suffix('w').unwrap_or(rest)),
        None => s.split_once('x').is_some_and(|(v, n)| {
            let (n, seqs) = n.split_once(['s', 't']).unwrap_or((n, "1"));
            number(v) && number(n) && number(seqs)
        }),
    };
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!(
            "--decode-tiles: expected VxN, VxNsS or VxNtS (e.g. 64x32, 64x16s4, 64x32t4) or sgV / sgVw (e.g. sg32), got {s:?}"
        ))
    }
}

fn variant(
    ctx: &Context,
    op: Op,
    p: &Problem,
    dtype: DType,
    decode_tiles: Option<&str>,
    decode_pool: DType,
) -> gdn_wgpu::Result<(Variant, String, Option<RecurrentStepTiles>)> {
    Ok(match op {
        Op::Forward
            if forward_algorithm(ctx, p, dtype)?.algorithm == ForwardAlgorithm::Recurrent =>
        {
            let tiles = gdn_wgpu::wgpu_backend::forward::recurrent_tiles(ctx, p, dtype)?;
            let name = format!("recurrent kernel, {}", inputs::tiles_name(&tiles));
            (Variant::RecurrentForward(name.clone()), name, None)
        }
        Op::Forward => {
            // The compute path depends on K, V, the dtype and the context (never on T), so the
            // check shape takes the same one.
            let path = ctx.forward_path(p, dtype)?.path;
            let vb = check::forward_v_block(ctx, p, path);
            let mut name = format!("chunked, {}", check::forward_variant_name(path, vb));
            // Sequence parallelism as the workspace will choose it (GDN_SEGMENT_CHUNKS or
            // automatic; checked and timed).
            if let Some(n) = gdn_wgpu::wgpu_backend::forward::segment_chunks_for(ctx, p, path) {
                name.push_str(&format!(", sequence-parallel segments of {n} chunks"));
                // GDN_SEGMENT_WINDOW or --segment-window (exact transitions, unnamed, else).
                if let Some(w) = ctx.config().segment_window {
                    name.push_str(&format!(", {w}"));
                }
            }
            (Variant::Forward(path, vb), name, None)
        }
        Op::Backward => {
            let vb = gdn_wgpu::wgpu_backend::backward::scan_v_block(ctx, p)?;
            let path = gdn_wgpu::wgpu_backend::backward::backward_path(ctx, p, dtype)?.path;
            (
                Variant::VBlock(vb),
                format!("backward {path}, scans V-block {vb}"),
                None,
            )
        }
        Op::Decode => {
            let tiles = match decode_tiles {
                None => RecurrentStepTiles::choose_for(ctx, p)?,
                Some(name) => RecurrentStepTiles::named(ctx, p, name, "--decode-tiles")?,
            };
            let name = format!("{}, {decode_pool} pool", inputs::tiles_name(&tiles));
            (Variant::Tiles(name.clone()), name, Some(tiles))
        }
    })
}

/// Run the gate for `op` on the small version of `planned` at `variant`.
fn run_check(
    ctx: &mut Context,
    c: &Config,
    planned: &Planned,
    big: &Problem,
    tiles: Option<RecurrentStepTiles>,
    v: &Variant,
) -> Result<CheckSummary, BenchError> {
    let case = match (planned.op, v) {
        (Op::Forward, Variant::RecurrentForward(name)) => {
            let p = planned
                .check_seqs()
                .problem(planned.heads, c.key_dim, c.value_dim)?;
            check::check_forward_recurrent(ctx, &p, c.dtype, name)?
        }
        (Op::Forward, Variant::Forward(_, vb)) | (Op::Backward, Variant::VBlock(vb)) => {
            let p = planned
                .check_seqs()
                .problem(planned.heads, c.key_dim, c.value_dim)?;
            if planned.op == Op::Forward {
                check::check_forward(ctx, &p, c.dtype, *vb)?
            } else {
                check::check_backward(ctx, &p, c.dtype, *vb)?
            }
        }
        _ => {
            let p = planned
                .check_seqs()
                .problem(planned.heads, big.key_dim, big.value_dim)?;
            let tiles = tiles.expect("decode has tiles");
            check::check_decode(ctx, &p, c.dtype, c.decode_pool, tiles)?
        }
    };
    verify(&case)
}

/// The gate for `op` on the small version of `planned`, through the [`gdn_wgpu::Backend`]
/// interface alone (a backend without wgpu's forced variants).
fn run_host_check(
    backend: &dyn gdn_wgpu::Backend,
    c: &Config,
    planned: &Planned,
) -> Result<CheckSummary, BenchError> {
    let p = planned
        .check_seqs()
        .problem(planned.heads, c.key_dim, c.value_dim)?;
    let variant = backend.name();
    let case = match planned.op {
        Op::Forward => check::check_forward_on(backend, &p, c.dtype, variant)?,
        Op::Backward => check::check_backward_on(backend, &p, c.dtype, variant)?,
        Op::Decode => check::check_decode_on(backend, &p, c.dtype, variant)?,
    };
    verify(&case)
}

/// A check's result, shared by every case with the same op, heads and kernel variant.
type CheckOutcome = Result<CheckSummary, (Status, String)>;

/// The gate's verdict for `key`, run once per key: an unsupported op is noted once and its
/// later cases skipped.
fn gate(
    checks: &mut HashMap<CheckKey, CheckOutcome>,
    unsupported: &mut HashMap<Op, String>,
    bar: &ProgressBar,
    key: CheckKey,
    run: impl FnOnce() -> CheckOutcome,
) -> Result<CheckRecord, (Status, String)> {
    let op = key.0;
    let summary = checks
        .entry(key)
        .or_insert_with(|| {
            let mut result = run();
            if let Err((Status::Unsupported, why)) = &mut result {
                *why = format!("{}: {why}", op.name());
                bar.suspend(|| eprintln!("note: {why}; its cases are skipped"));
                unsupported.insert(op, why.clone());
            }
            result
        })
        .clone()?;
    Ok(CheckRecord {
        shape: summary.shape,
        max_rel_l2: summary.worst,
        tolerance: summary.tolerance,
    })
}

/// Cases sharing op, heads, kernel variant and check shape share one check.
type CheckKey = (Op, HeadConfig, Variant, SeqSet);

/// Run a sweep. Per-case failures become records (status and note); only failing to open a
/// device is an error.
pub fn run(c: &Config, command: &str) -> Result<Report, BenchError> {
    let mut engine = open_engine(c)?;
    let adapter = engine.wgpu().and_then(|ctx| {
        ctx.adapter_info.as_ref().map(|i| AdapterRecord {
            name: i.name.clone(),
            backend: format!("{:?}", i.backend),
            device_type: format!("{:?}", i.device_type),
            driver: i.driver.clone(),
            driver_info: i.driver_info.clone(),
            timestamp_queries: GpuTimer::new(ctx, 2).is_some(),
        })
    });
    let adapter_name = match &adapter {
        Some(a) => format!("{} ({})", a.name, a.backend),
        None => engine.backend().describe(),
    };
    let backend_name = engine.backend().name();
    if let Some(a) = &adapter {
        eprintln!(
            "gdn bench: {} ({}, {}), {} storage, timestamps {}",
            a.name,
            a.backend,
            a.device_type,
            c.dtype,
            if a.timestamp_queries {
                "yes"
            } else {
                "no (wall clock only)"
            }
        );
    }

    let planned = plan(c);
    let bar = if c.progress && std::io::stderr().is_terminal() {
        let bar = ProgressBar::new(planned.len() as u64);
        bar.set_style(
            ProgressStyle::with_template("{bar:30} {pos}/{len} [{elapsed} < {eta}] {msg}")
                .expect("static template"),
        );
        bar
    } else {
        ProgressBar::hidden()
    };
    let mut checks: HashMap<CheckKey, CheckOutcome> = HashMap::new();
    let mut unsupported: HashMap<Op, String> = HashMap::new();
    let mut host: Option<(HeadConfig, Option<SeqSet>, usize, HostCase)> = None;
    let mut records = Vec::new();

    for (index, pc) in planned.iter().enumerate() {
        let label = pc.label();
        bar.set_message(format!("{} {label}", pc.op.name()));
        let problem = pc.problem(c);
        let mut record = Record {
            op: pc.op.name().into(),
            backend: backend_name.into(),
            dtype: c.dtype.name().into(),
            adapter: adapter_name.clone(),
            shape: ShapeRecord {
                label: label.clone(),
                seqs: pc.seqs_label(),
                heads_qk: pc.heads.heads_qk,
                heads_v: pc.heads.heads_v,
                key_dim: c.key_dim,
                value_dim: c.value_dim,
                batch: problem.as_ref().map_or(0, |p| p.batch),
                sequences: problem.as_ref().map_or(0, |p| p.num_sequences()),
                total_tokens: problem.as_ref().map_or(0, |p| p.total_tokens()),
            },
            status: Status::Ok,
            note: None,
            variant: None,
            algorithm: None,
            algorithm_reason: None,
            warmup: c.warmup.max(1),
            reps: 0,
            input_sets: 1,
            gpu_ms: None,
            gpu_ms_reps: Vec::new(),
            wall_ms: None,
            host_ms: None,
            passes: Vec::new(),
            flops: 0.0,
            bytes: 0.0,
            tflops: None,
            gbps: None,
            rate_basis: None,
            tokens_per_s: None,
            copy_ceiling_gbps: None,
            peak_memory_bytes: None,
            memory_source: None,
            backward_memory: None,
            segment_paths: None,
            check: None,
        };
        let outcome = (|| -> Result<(), (Status, String)> {
            let err = |e: BenchError| {
                let status = if e.is_unsupported() {
                    Status::Unsupported
                } else if e.is_too_large() {
                    Status::Skipped
                } else if matches!(e, BenchError::CheckFailed { .. }) {
                    Status::CheckFailed
                } else {
                    Status::Error
                };
                (status, one_line(&e.to_string()))
            };
            let p = problem.map_err(|e| err(e.into()))?;
            record.flops = metrics::flops(pc.op, &p);
            record.bytes = metrics::bytes_with_pool(pc.op, &p, c.dtype, c.decode_pool);
            if let Some(why) = unsupported.get(&pc.op) {
                return Err((Status::Unsupported, why.clone()));
            }
            preflight(engine.wgpu(), pc.op, &p, c.dtype).map_err(err)?;
            if pc.op == Op::Decode && c.decode_pool != DType::F32 && engine.wgpu().is_none() {
                return Err((
                    Status::Unsupported,
                    format!("a {} decode pool: the wgpu backend only", c.decode_pool),
                ));
            }
            let fresh = !matches!(&host, Some((h, s, b, _)) if *h == pc.heads && *s == pc.seqs && *b == pc.batch);
            if fresh {
                drop(host.take()); // free the previous shape's host inputs first
                host = Some((
                    pc.heads,
                    pc.seqs.clone(),
                    pc.batch,
                    HostCase::new(p.clone(), c.dtype, c.seed),
                ));
            }
            let hc = &host.as_ref().expect("just set").3;
            if c.fresh_device && engine.wgpu().is_some() {
                // Drop the old device (and everything allocated on it) before opening the next.
                engine = Engine::Cpu(gdn_wgpu::Oracle);
                engine = open_engine(c).map_err(err)?;
            }
            let timing = match engine.wgpu_mut() {
                None => {
                    // The oracle is the reference itself; any other backend is gated through
                    // the common interface.
                    if !matches!(engine, Engine::Cpu(_)) {
                        let key = (pc.op, pc.heads, Variant::Host, pc.check_seqs());
                        let backend = engine.backend();
                        record.check =
                            Some(gate(&mut checks, &mut unsupported, &bar, key, || {
                                run_host_check(backend, c, pc).map_err(err)
                            })?);
                    }
                    match &engine {
                        #[cfg(feature = "cuda")]
                        Engine::Cuda(ctx) => {
                            let (variant, timing) =
                                cuda::time(ctx, pc.op, hc, c).map_err(|e| err(e.into()))?;
                            record.variant = Some(variant);
                            timing
                        }
                        _ => {
                            time_host(engine.backend(), c, pc.op, hc).map_err(|e| err(e.into()))?
                        }
                    }
                }
                Some(ctx) => {
                    let (v, vname, tiles) = variant(
                        ctx,
                        pc.op,
                        &p,
                        c.dtype,
                        c.decode_tiles.as_deref(),
                        c.decode_pool,
                    )
                    .map_err(|e| err(e.into()))?;
                    record.variant = Some(vname);
                    if pc.op == Op::Forward {
                        let choice =
                            forward_algorithm(ctx, &p, c.dtype).map_err(|e| err(e.into()))?;
                        record.algorithm = Some(choice.algorithm.name().into());
                        record.algorithm_reason = Some(choice.reason);
                    }
                    let key = (pc.op, pc.heads, v.clone(), pc.check_seqs());
                    record.check = Some(gate(&mut checks, &mut unsupported, &bar, key, || {
                        run_check(ctx, c, pc, &p, tiles, &v).map_err(err)
                    })?);
                    let sets = if c.rotate_bytes > 0.0 {
                        inputs::input_sets(record.bytes, c.rotate_bytes, c.max_sets)
                    } else {
                        1
                    };
                    record.input_sets = sets;
                    let ctx = &*ctx;
                    let prepare =
                        |sets| cases::prepare(ctx, pc.op, hc, tiles, c.decode_pool, sets, c.seed);
                    let (case, measured) =
                        memory::measured_case(ctx, sets, prepare).map_err(err)?;
                    (record.peak_memory_bytes, record.memory_source) = match measured {
                        Some(bytes) => (Some(bytes), Some(MemorySource::Allocator)),
                        None => (
                            Some(metrics::peak_memory_estimate(
                                pc.op,
                                &p,
                                c.dtype,
                                forward_algorithm(ctx, &p, c.dtype)
                                    .map_err(|e| err(e.into()))?
                                    .algorithm,
                            )),
                            Some(MemorySource::Estimate),
                        ),
                    };
                    if let Some((m, budget, windows)) = case.backward_memory() {
                        // The backward's peak is what the library counts; the allocator's
                        // figure (padding included) stays beside it.
                        let allocator = match record.memory_source {
                            Some(MemorySource::Allocator) => record.peak_memory_bytes,
                            _ => None,
                        };
                        record.peak_memory_bytes = Some(m.total());
                        record.memory_source = Some(MemorySource::Library);
                        record.backward_memory = Some(report::BackwardMemoryRecord {
                            inputs_bytes: m.inputs,
                            saved_bytes: m.saved,
                            workspace_bytes: m.workspace,
                            gradients_bytes: m.gradients,
                            budget_bytes: budget,
                            windows,
                            allocator_bytes: allocator,
                        });
                    }
                    let mut copy_ceiling = match (pc.op, case.pool()) {
                        (Op::Decode, Some((buffer, bytes))) => {
                            timing::CopyCeiling::new(ctx, buffer, bytes)
                        }
                        _ => None,
                    };
                    let timing = time_gpu(ctx, case.as_ref(), c, copy_ceiling.as_mut())
                        .map_err(|e| err(e.into()))?;
                    if let Some(sp) = case.segment_paths().map_err(|e| err(e.into()))? {
                        record.segment_paths = Some(report::SegmentPathsRecord {
                            windowed: sp.windowed,
                            exact: sp.exact,
                            longest_warmup_chunks: sp.longest_warmup_chunks,
                        });
                    }
                    if let Some(copy_ceiling) = &copy_ceiling {
                        record.copy_ceiling_gbps = copy_ceiling.gbps();
                        if std::env::var_os("GDN_BENCH_CEILING_TRACE").is_some() {
                            let pool = metrics::pool_bytes(&p, c.decode_pool);
                            ceiling::trace(ctx, copy_ceiling, case.pool(), pool)
                                .map_err(|e| err(e.into()))?;
                        }
                    }
                    timing
                }
            };
            record.warmup = timing.warmup;
            record.reps = timing.reps;
            record.gpu_ms = Stats::of(&timing.gpu);
            record.gpu_ms_reps = timing.gpu.clone();
            record.wall_ms = Stats::of(&timing.wall);
            record.host_ms = Stats::of(&timing.host);
            // The tail span (copies after the last pass, e.g. the backward's dv and dh0) is
            // listed only when it is more than 2 % of the GPU time.
            let total = record.gpu_ms.map_or(0.0, |s| s.median);
            record.passes = timing
                .passes
                .iter()
                .filter_map(|(name, ms)| {
                    let median = Stats::of(ms)?.median;
                    (name != "tail" || median > 0.02 * total).then(|| PassTime {
                        name: name.clone(),
                        median_ms: median,
                    })
                })
                .collect();
            let (time, basis) = match (record.gpu_ms, record.wall_ms) {
                (Some(g), _) => (g.median, "gpu"),
                (None, Some(w)) => (w.median, "wall"),
                _ => return Ok(()),
            };
            if time > 0.0 {
                record.tflops = Some(record.flops / (time * 1e-3) / 1e12);
                record.gbps = Some(record.bytes / (time * 1e-3) / 1e9);
                record.rate_basis = Some(basis.into());
                record.tokens_per_s = Some(p.total_tokens() as f64 / (time * 1e-3));
            }
            Ok(())
        })();
        if let Err((status, note)) = outcome {
            record.status = status;
            record.note = Some(note);
        }
        let summary = match (&record.status, record.time_ms()) {
            (Status::Ok, Some(ms)) => format!("{ms:.4} ms"),
            (s, _) => s.name().to_string(),
        };
        if bar.is_hidden() {
            eprintln!(
                "[{}/{}] {} {} {label}: {summary}",
                index + 1,
                planned.len(),
                record.op,
                record.dtype
            );
        } else {
            bar.println(format!("{} {label}: {summary}", record.op));
        }
        bar.inc(1);
        records.push(record);
    }
    bar.finish_and_clear();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Ok(Report {
        tool: "gdn bench".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        date_utc: report::iso_utc(now),
        commit: commit(),
        command: command.into(),
        adapter,
        rotate_bytes: c.rotate_bytes,
        records,
    })
}
