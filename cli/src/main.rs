//! `gdn`: run the GDN kernels on safetensors files, and report what the GPUs offer.
//!
//! Exit codes: 0 success; 1 device or runtime failure; 2 bad input (file, tensor, flag).
//! Every failure is one `error: …` line on stderr.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Args, Parser, Subcommand};
use gdn_cli::backend::{BackendKind, Engine};
use gdn_wgpu::error::ShapeList;
use gdn_wgpu::io::{IntTensor, TensorFile};
use gdn_wgpu::{DType, Error, ForwardInputs, HostTensor, Options, Problem, wgpu_backend};

#[derive(Parser)]
#[command(
    name = "gdn",
    version,
    about = "Gated DeltaNet kernels on any GPU (wgpu), checked by an f64 CPU oracle"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List GPU adapters (features, limits) and the kernel variants the best one would use.
    Info,
    /// Compile every CUDA kernel for the first CUDA device into the on-disk cache, on parallel
    /// threads (on an empty cache the first CUDA call otherwise compiles them one by one, for
    /// over a minute).
    #[cfg(feature = "cuda")]
    Precompile,
    /// Run a kernel on tensors read from a safetensors file.
    #[command(subcommand)]
    Run(Kernel),
    /// Benchmark sweep of forward, backward and decode (oracle-checked first); see BENCHMARKS.md.
    Bench(Box<gdn_cli::bench::BenchArgs>),
}

#[derive(Subcommand)]
enum Kernel {
    /// Chunked forward. Reads q, k, v, g, beta and optionally initial_state, cu_seqlens (I32 or
    /// I64, with B = 1), A_log and dt_bias (with --gate-in-kernel); writes o and final_state.
    Forward(RunArgs),
    /// Chunked backward (the forward is replayed first). Reads the forward's tensors plus `do`
    /// (B,T,HV,V: the shape of v) and optionally `dht` (the state shape, F32); writes dq dk dv
    /// dg dbeta, dh0 when initial_state is given, and dA_log ddt_bias with --gate-in-kernel.
    Backward(BackwardArgs),
    /// The same inputs and outputs as `forward`, computed token by token by the recurrent
    /// decode kernel over a state pool (one decode step per token); agrees with `forward`.
    Decode(DecodeArgs),
}

/// Files, backend and GDN flags, shared by every `run` kernel.
#[derive(Args)]
struct RunArgs {
    /// safetensors file holding the kernel's input tensors, by name.
    #[arg(long, value_name = "IN.safetensors")]
    input: PathBuf,
    /// safetensors file to write the outputs to (replaced if it exists).
    #[arg(long, value_name = "OUT.safetensors")]
    output: PathBuf,
    /// What runs the kernel.
    #[arg(long, value_enum, default_value_t = BackendKind::Auto)]
    backend: BackendKind,
    #[command(flatten)]
    flags: GdnFlags,
}

/// `gdn run decode`: the run flags plus the state pool's storage dtype.
#[derive(Args)]
struct DecodeArgs {
    #[command(flatten)]
    run: RunArgs,
    /// Storage dtype of the state pool: f32, or bf16 (half the traffic; the state is rounded
    /// to bf16 after every step, the arithmetic stays f32; wgpu only). final_state is written
    /// as F32 either way.
    #[arg(long, value_enum, default_value_t = gdn_cli::bench::PoolDType::F32)]
    pool: gdn_cli::bench::PoolDType,
}

/// `gdn run backward`: the shared flags and the backward's memory budget.
#[derive(Args)]
struct BackwardArgs {
    #[command(flatten)]
    run: RunArgs,
    /// The backward's memory budget on wgpu (as GDN_BACKWARD_BUDGET, which it overrides): bytes
    /// with an optional KiB/MiB/GiB suffix, `Nx` (N times the backward's inputs) or
    /// `unbounded` [default: 2x].
    #[arg(long, value_name = "BYTES|Nx|unbounded")]
    backward_budget: Option<String>,
}

/// The flags of FLA's `chunk_gated_delta_rule` (see [`Options`]).
#[derive(Args)]
struct GdnFlags {
    /// Output scale [default: K^-1/2].
    #[arg(long)]
    scale: Option<f32>,
    /// Normalize q and k per head in the kernel: x / sqrt(Σx² + 1e-6).
    #[arg(long)]
    l2norm_qk: bool,
    /// beta holds logits; the kernel applies a sigmoid.
    #[arg(long)]
    beta_sigmoid: bool,
    /// β = 2·sigmoid(beta) ∈ (0, 2); needs --beta-sigmoid.
    #[arg(long)]
    allow_neg_eigval: bool,
    /// g is the raw gate: decay = −exp(A_log)·softplus(g + dt_bias); needs A_log and dt_bias.
    #[arg(long)]
    gate_in_kernel: bool,
    /// States are [N, HV, V, K] instead of [N, HV, K, V].
    #[arg(long)]
    state_v_first: bool,
}

impl GdnFlags {
    fn options(&self) -> Options {
        Options {
            scale: self.scale,
            l2norm_qk: self.l2norm_qk,
            beta_sigmoid: self.beta_sigmoid,
            allow_neg_eigval: self.allow_neg_eigval,
            gate_in_kernel: self.gate_in_kernel,
            state_v_first: self.state_v_first,
        }
    }
}

/// A failure and its exit code.
struct Failure {
    error: Error,
    code: u8,
}

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        let code = if error.is_input_error() { 2 } else { 1 };
        Failure { error, code }
    }
}

impl Failure {
    /// Whatever the variant, failing to get a device is not the input's fault.
    fn device(error: Error) -> Self {
        Failure { error, code: 1 }
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => e.exit(), // --help, --version
        Err(e) => {
            // clap's usage block spans lines; keep the promise of one `error:` line (code 2).
            let text = e.render().to_string();
            eprintln!("error: {}", one_line(text.trim_start_matches("error: ")));
            return ExitCode::from(2);
        }
    };
    let result = match &cli.command {
        Command::Info => info(),
        #[cfg(feature = "cuda")]
        Command::Precompile => precompile(),
        Command::Run(Kernel::Forward(args)) => run_forward(args, GpuPath::Chunked),
        Command::Run(Kernel::Backward(args)) => run_backward(args),
        Command::Run(Kernel::Decode(args)) => {
            run_forward(&args.run, GpuPath::TokenByToken(args.pool.dtype()))
        }
        Command::Bench(args) => return gdn_cli::bench::main(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure { error, code }) => {
            // Device messages (wgpu validation errors) can span lines; keep the promise of one.
            eprintln!("error: {}", one_line(&error.to_string()));
            ExitCode::from(code)
        }
    }
}

/// `text`'s non-empty lines, trimmed and joined by spaces.
fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The tensors `gdn run forward` reads; anything else in the input is ignored with a warning.
const FORWARD_TENSORS: [&str; 9] = [
    "q",
    "k",
    "v",
    "g",
    "beta",
    "initial_state",
    "cu_seqlens",
    "A_log",
    "dt_bias",
];

/// How the GPU computes a forward: `gdn run forward` or `gdn run decode`.
#[derive(Clone, Copy)]
enum GpuPath {
    /// The chunked kernels.
    Chunked,
    /// The recurrent decode kernel, one token per sequence per step, over a state pool stored
    /// in this dtype.
    TokenByToken(DType),
}

impl GpuPath {
    fn command(self) -> &'static str {
        match self {
            GpuPath::Chunked => "forward",
            GpuPath::TokenByToken(_) => "decode",
        }
    }
}

fn run_forward(args: &RunArgs, path: GpuPath) -> Result<(), Failure> {
    check_output(&args.output)?;
    let file = TensorFile::open(&args.input)?;
    let (problem, inputs) = read_forward(&file, args.flags.options())?;
    for name in file.names() {
        if !FORWARD_TENSORS.contains(&name.as_str()) {
            eprintln!(
                "warning: ignoring tensor `{name}` in {}: not an input of {}",
                file.path(),
                path.command()
            );
        }
    }
    // Inputs are fully checked before any device work, so bad input never waits on a GPU.
    let engine = open(args.backend)?;
    let backend = engine.backend();
    let start = Instant::now();
    let outputs = match path {
        GpuPath::Chunked => backend.forward(&problem, &inputs.as_ref())?,
        GpuPath::TokenByToken(DType::F32) => backend.decode(&problem, &inputs.as_ref(), 1)?,
        GpuPath::TokenByToken(pool) => match engine.wgpu() {
            Some(ctx) => {
                wgpu_backend::decode::decode_host_in(ctx, &problem, &inputs.as_ref(), 1, pool)?
            }
            None => {
                return Err(Error::Unsupported {
                    name: "--pool".into(),
                    what: format!(
                        "a {pool} state pool on the {} backend (wgpu only)",
                        backend.name()
                    ),
                }
                .into());
            }
        },
    };
    let elapsed_ms = start.elapsed().as_secs_f64() * 1e3;
    gdn_wgpu::io::write(
        &args.output,
        [
            ("o", (&outputs.o).into()),
            ("final_state", (&outputs.final_state).into()),
        ],
    )?;
    let p = &problem;
    eprintln!(
        "gdn run {}: {} | B={} T={} H={} HV={} K={} V={} N={} | {elapsed_ms:.1} ms | wrote {}",
        path.command(),
        engine.backend().describe(),
        p.batch,
        p.tokens,
        p.heads_qk,
        p.heads_v,
        p.key_dim,
        p.value_dim,
        p.num_sequences(),
        args.output.display()
    );
    Ok(())
}

/// The tensors `gdn run backward` reads besides the forward's.
const BACKWARD_TENSORS: [&str; 2] = ["do", "dht"];

fn run_backward(backward: &BackwardArgs) -> Result<(), Failure> {
    let args = &backward.run;
    let budget = backward
        .backward_budget
        .as_deref()
        .map(|b| wgpu_backend::MemoryBudget::parse("--backward-budget", b))
        .transpose()?;
    check_output(&args.output)?;
    let file = TensorFile::open(&args.input)?;
    let (problem, inputs) = read_forward(&file, args.flags.options())?;
    let d_o = file.float("do")?.ok_or_else(|| Error::Missing {
        name: "do".into(),
        why: format!("tensor [B,T,HV,V] (the gradient of o) in {}", file.path()),
    })?;
    let dht = file.float("dht")?;
    wgpu_backend::backward::check_host_gradients(&problem, inputs.v.dtype, &d_o, dht.as_ref())?;
    for name in file.names() {
        if !FORWARD_TENSORS.contains(&name.as_str()) && !BACKWARD_TENSORS.contains(&name.as_str()) {
            eprintln!(
                "warning: ignoring tensor `{name}` in {}: not an input of backward",
                file.path()
            );
        }
    }
    // Inputs are fully checked before any device work, so bad input never waits on a GPU.
    let mut engine = open(args.backend)?;
    if let (Some(budget), Some(ctx)) = (budget, engine.wgpu_mut()) {
        ctx.set_backward_budget(Some(budget));
    }
    let start = Instant::now();
    let (_, grads) =
        engine
            .backend()
            .forward_backward(&problem, &inputs.as_ref(), &d_o, dht.as_ref())?;
    let elapsed_ms = start.elapsed().as_secs_f64() * 1e3;
    let mut outputs: Vec<(&str, &HostTensor)> = vec![
        ("dq", &grads.dq),
        ("dk", &grads.dk),
        ("dv", &grads.dv),
        ("dg", &grads.dg),
        ("dbeta", &grads.dbeta),
    ];
    let optional = [
        ("dh0", &grads.dh0),
        ("dA_log", &grads.da_log),
        ("ddt_bias", &grads.ddt_bias),
    ];
    outputs.extend(
        optional
            .iter()
            .filter_map(|(n, t)| t.as_ref().map(|t| (*n, t))),
    );
    gdn_wgpu::io::write(
        &args.output,
        outputs.into_iter().map(|(n, t)| (n, t.into())),
    )?;
    let p = &problem;
    eprintln!(
        "gdn run backward: {} | B={} T={} H={} HV={} K={} V={} N={} | {elapsed_ms:.1} ms (forward + backward) | wrote {}",
        engine.backend().describe(),
        p.batch,
        p.tokens,
        p.heads_qk,
        p.heads_v,
        p.key_dim,
        p.value_dim,
        p.num_sequences(),
        args.output.display()
    );
    Ok(())
}

/// Refuse an output path that cannot be written before reading or computing anything: its
/// folder must exist and it must not be a folder itself. (A write that fails later still
/// leaves no file: `io::write` renames a finished temporary file into place.)
fn check_output(path: &std::path::Path) -> gdn_wgpu::Result<()> {
    let refuse = |expected: &str| {
        Err(Error::Value {
            name: "--output".into(),
            expected: expected.into(),
            got: path.display().to_string(),
        })
    };
    if path.is_dir() {
        return refuse("a file path, not a folder");
    }
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    if !folder.is_dir() {
        return refuse("a path in an existing folder");
    }
    Ok(())
}

/// Read and check the forward's tensors: the problem's sizes come from q `[B,T,H,K]` and
/// v `[B,T,HV,V]`, and every other tensor must agree with them.
fn read_forward(
    file: &TensorFile,
    options: Options,
) -> gdn_wgpu::Result<(Problem, ForwardInputs<HostTensor>)> {
    let required = |name: &str, layout: &str| {
        file.float(name)?.ok_or_else(|| Error::Missing {
            name: name.into(),
            why: format!("tensor {layout} in {}", file.path()),
        })
    };
    let inputs = ForwardInputs {
        q: required("q", "[B,T,H,K]")?,
        k: required("k", "[B,T,H,K]")?,
        v: required("v", "[B,T,HV,V]")?,
        g: required("g", "[B,T,HV]")?,
        beta: required("beta", "[B,T,HV]")?,
        initial_state: file.float("initial_state")?,
        a_log: file.float("A_log")?,
        dt_bias: file.float("dt_bias")?,
    };
    let cu_seqlens = file.int("cu_seqlens")?.map(cu_seqlens_values).transpose()?;
    let problem = problem_from_shapes(&inputs.q, &inputs.v, cu_seqlens, options)?;
    // Any storage dtype the file may hold; a backend without kernels for it refuses it with
    // a "not yet supported" error naming q.
    problem.check_inputs(&inputs.as_ref(), &[DType::F32, DType::F16, DType::BF16])?;
    gdn_wgpu::check_host_values(&problem, &inputs.as_ref())?;
    Ok((problem, inputs))
}

fn cu_seqlens_values(t: IntTensor) -> gdn_wgpu::Result<Vec<usize>> {
    const NAME: &str = "cu_seqlens";
    if t.shape.len() != 1 {
        return Err(Error::Shape {
            name: NAME.into(),
            expected: "[N + 1] (1-D)".into(),
            got: ShapeList(t.shape),
        });
    }
    let non_negative = |x: i64| {
        usize::try_from(x).map_err(|_| Error::Value {
            name: NAME.into(),
            expected: "non-negative entries".into(),
            got: x.to_string(),
        })
    };
    t.data.into_iter().map(non_negative).collect()
}

fn problem_from_shapes(
    q: &HostTensor,
    v: &HostTensor,
    cu_seqlens: Option<Vec<usize>>,
    options: Options,
) -> gdn_wgpu::Result<Problem> {
    let rank_error = |name: &str, layout: &str, t: &HostTensor| Error::Shape {
        name: name.into(),
        expected: format!("{layout} (4-D)"),
        got: ShapeList(t.shape.clone()),
    };
    let &[b, t, h, k] = q.shape.as_slice() else {
        return Err(rank_error("q", "[B, T, H, K]", q));
    };
    let &[_, _, hv, vd] = v.shape.as_slice() else {
        return Err(rank_error("v", "[B, T, HV, V]", v));
    };
    Problem::new(b, t, h, hv, k, vd, cu_seqlens, options).map_err(name_size_source)
}

/// `Problem::new` names sizes (e.g. "heads_v (HV)"); add the tensor each was read from.
fn name_size_source(error: Error) -> Error {
    let Error::Value {
        name,
        expected,
        got,
    } = error
    else {
        return error;
    };
    let source = match name.as_str() {
        "batch (B)" | "tokens (T)" | "heads_qk (H)" | "key_dim (K)" => Some("q"),
        "heads_v (HV)" | "value_dim (V)" => Some("v"),
        _ => None,
    };
    let name = match source {
        Some(tensor) => format!("{name} of {tensor}"),
        None => name,
    };
    Error::Value {
        name,
        expected,
        got,
    }
}

/// Open the backend for `gdn run`: failing to get a device is not the input's fault.
fn open(kind: BackendKind) -> Result<Engine, Failure> {
    Engine::open(kind, None).map_err(Failure::device)
}

/// The CUDA device, its architecture and what the CUDA backend runs on it.
#[cfg(feature = "cuda")]
fn print_cuda() {
    use gdn_wgpu::Backend;
    use gdn_wgpu::tolerance::Op;
    match gdn_wgpu::cuda_backend::Context::new() {
        Ok(ctx) => {
            println!("cuda: {}", ctx.describe());
            for (name, op) in [
                ("forward", Op::Forward),
                ("backward", Op::Backward),
                ("decode", Op::Decode),
            ] {
                let dtypes = ctx.storage_dtypes(op);
                let list = if dtypes.is_empty() {
                    "not available on this backend yet".to_string()
                } else {
                    dtypes
                        .iter()
                        .map(|d| d.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                println!("  {name}: {list}");
            }
        }
        Err(e) => println!("cuda: not usable ({e})"),
    }
}

/// Features worth knowing about for these kernels (f16 storage, subgroup reductions, GPU
/// timing, tensor cores).
const FEATURES_OF_INTEREST: [(&str, wgpu::Features); 4] = [
    ("SHADER_F16", wgpu::Features::SHADER_F16),
    ("SUBGROUP", wgpu::Features::SUBGROUP),
    ("TIMESTAMP_QUERY", wgpu::Features::TIMESTAMP_QUERY),
    (
        "EXPERIMENTAL_COOPERATIVE_MATRIX",
        wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX,
    ),
];

#[cfg(feature = "cuda")]
fn precompile() -> Result<(), Failure> {
    let start = std::time::Instant::now();
    let ctx = gdn_wgpu::cuda_backend::Context::new()?;
    let cache = gdn_wgpu::cuda_backend::nvrtc::default_cache_dir()
        .map(|d| d.display().to_string())
        .unwrap_or_else(|| "none (GDN_CUDA_CACHE, XDG_CACHE_HOME and HOME unset)".into());
    println!(
        "{} ({}), cache {cache}",
        ctx.device_name(),
        ctx.target().arch()
    );
    for (file, secs) in ctx.precompile()? {
        println!("  {file}: {secs:.1} s");
    }
    println!(
        "all CUDA kernels ready in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

fn info() -> Result<(), Failure> {
    #[cfg(feature = "cuda")]
    print_cuda();
    // The library's one reading of the environment; a bad GDN_* value is an error here too.
    let config = wgpu_backend::Config::from_env()?;
    let adapters = pollster::block_on(wgpu_backend::list_adapters_matching(&config));
    let filter = config
        .adapter
        .as_ref()
        .map(|f| format!(" matching GDN_ADAPTER={f:?}"))
        .unwrap_or_default();
    let Some(best) = adapters.first() else {
        println!("no GPU adapter found{filter} (is a Vulkan, Metal or DX12 driver installed?)");
        return Ok(());
    };
    println!("adapters{filter}, best first:");
    for (i, adapter) in adapters.iter().enumerate() {
        print_adapter(i, adapter);
    }
    println!("kernels on [0] {}:", best.get_info().name);
    match pollster::block_on(wgpu_backend::Context::from_adapter(best.clone())) {
        Ok(ctx) => {
            let tuning = ctx.tuning();
            println!("  workgroup memory: {} bytes", tuning.workgroup_bytes);
            println!("  state_scan V-blocks that fit: {:?}", tuning.v_blocks);
            if let Some(forced) = tuning.forced_v_block {
                println!("  GDN_V_BLOCK={forced} (used when it fits and divides V)");
            }
            let names = |ds: &[DType]| ds.iter().map(|d| d.name()).collect::<Vec<_>>().join(", ");
            let f16 = if ctx.features().contains(wgpu::Features::SHADER_F16) {
                "F16 storage possible: the device has SHADER_F16"
            } else {
                "no F16 storage: the device lacks SHADER_F16"
            };
            let has_f16 = ctx.features().contains(wgpu::Features::SHADER_F16);
            for (family, pass) in [
                ("forward", wgpu_backend::shaders::Pass::StateScan),
                ("backward", wgpu_backend::shaders::Pass::DhScan),
                ("decode", wgpu_backend::shaders::Pass::RecurrentStep),
            ] {
                let usable: Vec<DType> = pass
                    .storage_dtypes()
                    .iter()
                    .copied()
                    .filter(|&d| d != DType::F16 || has_f16)
                    .collect();
                println!("  storage dtypes, {family}: {}", names(&usable));
            }
            println!("  {f16}");
            let support = ctx.path_support();
            if support.coop_f16 {
                println!("  cooperative matrices: f16 16x16x16 -> f32, used by the coop path");
            } else {
                println!(
                    "  cooperative matrices: not used ({})",
                    support.coop_missing
                );
            }
            if support.f16_math {
                println!(
                    "  f16 math: available (SHADER_F16), taken only when forced: GDN_COMPUTE_PATH=f16"
                );
            } else {
                println!("  f16 math: not available ({})", support.f16_missing);
            }
            if let Some(forced) = ctx.forced_compute_path() {
                println!("  GDN_COMPUTE_PATH={forced} forces the forward's path");
            }
            // The path depends on the problem too; show it for the common K = V = 128.
            match gdn_wgpu::Problem::new(1, 64, 1, 1, 128, 128, None, Default::default()) {
                Ok(p) => {
                    for d in ctx.forward_storage_dtypes() {
                        match ctx.forward_path(&p, d) {
                            Ok(c) => println!(
                                "  forward compute path, {} storage, K = V = 128: {} ({})",
                                d.name(),
                                c.path,
                                c.reason
                            ),
                            Err(e) => println!(
                                "  forward compute path, {} storage, K = V = 128: {e}",
                                d.name()
                            ),
                        }
                        match gdn_wgpu::wgpu_backend::backward::backward_path(&ctx, &p, d) {
                            Ok(c) => println!(
                                "  backward compute path, {} storage, K = V = 128: {} ({})",
                                d.name(),
                                c.path,
                                c.reason
                            ),
                            Err(e) => println!(
                                "  backward compute path, {} storage, K = V = 128: {e}",
                                d.name()
                            ),
                        }
                    }
                }
                Err(e) => println!("  {e}"),
            }
            let device_binding = ctx.limits().max_storage_buffer_binding_size;
            let binding = ctx.max_binding_bytes();
            let lowered = if binding < device_binding {
                " (lowered by GDN_MAX_BINDING_BYTES)"
            } else {
                ""
            };
            println!(
                "  largest storage binding: {binding} bytes{lowered}; larger tensors run in windows"
            );
            if let Some(forced) = ctx.forced_forward_algorithm() {
                println!("  GDN_FORWARD_ALGORITHM={forced} forces the forward's algorithm");
            }
            // The algorithm depends on the sequence lengths: a decode-like call and a long one.
            for (what, batch, tokens) in [("B = 4, T = 1", 4, 1), ("B = 1, T = 4096", 1, 4096)] {
                let p =
                    gdn_wgpu::Problem::new(batch, tokens, 1, 1, 128, 128, None, Default::default());
                match p.and_then(|p| wgpu_backend::forward_algorithm(&ctx, &p, DType::F32)) {
                    Ok(c) => println!(
                        "  forward algorithm, {what}, K = V = 128: {} ({})",
                        c.algorithm, c.reason
                    ),
                    Err(e) => println!("  forward algorithm, {what}: {e}"),
                }
            }
            println!(
                "  forward_saved (for the backward): chunked always; backward and decode: \
                 scalar path (f32 arithmetic) on every adapter"
            );
        }
        Err(e) => println!("  unavailable: {e}"),
    }
    Ok(())
}

fn print_adapter(index: usize, adapter: &wgpu::Adapter) {
    let info = adapter.get_info();
    let (features, limits) = (adapter.features(), adapter.limits());
    println!("[{index}] {}", info.name);
    println!(
        "    backend {:?}, type {:?}, driver {} ({})",
        info.backend, info.device_type, info.driver, info.driver_info
    );
    let flags: Vec<String> = FEATURES_OF_INTEREST
        .iter()
        .map(|(name, f)| {
            format!(
                "{name} {}",
                if features.contains(*f) { "yes" } else { "no" }
            )
        })
        .collect();
    println!("    features: {}", flags.join(", "));
    println!(
        "    max_compute_workgroup_storage_size: {}",
        limits.max_compute_workgroup_storage_size
    );
    println!(
        "    max_compute_invocations_per_workgroup: {}",
        limits.max_compute_invocations_per_workgroup
    );
    println!(
        "    max_storage_buffer_binding_size: {}",
        limits.max_storage_buffer_binding_size
    );
    println!("    max_buffer_size: {}", limits.max_buffer_size);
    println!(
        "    max_storage_buffers_per_shader_stage: {}",
        limits.max_storage_buffers_per_shader_stage
    );
}
