//! The chunked backward on wgpu. The forward keeps q̂, k̂ (normalized with `l2norm_qk`, else the
//! inputs themselves), v, the chunk-local gate cumsum G and β (packed), the gate-free inverse A
//! and h0 — no per-chunk state. The backward recomputes what it needs, in eight passes:
//!
//! 1. `state_recompute` — the forward scan replayed: chunk-start states h, and W, V' per token.
//! 2. `dh_scan` — the reverse inter-chunk scan: dh (gradient w.r.t. each chunk's end state),
//!    dh0, and per token dV' and dv.
//! 3. `value_grams` — per chunk dP = scale·Γ⊙(dO V'ᵀ) and dAb = Γ⊙(dV' Wᵀ).
//! 4. `wy_grad` — through A·diag(β) and the WY inverse: dβ, a part of dG, dAt.
//! 5. `state_grad` — the dq, dk and dG terms through h and dh.
//! 6. `qk_grad` — dq, dk per v-head; dG completed and reverse-cumsummed per chunk into dg.
//! 7. `qk_finish` — GVA group sums and the l2norm backward → dq, dk `[B,T,H,K]`.
//! 8. `gate_finish` — β and gate activation chain rules, dA_log and ddt_bias.
//!
//! Passes 1–2 are sequential over chunks (one workgroup per segment, v-head, V-block); the
//! others are parallel over chunks or tokens. Nothing here submits or reads back.

mod dh_scan;
mod gate_finish;
mod qk_finish;
mod qk_grad;
mod state_grad;
mod state_recompute;
mod value_grams;
mod wy_grad;

pub use dh_scan::{DhScanBuffers, dh_scan};
pub use gate_finish::{GateFinishBuffers, gate_finish};
pub use qk_finish::{QkFinishBuffers, dv_finish, qk_finish};
pub use qk_grad::{QkGradBuffers, qk_grad};
pub use state_grad::{StateGradBuffers, state_grad};
pub use state_recompute::{RecomputeBuffers, state_recompute};
pub use value_grams::{ValueGramsBuffers, value_grams};
pub use wy_grad::{WyGradBuffers, wy_grad};

use crate::error::{Error, Result};
#[cfg(not(target_arch = "wasm32"))]
use crate::problem::ForwardOutputs;
use crate::problem::{CHUNK, ForwardInputs, Gradients, Problem};
use crate::tensor::{DType, HostTensor, TensorMeta};
use crate::wgpu_backend::forward::{
    Forward, Intermediates, ScanDims, WyInverseBuffers, tables, wy_inverse,
};
use crate::wgpu_backend::params::{Params, upload_u32};
use crate::wgpu_backend::shaders::Pass;
use crate::wgpu_backend::tuning::{BACKWARD_SCANS, V_BLOCK_WIDTHS, choose_v_block, token_slice};
use crate::wgpu_backend::{Context, GpuTensor, GpuTimer};

/// f32 words of workgroup memory of `state_recompute` and `dh_scan` at V-block width `bv`
/// (mirrors the layouts in their headers), the least either needs: the 64 × bv tile, then one
/// region reused by the phases — the K slice (64 × 17) plus a 16 × bv state slice; the packed
/// 64×64 lower triangle (which also holds `state_recompute`'s K token slice, `T·(K+1)` ≤ 2080
/// words); `dh_scan`'s second 64 × bv tile plus K and Q token slices (`2·T·(K+1)` ≤ 1088 words
/// at `T·K` ≤ 512; [`dh_scan_tiling`] widens them where the device has the memory).
pub fn scan_arena_words(bv: u32) -> u32 {
    scan_arena_words_with(bv, 1088)
}

/// The backward scans' arena at V-block `bv` with `token_slices` words of `dh_scan`'s K and Q
/// token slices (the one layout both [`scan_arena_words`] and [`dh_scan_tiling`] size).
fn scan_arena_words_with(bv: u32, token_slices: u32) -> u32 {
    let slices = 64 * 17 + 16 * bv;
    let triangle = 64 * 65 / 2;
    let update = 64 * bv + token_slices;
    64 * bv + slices.max(triangle).max(update)
}

/// Total workgroup bytes of the backward scans at their least (arena + two 64-vectors).
pub fn scan_bytes(bv: u32) -> u32 {
    4 * (scan_arena_words(bv) + 2 * 64)
}

/// Tokens per K slice in `state_recompute`'s state update: `T·K` ≤ 2048 (two vec4 loads per
/// invocation) with the slice (`T·(K+1)` words) inside the triangle's 2080 words.
pub fn recompute_token_slice(key_dim: u32) -> u32 {
    let mut t = token_slice(key_dim, 2048, 64);
    while t > 1 && t * (key_dim + 1) > 64 * 65 / 2 {
        t /= 2;
    }
    t
}

/// Tokens per K and Q slice of `dh_scan`'s state update, and its arena words, on a device
/// with `workgroup_bytes`: `T·K` ≤ 1024 (one vec4 of K and of Q per invocation) where that
/// fits, else `T·K` ≤ 512 (within [`scan_arena_words`]; 16 KiB at V-block 16).
pub fn dh_scan_tiling(bv: u32, key_dim: u32, workgroup_bytes: u32) -> (u32, u32) {
    let words = |t: u32| scan_arena_words_with(bv, 2 * t * (key_dim + 1));
    let wide = token_slice(key_dim, 1024, 32);
    if 4 * (words(wide) + 2 * 64) <= workgroup_bytes {
        return (wide, words(wide));
    }
    let narrow = token_slice(key_dim, 512, 32);
    (narrow, words(narrow))
}

/// The backward's passes that read or write q, k, v, do, dq, dk or dv (`gate_finish` reads f32
/// tensors only), besides the forward's `wy_inverse`, which it runs again.
const STORAGE_PASSES: [Pass; 7] = [
    Pass::StateRecompute,
    Pass::DhScan,
    Pass::ValueGrams,
    Pass::WyGrad,
    Pass::StateGrad,
    Pass::QkGrad,
    Pass::QkFinish,
];

/// Storage dtypes of q, k, v (and do, dq, dk, dv) the backward takes on this device: those
/// of the forward (f16 needs `SHADER_F16`) that every backward pass has kernels for.
pub fn storage_dtypes(ctx: &Context) -> Vec<DType> {
    ctx.forward_storage_dtypes()
        .into_iter()
        .filter(|d| {
            STORAGE_PASSES
                .iter()
                .all(|p| p.storage_dtypes().contains(d))
        })
        .collect()
}

/// V-block width of the two backward scans ([`BACKWARD_SCANS`]): the widest that fits the
/// device's workgroup memory (their arena, larger than the forward's) and divides V, narrowed
/// while the grid (sequences × v-heads × V-blocks) is small. A forced width (`GDN_V_BLOCK`)
/// is used where it fits and divides V.
pub fn scan_v_block(ctx: &Context, problem: &Problem) -> Result<u32> {
    let tuning = ctx.tuning();
    let fits: Vec<u32> = V_BLOCK_WIDTHS
        .into_iter()
        .filter(|&bv| scan_bytes(bv) <= tuning.workgroup_bytes)
        .collect();
    choose_v_block(&fits, tuning.forced_v_block, problem, BACKWARD_SCANS).ok_or_else(|| {
        Error::unsupported(
            "device",
            format!(
                "{} bytes of workgroup memory for the backward scans (need {})",
                tuning.workgroup_bytes,
                scan_bytes(16)
            ),
        )
    })
}

/// What the backward consumes: the problem, the forward's raw inputs (GPU buffers are shared
/// handles, so keeping them costs no memory) and the forward's intermediates. This is the
/// context an autograd integration saves between forward and backward.
#[derive(Debug, Clone)]
pub struct Saved {
    /// The problem the forward ran.
    pub problem: Problem,
    /// The forward's inputs as given (raw q, k, before any l2norm).
    pub inputs: ForwardInputs<GpuTensor>,
    /// What the forward kept for the backward ([`Forward::saved`](crate::wgpu_backend::Forward::saved)).
    pub intermediates: Intermediates,
}

impl Saved {
    /// Keep `inputs` and the intermediates a forward on them returned.
    pub fn new(
        problem: &Problem,
        inputs: &ForwardInputs<&GpuTensor>,
        intermediates: Intermediates,
    ) -> Self {
        Saved {
            problem: problem.clone(),
            inputs: ForwardInputs {
                q: inputs.q.clone(),
                k: inputs.k.clone(),
                v: inputs.v.clone(),
                g: inputs.g.clone(),
                beta: inputs.beta.clone(),
                initial_state: inputs.initial_state.cloned(),
                a_log: inputs.a_log.cloned(),
                dt_bias: inputs.dt_bias.cloned(),
            },
            intermediates,
        }
    }
}

/// Bytes the forward keeps for the backward beyond its own inputs and outputs: (G, β) and A
/// per token and v-head (8 + 256 bytes), plus q̂ and k̂ with `l2norm_qk`.
pub fn saved_bytes(problem: &Problem, dtype: DType) -> u64 {
    let (bt, hv) = (problem.total_tokens() as u64, problem.heads_v as u64);
    let normed = if problem.options.l2norm_qk {
        2 * bt * problem.heads_qk as u64 * problem.key_dim as u64 * dtype.size() as u64
    } else {
        0
    };
    bt * hv * 4 * (2 + CHUNK as u64) + normed
}

/// Scratch bytes the backward allocates besides its outputs: chunk-start states and their
/// gradients (`[chunks + N, HV, K, V]` f32 each), W, V', dV', dv (`[B·T, HV, V]` f32 each), dP
/// and dA (`[B·T, HV, 64]` f32 each), the per-v-head dq/dk terms (`[B·T, HV, 3K + 1]` f32,
/// sharing their memory with the scans' gated matrices, `[B·T, HV, 128]`) and (dg, dβ)
/// (`[B·T, HV, 2]` f32).
pub fn workspace_bytes(problem: &Problem) -> u64 {
    let (bt, hv) = (problem.total_tokens() as u64, problem.heads_v as u64);
    let (kd, vd) = (problem.key_dim as u64, problem.value_dim as u64);
    let slots = (problem.chunks().len() + problem.num_sequences()) as u64;
    let states = 2 * slots * hv * kd * vd;
    let per_token = 4 * vd + 2 * CHUNK as u64 + (3 * kd + 1).max(2 * CHUNK as u64) + 2;
    4 * (states + bt * hv * per_token)
}

/// Record a forward and return its outputs with the context the backward needs. Always the
/// chunked algorithm, whatever `forward` would choose: the backward replays its scan from the
/// intermediates it keeps (A, the gate cumsum and β), which the recurrent kernel has none of.
pub fn forward_saved(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    problem: &Problem,
    inputs: &ForwardInputs<&GpuTensor>,
) -> Result<(Forward, Saved)> {
    let (fwd, intermediates) =
        crate::wgpu_backend::forward::forward_chunked(ctx, encoder, problem, inputs)?;
    let saved = Saved::new(problem, inputs, intermediates);
    Ok((fwd, saved))
}

/// Record a forward and its backward for `d_o` (and `dht`, the gradient of the final state).
pub fn forward_backward(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    problem: &Problem,
    inputs: &ForwardInputs<&GpuTensor>,
    d_o: &GpuTensor,
    dht: Option<&GpuTensor>,
) -> Result<(Forward, Gradients<GpuTensor>)> {
    let (fwd, saved) = forward_saved(ctx, encoder, problem, inputs)?;
    let grads = backward(ctx, encoder, &saved, d_o, dht)?;
    Ok((fwd, grads))
}

/// Record the backward: the gradients of `L = Σ o ⊙ d_o + Σ final_state ⊙ dht` w.r.t. the raw
/// inputs of the forward that produced `saved`. `d_o` is `[B,T,HV,V]` in the dtype of v; `dht`
/// (optional) has the state shape, f32.
///
/// Precondition (not checked, it would need a readback): `d_o` and `dht` are finite.
pub fn backward(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    saved: &Saved,
    d_o: &GpuTensor,
    dht: Option<&GpuTensor>,
) -> Result<Gradients<GpuTensor>> {
    record_backward(ctx, encoder, saved, d_o, dht, None)
}

/// [`backward`] with a timestamp after each pass (labelled with the pass name); mark the
/// start yourself before calling.
pub fn backward_profiled(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    saved: &Saved,
    d_o: &GpuTensor,
    dht: Option<&GpuTensor>,
    timer: &GpuTimer,
) -> Result<Gradients<GpuTensor>> {
    record_backward(ctx, encoder, saved, d_o, dht, Some(timer))
}

fn check_saved(
    ctx: &Context,
    saved: &Saved,
    d_o: &GpuTensor,
    dht: Option<&GpuTensor>,
) -> Result<()> {
    let p = &saved.problem;
    p.check_inputs(&saved.inputs.as_ref(), &storage_dtypes(ctx))?;
    if d_o.shape() != p.v_shape() {
        return Err(Error::shape("do", &p.v_shape(), d_o.shape()));
    }
    if d_o.dtype != saved.inputs.v.dtype {
        return Err(Error::DType {
            name: "do".into(),
            expected: format!("{} (the dtype of v)", saved.inputs.v.dtype),
            got: d_o.dtype.to_string(),
        });
    }
    if let Some(dht) = dht {
        if dht.shape() != p.state_shape() {
            return Err(Error::shape("dht", &p.state_shape(), dht.shape()));
        }
        if dht.dtype != DType::F32 {
            return Err(Error::DType {
                name: "dht".into(),
                expected: "F32".into(),
                got: dht.dtype.to_string(),
            });
        }
    }
    let (bt, hv) = (p.total_tokens(), p.heads_v);
    let inter = &saved.intermediates;
    if inter.gate_beta.shape() != [bt, hv, 2] {
        return Err(Error::shape(
            "saved gate_beta",
            &[bt, hv, 2],
            inter.gate_beta.shape(),
        ));
    }
    if inter.a.shape() != [bt, hv, CHUNK] {
        return Err(Error::shape(
            "saved wy_inverse",
            &[bt, hv, CHUNK],
            inter.a.shape(),
        ));
    }
    if p.options.l2norm_qk && (inter.q_normed.is_none() || inter.k_normed.is_none()) {
        return Err(Error::Missing {
            name: "saved q_normed, k_normed".into(),
            why: "with l2norm_qk (from the same forward)".into(),
        });
    }
    Ok(())
}

fn record_backward(
    ctx: &Context,
    encoder: &mut wgpu::CommandEncoder,
    saved: &Saved,
    d_o: &GpuTensor,
    dht: Option<&GpuTensor>,
    timer: Option<&GpuTimer>,
) -> Result<Gradients<GpuTensor>> {
    let mark = |encoder: &mut wgpu::CommandEncoder, label| {
        if let Some(t) = timer {
            t.mark(encoder, label);
        }
    };
    ctx.check()?;
    check_saved(ctx, saved, d_o, dht)?;
    let p = &saved.problem;
    let inputs = saved.inputs.as_ref();
    let inter = &saved.intermediates;
    let q = inter.q_normed.as_ref().unwrap_or(inputs.q);
    let k = inter.k_normed.as_ref().unwrap_or(inputs.k);
    let (bt, hv, kd, vd) = (p.total_tokens(), p.heads_v, p.key_dim, p.value_dim);

    let (chunk_table, _) = tables(p);
    let num_chunks = chunk_table.len() / 2;
    let sequences = p.sequences();
    let mut segment_table = Vec::with_capacity(4 * sequences.len());
    let mut first_chunk = 0usize;
    for (n, s) in sequences.iter().enumerate() {
        segment_table.extend([s.start as u32, s.len() as u32, first_chunk as u32, n as u32]);
        first_chunk += s.len().div_ceil(CHUNK);
    }
    let num_segments = sequences.len();
    let params = Params::for_problem(p, num_chunks, num_segments).upload(ctx);
    let chunks = upload_u32(ctx, "chunks", &chunk_table);
    let segments = upload_u32(ctx, "backward segments", &segment_table);

    // Scratch. States and their gradients have one slot per chunk plus one per sequence (the
    // start state / dht in, dh0 out), in the problem's state layout.
    let slots = num_chunks + p.num_sequences();
    let states = GpuTensor::empty(ctx, "recomputed states", &[slots, hv, kd, vd], DType::F32)?;
    let dstates = GpuTensor::empty(ctx, "state gradients", &[slots, hv, kd, vd], DType::F32)?;
    let w_vnew = GpuTensor::empty(ctx, "W and V'", &[2, bt, hv, vd], DType::F32)?;
    let dvnew_dv = GpuTensor::empty(ctx, "dV' and dv", &[2, bt, hv, vd], DType::F32)?;
    let mats = GpuTensor::empty(ctx, "dP and dA", &[2, bt, hv, CHUNK], DType::F32)?;
    // The per-v-head dq/dk terms (written from state_grad on) share their memory with the
    // scans' gated matrices (read up to dh_scan).
    let union = GpuTensor::empty(
        ctx,
        "dq dk per v-head | gated matrices",
        &[bt, hv, (3 * kd + 1).max(2 * CHUNK)],
        DType::F32,
    )?;
    let view = |t: &GpuTensor, shape: &[usize]| GpuTensor {
        buffer: t.buffer.clone(),
        shape: shape.to_vec(),
        dtype: DType::F32,
    };
    let dqk_parts = view(&union, &[bt, hv, 3 * kd + 1]);
    let gated = view(&union, &[bt, hv, 2 * CHUNK]);
    let dg_dbeta = GpuTensor::empty(ctx, "dg and dbeta", &[bt, hv, 2], DType::F32)?;

    let tail_offset = (num_chunks * hv * kd * vd * 4) as u64;
    let tail_bytes = (p.num_sequences() * hv * kd * vd * 4) as u64;
    match inputs.initial_state {
        Some(h0) => {
            encoder.copy_buffer_to_buffer(&h0.buffer, 0, &states.buffer, tail_offset, tail_bytes)
        }
        None => encoder.clear_buffer(&states.buffer, tail_offset, Some(tail_bytes)),
    }
    match dht {
        Some(dht) => {
            encoder.copy_buffer_to_buffer(&dht.buffer, 0, &dstates.buffer, tail_offset, tail_bytes)
        }
        None => encoder.clear_buffer(&dstates.buffer, tail_offset, Some(tail_bytes)),
    }

    // Γ⊙A⊙β and Γ⊙QKᵀ per chunk, parallel over chunks: the forward's wy_inverse again (its A
    // goes to scratch: the first half of `mats`, written next by value_grams).
    let a_scratch = view(&mats, &[bt, hv, CHUNK]);
    let wy_buffers = WyInverseBuffers {
        k,
        q,
        gate_beta: &inter.gate_beta,
        chunks: &chunks,
        a: &a_scratch,
        gated: &gated,
    };
    wy_inverse(ctx, encoder, &params, &wy_buffers, num_chunks, hv)?;
    mark(encoder, "gated_matrices");

    let dims = ScanDims {
        num_segments,
        heads_v: hv,
        key_dim: kd,
        value_dim: vd,
        v_block: scan_v_block(ctx, p)?,
    };
    let recompute = RecomputeBuffers {
        k,
        v: inputs.v,
        gate_beta: &inter.gate_beta,
        gated: &gated,
        segments: &segments,
        states: &states,
        w_vnew: &w_vnew,
    };
    state_recompute(ctx, encoder, &params, &recompute, dims)?;
    mark(encoder, "state_recompute");
    let scan = DhScanBuffers {
        q,
        k,
        gate_beta: &inter.gate_beta,
        gated: &gated,
        d_o,
        segments: &segments,
        dstates: &dstates,
        dvnew_dv: &dvnew_dv,
    };
    dh_scan(ctx, encoder, &params, &scan, dims)?;
    mark(encoder, "dh_scan");
    let grams = ValueGramsBuffers {
        d_o,
        w_vnew: &w_vnew,
        dvnew_dv: &dvnew_dv,
        gate_beta: &inter.gate_beta,
        chunks: &chunks,
        mats: &mats,
    };
    value_grams(ctx, encoder, &params, &grams, num_chunks, hv)?;
    mark(encoder, "value_grams");
    let wy = WyGradBuffers {
        q,
        k,
        a: &inter.a,
        gate_beta: &inter.gate_beta,
        chunks: &chunks,
        mats: &mats,
        dg_dbeta: &dg_dbeta,
    };
    wy_grad(ctx, encoder, &params, &wy, num_chunks, hv)?;
    mark(encoder, "wy_grad");
    let state_bufs = StateGradBuffers {
        d_o,
        w_vnew: &w_vnew,
        dvnew_dv: &dvnew_dv,
        states: &states,
        dstates: &dstates,
        gate_beta: &inter.gate_beta,
        chunks: &chunks,
        dqk_parts: &dqk_parts,
    };
    state_grad(ctx, encoder, &params, &state_bufs, num_chunks, hv, kd)?;
    mark(encoder, "state_grad");
    let qk = QkGradBuffers {
        q,
        k,
        mats: &mats,
        chunks: &chunks,
        dqk_parts: &dqk_parts,
        dg_dbeta: &dg_dbeta,
    };
    qk_grad(ctx, encoder, &params, &qk, num_chunks, hv)?;
    mark(encoder, "qk_grad");

    let dq = GpuTensor::empty(ctx, "dq", &p.qk_shape(), inputs.q.dtype)?;
    let dk = GpuTensor::empty(ctx, "dk", &p.qk_shape(), inputs.k.dtype)?;
    let finish = QkFinishBuffers {
        q_raw: inputs.q,
        k_raw: inputs.k,
        dqk_parts: &dqk_parts,
        dq: &dq,
        dk: &dk,
    };
    qk_finish(ctx, encoder, &params, &finish)?;
    mark(encoder, "qk_finish");

    let small = |label: &str| {
        ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: (8 * hv) as u64,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_DST
                | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        })
    };
    let gate_params = small("gate_params");
    let dgate_params = small("dgate_params");
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
    let dg = GpuTensor::empty(ctx, "dg", &p.gate_shape(), DType::F32)?;
    let dbeta = GpuTensor::empty(ctx, "dbeta", &p.gate_shape(), DType::F32)?;
    let gate = GateFinishBuffers {
        g: inputs.g,
        beta: inputs.beta,
        gate_params: &gate_params,
        dg_dbeta: &dg_dbeta,
        dg: &dg,
        dbeta: &dbeta,
        dgate_params: &dgate_params,
    };
    gate_finish(ctx, encoder, &params, &gate, hv)?;
    mark(encoder, "gate_finish");

    // dv is the second half of `dvnew_dv`: a copy for f32 storage, else converted.
    let dv = GpuTensor::empty(ctx, "dv", &p.v_shape(), inputs.v.dtype)?;
    if dv.dtype == DType::F32 {
        let dv_bytes = (bt * hv * vd * 4) as u64;
        encoder.copy_buffer_to_buffer(&dvnew_dv.buffer, dv_bytes, &dv.buffer, 0, dv_bytes);
    } else {
        dv_finish(ctx, encoder, &params, &dvnew_dv, &dv)?;
    }
    mark(encoder, "dv_finish");
    let dh0 = match inputs.initial_state {
        Some(_) => {
            let dh0 = GpuTensor::empty(ctx, "dh0", &p.state_shape(), DType::F32)?;
            encoder.copy_buffer_to_buffer(&dstates.buffer, tail_offset, &dh0.buffer, 0, tail_bytes);
            Some(dh0)
        }
        None => None,
    };
    let (da_log, ddt_bias) = if p.options.gate_in_kernel {
        let da_log = GpuTensor::empty(ctx, "dA_log", &[hv], DType::F32)?;
        let ddt_bias = GpuTensor::empty(ctx, "ddt_bias", &[hv], DType::F32)?;
        encoder.copy_buffer_to_buffer(&dgate_params, 0, &da_log.buffer, 0, (4 * hv) as u64);
        encoder.copy_buffer_to_buffer(
            &dgate_params,
            (4 * hv) as u64,
            &ddt_bias.buffer,
            0,
            (4 * hv) as u64,
        );
        (Some(da_log), Some(ddt_bias))
    } else {
        (None, None)
    };
    Ok(Gradients {
        dq,
        dk,
        dv,
        dg,
        dbeta,
        dh0,
        da_log,
        ddt_bias,
    })
}

/// Check that a host gradient input is finite (the GPU path cannot check without a readback).
fn check_finite(name: &str, t: &HostTensor) -> Result<()> {
    match t.data.iter().position(|x| !x.is_finite()) {
        Some(i) => Err(Error::value(
            name,
            "finite values",
            format!("{} at flat index {i}", t.data[i]),
        )),
        None => Ok(()),
    }
}

/// Check `do` and `dht` host tensors against the problem: shape, dtype, finite values.
pub fn check_host_gradients(
    problem: &Problem,
    v_dtype: DType,
    d_o: &HostTensor,
    dht: Option<&HostTensor>,
) -> Result<()> {
    if d_o.shape() != problem.v_shape() {
        return Err(Error::shape("do", &problem.v_shape(), d_o.shape()));
    }
    if d_o.dtype != v_dtype {
        return Err(Error::DType {
            name: "do".into(),
            expected: format!("{v_dtype} (the dtype of v)"),
            got: d_o.dtype.to_string(),
        });
    }
    check_finite("do", d_o)?;
    if let Some(dht) = dht {
        if dht.shape() != problem.state_shape() {
            return Err(Error::shape("dht", &problem.state_shape(), dht.shape()));
        }
        if dht.dtype != DType::F32 {
            return Err(Error::DType {
                name: "dht".into(),
                expected: "F32".into(),
                got: dht.dtype.to_string(),
            });
        }
        check_finite("dht", dht)?;
    }
    Ok(())
}

/// Upload host inputs, run forward and backward in one submission, wait, and download the
/// forward's outputs and every gradient. Checks host values first. Native only; a convenience
/// for the CLI, examples and tests.
#[cfg(not(target_arch = "wasm32"))]
pub fn backward_host(
    ctx: &Context,
    problem: &Problem,
    inputs: &ForwardInputs<&HostTensor>,
    d_o: &HostTensor,
    dht: Option<&HostTensor>,
) -> Result<(ForwardOutputs<HostTensor>, Gradients<HostTensor>)> {
    problem.check_inputs(inputs, &storage_dtypes(ctx))?;
    crate::problem::check_host_values(problem, inputs)?;
    check_host_gradients(problem, inputs.v.dtype, d_o, dht)?;
    let gpu_inputs = crate::wgpu_backend::upload_inputs(ctx, inputs)?;
    let d_o = GpuTensor::upload(ctx, "do", d_o)?;
    let dht = dht.map(|t| GpuTensor::upload(ctx, "dht", t)).transpose()?;
    let mut encoder = ctx.create_encoder("gdn forward + backward");
    let (fwd, grads) = forward_backward(
        ctx,
        &mut encoder,
        problem,
        &gpu_inputs.as_ref(),
        &d_o,
        dht.as_ref(),
    )?;
    ctx.submit_and_wait(encoder)?;
    let down = |t: &GpuTensor| t.download_blocking(ctx);
    let down_opt = |t: &Option<GpuTensor>| t.as_ref().map(down).transpose();
    let outputs = ForwardOutputs {
        o: down(&fwd.o)?,
        final_state: down(&fwd.final_state)?,
    };
    let grads = Gradients {
        dq: down(&grads.dq)?,
        dk: down(&grads.dk)?,
        dv: down(&grads.dv)?,
        dg: down(&grads.dg)?,
        dbeta: down(&grads.dbeta)?,
        dh0: down_opt(&grads.dh0)?,
        da_log: down_opt(&grads.da_log)?,
        ddt_bias: down_opt(&grads.ddt_bias)?,
    };
    Ok((outputs, grads))
}
