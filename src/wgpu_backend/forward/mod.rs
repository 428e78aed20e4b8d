//! The forward on wgpu. The chunked algorithm: prepare_qk (optional l2norm) → prepare_gate
//! (activations and chunk-local gate cumsum) → wy_inverse (gate-free A) → state_scan (states,
//! o, final state); or, chosen per call ([`forward_algorithm`]), the recurrent kernel
//! ([`RecurrentForward`]). Everything is recorded into the caller's encoder; nothing is
//! submitted or read back here.

mod gate_q;
mod prepare_gate;
mod prepare_qk;
mod recurrent;
mod segment_combine;
mod state_scan;
mod state_scan_coop;
mod to_half;
mod workspace;
mod wy_inverse;

pub use crate::wgpu_backend::tuning::STATE_SCAN_COOP_BYTES;
pub use gate_q::gate_q;
pub use prepare_gate::{PrepareGateBuffers, prepare_gate};
pub use prepare_qk::prepare_qk;
pub use recurrent::{RecurrentForward, forward_algorithm, recurrent_rejects, recurrent_tiles};
pub use state_scan::{ScanBuffers, ScanDims, ScanMath, state_scan, state_scan_with_math};
pub use state_scan_coop::{CoopScanBuffers, state_scan_coop};
pub use to_half::to_half;
pub use workspace::ForwardWorkspace;
use workspace::ScanScratch;
pub use wy_inverse::{WyInverseBuffers, wy_inverse};

use crate::error::{Error, Result};

use crate::problem::{CHUNK, ForwardInputs, ForwardOutputs, Problem};
#[cfg(not(target_arch = "wasm32"))]
use crate::tensor::HostTensor;
use crate::tensor::{DType, TensorMeta};
use crate::wgpu_backend::path::{ComputePath, ForwardAlgorithm};
use crate::wgpu_backend::{Context, GpuTensor, GpuTimer};

/// What the forward keeps for the backward: the normalized q and k (with `l2norm_qk`), the
/// packed (G, β) per token and v-head, and the gate-free inverse A `[B·T, HV, 64]`.
#[derive(Debug, Clone)]
pub struct Intermediates {
    /// `[B,T,H,K]` l2-normalized q in the dtype of q; `Some` only with `l2norm_qk`.
    pub q_normed: Option<GpuTensor>,
    /// `[B,T,H,K]` l2-normalized k in the dtype of k; `Some` only with `l2norm_qk`.
    pub k_normed: Option<GpuTensor>,
    /// `[B·T, HV, 2]` f32: chunk-local gate cumsum G and activated β.
    pub gate_beta: GpuTensor,
    /// `[B·T, HV, 64]` f32.
    pub a: GpuTensor,
}

/// A recorded forward: outputs plus intermediates.
#[derive(Debug, Clone)]
pub struct Forward {
    /// `[B,T,HV,V]`, in the dtype of v.
    pub o: GpuTensor,
    /// `[N,HV,K,V]` (or V-first) f32.
    pub final_state: GpuTensor,
    /// What the backward needs from this forward: `Some` on the chunked algorithm, `None` when
    /// the recurrent kernel ran (it keeps nothing; `forward_saved` always runs the chunked one).
    pub saved: Option<Intermediates>,
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

/// Record a forward pass, allocating o (dtype of v) and the final state (f32), on the
/// algorithm [`forward_algorithm`] chooses.
///
/// Precondition (not checked: it would need a readback): without `gate_in_kernel`, every g is
/// ≤ 0 and finite. [`crate::check_host_values`] checks host tensors.
pub fn forward(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    problem: &Problem,
    inputs: &ForwardInputs<&GpuTensor>,
) -> Result<Forward> {
    let (o, final_state) = allocate_outputs(ctx, problem, inputs)?;
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

fn allocate_outputs(
    ctx: &Context,
    problem: &Problem,
    inputs: &ForwardInputs<&GpuTensor>,
) -> Result<(GpuTensor, GpuTensor)> {
    Ok((
        GpuTensor::empty(ctx, "o", &problem.v_shape(), inputs.v.dtype)?,
        GpuTensor::empty(ctx, "final_state", &problem.state_shape(), DType::F32)?,
    ))
}

/// [`forward`] on the chunked algorithm whatever the context would choose, returning its
/// intermediates: the forward the backward needs (`forward_saved`).
pub(crate) fn forward_chunked(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    problem: &Problem,
    inputs: &ForwardInputs<&GpuTensor>,
) -> Result<(Forward, Intermediates)> {
    let (o, final_state) = allocate_outputs(ctx, problem, inputs)?;
    let outputs = ForwardOutputs {
        o: &o,
        final_state: &final_state,
    };
    check_call(ctx, problem, inputs, &outputs)?;
    let saved = record_chunked(
        ctx,
        encoder,
        problem,
        inputs,
        &outputs,
        Recording::default(),
    )?;
    let fwd = Forward {
        o,
        final_state,
        saved: Some(saved.clone()),
    };
    Ok((fwd, saved))
}

/// Record a forward pass into caller-provided outputs (e.g. poisoned buffers in tests, or a
/// state pool entry) on the algorithm [`forward_algorithm`] chooses. The final state is first
/// set from `initial_state` (or zeros). Returns the intermediates of the chunked algorithm
/// (`None` when the recurrent kernel ran).
pub fn forward_into(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    problem: &Problem,
    inputs: &ForwardInputs<&GpuTensor>,
    outputs: &ForwardOutputs<&GpuTensor>,
) -> Result<Option<Intermediates>> {
    record_forward(ctx, encoder, problem, inputs, outputs, Recording::default())
}

/// [`forward_into`] on a given algorithm (instead of the context's choice; the chunked one on
/// the context's compute path). Forcing the recurrent kernel where it cannot run is an
/// `Error::Unsupported` naming "forward algorithm". For tests and benchmarks that compare the
/// algorithms on one context.
pub fn forward_into_with_algorithm(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    problem: &Problem,
    inputs: &ForwardInputs<&GpuTensor>,
    outputs: &ForwardOutputs<&GpuTensor>,
    algorithm: ForwardAlgorithm,
) -> Result<Option<Intermediates>> {
    record_forward(
        ctx,
        encoder,
        problem,
        inputs,
        outputs,
        Recording {
            algorithm: Some(algorithm),
            ..Recording::default()
        },
    )
}

/// [`forward_into`] on the chunked algorithm with a given compute path (instead of the
/// context's choice); a path this device or problem cannot run is an `Error::Unsupported`.
/// For tests and benchmarks that compare paths on one context.
pub fn forward_into_with_path(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    problem: &Problem,
    inputs: &ForwardInputs<&GpuTensor>,
    outputs: &ForwardOutputs<&GpuTensor>,
    path: ComputePath,
) -> Result<Intermediates> {
    check_call(ctx, problem, inputs, outputs)?;
    record_chunked(
        ctx,
        encoder,
        problem,
        inputs,
        outputs,
        Recording {
            path: Some(path),
            ..Recording::default()
        },
    )
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
) -> Result<Option<Intermediates>> {
    record_forward(
        ctx,
        encoder,
        problem,
        inputs,
        outputs,
        Recording {
            timer: Some(timer),
            ..Recording::default()
        },
    )
}

/// The chunked forward with its scratch in `workspace` (made for this problem and storage
/// dtype, see [`ForwardWorkspace`]) instead of buffers allocated per call, on the workspace's
/// compute path; with `timer`, a timestamp after each pass as in [`forward_into_profiled`].
/// The returned intermediates are the workspace's buffers: they hold this call's values until
/// the workspace is used again. A workspace is the chunked algorithm's scratch; the recurrent
/// kernel needs none (prepare a [`RecurrentForward`] once to record it without allocating).
pub fn forward_into_workspace(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    problem: &Problem,
    inputs: &ForwardInputs<&GpuTensor>,
    outputs: &ForwardOutputs<&GpuTensor>,
    workspace: &ForwardWorkspace,
    timer: Option<&GpuTimer>,
) -> Result<Intermediates> {
    check_call(ctx, problem, inputs, outputs)?;
    record_chunked(
        ctx,
        encoder,
        problem,
        inputs,
        outputs,
        Recording {
            timer,
            workspace: Some(workspace),
            ..Recording::default()
        },
    )
}

/// What the public forward entry points vary: per-pass timestamps, a forced algorithm or
/// compute path, and the chunked scratch (a caller's workspace, else one made for the call).
#[derive(Default, Clone, Copy)]
struct Recording<'a> {
    timer: Option<&'a GpuTimer>,
    algorithm: Option<ForwardAlgorithm>,
    path: Option<ComputePath>,
    workspace: Option<&'a ForwardWorkspace>,
}

/// The forward on the recording's algorithm, else the one [`forward_algorithm`] chooses.
fn record_forward(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    problem: &Problem,
    inputs: &ForwardInputs<&GpuTensor>,
    outputs: &ForwardOutputs<&GpuTensor>,
    rec: Recording<'_>,
) -> Result<Option<Intermediates>> {
    check_call(ctx, problem, inputs, outputs)?;
    let algorithm = match rec.algorithm {
        Some(a) => a,
        None => forward_algorithm(ctx, problem, inputs.q.dtype)?.algorithm,
    };
    match algorithm {
        ForwardAlgorithm::Recurrent => {
            RecurrentForward::new(ctx, problem, inputs, outputs)?.record(encoder);
            if let Some(t) = rec.timer {
                t.mark(encoder, "recurrent_step");
            }
            Ok(None)
        }
        ForwardAlgorithm::Chunked => {
            record_chunked(ctx, encoder, problem, inputs, outputs, rec).map(Some)
        }
    }
}

/// Everything a forward checks before recording, whatever its algorithm: the device, the
/// inputs and the outputs' shapes and dtypes.
pub(crate) fn check_call(
    ctx: &Context,
    problem: &Problem,
    inputs: &ForwardInputs<&GpuTensor>,
    outputs: &ForwardOutputs<&GpuTensor>,
) -> Result<()> {
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
    Ok(())
}

/// The chunked algorithm (checked by [`check_call`] before).
fn record_chunked(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    problem: &Problem,
    inputs: &ForwardInputs<&GpuTensor>,
    outputs: &ForwardOutputs<&GpuTensor>,
    rec: Recording<'_>,
) -> Result<Intermediates> {
    let Recording {
        timer,
        path,
        workspace,
        ..
    } = rec;
    let mark = |encoder: &mut wgpu::CommandEncoder, label| {
        if let Some(t) = timer {
            t.mark(encoder, label);
        }
    };
    let dtype = inputs.q.dtype;
    let owned;
    let ws = match workspace {
        Some(ws) => {
            ws.check(problem, dtype)?;
            if let Some(p) = path.filter(|&p| p != ws.path) {
                return Err(Error::Value {
                    name: "compute path".into(),
                    expected: format!("the workspace's path ({})", ws.path),
                    got: p.to_string(),
                });
            }
            ws
        }
        None => {
            let chosen = ctx
                .path_support()
                .choose(problem, dtype, path.or(ctx.forced_compute_path()))?
                .path;
            owned = ForwardWorkspace::with_path_and_config(ctx, problem, dtype, chosen)?;
            &owned
        }
    };
    let (bt, hv) = (problem.total_tokens(), problem.heads_v);
    let (params, chunks, segments) = (&ws.params, &ws.chunks, &ws.segments);
    let (num_chunks, num_segments) = (ws.num_chunks, ws.num_segments);

    // The scan updates the state in place, so it starts as a copy of h0 (the caller's h0 is
    // never modified).
    match inputs.initial_state {
        Some(h0) => {
            encoder.copy_buffer_to_buffer(&h0.buffer, 0, &outputs.final_state.buffer, 0, h0.bytes())
        }
        None => encoder.clear_buffer(&outputs.final_state.buffer, 0, None),
    }

    if let (Some(qn), Some(kn)) = (&ws.q_normed, &ws.k_normed) {
        prepare_qk(ctx, encoder, params, inputs.q, qn)?;
        prepare_qk(ctx, encoder, params, inputs.k, kn)?;
        mark(encoder, "prepare_qk");
    }
    let q = ws.q_normed.as_ref().unwrap_or(inputs.q);
    let k = ws.k_normed.as_ref().unwrap_or(inputs.k);

    if let (Some(a_log), Some(dt_bias)) = (inputs.a_log, inputs.dt_bias) {
        let gp = &ws.gate_params;
        encoder.copy_buffer_to_buffer(&a_log.buffer, 0, gp, 0, (4 * hv) as u64);
        encoder.copy_buffer_to_buffer(&dt_bias.buffer, 0, gp, (4 * hv) as u64, (4 * hv) as u64);
    }
    let gate_beta = &ws.gate_beta;
    prepare_gate(
        ctx,
        encoder,
        params,
        &PrepareGateBuffers {
            g: inputs.g,
            beta: inputs.beta,
            gate_params: &ws.gate_params,
            chunks,
            gate_beta,
        },
        num_chunks,
        hv,
    )?;
    mark(encoder, "prepare_gate");

    let wy_buffers = |gated| WyInverseBuffers {
        k,
        q,
        gate_beta,
        chunks,
        a: &ws.a,
        gated,
    };
    match &ws.scan {
        ScanScratch::Scalar { gated } => {
            wy_inverse(ctx, encoder, params, &wy_buffers(gated), num_chunks, hv)?;
            mark(encoder, "wy_inverse");
        }
        ScanScratch::Coop { gated16, k16, qg16 } => {
            // The f16 operands carry one chunk of padding rows so 64-row tiles starting at any
            // token stay inside their buffers; wy_inverse never writes gated16's, so it is
            // zeroed here (to_half and gate_q write theirs).
            encoder.clear_buffer(&gated16.buffer, (bt * hv * 2 * CHUNK * 2) as u64, None);
            wy_inverse(ctx, encoder, params, &wy_buffers(gated16), num_chunks, hv)?;
            mark(encoder, "wy_inverse");
            to_half(ctx, encoder, params, k, k16)?;
            gate_q(ctx, encoder, params, q, gate_beta, qg16)?;
            mark(encoder, "to_half");
        }
    }

    let scan = |encoder: &mut wgpu::CommandEncoder, run: ScanRun<'_>| {
        record_scan(ctx, encoder, ws, q, k, run)
    };
    match &ws.segmented {
        None => {
            scan(
                encoder,
                ScanRun {
                    problem,
                    params,
                    segments,
                    num_segments,
                    v: inputs.v,
                    state: outputs.final_state,
                    o: outputs.o,
                },
            )?;
            mark(encoder, "state_scan");
        }
        Some(sp) => {
            // End states from zero (o is overwritten by the last scan), transitions from the
            // identity with v = 0, the sequential combine, then the scan from the right starts.
            encoder.clear_buffer(&sp.ends.buffer, 0, None);
            scan(
                encoder,
                ScanRun {
                    problem: &sp.scan_problem,
                    params: &sp.scan_params,
                    segments: &sp.segments,
                    num_segments: sp.num_segments,
                    v: inputs.v,
                    state: &sp.ends,
                    o: outputs.o,
                },
            )?;
            segment_combine::fill_identity(ctx, encoder, &sp.identity_params, &sp.trans)?;
            scan(
                encoder,
                ScanRun {
                    problem: &sp.trans_problem,
                    params: &sp.trans_params,
                    segments: &sp.segments,
                    num_segments: sp.num_segments,
                    v: &sp.zero_v,
                    state: &sp.trans,
                    o: &sp.trans_o,
                },
            )?;
            mark(encoder, "segment_scans");
            segment_combine::segment_combine(
                ctx,
                encoder,
                params,
                &segment_combine::CombineBuffers {
                    seq_segments: &sp.seq_segments,
                    h0: inputs.initial_state,
                    trans: &sp.trans,
                    ends: &sp.ends,
                    starts: &sp.starts,
                    final_state: outputs.final_state,
                },
                problem.num_sequences(),
                hv,
                problem.value_dim,
            )?;
            mark(encoder, "segment_combine");
            scan(
                encoder,
                ScanRun {
                    problem: &sp.scan_problem,
                    params: &sp.scan_params,
                    segments: &sp.segments,
                    num_segments: sp.num_segments,
                    v: inputs.v,
                    state: &sp.starts,
                    o: outputs.o,
                },
            )?;
            mark(encoder, "state_scan");
        }
    }

    Ok(Intermediates {
        q_normed: ws.q_normed.clone(),
        k_normed: ws.k_normed.clone(),
        gate_beta: ws.gate_beta.clone(),
        a: ws.a.clone(),
    })
}

/// One scan over a segment table: the problem variant it runs (its value_dim and state
/// layout), its parameters, and the v, state slots and o it reads and writes.
struct ScanRun<'a> {
    problem: &'a Problem,
    params: &'a wgpu::Buffer,
    segments: &'a wgpu::Buffer,
    num_segments: usize,
    v: &'a GpuTensor,
    state: &'a GpuTensor,
    o: &'a GpuTensor,
}

/// Record the workspace path's scan for `run`.
fn record_scan(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    ws: &ForwardWorkspace,
    q: &GpuTensor,
    k: &GpuTensor,
    run: ScanRun<'_>,
) -> Result<()> {
    let hv = run.problem.heads_v;
    match &ws.scan {
        ScanScratch::Scalar { gated } => {
            let bufs = ScanBuffers {
                q,
                k,
                v: run.v,
                gate_beta: &ws.gate_beta,
                gated,
                segments: run.segments,
                state: run.state,
                o: run.o,
            };
            // The f16-math path differs from the scalar one only in the scan's operand math.
            let math = match ws.path {
                ComputePath::F16Math => ScanMath::F16,
                _ => ScanMath::F32,
            };
            let dims = ScanDims {
                num_segments: run.num_segments,
                heads_v: hv,
                key_dim: run.problem.key_dim,
                value_dim: run.problem.value_dim,
                v_block: ctx.tuning.state_scan_v_block(run.problem),
            };
            state_scan_with_math(ctx, encoder, run.params, &bufs, dims, math)
        }
        ScanScratch::Coop { gated16, k16, qg16 } => {
            let bufs = CoopScanBuffers {
                qg16,
                k16,
                v: run.v,
                gate_beta: &ws.gate_beta,
                gated16,
                segments: run.segments,
                state: run.state,
                o: run.o,
            };
            state_scan_coop(ctx, encoder, run.params, &bufs, run.num_segments, hv)
        }
    }
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
    let gpu_inputs = crate::wgpu_backend::upload_inputs(ctx, inputs)?;
    let mut encoder = ctx.create_encoder("gdn forward");
    let fwd = forward(ctx, &mut encoder, problem, &gpu_inputs.as_ref())?;
    ctx.submit_and_wait(encoder)?;
    Ok(ForwardOutputs {
        o: fwd.o.download_blocking(ctx)?,
        final_state: fwd.final_state.download_blocking(ctx)?,
    })
}
