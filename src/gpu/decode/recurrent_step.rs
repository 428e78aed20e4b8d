//! Launcher of `shaders/decode/recurrent_step.wgsl`: the token-by-token recurrence over a
//! state pool. A [`DecodePlan`] holds everything a step needs (pipeline, bind group, uniform
//! tables), so recording a step is one compute pass: the decode hot path allocates nothing.

use wgpu::util::DeviceExt;

use crate::error::{Error, Result};
use crate::gpu::decode::pool::{StatePool, StateSlot, check_slots};
use crate::gpu::params::{Params, bind};
use crate::gpu::shaders::{Pass, source};
use crate::gpu::{Context, GpuTensor};
use crate::problem::{ForwardInputs, Problem};

/// u32 words of the kernel's uniform `tables` (64 KiB: WebGPU's default uniform binding size).
pub const TABLE_WORDS: usize = 16384;
/// vec4 registers of state per invocation: the kernel's eight named registers s0..s7.
pub const MAX_ROWS_PER_THREAD: u32 = 8;
/// Largest workgroup the tile choice uses (every WebGPU device allows 256).
pub const MAX_WORKGROUP: u32 = 256;

/// The largest number of sequences one call can address: the tables hold N + 1 token
/// starts, N slot codes and A_log, dt_bias (HV each).
pub fn max_sequences(heads_v: usize) -> usize {
    (TABLE_WORDS - 1).saturating_sub(2 * heads_v) / 2
}

/// The outputs of a decode call.
#[derive(Debug, Clone, Copy)]
pub struct DecodeOutputs<'a> {
    /// `[B, T, HV, V]`, in the dtype of v.
    pub o: &'a GpuTensor,
    /// `[B·T, HV, K, V]` (the pool's layout), f32: the state after every token, so a server
    /// can accept the first k of T draft tokens. `None` skips the extra writes.
    pub per_token_states: Option<&'a GpuTensor>,
}

/// Tile sizes of `recurrent_step` (WGSL override constants). An invocation owns
/// `rows_per_thread` vec4s of a K × `v_block` state slice; see the shader's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecurrentStepTiles {
    pub v_block: u32,
    /// Invocations along the slice's non-contiguous axis (k rows for K-first, v rows for
    /// V-first); the contiguous axis takes `row_vecs` invocations of one vec4 each.
    pub row_lanes: u32,
    pub row_vecs: u32,
    pub rows_per_thread: u32,
    pub v_first: bool,
    key_dim: u32,
}

impl RecurrentStepTiles {
    fn new(key_dim: u32, v_block: u32, row_lanes: u32, v_first: bool) -> Option<Self> {
        let (row_vecs, rows) = if v_first {
            (key_dim / 4, v_block)
        } else {
            (v_block / 4, key_dim)
        };
        if !v_block.is_multiple_of(4) || !rows.is_multiple_of(row_lanes) {
            return None;
        }
        let tiles = RecurrentStepTiles {
            v_block,
            row_lanes,
            row_vecs,
            rows_per_thread: rows / row_lanes,
            v_first,
            key_dim,
        };
        (tiles.rows_per_thread <= MAX_ROWS_PER_THREAD && tiles.workgroup() <= MAX_WORKGROUP)
            .then_some(tiles)
    }

    /// Invocations per workgroup.
    pub fn workgroup(&self) -> u32 {
        self.row_vecs * self.row_lanes
    }

    /// Partial sums per result of the per-token reduction.
    fn lanes(&self) -> u32 {
        if self.v_first {
            self.row_vecs
        } else {
            self.row_lanes
        }
    }

    /// Results of the per-token reduction: a and b per column, then Σk², Σq², k·q.
    fn results(&self) -> u32 {
        2 * self.v_block + 3
    }

    /// Bytes of workgroup memory (k of two tokens, q, v, u, partials, sums, gate).
    pub fn workgroup_bytes(&self) -> u32 {
        4 * (3 * self.key_dim
            + 2 * self.v_block
            + self.lanes() * self.results()
            + self.results()
            + 2)
    }

    /// Every tiling of `problem` the device fits, for tests and benchmarks.
    pub fn candidates(limits: &wgpu::Limits, problem: &Problem) -> Vec<Self> {
        let (k, v) = (problem.key_dim as u32, problem.value_dim as u32);
        let v_first = problem.options.state_v_first;
        let max_wg = MAX_WORKGROUP
            .min(limits.max_compute_invocations_per_workgroup)
            .min(limits.max_compute_workgroup_size_x);
        let mut out = Vec::new();
        for v_block in [4u32, 8, 16, 32, 64, 128] {
            if v % v_block != 0 {
                continue;
            }
            for row_lanes in (0..9).map(|i| 1u32 << i) {
                let Some(t) = Self::new(k, v_block, row_lanes, v_first) else {
                    continue;
                };
                if t.workgroup() <= max_wg
                    && t.workgroup_bytes() <= limits.max_compute_workgroup_storage_size
                {
                    out.push(t);
                }
            }
        }
        out
    }

    /// The default tiling: about 8 vec4s of state per invocation (32 registers) when there is
    /// enough state to keep the GPU's memory system busy, fewer — spreading the state over
    /// more invocations — when there is not (B = 1), and workgroups near 128 invocations.
    /// K-first prefers slices of ≥ 32 columns (128-byte row segments).
    pub fn choose(limits: &wgpu::Limits, problem: &Problem) -> Result<Self> {
        let total_vec4s =
            problem.num_sequences() * problem.heads_v * problem.key_dim * problem.value_dim / 4;
        // 65536 invocations is a fraction of a big GPU but already far more than B = 1 fills.
        let target = (total_vec4s / 65536).clamp(1, 8).next_power_of_two().min(8) as f64;
        let score = |t: &Self| {
            let registers = (t.rows_per_thread as f64 / target).log2().abs();
            let size = (t.workgroup() as f64 / 128.0).log2().abs();
            let short_rows = if !t.v_first && t.row_vecs < 8 {
                0.5
            } else {
                0.0
            };
            registers + 0.5 * size + short_rows
        };
        Self::candidates(limits, problem)
            .into_iter()
            .min_by(|a, b| score(a).total_cmp(&score(b)))
            .ok_or_else(|| {
                Error::unsupported(
                    "device",
                    format!(
                        "no decode tiling for K = {} within the workgroup limits",
                        problem.key_dim
                    ),
                )
            })
    }

    /// The pipeline's override constants (public so the shader tests specialize every tiling).
    pub fn pipeline_constants(&self, per_token_states: bool) -> [(&'static str, f64); 9] {
        let bool_constant = |b: bool| if b { 1.0 } else { 0.0 };
        [
            ("WG", self.workgroup() as f64),
            ("K_DIM", self.key_dim as f64),
            ("V_BLOCK", self.v_block as f64),
            ("ROW_LANES", self.row_lanes as f64),
            ("V_FIRST", bool_constant(self.v_first)),
            ("PER_TOKEN_STATES", bool_constant(per_token_states)),
            ("K_WORDS", (2 * self.key_dim) as f64),
            ("PARTIAL_WORDS", (self.lanes() * self.results()) as f64),
            ("RESULTS", self.results() as f64),
        ]
    }
}

/// A prepared decode step: record it once per step with [`DecodePlan::record`]. It binds the
/// given tensors; refill them (e.g. `queue.write_buffer` of the next token's q, k, v, g,
/// beta) between steps.
pub struct DecodePlan {
    pipeline: wgpu::ComputePipeline,
    bind_group: wgpu::BindGroup,
    tables: wgpu::Buffer,
    /// (A_log, dt_bias) and their word offset in the tables, with `gate_in_kernel`.
    gate_params: Option<(wgpu::Buffer, wgpu::Buffer, u64)>,
    grid: (u32, u32, u32),
    heads_v: usize,
    pool_slots: usize,
    slots: Vec<StateSlot>,
    tiles: RecurrentStepTiles,
}

impl DecodePlan {
    /// Validate and prepare a step over `problem`'s tokens with the default tiling.
    pub fn new(
        ctx: &Context,
        problem: &Problem,
        inputs: &ForwardInputs<&GpuTensor>,
        pool: &StatePool,
        slots: &[StateSlot],
        outputs: &DecodeOutputs<'_>,
    ) -> Result<Self> {
        let tiles = RecurrentStepTiles::choose(&ctx.limits(), problem)?;
        Self::with_tiles(ctx, problem, inputs, pool, slots, outputs, tiles)
    }

    /// [`DecodePlan::new`] with a given tiling (one of [`RecurrentStepTiles::candidates`]).
    pub fn with_tiles(
        ctx: &Context,
        problem: &Problem,
        inputs: &ForwardInputs<&GpuTensor>,
        pool: &StatePool,
        slots: &[StateSlot],
        outputs: &DecodeOutputs<'_>,
        tiles: RecurrentStepTiles,
    ) -> Result<Self> {
        ctx.check()?;
        super::check_decode(ctx, problem, inputs, pool, slots, outputs)?;
        if !RecurrentStepTiles::candidates(&ctx.limits(), problem).contains(&tiles) {
            return Err(Error::value(
                "tiles",
                "a tiling from RecurrentStepTiles::candidates for this problem and device",
                format!("{tiles:?}"),
            ));
        }

        let n = problem.num_sequences();
        let hv = problem.heads_v;
        let mut params = Params::for_problem(problem, 0, n);
        params.rows = pool.slots() as u32;
        let params = params.upload(ctx);

        // Token starts, slot codes, then A_log and dt_bias (copied in by `record`).
        let mut words = vec![0u32; TABLE_WORDS];
        let starts = problem
            .sequences()
            .into_iter()
            .map(|s| s.start as u32)
            .chain([problem.total_tokens() as u32]);
        for (w, start) in words.iter_mut().zip(starts) {
            *w = start;
        }
        for (w, s) in words[n + 1..].iter_mut().zip(slots) {
            *w = s.code() as u32;
        }
        let tables = ctx
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("decode tables"),
                contents: bytemuck::cast_slice(&words),
                usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            });
        let gate_params = match (inputs.a_log, inputs.dt_bias) {
            (Some(a), Some(d)) => Some((a.buffer.clone(), d.buffer.clone(), (2 * n + 1) as u64)),
            _ => None,
        };

        let per_token = outputs.per_token_states.map(|t| t.buffer.clone());
        // The binding exists whether or not the kernel writes it; 16 bytes = one vec4.
        let no_token_states = || {
            ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("no per-token states"),
                size: 16,
                usage: wgpu::BufferUsages::STORAGE,
                mapped_at_creation: false,
            })
        };
        let token_states = per_token.unwrap_or_else(no_token_states);

        let constants = tiles.pipeline_constants(outputs.per_token_states.is_some());
        let pipeline = ctx.pipelines.get(
            source(Pass::RecurrentStep, inputs.q.dtype)?,
            "recurrent_step",
            &constants,
        );
        let bind_group = bind(
            ctx,
            &pipeline,
            "recurrent_step",
            &[
                &params,
                &tables,
                &inputs.q.buffer,
                &inputs.k.buffer,
                &inputs.v.buffer,
                &inputs.g.buffer,
                &inputs.beta.buffer,
                &pool.tensor().buffer,
                &outputs.o.buffer,
                &token_states,
            ],
        );
        let grid = (
            (problem.value_dim as u32) / tiles.v_block,
            hv as u32,
            n as u32,
        );
        Ok(DecodePlan {
            pipeline,
            bind_group,
            tables,
            gate_params,
            grid,
            heads_v: hv,
            pool_slots: pool.slots(),
            slots: slots.to_vec(),
            tiles,
        })
    }

    /// Use other slots from the next submission on (`queue.write_buffer`: it lands before the
    /// next `queue.submit`'s commands, so steps with different slots need separate submits
    /// or separate plans). Validated like the plan; on error nothing changes.
    pub fn set_slots(&mut self, ctx: &Context, slots: &[StateSlot]) -> Result<()> {
        check_slots(slots, self.slots.len(), self.pool_slots)?;
        if slots != self.slots {
            let codes: Vec<i32> = slots.iter().map(|s| s.code()).collect();
            ctx.queue.write_buffer(
                &self.tables,
                4 * (slots.len() as u64 + 1),
                bytemuck::cast_slice(&codes),
            );
            self.slots = slots.to_vec();
        }
        Ok(())
    }

    /// The slots the plan's steps use.
    pub fn slots(&self) -> &[StateSlot] {
        &self.slots
    }

    pub fn tiles(&self) -> RecurrentStepTiles {
        self.tiles
    }

    /// Record one step: one compute pass (plus, with `gate_in_kernel`, two small copies of
    /// A_log and dt_bias into the uniform tables, since a ninth storage binding would exceed
    /// WebGPU's default of 8).
    pub fn record(&self, encoder: &mut wgpu::CommandEncoder) {
        if let Some((a_log, dt_bias, word)) = &self.gate_params {
            let bytes = 4 * self.heads_v as u64;
            encoder.copy_buffer_to_buffer(a_log, 0, &self.tables, 4 * word, bytes);
            encoder.copy_buffer_to_buffer(dt_bias, 0, &self.tables, 4 * word + bytes, bytes);
        }
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("recurrent_step"),
            timestamp_writes: None,
        });
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        pass.dispatch_workgroups(self.grid.0, self.grid.1, self.grid.2);
    }
}
