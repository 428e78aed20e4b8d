//! The demo itself, free of JavaScript: draw a random problem, run the forward
//! (`wgpu_backend::forward`, on the algorithm the library chooses for the adapter or the one
//! asked for) on the first T tokens and then a few decode steps (`wgpu_backend::DecodePlan`,
//! the recurrent kernel, one token each) continuing from its final state on the GPU, and check
//! everything against the f64 oracle over all T + steps tokens. `lib.rs` is the wasm-bindgen
//! glue around it.

use gdn_wgpu::reference::{self, select_heads};
use gdn_wgpu::wgpu_backend::{
    self, Context, DecodeOutputs, DecodePlan, ForwardAlgorithm, GpuTensor, StateLayout, StatePool,
    StateSlot,
};
use gdn_wgpu::{
    DType, Error, ForwardInputs, HostTensor, Options, Problem, RandomSpec, Result, relative_l2,
};

/// What the user chose on the page.
#[derive(Debug, Clone)]
pub struct Config {
    pub tokens: usize,
    pub heads_qk: usize,
    pub heads_v: usize,
    pub key_dim: usize,
    pub value_dim: usize,
    pub decode_steps: usize,
    pub seed: u64,
    /// Request WebGPU's default limits (16 KiB workgroup memory, 256 invocations, 8 storage
    /// buffers per stage) instead of the adapter's: proves the kernels fit them.
    pub default_limits: bool,
    /// Normalize q and k in the kernel (runs the `prepare_qk` pass too).
    pub l2norm_qk: bool,
    /// Forward calls (≥ 1), each with upload and readback; the first compiles the pipelines,
    /// the rest are warm. The last one's results are checked and continued by decode.
    pub runs: usize,
    /// The forward's algorithm (`None`: the library's choice for the adapter and problem).
    pub algorithm: Option<ForwardAlgorithm>,
    /// Run the forward through the recurrent kernel at this tiling, (V-block, vec4s per
    /// invocation), for tiling sweeps (one page load per tiling: a fresh device).
    pub tiles: Option<(u32, u32)>,
}

/// One phase (the forward, or all decode steps) compared with the oracle.
#[derive(Debug, Clone)]
pub struct Phase {
    pub tokens: usize,
    /// Σ o and Σ |o| over the phase's outputs.
    pub checksum: f64,
    pub abs_sum: f64,
    /// Relative L2 error of o and of the state at the end of the phase.
    pub rel_o: f64,
    pub rel_state: f64,
    /// GPU time between timestamps around the phase's passes (None without timestamp queries).
    pub gpu_ms: Option<f64>,
    /// Wall time from recording to having the results back on the host (performance.now() in
    /// the browser); includes first-use pipeline compilation.
    pub wall_ms: f64,
    /// The forward only: wall time of every call (upload, record, submit, readback), the
    /// first (pipeline creation) included. Empty for decode.
    pub runs_ms: Vec<f64>,
    /// The forward only: GPU time of every call (timestamps; empty without them). Wall minus
    /// GPU is what the call spends outside the kernels: upload, submit, readback.
    pub runs_gpu_ms: Vec<f64>,
}

#[derive(Debug, Clone)]
pub struct Report {
    /// Wall time of adapter and device creation (set by the caller that made the context).
    pub context_ms: f64,
    pub adapter: String,
    pub backend: String,
    pub device_type: String,
    pub limits: &'static str,
    pub workgroup_bytes: u32,
    pub invocations: u32,
    pub storage_buffers: u32,
    pub binding_bytes: u64,
    pub features: Vec<String>,
    pub v_block: u32,
    /// The forward's algorithm (`chunked` or `recurrent`) and why.
    pub algorithm: String,
    pub algorithm_reason: String,
    /// Pipelines compiled after the forward runs (the first call creates them).
    pub forward_pipelines: usize,
    /// The decode kernel's tiling, in words.
    pub decode_tiles: Option<String>,
    pub l2norm_qk: bool,
    pub forward: Phase,
    pub decode: Option<Phase>,
    /// v-heads the oracle checked (all of them unless the problem is large).
    pub oracle_heads: Vec<usize>,
    pub oracle_ms: f64,
    /// The largest relative error of any output.
    pub max_rel: f64,
}

/// Oracle work (tokens × v-heads × K × V) above which only the first and last v-head are
/// checked, so a big problem does not keep the page busy for minutes.
const ORACLE_FULL_WORK: usize = 1 << 27;

/// Tokens `range` of a `[1, T, ...]` host tensor.
fn tokens_of(t: &HostTensor, range: std::ops::Range<usize>) -> HostTensor {
    let per_token: usize = t.shape[2..].iter().product();
    let mut shape = t.shape.clone();
    shape[1] = range.len();
    HostTensor {
        shape,
        dtype: t.dtype,
        data: t.data[range.start * per_token..range.end * per_token].to_vec(),
    }
}

struct Uploaded {
    q: GpuTensor,
    k: GpuTensor,
    v: GpuTensor,
    g: GpuTensor,
    beta: GpuTensor,
}

impl Uploaded {
    fn new(
        ctx: &Context,
        all: &ForwardInputs<HostTensor>,
        range: std::ops::Range<usize>,
    ) -> Result<Self> {
        let up =
            |name: &str, t: &HostTensor| GpuTensor::upload(ctx, name, &tokens_of(t, range.clone()));
        Ok(Uploaded {
            q: up("q", &all.q)?,
            k: up("k", &all.k)?,
            v: up("v", &all.v)?,
            g: up("g", &all.g)?,
            beta: up("beta", &all.beta)?,
        })
    }

    fn inputs<'a>(&'a self, initial_state: Option<&'a GpuTensor>) -> ForwardInputs<&'a GpuTensor> {
        ForwardInputs {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            g: &self.g,
            beta: &self.beta,
            initial_state,
            a_log: None,
            dt_bias: None,
        }
    }
}

/// The decode loop, as a server runs it: a [`DecodePlan`] prepared once over one token's input
/// tensors and a state pool, here the forward's final state (slot 0, continued in place). Each
/// step copies the next token's inputs into the bound tensors, records the plan's one compute
/// pass and copies o out: no allocation per step, and every step goes into one encoder.
struct Decoder {
    plan: DecodePlan,
    /// The tensors the plan reads: one token.
    token: Uploaded,
    o: GpuTensor,
}

impl Decoder {
    fn new(ctx: &Context, step_problem: &Problem, pool: &StatePool) -> Result<Self> {
        let zeros = |name: &str, shape: &[usize]| GpuTensor::empty(ctx, name, shape, DType::F32);
        let (qk, gate) = (step_problem.qk_shape(), step_problem.gate_shape());
        let token = Uploaded {
            q: zeros("q", &qk)?,
            k: zeros("k", &qk)?,
            v: zeros("v", &step_problem.v_shape())?,
            g: zeros("g", &gate)?,
            beta: zeros("beta", &gate)?,
        };
        let o = zeros("o", &step_problem.v_shape())?;
        let plan = DecodePlan::new(
            ctx,
            step_problem,
            &token.inputs(None),
            pool,
            &[StateSlot::Resume(0)],
            &DecodeOutputs {
                o: &o,
                per_token_states: None,
            },
        )?;
        Ok(Decoder { plan, token, o })
    }

    /// Record step `i` over token `i` of `tokens` (`[1, steps, ..]` tensors), writing its o
    /// into row `i` of `o_all`.
    fn step(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        tokens: &Uploaded,
        i: usize,
        o_all: &GpuTensor,
    ) {
        let copy =
            |encoder: &mut wgpu::CommandEncoder, from: &GpuTensor, to: &GpuTensor, i: usize| {
                let bytes = to.bytes();
                encoder.copy_buffer_to_buffer(&from.buffer, i as u64 * bytes, &to.buffer, 0, bytes);
            };
        let (t, u) = (tokens, &self.token);
        for (from, to) in [
            (&t.q, &u.q),
            (&t.k, &u.k),
            (&t.v, &u.v),
            (&t.g, &u.g),
            (&t.beta, &u.beta),
        ] {
            copy(encoder, from, to, i);
        }
        self.plan.record(encoder);
        let bytes = self.o.bytes();
        encoder.copy_buffer_to_buffer(&self.o.buffer, 0, &o_all.buffer, i as u64 * bytes, bytes);
    }
}

/// GPU time of a span from two timestamps, each written by an empty compute pass: WebGPU has
/// timestamps only at pass boundaries (no `TIMESTAMP_QUERY_INSIDE_ENCODERS`), and the
/// launchers own their passes.
struct PassTimer {
    set: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    readback: wgpu::Buffer,
    period_ns: f64,
}

impl PassTimer {
    fn new(ctx: &Context) -> Option<Self> {
        if !ctx.features().contains(wgpu::Features::TIMESTAMP_QUERY) {
            return None;
        }
        let set = ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("demo timer"),
            ty: wgpu::QueryType::Timestamp,
            count: 2,
        });
        let buffer = |usage| {
            ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("demo timer"),
                size: 16,
                usage,
                mapped_at_creation: false,
            })
        };
        Some(PassTimer {
            set,
            resolve: buffer(wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC),
            readback: buffer(wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST),
            period_ns: ctx.queue.get_timestamp_period() as f64,
        })
    }

    fn mark(&self, encoder: &mut wgpu::CommandEncoder, index: u32) {
        let writes = wgpu::ComputePassTimestampWrites {
            query_set: &self.set,
            beginning_of_pass_write_index: Some(index),
            end_of_pass_write_index: None,
        };
        encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("demo timestamp"),
            timestamp_writes: Some(writes),
        });
    }

    fn resolve(&self, encoder: &mut wgpu::CommandEncoder) {
        encoder.resolve_query_set(&self.set, 0..2, &self.resolve, 0);
        encoder.copy_buffer_to_buffer(&self.resolve, 0, &self.readback, 0, 16);
    }

    /// Milliseconds between the marks, once the submission is done (async: no blocking poll).
    #[cfg_attr(target_arch = "wasm32", allow(unused_variables))]
    async fn read_ms(&self, ctx: &Context) -> Result<f64> {
        let (tx, rx) = futures_channel::oneshot::channel();
        self.readback
            .slice(..)
            .map_async(wgpu::MapMode::Read, move |r| {
                let _ = tx.send(r);
            });
        #[cfg(not(target_arch = "wasm32"))]
        ctx.device
            .poll(wgpu::PollType::Wait {
                submission_index: None,
                timeout: None,
            })
            .map_err(|e| Error::Gpu(e.to_string()))?;
        rx.await
            .map_err(|_| Error::Gpu("timestamp readback cancelled".into()))?
            .map_err(|e| Error::Gpu(e.to_string()))?;
        let ticks: [u64; 2] = {
            let view = self
                .readback
                .slice(..)
                .get_mapped_range()
                .map_err(|e| Error::Gpu(e.to_string()))?;
            read_ticks(&view)
        };
        self.readback.unmap();
        Ok(ticks[1].wrapping_sub(ticks[0]) as f64 * self.period_ns / 1e6)
    }
}

fn read_ticks(bytes: &[u8]) -> [u64; 2] {
    let t = |i: usize| u64::from_le_bytes(bytes[8 * i..8 * i + 8].try_into().unwrap());
    [t(0), t(1)]
}

fn sums(values: &[f32]) -> (f64, f64) {
    values.iter().fold((0.0, 0.0), |(s, a), &x| {
        (s + x as f64, a + (x as f64).abs())
    })
}

/// `VxN` (V-block, vec4s per invocation), `colV` (the column kernel, N = 0) or empty.
pub fn parse_tiles(s: &str) -> Result<Option<(u32, u32)>> {
    if s.trim().is_empty() {
        return Ok(None);
    }
    if let Some(v) = s.trim().strip_prefix("col") {
        return v.parse().map(|v| Some((v, 0))).map_err(|_| Error::Value {
            name: "tiles".into(),
            expected: "VxN or colV, e.g. 32x32 or col32".into(),
            got: format!("{s:?}"),
        });
    }
    s.split_once('x')
        .and_then(|(v, n)| Some((v.trim().parse().ok()?, n.trim().parse().ok()?)))
        .map(Some)
        .ok_or_else(|| Error::Value {
            name: "tiles".into(),
            expected: "VxN or colV, e.g. 32x32 or col32".into(),
            got: format!("{s:?}"),
        })
}

/// The forward through the recurrent kernel at tiling (V-block, vec4s per invocation), or
/// the column kernel with V-block columns when vec4s is 0.
fn recurrent_at(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    problem: &Problem,
    inputs: &ForwardInputs<&GpuTensor>,
    (v_block, vec4s): (u32, u32),
) -> Result<wgpu_backend::Forward> {
    use wgpu_backend::decode::{RecurrentStepTiles, StepKernel};
    let tiles = RecurrentStepTiles::all_candidates(ctx, problem)
        .into_iter()
        .find(|t| match t.kernel {
            StepKernel::Column => vec4s == 0 && t.v_block == v_block,
            StepKernel::Workgroup => t.v_block == v_block && t.vec4s_per_thread == vec4s,
            StepKernel::Subgroup => false,
        })
        .ok_or_else(|| Error::Value {
            name: "tiles".into(),
            expected:
                "a recurrent tiling this device fits (V-block dividing V, vec4s a power of two; colV: the column kernel)"
                    .into(),
            got: format!("{v_block}x{vec4s}"),
        })?;
    let o = GpuTensor::empty(ctx, "o", &problem.v_shape(), inputs.v.dtype)?;
    let final_state = GpuTensor::empty(ctx, "final_state", &problem.state_shape(), DType::F32)?;
    let outputs = gdn_wgpu::ForwardOutputs {
        o: &o,
        final_state: &final_state,
    };
    wgpu_backend::RecurrentForward::with_tiles(ctx, problem, inputs, &outputs, tiles)?
        .record(encoder);
    Ok(wgpu_backend::Forward {
        o,
        final_state,
        saved: None,
    })
}

/// The best adapter with the requested limits, the forward's algorithm forced when given.
pub async fn context(default_limits: bool, algorithm: Option<ForwardAlgorithm>) -> Result<Context> {
    let adapter = wgpu_backend::list_adapters()
        .await
        .into_iter()
        .next()
        .ok_or_else(|| Error::NoAdapter("WebGPU gave no adapter".into()))?;
    let limits = if default_limits {
        wgpu::Limits::default()
    } else {
        adapter.limits()
    };
    let config = wgpu_backend::Config {
        forward_algorithm: algorithm,
        ..wgpu_backend::Config::default()
    };
    Context::from_adapter_with_config(adapter, limits, config).await
}

/// Run the demo on `ctx`. `now` is a millisecond clock (performance.now() in the browser).
pub async fn run(ctx: &Context, config: &Config, now: fn() -> f64) -> Result<Report> {
    let c = config;
    let total = c.tokens + c.decode_steps;
    let options = Options {
        l2norm_qk: c.l2norm_qk,
        ..Options::default()
    };
    let whole = Problem::new(
        1,
        total,
        c.heads_qk,
        c.heads_v,
        c.key_dim,
        c.value_dim,
        None,
        options,
    )?;
    let prefill = Problem::new(
        1,
        c.tokens,
        c.heads_qk,
        c.heads_v,
        c.key_dim,
        c.value_dim,
        None,
        options,
    )?;
    let step = Problem::new(
        1,
        1,
        c.heads_qk,
        c.heads_v,
        c.key_dim,
        c.value_dim,
        None,
        options,
    )?;
    let inputs = RandomSpec {
        seed: c.seed,
        ..RandomSpec::default()
    }
    .generate(&whole);

    // The forward over the first T tokens, from the random initial state: `runs` calls, each
    // uploading the inputs, recording, submitting and reading o and the final state back.
    let timer = PassTimer::new(ctx);
    let h0_host = inputs
        .initial_state
        .as_ref()
        .expect("RandomSpec draws an initial state");
    let mut runs_ms = Vec::new();
    let mut runs_gpu_ms = Vec::new();
    let mut last = None;
    for _ in 0..c.runs.max(1) {
        let t0 = now();
        let h0 = GpuTensor::upload(ctx, "initial_state", h0_host)?;
        let prefix = Uploaded::new(ctx, &inputs, 0..c.tokens)?;
        let mut encoder = ctx.create_encoder("demo forward");
        if let Some(t) = &timer {
            t.mark(&mut encoder, 0);
        }
        let fwd_inputs = prefix.inputs(Some(&h0));
        let fwd = match c.tiles {
            None => wgpu_backend::forward(ctx, &mut encoder, &prefill, &fwd_inputs)?,
            Some(tiles) => recurrent_at(ctx, &mut encoder, &prefill, &fwd_inputs, tiles)?,
        };
        if let Some(t) = &timer {
            t.mark(&mut encoder, 1);
            t.resolve(&mut encoder);
        }
        ctx.queue.submit([encoder.finish()]);
        let o_fwd = fwd.o.download(ctx).await?;
        let state_fwd = fwd.final_state.download(ctx).await?;
        let gpu_ms = match &timer {
            Some(t) => Some(t.read_ms(ctx).await?),
            None => None,
        };
        runs_ms.push(now() - t0);
        runs_gpu_ms.extend(gpu_ms);
        last = Some((fwd, o_fwd, state_fwd, gpu_ms));
    }
    let (fwd, o_fwd, state_fwd, fwd_gpu_ms) = last.expect("at least one run");
    let fwd_wall = runs_ms[0];
    let forward_pipelines = ctx.compiled_pipelines();
    let choice = match c.tiles {
        None => wgpu_backend::forward_algorithm(ctx, &prefill, DType::F32)?,
        Some((v, 0)) => wgpu_backend::AlgorithmChoice {
            algorithm: ForwardAlgorithm::Recurrent,
            reason: format!("tiles=col{v} asked for"),
        },
        Some((v, n)) => wgpu_backend::AlgorithmChoice {
            algorithm: ForwardAlgorithm::Recurrent,
            reason: format!("tiles={v}x{n} asked for"),
        },
    };

    // Decode steps with the recurrent kernel, continuing the forward's final state in place.
    let mut decode = None;
    let mut decode_tiles = None;
    if c.decode_steps > 0 {
        let t0 = now();
        let pool = StatePool::from_tensor(fwd.final_state.clone(), StateLayout::of(&step))?;
        let decoder = Decoder::new(ctx, &step, &pool)?;
        decode_tiles = Some(decoder.plan.tiles());
        let tokens = Uploaded::new(ctx, &inputs, c.tokens..total)?;
        let o_all = GpuTensor::empty(
            ctx,
            "o decode",
            &[1, c.decode_steps, c.heads_v, c.value_dim],
            DType::F32,
        )?;
        let mut encoder = ctx.create_encoder("demo decode");
        if let Some(t) = &timer {
            t.mark(&mut encoder, 0);
        }
        for i in 0..c.decode_steps {
            decoder.step(&mut encoder, &tokens, i, &o_all);
        }
        if let Some(t) = &timer {
            t.mark(&mut encoder, 1);
            t.resolve(&mut encoder);
        }
        ctx.queue.submit([encoder.finish()]);
        let o = o_all.download(ctx).await?.data;
        let state = pool.tensor().download(ctx).await?;
        let gpu_ms = match &timer {
            Some(t) => Some(t.read_ms(ctx).await?),
            None => None,
        };
        decode = Some((o, state, gpu_ms, now() - t0));
    }
    ctx.check()?;

    // The oracle over all T + steps tokens (on two v-heads when that would take long).
    let t0 = now();
    let hv = c.heads_v;
    let oracle_heads: Vec<usize> =
        if total * hv * c.key_dim * c.value_dim <= ORACLE_FULL_WORK || hv <= 2 {
            (0..hv).collect()
        } else {
            vec![0, hv - 1]
        };
    let oracle = reference::forward_heads(&whole, &inputs.as_ref(), &oracle_heads)?;
    let oracle_ms = now() - t0;

    // Compare on the checked heads: o is [tokens, HV, V], states [1, HV, K·V].
    let (vd, kv) = (c.value_dim, c.key_dim * c.value_dim);
    let split = c.tokens * hv * vd;
    let rel = |gpu: &[f32], oracle: &[f64], inner: usize| {
        relative_l2(
            &select_heads(gpu, hv, inner, &oracle_heads),
            &select_heads(oracle, hv, inner, &oracle_heads),
        )
    };
    let (checksum, abs_sum) = sums(&o_fwd.data);
    let forward = Phase {
        tokens: c.tokens,
        checksum,
        abs_sum,
        rel_o: rel(&o_fwd.data, &oracle.o[..split], vd),
        // The forward's final state is the oracle's only without decode steps after it.
        rel_state: if c.decode_steps == 0 {
            rel(&state_fwd.data, &oracle.final_state, kv)
        } else {
            f64::NAN
        },
        gpu_ms: fwd_gpu_ms,
        wall_ms: fwd_wall,
        runs_ms,
        runs_gpu_ms,
    };
    let decode = decode.map(|(o, state, gpu_ms, wall_ms)| {
        let (checksum, abs_sum) = sums(&o);
        Phase {
            tokens: c.decode_steps,
            checksum,
            abs_sum,
            rel_o: rel(&o, &oracle.o[split..], vd),
            rel_state: rel(&state.data, &oracle.final_state, kv),
            gpu_ms,
            wall_ms,
            runs_ms: Vec::new(),
            runs_gpu_ms: Vec::new(),
        }
    });
    let mut errors = vec![forward.rel_o];
    match &decode {
        Some(d) => errors.extend([d.rel_o, d.rel_state]),
        None => errors.push(forward.rel_state),
    }
    // NaN (non-finite output) must fail, so it wins over every number.
    let max_rel = errors.iter().copied().fold(0.0, |m: f64, e| {
        if e.is_nan() || m.is_nan() {
            f64::NAN
        } else {
            m.max(e)
        }
    });

    let info = ctx.adapter_info.as_ref();
    let limits = ctx.limits();
    Ok(Report {
        context_ms: 0.0,
        adapter: info.map_or("(unknown)".into(), |i| i.name.clone()),
        backend: info.map_or("(unknown)".into(), |i| format!("{:?}", i.backend)),
        device_type: info.map_or("(unknown)".into(), |i| format!("{:?}", i.device_type)),
        limits: if c.default_limits {
            "WebGPU defaults"
        } else {
            "adapter's"
        },
        workgroup_bytes: limits.max_compute_workgroup_storage_size,
        invocations: limits.max_compute_invocations_per_workgroup,
        storage_buffers: limits.max_storage_buffers_per_shader_stage,
        binding_bytes: limits.max_storage_buffer_binding_size,
        features: ctx
            .features()
            .iter_names()
            .map(|(n, _)| n.to_string())
            .collect(),
        v_block: ctx.tuning().state_scan_v_block(&prefill),
        algorithm: choice.algorithm.name().into(),
        algorithm_reason: choice.reason,
        forward_pipelines,
        decode_tiles: decode_tiles.map(|t| {
            format!(
                "V-block {}, {} invocations, {} B of workgroup memory",
                t.v_block,
                t.workgroup(),
                t.workgroup_bytes()
            )
        }),
        l2norm_qk: c.l2norm_qk,
        forward,
        decode,
        oracle_heads,
        oracle_ms,
        max_rel,
    })
}

fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// JSON numbers cannot be NaN or infinite: those become null.
fn json_num(x: f64) -> String {
    if x.is_finite() {
        format!("{x:e}")
    } else {
        "null".into()
    }
}

fn json_opt(x: Option<f64>) -> String {
    x.map_or("null".into(), json_num)
}

impl Phase {
    fn to_json(&self) -> String {
        let list = |v: &[f64]| v.iter().map(|&x| json_num(x)).collect::<Vec<_>>().join(",");
        format!(
            r#"{{"tokens":{},"checksum":{},"abs_sum":{},"rel_o":{},"rel_state":{},"gpu_ms":{},"wall_ms":{},"runs_ms":[{}],"runs_gpu_ms":[{}]}}"#,
            self.tokens,
            json_num(self.checksum),
            json_num(self.abs_sum),
            json_num(self.rel_o),
            json_num(self.rel_state),
            json_opt(self.gpu_ms),
            json_num(self.wall_ms),
            list(&self.runs_ms),
            list(&self.runs_gpu_ms)
        )
    }
}

impl Report {
    pub fn to_json(&self) -> String {
        let features: Vec<String> = self.features.iter().map(|f| json_str(f)).collect();
        let heads: Vec<String> = self.oracle_heads.iter().map(|h| h.to_string()).collect();
        format!(
            r#"{{"context_ms":{},"adapter":{},"backend":{},"device_type":{},"limits":{},"workgroup_bytes":{},"invocations":{},"storage_buffers":{},"binding_bytes":{},"features":[{}],"v_block":{},"algorithm":{},"algorithm_reason":{},"forward_pipelines":{},"decode_tiles":{},"l2norm_qk":{},"forward":{},"decode":{},"oracle_heads":[{}],"oracle_ms":{},"max_rel":{}}}"#,
            json_num(self.context_ms),
            json_str(&self.adapter),
            json_str(&self.backend),
            json_str(&self.device_type),
            json_str(self.limits),
            self.workgroup_bytes,
            self.invocations,
            self.storage_buffers,
            self.binding_bytes,
            features.join(","),
            self.v_block,
            json_str(&self.algorithm),
            json_str(&self.algorithm_reason),
            self.forward_pipelines,
            self.decode_tiles.as_deref().map_or("null".into(), json_str),
            self.l2norm_qk,
            self.forward.to_json(),
            self.decode.as_ref().map_or("null".into(), Phase::to_json),
            heads.join(","),
            json_num(self.oracle_ms),
            json_num(self.max_rel)
        )
    }
}
