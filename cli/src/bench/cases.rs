//! One timed case per op and backend: buffers prepared once (pipelines compile on the first
//! warm-up run and stay cached), then `record` per repetition. Each op is one `prepare_*`
//! function; wiring a new op or backend means adding one here and one check in `check.rs`.

use crate::bench::BenchError;
use crate::bench::inputs::{gpu_inputs, host_inputs, normal};
use crate::bench::metrics::Op;
use gdn_wgpu::tensor::{DType, HostTensor};
use gdn_wgpu::wgpu_backend::backward::{self, BackwardMemory, BackwardWorkspace};
use gdn_wgpu::wgpu_backend::decode::{RecurrentStepTiles, StatePool, StateSlot};
use gdn_wgpu::wgpu_backend::{
    self, Context, DecodeOutputs, DecodePlan, ForwardAlgorithm, GpuTensor, GpuTimer, Saved,
};
use gdn_wgpu::{ForwardInputs, ForwardOutputs, Gradients, Problem};

/// A prepared GPU case.
pub trait GpuCase {
    /// Copies of the inputs that repetitions rotate through.
    fn sets(&self) -> usize;
    /// Record one run on input set `set` (timestamps after each pass when `timer` is given).
    fn record(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        set: usize,
        timer: Option<&GpuTimer>,
    ) -> gdn_wgpu::Result<()>;

    /// The label of the timer's closing mark: "tail" (the copies after the last pass's own
    /// mark), or the last pass's name for a case that leaves its end to that mark — one
    /// timestamp less, whose cost (~2 µs on the H200) would otherwise count as GPU time.
    fn closing_label(&self) -> &'static str {
        "tail"
    }

    /// The backward: what one call holds, counted from the buffers the library allocated
    /// (`backward::backward_memory`), and the plan's budget and windows.
    fn backward_memory(&self) -> Option<(BackwardMemory, Option<u64>, usize)> {
        None
    }

    /// The segmented chunked forward: which path its (segment, v-head) pairs took in the
    /// last recorded call (reads the device's counts back; call after the timing).
    fn segment_paths(&self) -> gdn_wgpu::Result<Option<wgpu_backend::SegmentPaths>> {
        Ok(None)
    }

    /// Decode: the first input set's state pool (buffer, bytes), which the bench's copy
    /// ceiling copies.
    fn pool(&self) -> Option<(&wgpu::Buffer, u64)> {
        None
    }
}

/// Host inputs of one (heads, sequences) shape, generated once and shared by forward and
/// backward.
pub struct HostCase {
    /// The shape.
    pub problem: Problem,
    /// Random inputs for it, rounded to `dtype`.
    pub inputs: ForwardInputs<HostTensor>,
    /// Storage dtype of q, k, v.
    pub dtype: DType,
}

impl HostCase {
    /// Random inputs of `problem` in `dtype` from `seed`.
    pub fn new(problem: Problem, dtype: DType, seed: u64) -> Self {
        let inputs = host_inputs(&problem, dtype, seed);
        HostCase {
            problem,
            inputs,
            dtype,
        }
    }
}

/// The chunked forward's scratch, or the recurrent kernel prepared once per input set.
enum ForwardRun {
    Chunked(Box<wgpu_backend::ForwardWorkspace>),
    Recurrent(Vec<wgpu_backend::RecurrentForward>),
}

struct ForwardCase<'a> {
    ctx: &'a Context,
    problem: Problem,
    sets: Vec<ForwardInputs<GpuTensor>>,
    o: GpuTensor,
    state: GpuTensor,
    run: ForwardRun,
}

impl GpuCase for ForwardCase<'_> {
    fn sets(&self) -> usize {
        self.sets.len()
    }

    fn record(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        set: usize,
        timer: Option<&GpuTimer>,
    ) -> gdn_wgpu::Result<()> {
        let inputs = self.sets[set].as_ref();
        let outputs = ForwardOutputs {
            o: &self.o,
            final_state: &self.state,
        };
        match &self.run {
            ForwardRun::Chunked(workspace) => {
                wgpu_backend::forward_into_workspace(
                    self.ctx,
                    encoder,
                    &self.problem,
                    &inputs,
                    &outputs,
                    workspace,
                    timer,
                )?;
            }
            ForwardRun::Recurrent(plans) => {
                plans[set].record(encoder);
                if let Some(t) = timer {
                    t.mark(encoder, "recurrent_step");
                }
            }
        }
        Ok(())
    }

    fn segment_paths(&self) -> gdn_wgpu::Result<Option<wgpu_backend::SegmentPaths>> {
        match &self.run {
            ForwardRun::Chunked(workspace) => workspace.segment_paths(self.ctx),
            ForwardRun::Recurrent(_) => Ok(None),
        }
    }
}

/// The forward into preallocated o and final state, on the algorithm the context chooses
/// (`wgpu_backend::forward_algorithm`), as a serving loop would run it: the chunked one with its
/// scratch in a workspace made once per case (`wgpu_backend::forward_into_workspace`;
/// allocating ~GBs of scratch per call dominated the host time of large cases), the recurrent
/// one prepared once per input set (`wgpu_backend::RecurrentForward`).
pub fn prepare_forward<'a>(
    ctx: &'a Context,
    host: &HostCase,
    sets: usize,
) -> Result<Box<dyn GpuCase + 'a>, BenchError> {
    let p = &host.problem;
    let sets = (0..sets)
        .map(|_| gpu_inputs(ctx, &host.inputs))
        .collect::<gdn_wgpu::Result<Vec<_>>>()?;
    let o = GpuTensor::empty(ctx, "o", &p.v_shape(), host.dtype)?;
    let state = GpuTensor::empty(ctx, "final_state", &p.state_shape(), DType::F32)?;
    let run = match wgpu_backend::forward_algorithm(ctx, p, host.dtype)?.algorithm {
        ForwardAlgorithm::Chunked => ForwardRun::Chunked(Box::new(
            wgpu_backend::ForwardWorkspace::new(ctx, p, host.dtype)?,
        )),
        ForwardAlgorithm::Recurrent => {
            let outputs = ForwardOutputs {
                o: &o,
                final_state: &state,
            };
            let plans = sets
                .iter()
                .map(|inputs| {
                    wgpu_backend::RecurrentForward::new(ctx, p, &inputs.as_ref(), &outputs)
                })
                .collect::<gdn_wgpu::Result<Vec<_>>>()?;
            ForwardRun::Recurrent(plans)
        }
    };
    Ok(Box::new(ForwardCase {
        ctx,
        problem: p.clone(),
        sets,
        o,
        state,
        run,
    }))
}

/// One input set of the backward: its saved forward context, upstream gradients and the
/// gradients it writes.
struct BackwardSet {
    saved: Saved,
    d_o: GpuTensor,
    dht: GpuTensor,
    grads: Gradients<GpuTensor>,
}

struct BackwardCase<'a> {
    ctx: &'a Context,
    workspace: BackwardWorkspace,
    sets: Vec<BackwardSet>,
}

impl GpuCase for BackwardCase<'_> {
    fn sets(&self) -> usize {
        self.sets.len()
    }

    fn record(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        set: usize,
        timer: Option<&GpuTimer>,
    ) -> gdn_wgpu::Result<()> {
        let s = &self.sets[set];
        wgpu_backend::backward_into_workspace(
            self.ctx,
            encoder,
            &s.saved,
            &s.d_o,
            Some(&s.dht),
            &backward::gradients_ref(&s.grads),
            &self.workspace,
            timer,
        )
    }

    fn backward_memory(&self) -> Option<(BackwardMemory, Option<u64>, usize)> {
        let s = self.sets.first()?;
        let memory = backward::backward_memory(
            &s.saved,
            &s.d_o,
            Some(&s.dht),
            &backward::gradients_ref(&s.grads),
            &self.workspace,
        );
        let plan = self.workspace.plan();
        Some((memory, plan.budget(), plan.windows()))
    }
}

/// The backward alone: a workspace planned for the context's budget (`GDN_BACKWARD_BUDGET`,
/// `--backward-budget`) made once; the forward that produces each input set's saved context
/// runs in its windows during preparation (not timed); each repetition records the backward
/// through the workspace into gradients allocated once (no allocation per call).
pub fn prepare_backward<'a>(
    ctx: &'a Context,
    host: &HostCase,
    sets: usize,
    seed: u64,
) -> Result<Box<dyn GpuCase + 'a>, BenchError> {
    let p = &host.problem;
    let workspace = BackwardWorkspace::new(ctx, p, host.dtype)?;
    let d_o = normal(&p.v_shape(), 1.0, seed ^ 0xd0).with_dtype(host.dtype);
    let dht = normal(&p.state_shape(), 0.5, seed ^ 0xd7);
    let mut prepared = Vec::with_capacity(sets);
    for _ in 0..sets {
        let inputs = gpu_inputs(ctx, &host.inputs)?;
        let mut encoder = ctx.create_encoder("bench backward setup");
        let (_, saved) = wgpu_backend::forward_saved_for(
            ctx,
            &mut encoder,
            p,
            &inputs.as_ref(),
            workspace.plan(),
        )?;
        ctx.submit_and_wait(encoder)?;
        let grads = backward::alloc_gradients(ctx, &saved)?;
        prepared.push(BackwardSet {
            saved,
            d_o: GpuTensor::upload(ctx, "do", &d_o)?,
            dht: GpuTensor::upload(ctx, "dht", &dht)?,
            grads,
        });
    }
    Ok(Box::new(BackwardCase {
        ctx,
        workspace,
        sets: prepared,
    }))
}

struct DecodeCase {
    /// Each plan binds its own inputs, pool and o (the bind groups keep the buffers alive).
    plans: Vec<DecodePlan>,
    /// The first plan's pool.
    pool: StatePool,
}

impl GpuCase for DecodeCase {
    fn sets(&self) -> usize {
        self.plans.len()
    }

    fn record(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        set: usize,
        _timer: Option<&GpuTimer>,
    ) -> gdn_wgpu::Result<()> {
        // The step is one pass: the bench's closing mark ends it (`closing_label`).
        self.plans[set].record(encoder);
        Ok(())
    }

    fn closing_label(&self) -> &'static str {
        self.plans[0].tiles().entry()
    }

    fn pool(&self) -> Option<(&wgpu::Buffer, u64)> {
        let t = self.pool.tensor();
        Some((&t.buffer, t.bytes()))
    }
}

/// One decode step (`problem`: B sequences × 1 token) over a pool of B slots holding random
/// states (stored as `pool_dtype`), every sequence resuming its slot in place; a `DecodePlan`
/// per input set, so a repetition is one compute pass, as in a serving loop.
pub fn prepare_decode(
    ctx: &Context,
    host: &HostCase,
    tiles: RecurrentStepTiles,
    pool_dtype: DType,
    sets: usize,
) -> Result<Box<dyn GpuCase>, BenchError> {
    let p = &host.problem;
    let h0 = host
        .inputs
        .initial_state
        .as_ref()
        .expect("bench inputs have an initial state");
    let step = ForwardInputs {
        initial_state: None,
        ..host.inputs.clone()
    };
    let slots: Vec<StateSlot> = (0..p.num_sequences() as u32)
        .map(StateSlot::Resume)
        .collect();
    let mut plans = Vec::with_capacity(sets);
    let mut first_pool = None;
    for _ in 0..sets {
        let inputs = gpu_inputs(ctx, &step)?;
        let pool = StatePool::from_tensor(
            GpuTensor::from_values(ctx, "pool", &h0.shape, pool_dtype, &h0.data)?,
            wgpu_backend::StateLayout::of(p),
        )?;
        let o = GpuTensor::empty(ctx, "o", &p.v_shape(), host.dtype)?;
        let outputs = DecodeOutputs {
            o: &o,
            per_token_states: None,
        };
        plans.push(DecodePlan::with_tiles(
            ctx,
            p,
            &inputs.as_ref(),
            &pool,
            &slots,
            &outputs,
            tiles,
        )?);
        first_pool.get_or_insert(pool);
    }
    let pool = first_pool.expect("a decode case has at least one input set");
    Ok(Box::new(DecodeCase { plans, pool }))
}

/// The case of `op` with `sets` input copies; decode runs at `tiles` (the device's choice when
/// `None`) on a pool stored as `pool`.
pub fn prepare<'a>(
    ctx: &'a Context,
    op: Op,
    host: &HostCase,
    tiles: Option<RecurrentStepTiles>,
    pool: DType,
    sets: usize,
    seed: u64,
) -> Result<Box<dyn GpuCase + 'a>, BenchError> {
    match op {
        Op::Forward => prepare_forward(ctx, host, sets),
        Op::Backward => prepare_backward(ctx, host, sets, seed),
        Op::Decode => {
            let tiles = match tiles {
                Some(t) => t,
                None => RecurrentStepTiles::choose_for(ctx, &host.problem)?,
            };
            prepare_decode(ctx, host, tiles, pool, sets)
        }
    }
}

/// One run of `op` through a backend's host entry points (upload, run, wait, download): how
/// backends without GPU timing here are timed. The cpu backend is the oracle itself, so it
/// has no correctness gate.
pub fn run_host(
    backend: &dyn gdn_wgpu::Backend,
    op: Op,
    host: &HostCase,
    seed: u64,
) -> gdn_wgpu::Result<()> {
    let (p, inputs) = (&host.problem, host.inputs.as_ref());
    match op {
        Op::Forward => drop(backend.forward(p, &inputs)?),
        Op::Decode => drop(backend.decode(p, &inputs, 1)?),
        Op::Backward => {
            let d_o = normal(&p.v_shape(), 1.0, seed ^ 0xd0).with_dtype(host.dtype);
            let dht = normal(&p.state_shape(), 0.5, seed ^ 0xd7);
            drop(backend.forward_backward(p, &inputs, &d_o, Some(&dht))?);
        }
    }
    Ok(())
}
