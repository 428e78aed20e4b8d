//! The forward on wgpu. The chunked algorithm: prepare_qk (optional l2norm) → prepare_gate
//! (activations and chunk-local gate cumsum) → wy_inverse (gate-free A) → state_scan (states,
//! o, final state); or, chosen per call ([`forward_algorithm`]), the recurrent kernel
//! ([`RecurrentForward`]). Everything is recorded into the caller's encoder; nothing is
//! submitted or read back here.

mod chunk_output_coop;
mod prepare_gate;
mod prepare_qk;
mod recurrent;
mod segment_combine;
mod segment_window;
mod state_chain_coop;
mod state_scan;
mod state_scan_coop;
mod workspace;
mod wy_inverse;
mod wy_inverse_coop;

pub use crate::wgpu_backend::tuning::STATE_SCAN_COOP_BYTES;
pub use chunk_output_coop::{ChunkOutputBuffers, chunk_output_coop};
pub use prepare_gate::{PrepareGateBuffers, prepare_gate};
pub use prepare_qk::prepare_qk;
pub use recurrent::{RecurrentForward, forward_algorithm, recurrent_rejects, recurrent_tiles};
pub use state_chain_coop::{CoopChainBuffers, STATE_CHAIN_COOP_BYTES, state_chain_coop};
pub use state_scan::{ScanBuffers, ScanDims, ScanMath, state_scan, state_scan_with_math};
pub use state_scan_coop::{CoopScanBuffers, state_scan_coop};
pub(crate) use workspace::planned_windows;
pub use workspace::{
    AUTO_SEGMENT_BELOW_WORKGROUPS, AUTO_SEGMENT_TARGET_WORKGROUPS, ForwardWorkspace,
    MIN_AUTO_SEGMENT_CHUNKS, SegmentPaths, auto_segment_chunks, segment_chunks_for,
};
use workspace::{ScanScratch, WindowTables};
pub use wy_inverse::{WyInverseBuffers, wy_inverse};
pub use wy_inverse_coop::{WyInverseCoopBuffers, wy_inverse_coop};

use crate::error::{Error, Result};

use crate::problem::{CHUNK, ForwardInputs, ForwardOutputs, Problem};
#[cfg(not(target_arch = "wasm32"))]
use crate::tensor::HostTensor;
use crate::tensor::{DType, TensorMeta};
use crate::wgpu_backend::path::{ComputePath, ForwardAlgorithm};
use crate::wgpu_backend::tensor::{check_distinct_buffers, named_inputs};
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
    /// The tokens of the packed axis these tensors hold, row 0 first: all of them, unless
    /// the forward ran in token windows (tensors larger than one storage binding), when they
    /// hold the last window's rows (and the leading dimensions are that window's tokens).
    pub tokens: std::ops::Range<usize>,
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
    let rec = Recording {
        path: Some(path),
        ..Recording::default()
    };
    record_forward_chunked(ctx, encoder, problem, inputs, outputs, rec)
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
    let rec = Recording {
        timer,
        workspace: Some(workspace),
        ..Recording::default()
    };
    record_forward_chunked(ctx, encoder, problem, inputs, outputs, rec)
}

/// What the public forward entry points vary: per-pass timestamps, a forced algorithm or
/// compute path, and the chunked scratch (a caller's workspace, else one made for the call).
#[derive(Default, Clone, Copy)]
struct Recording<'a> {
    timer: Option<&'a GpuTimer>,
    algorithm: Option<ForwardAlgorithm>,
    path: Option<ComputePath>,
    workspace: Option<&'a ForwardWorkspace>,
    /// Receives every window's start states (`[Σ window sequences, HV, ..]` f32), for a
    /// windowed backward.
    checkpoints: Option<&'a GpuTensor>,
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
    // Device errors anywhere in the recording (scratch, tables, pipelines) come back typed.
    ctx.scoped("forward", None, || {
        record_forward_scoped(ctx, encoder, problem, inputs, outputs, rec)
    })?
}

fn record_forward_scoped(
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
    outputs.o.check_storage("o")?;
    outputs.final_state.check_storage("final_state")?;
    check_distinct_buffers(
        &[("o", outputs.o), ("final_state", outputs.final_state)],
        &named_inputs(inputs),
    )?;
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
        checkpoints,
        ..
    } = rec;
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
    let hv = problem.heads_v;

    // The scan updates the state in place, so it starts as a copy of h0 (the caller's h0 is
    // never modified). Copies are not bindings: they take buffers of any size.
    match inputs.initial_state {
        Some(h0) => encoder.copy_buffer_to_buffer(
            &h0.buffer,
            h0.offset(),
            &outputs.final_state.buffer,
            outputs.final_state.offset(),
            h0.bytes(),
        ),
        None => encoder.clear_buffer(
            &outputs.final_state.buffer,
            outputs.final_state.offset(),
            Some(outputs.final_state.bytes()),
        ),
    }
    if let (Some(a_log), Some(dt_bias)) = (inputs.a_log, inputs.dt_bias) {
        let gp = &ws.gate_params;
        encoder.copy_buffer_to_buffer(&a_log.buffer, 0, gp, 0, (4 * hv) as u64);
        encoder.copy_buffer_to_buffer(&dt_bias.buffer, 0, gp, (4 * hv) as u64, (4 * hv) as u64);
    }

    // One window: a mark per pass. Several: a mark per window (a timer has a fixed number of
    // marks, and the windows repeat the same passes).
    let windowed = ws.windows.len() > 1;
    let pass_timer = timer.filter(|_| !windowed);
    let mut last = None;
    for wt in &ws.windows {
        last = Some(record_window(
            ctx,
            encoder,
            problem,
            inputs,
            outputs,
            ws,
            wt,
            pass_timer,
            checkpoints,
        )?);
        if windowed && let Some(t) = timer {
            t.mark(encoder, "window");
        }
    }
    last.ok_or_else(|| Error::value("tokens (T)", "at least one token", 0))
}

/// `t`'s rows `[base, base + rows)` of the packed token axis (`row` elements each) as a
/// tensor `[rows, row dims..]`; `t` itself when that is all of it.
fn token_rows(
    t: &GpuTensor,
    name: &str,
    base: usize,
    rows: usize,
    tokens: usize,
) -> Result<GpuTensor> {
    if base == 0 && rows == tokens {
        return Ok(t.clone());
    }
    let row_dims = &t.shape[t.shape.len() - 2..];
    let row: usize = row_dims.iter().product();
    let shape: Vec<usize> = [rows].into_iter().chain(row_dims.iter().copied()).collect();
    t.view(name, base * row, &shape)
}

/// A gate tensor `[B, T, HV]` rows (one token each) `[base, base + rows)`.
fn gate_rows(
    t: &GpuTensor,
    name: &str,
    base: usize,
    rows: usize,
    tokens: usize,
) -> Result<GpuTensor> {
    if base == 0 && rows == tokens {
        return Ok(t.clone());
    }
    let hv = t.shape[t.shape.len() - 1];
    t.view(name, base * hv, &[rows, hv])
}

/// The first `rows` rows (along the leading dimension) of scratch sized for the largest
/// window; the scratch itself when that is all of it or the forward has one window.
fn scratch_rows(t: &GpuTensor, rows: usize, windowed: bool) -> Result<GpuTensor> {
    if !windowed || t.shape[0] == rows {
        return Ok(t.clone());
    }
    let shape: Vec<usize> = [rows]
        .into_iter()
        .chain(t.shape[1..].iter().copied())
        .collect();
    t.view("scratch", 0, &shape)
}

/// Record the passes of one window (the whole problem when it is the only one).
#[allow(clippy::too_many_arguments)]
fn record_window(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    problem: &Problem,
    inputs: &ForwardInputs<&GpuTensor>,
    outputs: &ForwardOutputs<&GpuTensor>,
    ws: &ForwardWorkspace,
    wt: &WindowTables,
    timer: Option<&GpuTimer>,
    checkpoints: Option<&GpuTensor>,
) -> Result<Intermediates> {
    let mark = |encoder: &mut wgpu::CommandEncoder, label| {
        if let Some(t) = timer {
            t.mark(encoder, label);
        }
    };
    let (bt, hv) = (problem.total_tokens(), problem.heads_v);
    let windowed = ws.windows.len() > 1;
    let scratch_rows = |t: &GpuTensor, rows: usize| scratch_rows(t, rows, windowed);
    let w = &wt.window;
    let (base, rows) = (w.base, w.tokens);
    let (params, chunks, segments) = (&wt.params, &wt.chunks, &wt.segments);
    let (num_chunks, num_segments) = (wt.num_chunks, wt.num_segments);
    let tokens = |t: &GpuTensor, name: &str| token_rows(t, name, base, rows, bt);
    let gates = |t: &GpuTensor, name: &str| gate_rows(t, name, base, rows, bt);
    let (q_in, k_in, v) = (
        tokens(inputs.q, "q")?,
        tokens(inputs.k, "k")?,
        tokens(inputs.v, "v")?,
    );
    let o = tokens(outputs.o, "o")?;
    let (g, beta) = (gates(inputs.g, "g")?, gates(inputs.beta, "beta")?);
    let n_all = problem.num_sequences();
    let state = if w.first_seq == 0 && w.seqs() == n_all {
        outputs.final_state.clone()
    } else {
        let slot: usize = problem.state_shape()[1..].iter().product();
        let shape: Vec<usize> = [w.seqs()]
            .into_iter()
            .chain(problem.state_shape()[1..].iter().copied())
            .collect();
        outputs
            .final_state
            .view("final_state", w.first_seq * slot, &shape)?
    };

    // The start state of a sequence this window continues, before its scans move it on
    // (the window's first slot; the other pieces start from h0).
    if let (Some(c), Some(i)) = (checkpoints, wt.checkpoint) {
        let slot = (problem.state_shape()[1..].iter().product::<usize>() * 4) as u64;
        let at = c.offset() + i as u64 * slot;
        encoder.copy_buffer_to_buffer(&state.buffer, state.offset(), &c.buffer, at, slot);
    }

    let normed = |t: &Option<GpuTensor>| t.as_ref().map(|t| scratch_rows(t, rows)).transpose();
    let (q_normed, k_normed) = (normed(&ws.q_normed)?, normed(&ws.k_normed)?);
    if let (Some(qn), Some(kn)) = (&q_normed, &k_normed) {
        prepare_qk(ctx, encoder, params, &q_in, qn)?;
        prepare_qk(ctx, encoder, params, &k_in, kn)?;
        mark(encoder, "prepare_qk");
    }
    let q = q_normed.as_ref().unwrap_or(&q_in);
    let k = k_normed.as_ref().unwrap_or(&k_in);

    let gate_beta = &scratch_rows(&ws.gate_beta, rows)?;
    prepare_gate(
        ctx,
        encoder,
        params,
        &PrepareGateBuffers {
            g: &g,
            beta: &beta,
            gate_params: &ws.gate_params,
            chunks,
            gate_beta,
        },
        num_chunks,
        hv,
    )?;
    mark(encoder, "prepare_gate");

    let a = scratch_rows(&ws.a, rows)?;
    let wy_buffers = |gated| WyInverseBuffers {
        k,
        q,
        gate_beta,
        chunks,
        a: &a,
        gated,
    };
    let scan_scratch = match &ws.scan {
        ScanScratch::Scalar { gated } => {
            let gated = scratch_rows(gated, rows)?;
            wy_inverse(ctx, encoder, params, &wy_buffers(&gated), num_chunks, hv)?;
            mark(encoder, "wy_inverse");
            ScanScratch::Scalar { gated }
        }
        ScanScratch::Coop {
            gated16,
            k16,
            qg16,
            split,
        } => {
            let padded = rows + CHUNK;
            let (gated16, k16, qg16) = (
                scratch_rows(gated16, padded)?,
                scratch_rows(k16, padded)?,
                scratch_rows(qg16, padded)?,
            );
            // The f16 operands carry one chunk of padding rows so 64-row tiles starting at any
            // token stay inside their buffers; wy_inverse_coop writes only the rows of chunks,
            // so the padding rows are zeroed here.
            for (t, row) in [
                (&gated16, hv * 2 * CHUNK),
                (&k16, problem.heads_qk * problem.key_dim),
                (&qg16, hv * problem.key_dim),
            ] {
                let row_bytes = (row * 2) as u64;
                encoder.clear_buffer(
                    &t.buffer,
                    t.offset() + rows as u64 * row_bytes,
                    Some(CHUNK as u64 * row_bytes),
                );
            }
            wy_inverse_coop(
                ctx,
                encoder,
                params,
                &WyInverseCoopBuffers {
                    k,
                    q,
                    gate_beta,
                    chunks,
                    a: &a,
                    gated16: &gated16,
                    k16: &k16,
                    qg16: &qg16,
                },
                num_chunks,
                hv,
            )?;
            mark(encoder, "wy_inverse");
            ScanScratch::Coop {
                gated16,
                k16,
                qg16,
                split: split.clone(),
            }
        }
    };

    let scan = |encoder: &mut wgpu::CommandEncoder, run: ScanRun<'_>| {
        record_scan(
            ctx,
            encoder,
            ws.path,
            &scan_scratch,
            gate_beta,
            q,
            k,
            timer,
            run,
        )
    };
    let windowed_segments = ws.segmented.is_some() && ws.segment_window.is_some();
    ws.last_windowed
        .store(windowed_segments, std::sync::atomic::Ordering::Relaxed);
    match (&ws.segmented, &wt.segmented) {
        (Some(sp), Some(st)) => {
            let segs = st.num_segments;
            let (trans, ends, starts) = (
                scratch_rows(&sp.trans, segs.max(1))?,
                scratch_rows(&sp.ends, segs.max(1))?,
                scratch_rows(&sp.starts, segs.max(1))?,
            );
            let (zero_v, trans_o) = (
                scratch_rows(&sp.zero_v, rows)?,
                scratch_rows(&sp.trans_o, rows)?,
            );
            // End states from zero (o is overwritten by the last scan), transitions from the
            // identity with v = 0, the sequential combine, then the scan from the right starts.
            // With the gate-driven window, the window pass first gives each (segment, v-head)
            // its rows of the two scans: a warm-up of the last chunks and no transition, or
            // (fallback) the whole segment as without it.
            let (end_rows, trans_rows) = match ws.segment_window {
                Some(window) => {
                    segment_window::segment_window(
                        ctx,
                        encoder,
                        &st.window_params,
                        &segment_window::WindowBuffers {
                            segments: &st.segments,
                            last_segment: &st.last_segment,
                            gate_beta,
                            end_rows: &st.end_rows,
                            trans_rows: &st.trans_rows,
                            warmup: &st.warmup,
                        },
                        segs * hv,
                        window,
                    )?;
                    (Some(&st.end_rows), Some(&st.trans_rows))
                }
                None => (None, None),
            };
            encoder.clear_buffer(&ends.buffer, 0, Some(ends.binding_bytes()));
            // The transitions start from the identity: copied (not filled by a pass), so
            // that the transition scan waits on no compute work and may overlap the end-state
            // scan (with the window, the windowed pairs' slots get it too: nothing reads them).
            let identity = scratch_rows(&sp.identity, segs.max(1))?;
            encoder.copy_buffer_to_buffer(
                &identity.buffer,
                identity.offset(),
                &trans.buffer,
                trans.offset(),
                trans.bytes(),
            );
            scan(
                encoder,
                ScanRun {
                    problem: &sp.scan_problem,
                    params: &st.scan_params,
                    segments: end_rows.unwrap_or(&st.segments),
                    segments_per_head: end_rows.is_some(),
                    num_segments: segs,
                    v: &v,
                    state: &ends,
                    o: &o,
                    output: None,
                },
            )?;
            scan(
                encoder,
                ScanRun {
                    problem: &sp.trans_problem,
                    params: &st.trans_params,
                    segments: trans_rows.unwrap_or(&st.segments),
                    segments_per_head: trans_rows.is_some(),
                    num_segments: segs,
                    v: &zero_v,
                    state: &trans,
                    o: &trans_o,
                    output: None,
                },
            )?;
            mark(encoder, "segment_scans");
            // A window's sequences start from the states earlier windows left (h0 in the
            // first): copied aside, since the combine writes the states themselves.
            let carry = match &sp.carry {
                Some(carry) => {
                    let carry = scratch_rows(carry, w.seqs())?;
                    encoder.copy_buffer_to_buffer(
                        &state.buffer,
                        state.offset(),
                        &carry.buffer,
                        0,
                        state.bytes(),
                    );
                    Some(carry)
                }
                None => None,
            };
            segment_combine::segment_combine(
                ctx,
                encoder,
                params,
                &segment_combine::CombineBuffers {
                    seq_segments: &st.seq_segments,
                    h0: carry.as_ref().or(inputs.initial_state),
                    trans: &trans,
                    ends: &ends,
                    starts: &starts,
                    final_state: &state,
                    warmup: ws.segment_window.map(|_| &st.warmup),
                },
                w.seqs(),
                hv,
                problem.value_dim,
            )?;
            mark(encoder, "segment_combine");
            scan(
                encoder,
                ScanRun {
                    problem: &sp.scan_problem,
                    params: &st.scan_params,
                    segments: &st.segments,
                    segments_per_head: false,
                    num_segments: segs,
                    v: &v,
                    state: &starts,
                    o: &o,
                    output: Some((&st.chunk_base, chunks, num_chunks)),
                },
            )?;
            if ws.segment_window.is_some() {
                segment_combine::final_copy(
                    ctx,
                    encoder,
                    params,
                    &st.seq_segments,
                    &st.warmup,
                    &starts,
                    &state,
                    w.seqs(),
                    hv,
                    problem.value_dim,
                )?;
            }
            mark(encoder, "state_scan");
        }
        _ => {
            scan(
                encoder,
                ScanRun {
                    problem,
                    params,
                    segments,
                    segments_per_head: false,
                    num_segments,
                    v: &v,
                    state: &state,
                    o: &o,
                    output: Some((&wt.chunk_base, chunks, num_chunks)),
                },
            )?;
            mark(encoder, "state_scan");
        }
    }

    Ok(Intermediates {
        q_normed,
        k_normed,
        gate_beta: gate_beta.clone(),
        a,
        tokens: base..base + rows,
    })
}

/// The forward of `forward_saved` over a workspace made with the backward's window costs:
/// every window whose first piece continues a sequence copies that piece's start state into
/// `checkpoints` (`[continuing windows, HV, ..]` f32).
pub(crate) fn forward_with_checkpoints(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    problem: &Problem,
    inputs: &ForwardInputs<&GpuTensor>,
    outputs: &ForwardOutputs<&GpuTensor>,
    workspace: &ForwardWorkspace,
    checkpoints: Option<&GpuTensor>,
) -> Result<Intermediates> {
    let rec = Recording {
        workspace: Some(workspace),
        checkpoints,
        ..Recording::default()
    };
    record_forward_chunked(ctx, encoder, problem, inputs, outputs, rec)
}

/// [`record_forward`] on the chunked algorithm (inside the same error scope and checks as
/// every forward), for the entry points that return its intermediates.
fn record_forward_chunked(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    problem: &Problem,
    inputs: &ForwardInputs<&GpuTensor>,
    outputs: &ForwardOutputs<&GpuTensor>,
    rec: Recording<'_>,
) -> Result<Intermediates> {
    let rec = Recording {
        algorithm: Some(ForwardAlgorithm::Chunked),
        ..rec
    };
    record_forward(ctx, encoder, problem, inputs, outputs, rec)?
        .ok_or_else(|| Error::Gpu("the chunked forward kept no intermediates".into()))
}

/// One scan over a segment table: the problem variant it runs (its value_dim and state
/// layout), its parameters, and the v, state slots and o it reads and writes.
struct ScanRun<'a> {
    problem: &'a Problem,
    params: &'a wgpu::Buffer,
    segments: &'a wgpu::Buffer,
    /// `segments` has a row per (segment, v-head) (the gate-driven window's tables).
    segments_per_head: bool,
    num_segments: usize,
    v: &'a GpuTensor,
    state: &'a GpuTensor,
    o: &'a GpuTensor,
    /// Where o is wanted: the segment table's chunk bases, the window's chunk table and its
    /// rows (the split coop scan's output pass). `None`: a scan whose o is discarded.
    output: Option<(&'a wgpu::Buffer, &'a wgpu::Buffer, usize)>,
}

/// Record the scan of `path` for `run` over the window's scratch.
#[allow(clippy::too_many_arguments)]
fn record_scan(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    path: ComputePath,
    scratch: &ScanScratch,
    gate_beta: &GpuTensor,
    q: &GpuTensor,
    k: &GpuTensor,
    timer: Option<&GpuTimer>,
    run: ScanRun<'_>,
) -> Result<()> {
    let hv = run.problem.heads_v;
    match scratch {
        ScanScratch::Scalar { gated } => {
            let bufs = ScanBuffers {
                q,
                k,
                v: run.v,
                gate_beta,
                gated,
                segments: run.segments,
                segments_per_head: run.segments_per_head,
                state: run.state,
                o: run.o,
            };
            // The f16-math path differs from the scalar one only in the scan's operand math.
            let math = match path {
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
        ScanScratch::Coop {
            gated16,
            k16,
            qg16,
            split: Some(split),
        } => {
            let bufs = CoopChainBuffers {
                k16,
                v: run.v,
                gate_beta,
                gated16,
                segments: run.segments,
                segments_per_head: run.segments_per_head,
                state: run.state,
                chunk_base: run.output.map(|(chunk_base, _, _)| chunk_base),
                states16: &split.states16,
                vprime16: &split.vprime16,
            };
            state_chain_coop(ctx, encoder, run.params, &bufs, run.num_segments, hv)?;
            let Some((_, chunks, num_chunks)) = run.output else {
                return Ok(());
            };
            if let Some(t) = timer {
                t.mark(encoder, "state_chain");
            }
            let bufs = ChunkOutputBuffers {
                qg16,
                gated16,
                chunks,
                states16: &split.states16,
                vprime16: &split.vprime16,
                o: run.o,
            };
            chunk_output_coop(ctx, encoder, run.params, &bufs, num_chunks, hv)
        }
        ScanScratch::Coop {
            gated16,
            k16,
            qg16,
            split: None,
        } => {
            let bufs = CoopScanBuffers {
                qg16,
                k16,
                v: run.v,
                gate_beta,
                gated16,
                segments: run.segments,
                segments_per_head: run.segments_per_head,
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
