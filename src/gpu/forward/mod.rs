//! The chunked forward on wgpu: prepare_qk (optional l2norm) → prepare_gate (activations and
//! chunk-local gate cumsum) → wy_inverse (gate-free A) → state_scan (states, o, final state).
//! Everything is recorded into the caller's encoder; nothing is submitted or read back here.

mod gate_q;
mod prepare_gate;
mod prepare_qk;
mod state_scan;
mod state_scan_coop;
mod to_half;
mod wy_inverse;

pub use gate_q::gate_q;
pub use prepare_gate::prepare_gate;
pub use prepare_qk::prepare_qk;
pub use state_scan::{ScanBuffers, state_scan};
pub use state_scan_coop::{CoopScanBuffers, STATE_SCAN_COOP_BYTES, state_scan_coop};
pub use to_half::to_half;
pub use wy_inverse::wy_inverse;

use crate::error::{Error, Result};
use crate::gpu::params::{Params, upload_u32};
use crate::gpu::path::ComputePath;
use crate::gpu::{Context, GpuTensor, GpuTimer};
use crate::problem::{CHUNK, ForwardInputs, ForwardOutputs, Problem};
#[cfg(not(target_arch = "wasm32"))]
use crate::tensor::HostTensor;
use crate::tensor::{DType, TensorMeta};

/// What the forward keeps for the backward: the normalized q and k (with `l2norm_qk`), the
/// packed (G, β) per token and v-head, and the gate-free inverse A `[B·T, HV, 64]`.
#[derive(Debug, Clone)]
pub struct Intermediates {
    pub q_normed: Option<GpuTensor>,
    pub k_normed: Option<GpuTensor>,
    /// `[B·T, HV, 2]` f32: chunk-local gate cumsum G and activated β.
    pub gate_beta: GpuTensor,
    /// `[B·T, HV, 64]` f32.
    pub a: GpuTensor,
}

/// A recorded forward: outputs plus intermediates.
#[derive(Debug, Clone)]
pub struct Forward {
    pub o: GpuTensor,
    pub final_state: GpuTensor,
    pub saved: Intermediates,
}

/// Chunk table (start, length) and segment table (start, length, state slot) of a problem.
/// Each sequence is one segment starting from state slot n.
pub fn tables(problem: &Problem) -> (Vec<u32>, Vec<u32>) {
    let chunks = problem
        .chunks()
        .into_iter()
        .flat_map(|c| [c.start as u32, c.len() as u32])
        .collect();
    let segments = problem
        .sequences()
        .into_iter()
        .enumerate()
        .flat_map(|(n, s)| [s.start as u32, s.len() as u32, n as u32])
        .collect();
    (chunks, segments)
}

/// Record a forward pass, allocating o (dtype of v) and the final state (f32).
///
/// Precondition (not checked: it would need a readback): without `gate_in_kernel`, every g is
/// ≤ 0 and finite. [`crate::check_host_values`] checks host tensors.
pub fn forward(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    problem: &Problem,
    inputs: &ForwardInputs<&GpuTensor>,
) -> Result<Forward> {
    let o = GpuTensor::empty(ctx, "o", &problem.v_shape(), inputs.v.dtype)?;
    let final_state = GpuTensor::empty(ctx, "final_state", &problem.state_shape(), DType::F32)?;
    let saved = forward_into(
        ctx,
        encoder,
        problem,
        inputs,
        &ForwardOutputs {
            o: &o,
            final_state: &final_state,
        },
    )?;
    Ok(Forward {
        o,
        final_state,
        saved,
    })
}

/// Record a forward pass into caller-provided outputs (e.g. poisoned buffers in tests, or a
/// state pool entry). The final state is first set from `initial_state` (or zeros).
pub fn forward_into(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    problem: &Problem,
    inputs: &ForwardInputs<&GpuTensor>,
    outputs: &ForwardOutputs<&GpuTensor>,
) -> Result<Intermediates> {
    record_forward(ctx, encoder, problem, inputs, outputs, None, None)
}

/// [`forward_into`] on a given compute path (instead of the context's choice); a path this
/// device or problem cannot run is an `Error::Unsupported`. For tests and benchmarks that
/// compare paths on one context.
pub fn forward_into_with_path(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    problem: &Problem,
    inputs: &ForwardInputs<&GpuTensor>,
    outputs: &ForwardOutputs<&GpuTensor>,
    path: ComputePath,
) -> Result<Intermediates> {
    record_forward(ctx, encoder, problem, inputs, outputs, None, Some(path))
}

/// [`forward_into`] with a timestamp after each pass (labelled with the pass name) for a
/// per-pass breakdown; mark the start yourself before calling.
pub fn forward_into_profiled(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    problem: &Problem,
    inputs: &ForwardInputs<&GpuTensor>,
    outputs: &ForwardOutputs<&GpuTensor>,
    timer: &GpuTimer,
) -> Result<Intermediates> {
    record_forward(ctx, encoder, problem, inputs, outputs, Some(timer), None)
}

fn record_forward(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    problem: &Problem,
    inputs: &ForwardInputs<&GpuTensor>,
    outputs: &ForwardOutputs<&GpuTensor>,
    timer: Option<&GpuTimer>,
    path: Option<ComputePath>,
) -> Result<Intermediates> {
    let mark = |encoder: &mut wgpu::CommandEncoder, label| {
        if let Some(t) = timer {
            t.mark(encoder, label);
        }
    };
    ctx.check()?;
    problem.check_inputs(inputs, &ctx.forward_storage_dtypes())?;
    if outputs.o.shape() != problem.v_shape() {
        return Err(Error::shape("o", &problem.v_shape(), outputs.o.shape()));
    }
    if outputs.o.dtype != inputs.v.dtype {
        return Err(Error::DType {
            name: "o".into(),
            expected: inputs.v.dtype.to_string(),
            got: outputs.o.dtype.to_string(),
        });
    }
    if outputs.final_state.shape() != problem.state_shape() {
        return Err(Error::shape(
            "final_state",
            &problem.state_shape(),
            outputs.final_state.shape(),
        ));
    }
    if outputs.final_state.dtype != DType::F32 {
        return Err(Error::DType {
            name: "final_state".into(),
            expected: "F32".into(),
            got: outputs.final_state.dtype.to_string(),
        });
    }

    let (bt, hv) = (problem.total_tokens(), problem.heads_v);
    let (chunk_table, segment_table) = tables(problem);
    let num_chunks = chunk_table.len() / 2;
    let num_segments = segment_table.len() / 3;
    let params = Params::for_problem(problem, num_chunks, num_segments).upload(ctx);
    let chunks = upload_u32(ctx, "chunks", &chunk_table);
    let segments = upload_u32(ctx, "segments", &segment_table);

    // The scan updates the state in place, so it starts as a copy of h0 (the caller's h0 is
    // never modified).
    match inputs.initial_state {
        Some(h0) => {
            encoder.copy_buffer_to_buffer(&h0.buffer, 0, &outputs.final_state.buffer, 0, h0.bytes())
        }
        None => encoder.clear_buffer(&outputs.final_state.buffer, 0, None),
    }

    let (q_normed, k_normed) = if problem.options.l2norm_qk {
        let qn = GpuTensor::empty(ctx, "q_normed", inputs.q.shape(), inputs.q.dtype)?;
        let kn = GpuTensor::empty(ctx, "k_normed", inputs.k.shape(), inputs.k.dtype)?;
        prepare_qk(ctx, encoder, &params, inputs.q, &qn)?;
        prepare_qk(ctx, encoder, &params, inputs.k, &kn)?;
        mark(encoder, "prepare_qk");
        (Some(qn), Some(kn))
    } else {
        (None, None)
    };
    let q = q_normed.as_ref().unwrap_or(inputs.q);
    let k = k_normed.as_ref().unwrap_or(inputs.k);

    let gate_params = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("gate_params"),
        size: (8 * hv) as u64,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    if let (Some(a_log), Some(dt_bias)) = (inputs.a_log, inputs.dt_bias) {
        encoder.copy_buffer_to_buffer(&a_log.buffer, 0, &gate_params, 0, (4 * hv) as u64);
        encoder.copy_buffer_to_buffer(
            &dt_bias.buffer,
            0,
            &gate_params,
            (4 * hv) as u64,
            (4 * hv) as u64,
        );
    }
    let gate_beta = GpuTensor::empty(ctx, "gate_beta", &[bt, hv, 2], DType::F32)?;
    prepare_gate(
        ctx,
        encoder,
        &params,
        inputs.g,
        inputs.beta,
        &gate_params,
        &chunks,
        num_chunks,
        hv,
        &gate_beta,
    )?;
    mark(encoder, "prepare_gate");

    let a = GpuTensor::empty(ctx, "wy_inverse", &[bt, hv, CHUNK], DType::F32)?;
    let path = ctx
        .path_support()
        .choose(problem, inputs.q.dtype, path.or(ctx.forced_compute_path()))?
        .path;
    match path {
        ComputePath::Scalar | ComputePath::F16Math => {
            // Forward-only scratch (not kept for the backward): the scan's gated matrices.
            let gated = GpuTensor::empty(ctx, "gated", &[bt, hv, 2 * CHUNK], DType::F32)?;
            wy_inverse(
                ctx, encoder, &params, k, q, &gate_beta, &chunks, num_chunks, hv, &a, &gated,
            )?;
            mark(encoder, "wy_inverse");
            let v_block = ctx.tuning.state_scan_v_block(problem);
            let bufs = ScanBuffers {
                q,
                k,
                v: inputs.v,
                gate_beta: &gate_beta,
                gated: &gated,
                segments: &segments,
                state: outputs.final_state,
                o: outputs.o,
            };
            // The f16-math path differs from the scalar one only in the scan's operand math.
            let math = match path {
                ComputePath::F16Math => state_scan::ScanMath::F16,
                _ => state_scan::ScanMath::F32,
            };
            state_scan::state_scan_with_math(
                ctx,
                encoder,
                &params,
                &bufs,
                num_segments,
                hv,
                problem.key_dim,
                problem.value_dim,
                v_block,
                math,
            )?;
            mark(encoder, "state_scan");
        }
        ComputePath::CoopMatrix => {
            // f16 GEMM operands, each with one chunk of padding rows so 64-row tiles starting
            // at any token stay inside their buffers (the padding is zeroed).
            let gated16 =
                GpuTensor::empty(ctx, "gated16", &[bt + CHUNK, hv, 2 * CHUNK], DType::F16)?;
            encoder.clear_buffer(&gated16.buffer, (bt * hv * 2 * CHUNK * 2) as u64, None);
            wy_inverse(
                ctx, encoder, &params, k, q, &gate_beta, &chunks, num_chunks, hv, &a, &gated16,
            )?;
            mark(encoder, "wy_inverse");
            let k16 = GpuTensor::empty(
                ctx,
                "k16",
                &[bt + CHUNK, problem.heads_qk, problem.key_dim],
                DType::F16,
            )?;
            let qg16 =
                GpuTensor::empty(ctx, "qg16", &[bt + CHUNK, hv, problem.key_dim], DType::F16)?;
            to_half(ctx, encoder, &params, k, &k16)?;
            gate_q(ctx, encoder, &params, q, &gate_beta, &qg16)?;
            mark(encoder, "to_half");
            let bufs = CoopScanBuffers {
                qg16: &qg16,
                k16: &k16,
                v: inputs.v,
                gate_beta: &gate_beta,
                gated16: &gated16,
                segments: &segments,
                state: outputs.final_state,
                o: outputs.o,
            };
            state_scan_coop(ctx, encoder, &params, &bufs, num_segments, hv)?;
            mark(encoder, "state_scan_coop");
        }
    }

    Ok(Intermediates {
        q_normed,
        k_normed,
        gate_beta,
        a,
    })
}

/// Upload host inputs, run the forward, wait, and download o (in v's dtype) and the final
/// state. Checks host values first (finite, g ≤ 0). Native only; a convenience for the CLI and
/// examples, not for hot paths.
#[cfg(not(target_arch = "wasm32"))]
pub fn forward_host(
    ctx: &Context,
    problem: &Problem,
    inputs: &ForwardInputs<&HostTensor>,
) -> Result<ForwardOutputs<HostTensor>> {
    problem.check_inputs(inputs, &ctx.forward_storage_dtypes())?;
    crate::problem::check_host_values(problem, inputs)?;
    let gpu_inputs = crate::gpu::upload_inputs(ctx, inputs)?;
    let mut encoder = ctx.create_encoder("gdn forward");
    let fwd = forward(ctx, &mut encoder, problem, &gpu_inputs.as_ref())?;
    ctx.submit_and_wait(encoder)?;
    Ok(ForwardOutputs {
        o: fwd.o.download_blocking(ctx)?,
        final_state: fwd.final_state.download_blocking(ctx)?,
    })
}
