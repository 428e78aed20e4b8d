//! The recurrent decode path against the f64 oracle (the tolerance policy's bounds): T = 1
//! decode and T = 16 verification over a state pool, every option, varlen, fresh and padding
//! slots, per-token states, prefill → decode continuity and every tiling. Outputs are
//! NaN-poisoned before kernels run; pools start random, so a state that is not written back
//! shows up. Typed errors are in tests/errors.rs, `gdn run decode` in tests/cli_decode.rs.

mod common;

use std::ops::Range;

use common::decode::{random_pool, spec};
use common::{dense, gpu, problem, tol_o_state, upload_inputs};
use gdn_wgpu::tolerance::{Case, Op};
use gdn_wgpu::wgpu_backend::decode::{
    RecurrentStepTiles, SUBGROUP_V_BLOCK, StateLayout, StatePool, StateSlot, StepKernel,
    decode_host, decode_host_in, subgroup_kernel_available,
};
use gdn_wgpu::wgpu_backend::{self, Context, DecodeOutputs, DecodePlan, GpuTensor, decode_step};
use gdn_wgpu::{
    DType, ForwardInputs, HostTensor, Options, Problem, RandomSpec, reference, relative_l2,
};

use StateSlot::{Fresh, Padding, Resume};

thread_local! {
    /// The β range of `check_decode_in`'s inputs (RandomSpec's default unless a test sets it).
    static BETA: std::cell::Cell<(f32, f32)> = const { std::cell::Cell::new((0.0, 1.0)) };
}

fn state_len(p: &Problem) -> usize {
    p.heads_v * p.key_dim * p.value_dim
}

/// The sequences' starting states as the oracle's initial_state: a resumed slot's state, zero
/// for fresh and padding.
fn starting_states(p: &Problem, pool: &HostTensor, slots: &[StateSlot]) -> HostTensor {
    let len = state_len(p);
    let data = slots
        .iter()
        .flat_map(|s| match s {
            Resume(slot) => pool.data[*slot as usize * len..(*slot as usize + 1) * len].to_vec(),
            Fresh(_) | Padding => vec![0.0; len],
        })
        .collect();
    HostTensor::new(p.state_shape(), data)
}

struct DecodeRun {
    o: HostTensor,
    pool: HostTensor,
    per_token_states: Option<HostTensor>,
}

/// One decode call on the GPU into NaN-poisoned outputs, from a pool holding `pool` (stored in
/// `pool`'s dtype, f32 or bf16).
fn run_decode(
    ctx: &Context,
    p: &Problem,
    inputs: &ForwardInputs<HostTensor>,
    pool: &HostTensor,
    slots: &[StateSlot],
    per_token: bool,
    tiles: Option<RecurrentStepTiles>,
) -> DecodeRun {
    let pool_dtype = pool.dtype;
    let mut gpu_inputs = upload_inputs(ctx, inputs);
    gpu_inputs.initial_state = None;
    let pool_gpu = StatePool::from_tensor(
        GpuTensor::upload(ctx, "pool", pool).unwrap(),
        StateLayout::of(p),
    )
    .unwrap();
    let o = GpuTensor::filled(ctx, "o", &p.v_shape(), inputs.v.dtype, f32::NAN).unwrap();
    let [a, b] = StateLayout::of(p).inner_shape(p.key_dim, p.value_dim);
    let states_shape = [p.total_tokens(), p.heads_v, a, b];
    let per_token_states = per_token.then(|| {
        GpuTensor::filled(ctx, "per_token_states", &states_shape, pool_dtype, f32::NAN).unwrap()
    });
    let outputs = DecodeOutputs {
        o: &o,
        per_token_states: per_token_states.as_ref(),
    };
    let plan = match tiles {
        Some(t) => {
            DecodePlan::with_tiles(ctx, p, &gpu_inputs.as_ref(), &pool_gpu, slots, &outputs, t)
        }
        None => DecodePlan::new(ctx, p, &gpu_inputs.as_ref(), &pool_gpu, slots, &outputs),
    }
    .unwrap();
    let mut encoder = ctx.create_encoder("test decode");
    plan.record(&mut encoder);
    ctx.submit_and_wait(encoder).unwrap();
    DecodeRun {
        o: o.download_blocking(ctx).unwrap(),
        pool: pool_gpu.tensor().download_blocking(ctx).unwrap(),
        per_token_states: per_token_states.map(|t| t.download_blocking(ctx).unwrap()),
    }
}

/// Assert the pool after a call: slots written by a sequence hold its oracle final state (to
/// the tolerance), every other slot is bitwise unchanged.
fn assert_pool(
    p: &Problem,
    before: &HostTensor,
    after: &HostTensor,
    final_states: &[f64],
    slots: &[StateSlot],
    tol_s: f64,
    what: &str,
) {
    let len = state_len(p);
    let (mut got, mut want) = (Vec::new(), Vec::new());
    let mut written = vec![false; before.shape[0]];
    for (n, s) in slots.iter().enumerate() {
        if let Some(slot) = s.slot() {
            let slot = slot as usize;
            written[slot] = true;
            got.extend_from_slice(&after.data[slot * len..(slot + 1) * len]);
            want.extend_from_slice(&final_states[n * len..(n + 1) * len]);
        }
    }
    if !got.is_empty() {
        let e = relative_l2(&got, &want);
        eprintln!("  rel-L2 pool states {e:.3e}");
        assert!(
            e <= tol_s,
            "{what}: written pool slots rel-L2 {e:e} > {tol_s:e}"
        );
    }
    for (slot, _) in written.iter().enumerate().filter(|(_, w)| !**w) {
        let range = slot * len..(slot + 1) * len;
        let same = before.data[range.clone()]
            .iter()
            .zip(&after.data[range])
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same,
            "{what}: pool slot {slot} was not addressed but changed"
        );
    }
}

/// The inputs of the tokens in `ranges` (on `p`'s packed token axis) as a new problem: dense
/// `[ranges.len(), L]` when `dense_rows` (all ranges of length L), else `cu_seqlens`. The
/// initial state is left out.
fn select_tokens(
    p: &Problem,
    inputs: &ForwardInputs<HostTensor>,
    ranges: &[Range<usize>],
    dense_rows: bool,
) -> (Problem, ForwardInputs<HostTensor>) {
    let total: usize = ranges.iter().map(|r| r.len()).sum();
    let sub = if dense_rows {
        let len = ranges[0].len();
        assert!(
            ranges.iter().all(|r| r.len() == len),
            "dense selection needs equal lengths"
        );
        problem(
            ranges.len(),
            len,
            p.heads_qk,
            p.heads_v,
            p.key_dim,
            p.value_dim,
            None,
            p.options,
        )
    } else {
        let mut cu = vec![0];
        for r in ranges {
            cu.push(cu.last().unwrap() + r.len());
        }
        problem(
            1,
            total,
            p.heads_qk,
            p.heads_v,
            p.key_dim,
            p.value_dim,
            Some(cu),
            p.options,
        )
    };
    let take = |t: &HostTensor, shape: Vec<usize>| {
        let row = t.len() / p.total_tokens();
        HostTensor::new(
            shape,
            ranges
                .iter()
                .flat_map(|r| t.data[r.start * row..r.end * row].iter().copied())
                .collect(),
        )
    };
    let selected = ForwardInputs {
        q: take(&inputs.q, sub.qk_shape().to_vec()),
        k: take(&inputs.k, sub.qk_shape().to_vec()),
        v: take(&inputs.v, sub.v_shape().to_vec()),
        g: take(&inputs.g, sub.gate_shape().to_vec()),
        beta: take(&inputs.beta, sub.gate_shape().to_vec()),
        initial_state: None,
        a_log: inputs.a_log.clone(),
        dt_bias: inputs.dt_bias.clone(),
    };
    (sub, selected)
}

/// The decode call against the oracle: o, the pool (written slots and untouched ones), and
/// with `per_token` the state after every token against the oracle run prefix by prefix.
fn check_decode_with(
    ctx: &Context,
    p: &Problem,
    seed: u64,
    pool_slots: usize,
    slots: &[StateSlot],
    per_token: bool,
    tiles: Option<RecurrentStepTiles>,
) {
    check_decode_stored(
        ctx,
        p,
        seed,
        pool_slots,
        slots,
        per_token,
        tiles,
        DType::F32,
    );
}

/// q, k, v (and so o) stored as `dtype`; o and the f32 states are compared with the oracle on
/// the same rounded inputs at the policy's decode bounds.
#[allow(clippy::too_many_arguments)]
fn check_decode_stored(
    ctx: &Context,
    p: &Problem,
    seed: u64,
    pool_slots: usize,
    slots: &[StateSlot],
    per_token: bool,
    tiles: Option<RecurrentStepTiles>,
    dtype: DType,
) {
    check_decode_in(
        ctx,
        p,
        seed,
        pool_slots,
        slots,
        per_token,
        tiles,
        dtype,
        DType::F32,
    );
}

/// [`check_decode_stored`] on a pool stored as `pool_dtype`: the pool starts from random states
/// rounded to it (the oracle starts from the same values), and the states the kernel stores
/// carry one more rounding, which the policy's bound for that pool dtype covers.
#[allow(clippy::too_many_arguments)]
fn check_decode_in(
    ctx: &Context,
    p: &Problem,
    seed: u64,
    pool_slots: usize,
    slots: &[StateSlot],
    per_token: bool,
    tiles: Option<RecurrentStepTiles>,
    dtype: DType,
    pool_dtype: DType,
) {
    let case = Case::new(Op::Decode, dtype)
        .with_l2norm(p.options.l2norm_qk)
        .with_pool(pool_dtype);
    let (tol_o, tol_s) = tol_o_state(case);
    let what = format!("{dtype} (pool {pool_dtype}) {p:?} slots {slots:?} tiles {tiles:?}");
    let special = if p.heads_v >= 3 { (1, 1) } else { (0, 0) };
    let s = RandomSpec {
        zero_gate_heads: special.0,
        strong_gate_heads: special.1,
        beta: BETA.get(),
        ..spec(seed)
    };
    let mut inputs = s.generate(p);
    for t in [&mut inputs.q, &mut inputs.k, &mut inputs.v] {
        *t = t.clone().with_dtype(dtype);
    }
    let pool = random_pool(p, pool_slots, seed).with_dtype(pool_dtype);
    // The column kernel takes f32 pools and one element per storage word only: elsewhere
    // a typed error naming the tiles.
    if let Some(t) = tiles.filter(|t| t.kernel == StepKernel::Column)
        && (pool_dtype != DType::F32 || dtype == DType::BF16)
    {
        let mut gpu_inputs = upload_inputs(ctx, &inputs);
        gpu_inputs.initial_state = None;
        let pool_gpu = StatePool::from_tensor(
            GpuTensor::upload(ctx, "pool", &pool).unwrap(),
            StateLayout::of(p),
        )
        .unwrap();
        let o = GpuTensor::empty(ctx, "o", &p.v_shape(), dtype).unwrap();
        let outputs = DecodeOutputs {
            o: &o,
            per_token_states: None,
        };
        let plan =
            DecodePlan::with_tiles(ctx, p, &gpu_inputs.as_ref(), &pool_gpu, slots, &outputs, t);
        match plan.err() {
            Some(gdn_wgpu::Error::Value { name, .. }) => assert_eq!(name, "tiles", "{what}"),
            other => panic!("{what}: expected a tiles error, got {other:?}"),
        }
        return;
    }
    let mut oracle_inputs = inputs.clone();
    oracle_inputs.initial_state = Some(starting_states(p, &pool, slots));
    let expected = reference::forward(p, &oracle_inputs.as_ref()).unwrap();

    let run = run_decode(ctx, p, &inputs, &pool, slots, per_token, tiles);
    assert_eq!(run.o.dtype, dtype, "{what}: o in the dtype of v");
    let e_o = relative_l2(&run.o.data, &expected.o);
    eprintln!("{what}\n  rel-L2 o {e_o:.3e}");
    assert_eq!(
        run.pool.dtype, pool_dtype,
        "{what}: the pool keeps its dtype"
    );
    assert!(e_o <= tol_o, "{what}: o rel-L2 {e_o:e} > {tol_o:e}");
    assert_pool(
        p,
        &pool,
        &run.pool,
        &expected.final_state,
        slots,
        tol_s,
        &what,
    );

    if let Some(states) = run.per_token_states {
        let sequences = p.sequences();
        let longest = sequences.iter().map(|r| r.len()).max().unwrap();
        let len = state_len(p);
        let mut want = vec![f64::NAN; p.total_tokens() * len];
        for j in 1..=longest {
            let prefixes: Vec<Range<usize>> = sequences
                .iter()
                .map(|r| r.start..(r.start + j).min(r.end))
                .collect();
            let (sub, mut sub_inputs) = select_tokens(p, &oracle_inputs, &prefixes, false);
            sub_inputs.initial_state = oracle_inputs
                .initial_state
                .clone()
                .map(|h| HostTensor::new(sub.state_shape(), h.data));
            let out = reference::forward(&sub, &sub_inputs.as_ref()).unwrap();
            for (n, r) in sequences.iter().enumerate().filter(|(_, r)| r.len() >= j) {
                let token = r.start + j - 1;
                want[token * len..(token + 1) * len]
                    .copy_from_slice(&out.final_state[n * len..(n + 1) * len]);
            }
        }
        let e = relative_l2(&states.data, &want);
        eprintln!("  rel-L2 per-token states {e:.3e}");
        assert!(
            e <= tol_s,
            "{what}: per-token states rel-L2 {e:e} > {tol_s:e}"
        );
    }
}

/// The default tiling, the column kernel's (V-block nearest 32) where it takes the head dims
/// and, where the device has subgroups of ≥ 8 invocations, the subgroup kernel's own default
/// too (opt-in), so every option runs through every kernel.
fn kernels(ctx: &Context, p: &Problem) -> Vec<Option<RecurrentStepTiles>> {
    let mut out = vec![None];
    // The column kernel (the forward's on CPU adapters) where it takes the head dims.
    if let Some(t) = RecurrentStepTiles::column_candidates(&ctx.limits(), p)
        .into_iter()
        .min_by_key(|t| t.v_block.abs_diff(32))
    {
        out.push(Some(t));
    }
    if subgroup_kernel_available(ctx) {
        out.push(RecurrentStepTiles::choose_subgroup(&ctx.limits(), p));
    }
    out
}

fn check_decode(p: &Problem, seed: u64, pool_slots: usize, slots: &[StateSlot], per_token: bool) {
    let Some(ctx) = gpu() else { return };
    for tiles in kernels(ctx, p) {
        check_decode_with(ctx, p, seed, pool_slots, slots, per_token, tiles);
    }
}

#[test]
fn decode_one_token_per_sequence() {
    check_decode(
        &dense(3, 1, 1, 2, 32, 32),
        1,
        5,
        &[Resume(4), Resume(0), Resume(2)],
        false,
    );
}

#[test]
fn verification_of_16_tokens_with_per_token_states() {
    check_decode(
        &dense(2, 16, 1, 2, 32, 48),
        2,
        3,
        &[Resume(2), Resume(0)],
        true,
    );
}

#[test]
fn gva_ratios_1_2_4() {
    for (i, hv) in [2, 4, 8].into_iter().enumerate() {
        check_decode(
            &dense(2, 2, 2, hv, 32, 32),
            10 + i as u64,
            2,
            &[Resume(1), Resume(0)],
            false,
        );
    }
}

#[test]
fn each_option() {
    for (i, o) in common::each_single_option().into_iter().enumerate() {
        check_decode(
            &problem(2, 3, 1, 3, 32, 32, None, o),
            20 + i as u64,
            3,
            &[Resume(0), Resume(2)],
            false,
        );
    }
}

#[test]
fn state_v_first() {
    let o = Options {
        state_v_first: true,
        ..Options::default()
    };
    check_decode(
        &problem(2, 3, 1, 2, 32, 48, None, o),
        30,
        3,
        &[Resume(1), Resume(2)],
        true,
    );
    check_decode(
        &problem(2, 1, 1, 2, 48, 32, None, o),
        31,
        2,
        &[Resume(1), Resume(0)],
        false,
    );
    check_decode(
        &problem(1, 2, 1, 1, 64, 64, None, o),
        32,
        1,
        &[Resume(0)],
        false,
    );
}

#[test]
fn head_dim_128_both_layouts() {
    for (i, v_first) in [false, true].into_iter().enumerate() {
        let o = Options {
            state_v_first: v_first,
            ..Options::default()
        };
        check_decode(
            &problem(2, 1, 1, 1, 128, 128, None, o),
            40 + i as u64,
            3,
            &[Resume(2), Resume(0)],
            false,
        );
    }
}

#[test]
fn varlen_with_lengths_one_and_zero() {
    let cu = vec![0, 1, 5, 5, 21];
    let p = problem(1, 21, 1, 2, 32, 32, Some(cu), Options::default());
    check_decode(
        &p,
        50,
        6,
        &[Resume(3), Fresh(0), Resume(5), Resume(1)],
        true,
    );
}

#[test]
fn fresh_and_padding_mixed_with_resumed_slots() {
    // Fresh(1) overwrites a slot holding a random state; padding writes nothing; slots 2 and
    // 5 are addressed by nobody and must keep their bits.
    let p = dense(4, 2, 1, 2, 32, 32);
    check_decode(&p, 60, 6, &[Resume(3), Fresh(1), Padding, Resume(0)], true);
    check_decode(&p, 61, 6, &[Fresh(4), Fresh(0), Fresh(5), Padding], false);
}

#[test]
fn every_option_together_with_varlen_gva_and_v_first() {
    let o = Options {
        scale: Some(0.2),
        l2norm_qk: true,
        beta_sigmoid: true,
        allow_neg_eigval: true,
        gate_in_kernel: true,
        state_v_first: true,
    };
    let p = problem(1, 9, 2, 4, 32, 48, Some(vec![0, 1, 9]), o);
    check_decode(&p, 70, 4, &[Fresh(2), Resume(0)], true);
}

#[test]
fn every_tiling_the_device_fits() {
    let Some(ctx) = gpu() else { return };
    let cases = [
        (32, 64, false),
        (64, 32, true),
        (48, 32, false),
        (48, 16, true),
    ];
    for (i, (k, v, v_first)) in cases.into_iter().enumerate() {
        let o = Options {
            state_v_first: v_first,
            ..Options::default()
        };
        let p = problem(2, 2, 1, 2, k, v, None, o);
        let mut tiles = RecurrentStepTiles::candidates(&ctx.limits(), &p);
        assert!(!tiles.is_empty(), "no tiling for {p:?}");
        let columns = RecurrentStepTiles::column_candidates(&ctx.limits(), &p);
        assert!(!columns.is_empty(), "no column tiling for {p:?}");
        tiles.extend(columns);
        for t in tiles {
            check_decode_with(
                ctx,
                &p,
                80 + i as u64,
                3,
                &[Resume(2), Fresh(0)],
                false,
                Some(t),
            );
        }
    }
}

/// Calls whose sequences have at most one token (T = 1 decode), which the workgroup kernel
/// runs without its token loop (`ONE_TOKEN`): every workgroup tiling (walking ones
/// included), lengths 0 and 1 side by side, resumed, fresh and padding slots, GVA with a
/// g = 0 and a g ≈ −20 head, per-token states, every option, β near 0 and near 2, both
/// layouts, f32 and bf16 pools and every storage dtype the device takes.
#[test]
fn one_token_calls_on_every_tiling() {
    let Some(ctx) = gpu() else { return };
    let slots = [Resume(3), Fresh(0), Padding, Resume(5), Fresh(6)];
    let varlen = Some(vec![0, 1, 1, 2, 3, 3]);
    let mut ran = 0;
    for (i, v_first) in [false, true].into_iter().enumerate() {
        let every = Options {
            scale: Some(0.3),
            l2norm_qk: true,
            beta_sigmoid: true,
            allow_neg_eigval: true,
            gate_in_kernel: true,
            state_v_first: v_first,
        };
        let plain = Options {
            state_v_first: v_first,
            ..Options::default()
        };
        let cases = [
            (problem(5, 1, 2, 4, 32, 32, None, plain), false, (0.0, 0.02)),
            (
                problem(1, 3, 2, 4, 32, 32, varlen.clone(), every),
                true,
                (0.99, 1.0),
            ),
        ];
        for (j, (p, per_token, beta)) in cases.into_iter().enumerate() {
            BETA.set(beta);
            let seed = 1300 + (2 * i + j) as u64;
            for t in RecurrentStepTiles::candidates(&ctx.limits(), &p) {
                check_decode_with(ctx, &p, seed, 8, &slots, per_token, Some(t));
                ran += 1;
            }
            for pool in [DType::F32, DType::BF16] {
                for dtype in [DType::F32].into_iter().chain(half_storages(ctx)) {
                    check_decode_in(ctx, &p, seed, 8, &slots, per_token, None, dtype, pool);
                }
            }
        }
    }
    BETA.set((0.0, 1.0));
    assert!(ran >= 20, "only {ran} tilings ran");
}

/// Workgroups that walk several sequences (the `VxNsS` and `VxNtS` tilings): more sequences than a
/// workgroup walks and not a multiple of it, lengths 0, 1 and odd (k's double buffer carries
/// its parity across sequences), resumed, fresh and padding slots side by side, GVA with a
/// g = 0 and a g ≈ −20 head, per-token states, β near 0 and near 2, both layouts.
#[test]
fn workgroups_walking_several_sequences() {
    let Some(ctx) = gpu() else { return };
    let all = Options {
        scale: Some(0.2),
        l2norm_qk: true,
        beta_sigmoid: true,
        allow_neg_eigval: true,
        gate_in_kernel: true,
        state_v_first: false,
    };
    let slots = [
        Resume(3),
        Fresh(0),
        Padding,
        Resume(5),
        Fresh(6),
        Padding,
        Resume(1),
    ];
    let varlen = Some(vec![0, 1, 1, 4, 9, 10, 13, 14]);
    let mut walked = 0;
    for (i, v_first) in [false, true].into_iter().enumerate() {
        let plain = Options {
            state_v_first: v_first,
            ..Options::default()
        };
        let every = Options {
            state_v_first: v_first,
            ..all
        };
        let cases = [
            (problem(7, 1, 1, 4, 32, 32, None, plain), false, (0.0, 0.02)),
            (
                problem(1, 14, 2, 4, 32, 32, varlen.clone(), every),
                true,
                (0.99, 1.0),
            ),
        ];
        for (j, (p, per_token, beta)) in cases.into_iter().enumerate() {
            BETA.set(beta);
            let tiles = RecurrentStepTiles::candidates(&ctx.limits(), &p);
            for t in tiles.into_iter().filter(|t| t.seqs_per_workgroup > 1) {
                let mark = if t.prefetch_next { "s" } else { "t" };
                assert!(
                    t.name()
                        .ends_with(&format!("{mark}{}", t.seqs_per_workgroup))
                );
                check_decode_with(
                    ctx,
                    &p,
                    900 + (2 * i + j) as u64,
                    8,
                    &slots,
                    per_token,
                    Some(t),
                );
                walked += 1;
            }
        }
    }
    BETA.set((0.0, 1.0));
    assert!(walked >= 6, "only {walked} walking tilings ran");
}

/// The subgroup kernel at every tiling it has, on K with partial and full k-groups (16, 48,
/// 256), V-blocks wider than V (idle teams), both layouts, per-token states and fresh slots.
#[test]
fn subgroup_kernel_every_tiling() {
    let Some(ctx) = gpu() else { return };
    if !subgroup_kernel_available(ctx) {
        eprintln!("no subgroups of at least 8 invocations on this adapter: not run");
        return;
    }
    let cases = [
        (32, 64, false),
        (64, 32, true),
        (48, 32, false),
        (48, 16, true),
        (256, 48, false),
        (16, 16, true),
        (128, 48, true),
    ];
    for (i, (k, v, v_first)) in cases.into_iter().enumerate() {
        let o = Options {
            state_v_first: v_first,
            ..Options::default()
        };
        let p = problem(2, 2, 1, 2, k, v, None, o);
        let tiles = RecurrentStepTiles::subgroup_candidates(&ctx.limits(), &p);
        assert!(!tiles.is_empty(), "no subgroup tiling for {p:?}");
        for t in tiles {
            assert_eq!(t.kernel, StepKernel::Subgroup);
            check_decode_with(
                ctx,
                &p,
                300 + i as u64,
                3,
                &[Resume(2), Fresh(0)],
                true,
                Some(t),
            );
        }
    }
}

/// Decode plans take the workgroup kernel's tiling (the subgroup kernel measured slower on the
/// H200); the subgroup kernel's own default is `SUBGROUP_V_BLOCK` columns per workgroup, and
/// it is offered only where the device has subgroups of at least 8 invocations.
#[test]
fn default_kernel_and_the_subgroup_default() {
    let Some(ctx) = gpu() else { return };
    let p = problem(4, 1, 2, 4, 128, 128, None, Options::default());
    let t = RecurrentStepTiles::choose_for(ctx, &p).unwrap();
    assert_eq!(t, RecurrentStepTiles::choose(&ctx.limits(), &p).unwrap());
    assert_eq!(t.kernel, StepKernel::Workgroup);
    let sg = RecurrentStepTiles::choose_subgroup(&ctx.limits(), &p).unwrap();
    assert_eq!(sg.kernel, StepKernel::Subgroup);
    assert_eq!(
        (sg.v_block, sg.name()),
        (SUBGROUP_V_BLOCK, "sg32".to_string())
    );
    assert_eq!(
        RecurrentStepTiles::all_candidates(ctx, &p).contains(&sg),
        subgroup_kernel_available(ctx)
    );
}

/// The default tiling does what `RecurrentStepTiles::choose` documents, on a big GPU's limits
/// (no adapter needed): 16 vec4s per invocation and 128-invocation workgroups for B = 256,
/// HV = 32, K = V = 128 (K-first: 64-column V-blocks, 256-byte row segments), 8 for B = 1.
#[test]
fn default_tiling_follows_the_state_size() {
    let limits = wgpu::Limits {
        max_compute_workgroup_storage_size: 49152,
        max_compute_invocations_per_workgroup: 1024,
        max_compute_workgroup_size_x: 1024,
        ..wgpu::Limits::default()
    };
    for v_first in [false, true] {
        let o = Options {
            state_v_first: v_first,
            ..Options::default()
        };
        let big = RecurrentStepTiles::choose(&limits, &problem(256, 1, 16, 32, 128, 128, None, o))
            .unwrap();
        eprintln!("B = 256: {big:?}");
        // The fastest tiling of the H200 sweep of 2026-12-02 at B = 64 to 256 (K-first: V-block
        // 64, 16 vec4s, workgroups of 128; see `RecurrentStepTiles::choose`).
        assert_eq!(
            (big.vec4s_per_thread, big.workgroup()),
            (16, 128),
            "{big:?}"
        );
        if !v_first {
            assert_eq!(big.v_block, 64, "{big:?}");
        }
        // K-first B = 64 (128 MiB of state): 16 vec4s in workgroups of 128 (V-block 64), the
        // fastest of the H200 sweep of 2026-12-02 there.
        let mid = RecurrentStepTiles::choose(&limits, &problem(64, 1, 16, 32, 128, 128, None, o))
            .unwrap();
        eprintln!("B = 64: {mid:?}");
        assert_eq!(
            (mid.vec4s_per_thread, mid.workgroup()),
            (16, 128),
            "{mid:?}"
        );
        if !v_first {
            assert_eq!(mid.v_block, 64, "{mid:?}");
        }
        let one =
            RecurrentStepTiles::choose(&limits, &problem(1, 1, 16, 32, 128, 128, None, o)).unwrap();
        eprintln!("B = 1: {one:?}");
        assert_eq!(one.vec4s_per_thread, 8, "{one:?}");
    }
}

/// WebGPU's default limits (16 KiB workgroup memory, 8 storage buffers): what a browser grants.
#[test]
fn webgpu_default_limits() {
    if gpu().is_none() {
        return;
    }
    let adapter = pollster::block_on(wgpu_backend::list_adapters())
        .into_iter()
        .next()
        .unwrap();
    let info = adapter.get_info();
    let desc = wgpu::DeviceDescriptor {
        required_limits: wgpu::Limits::default(),
        ..Default::default()
    };
    let (device, queue) = pollster::block_on(adapter.request_device(&desc)).unwrap();
    let ctx = Context::from_device(device, queue, Some(info)).unwrap();
    for (i, v_first) in [false, true].into_iter().enumerate() {
        let o = Options {
            state_v_first: v_first,
            ..Options::default()
        };
        for (k, v) in [(128, 128), (256, 256)] {
            let p = problem(1, 2, 1, 1, k, v, None, o);
            let tiles = RecurrentStepTiles::choose(&ctx.limits(), &p).unwrap();
            assert!(tiles.workgroup_bytes() <= 16384, "{tiles:?}");
            // No SUBGROUP requested: no subgroup tiling is offered.
            assert_eq!(RecurrentStepTiles::choose_for(&ctx, &p).unwrap(), tiles);
            assert!(
                RecurrentStepTiles::all_candidates(&ctx, &p)
                    .iter()
                    .all(|t| t.kernel != StepKernel::Subgroup)
            );
            // The default and the column kernel (where K ≤ 128) within these limits.
            for tiles in kernels(&ctx, &p) {
                check_decode_with(&ctx, &p, 90 + i as u64, 1, &[Resume(0)], false, tiles);
            }
        }
    }
}

// ---- f16 and bf16 storage of q, k, v, o (the state stays f32) ----

/// The 16-bit storage dtypes the device takes for decode (o carries one rounding to the dtype;
/// the oracle runs on the same rounded inputs).
fn half_storages(ctx: &Context) -> Vec<DType> {
    let available = wgpu_backend::decode::decode_storage_dtypes(ctx);
    [DType::BF16, DType::F16]
        .into_iter()
        .filter(|dtype| {
            let ok = available.contains(dtype);
            if !ok {
                eprintln!("{dtype} storage not available on this device: not run");
            }
            ok
        })
        .collect()
}

#[test]
fn half_storage_decode_and_verification() {
    let Some(ctx) = gpu() else { return };
    let storages = half_storages(ctx);
    assert!(storages.contains(&DType::BF16), "bf16 runs on every device");
    for (i, storage) in storages.into_iter().enumerate() {
        let seed = 200 + 10 * i as u64;
        // T = 1 at head dim 128 with the default tilings, both layouts.
        for (j, v_first) in [false, true].into_iter().enumerate() {
            let o = Options {
                state_v_first: v_first,
                ..Options::default()
            };
            check_decode_stored(
                ctx,
                &problem(2, 1, 1, 2, 128, 128, None, o),
                seed + j as u64,
                3,
                &[Resume(2), Resume(0)],
                false,
                None,
                storage,
            );
        }
        // Verification with per-token states, varlen with lengths 1 and 0, fresh and padding
        // slots, GVA and every option (l2norm uses the raw q, k: the state stays exact).
        let all = Options {
            scale: Some(0.2),
            l2norm_qk: true,
            beta_sigmoid: true,
            allow_neg_eigval: true,
            gate_in_kernel: true,
            state_v_first: true,
        };
        check_decode_stored(
            ctx,
            &problem(1, 9, 2, 4, 32, 48, Some(vec![0, 1, 9]), all),
            seed + 2,
            4,
            &[Fresh(2), Resume(0)],
            true,
            None,
            storage,
        );
        let k_first = Options {
            state_v_first: false,
            ..all
        };
        check_decode_stored(
            ctx,
            &problem(1, 21, 1, 2, 48, 32, Some(vec![0, 1, 5, 5, 21]), k_first),
            seed + 3,
            6,
            &[Resume(3), Fresh(0), Padding, Resume(1)],
            true,
            None,
            storage,
        );
    }
}

/// Every tiling with packed (bf16) and f16 o stores: K-first pairs within an invocation's
/// four columns, V-first pairs of neighbouring rows written by the even row's lane 0.
#[test]
fn half_storage_every_tiling() {
    let Some(ctx) = gpu() else { return };
    for (i, storage) in half_storages(ctx).into_iter().enumerate() {
        for (j, v_first) in [false, true].into_iter().enumerate() {
            let o = Options {
                state_v_first: v_first,
                ..Options::default()
            };
            let p = problem(2, 2, 1, 2, 32, 32, None, o);
            let tiles = RecurrentStepTiles::candidates(&ctx.limits(), &p);
            assert!(!tiles.is_empty(), "no tiling for {p:?}");
            for t in tiles {
                check_decode_stored(
                    ctx,
                    &p,
                    220 + (2 * i + j) as u64,
                    3,
                    &[Resume(2), Fresh(0)],
                    false,
                    Some(t),
                    storage,
                );
            }
        }
    }
}

/// The GPU chunked forward of `p` from `initial_state` (or zeros).
fn gpu_forward(
    ctx: &Context,
    p: &Problem,
    inputs: &ForwardInputs<HostTensor>,
) -> (GpuTensor, GpuTensor) {
    let gpu_inputs = upload_inputs(ctx, inputs);
    let mut encoder = ctx.create_encoder("test forward");
    let fwd = wgpu_backend::forward(ctx, &mut encoder, p, &gpu_inputs.as_ref()).unwrap();
    ctx.submit_and_wait(encoder).unwrap();
    (fwd.o, fwd.final_state)
}

/// Chunked prefill of each sequence's first `prompt[n]` tokens (`wgpu_backend::forward`, its final
/// state copied into the pool), then decode calls of `steps[i]` tokens per sequence; o and the
/// final states must equal one chunked forward — and the oracle — over the whole sequences.
/// A sequence with an empty prompt starts its first decode call as `Fresh`.
fn check_prefill_then_decode(
    options: Options,
    lengths: &[usize],
    prompts: &[usize],
    steps: &[usize],
    seed: u64,
) {
    let Some(ctx) = gpu() else { return };
    let n = lengths.len();
    let mut cu = vec![0];
    for l in lengths {
        cu.push(cu.last().unwrap() + l);
    }
    let whole = problem(1, cu[n], 1, 2, 32, 32, Some(cu.clone()), options);
    let s = RandomSpec {
        zero_gate_heads: 0,
        strong_gate_heads: 0,
        ..spec(seed)
    };
    let inputs = s.generate(&whole);
    let expected = reference::forward(&whole, &inputs.as_ref()).unwrap();
    let (whole_o, whole_state) = gpu_forward(ctx, &whole, &inputs);
    let (whole_o, whole_state) = (
        whole_o.download_blocking(ctx).unwrap(),
        whole_state.download_blocking(ctx).unwrap(),
    );

    // Slots in reverse order in a pool with a spare slot, so slot ≠ sequence index.
    let pool_problem = problem(1, 1, 1, 2, 32, 32, None, options);
    let pool = StatePool::for_problem(ctx, &pool_problem, n + 1).unwrap();
    let slot_of = |i: usize| (n - i) as u32;
    let o = GpuTensor::filled(ctx, "o", &whole.v_shape(), DType::F32, f32::NAN).unwrap();
    let o_row = 4 * (whole.heads_v * whole.value_dim) as u64;
    let mut encoder = ctx.create_encoder("prefill");
    let prefilled: Vec<usize> = (0..n).filter(|&i| prompts[i] > 0).collect();
    if !prefilled.is_empty() {
        let ranges: Vec<Range<usize>> = prefilled
            .iter()
            .map(|&i| cu[i]..cu[i] + prompts[i])
            .collect();
        let (prefix, prefix_inputs) = select_tokens(&whole, &inputs, &ranges, false);
        let (prefix_o, prefix_state) = gpu_forward(ctx, &prefix, &prefix_inputs);
        for (entry, (&i, r)) in prefilled.iter().zip(&ranges).enumerate() {
            pool.copy_into_slot(&mut encoder, &prefix_state, entry, slot_of(i) as usize)
                .unwrap();
            let from = prefix.sequences()[entry].start as u64 * o_row;
            encoder.copy_buffer_to_buffer(
                &prefix_o.buffer,
                from,
                &o.buffer,
                r.start as u64 * o_row,
                r.len() as u64 * o_row,
            );
        }
    }
    ctx.submit_and_wait(encoder).unwrap();

    let mut done = prompts.to_vec();
    for &step in steps {
        let ranges: Vec<Range<usize>> = (0..n)
            .map(|i| (cu[i] + done[i]).min(cu[i + 1])..(cu[i] + done[i] + step).min(cu[i + 1]))
            .collect();
        let all_equal = ranges.iter().all(|r| r.len() == ranges[0].len()) && !ranges[0].is_empty();
        let (sub, sub_inputs) = select_tokens(&whole, &inputs, &ranges, all_equal);
        let slots: Vec<StateSlot> = (0..n)
            .map(|i| match (ranges[i].is_empty(), done[i]) {
                (true, _) => Padding,
                (false, 0) => Fresh(slot_of(i)),
                (false, _) => Resume(slot_of(i)),
            })
            .collect();
        let gpu_inputs = upload_inputs(ctx, &sub_inputs);
        let step_o = GpuTensor::empty(ctx, "o of a step", &sub.v_shape(), DType::F32).unwrap();
        let mut encoder = ctx.create_encoder("decode");
        decode_step(
            ctx,
            &mut encoder,
            &sub,
            &gpu_inputs.as_ref(),
            &pool,
            &slots,
            &DecodeOutputs {
                o: &step_o,
                per_token_states: None,
            },
        )
        .unwrap();
        for (r, seq) in ranges.iter().zip(sub.sequences()) {
            if !r.is_empty() {
                encoder.copy_buffer_to_buffer(
                    &step_o.buffer,
                    seq.start as u64 * o_row,
                    &o.buffer,
                    r.start as u64 * o_row,
                    r.len() as u64 * o_row,
                );
            }
        }
        ctx.submit_and_wait(encoder).unwrap();
        for (i, r) in ranges.iter().enumerate() {
            done[i] += r.len();
        }
    }
    assert_eq!(done, lengths, "the steps must cover every token");

    let o = o.download_blocking(ctx).unwrap();
    let pool_host = pool.tensor().download_blocking(ctx).unwrap();
    let len = state_len(&whole);
    let states: Vec<f32> = (0..n)
        .flat_map(|i| {
            pool_host.data[slot_of(i) as usize * len..(slot_of(i) as usize + 1) * len].to_vec()
        })
        .collect();
    let as_f64 = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<f64>>();
    let errors = [
        (
            "o vs one chunked forward",
            relative_l2(&o.data, &as_f64(&whole_o.data)),
        ),
        (
            "final state vs one chunked forward",
            relative_l2(&states, &as_f64(&whole_state.data)),
        ),
        ("o vs oracle", relative_l2(&o.data, &expected.o)),
        (
            "final state vs oracle",
            relative_l2(&states, &expected.final_state),
        ),
    ];
    let shown: Vec<String> = errors
        .iter()
        .map(|(name, e)| format!("{name} {e:.3e}"))
        .collect();
    eprintln!(
        "{options:?} lengths {lengths:?} prompts {prompts:?} steps {steps:?}: {}",
        shown.join(", ")
    );
    let (tol_o, tol_s) = tol_o_state(Case::new(Op::Decode, DType::F32));
    for (name, e) in errors {
        let tol = if name.contains("state") { tol_s } else { tol_o };
        assert!(
            e <= tol,
            "{name}: rel-L2 {e:e} > {tol:e} ({options:?}, prompts {prompts:?})"
        );
    }
}

#[test]
fn prefill_then_decode_equals_one_forward() {
    // Prompts of 70 tokens (two chunks), then 4 single-token steps.
    check_prefill_then_decode(Options::default(), &[74, 74], &[70, 70], &[1, 1, 1, 1], 100);
}

#[test]
fn prefill_then_decode_with_every_flag_and_v_first() {
    let o = common::every_option();
    check_prefill_then_decode(o, &[69, 8], &[64, 5], &[1, 3, 1], 101);
}

#[test]
fn prefill_then_decode_mixed_with_fresh_sequences() {
    // The second and fourth sequences have no prompt: their first decode call starts fresh;
    // the last verification step (T = 4) runs past the end of the shorter sequences.
    check_prefill_then_decode(
        Options::default(),
        &[70, 6, 9, 3],
        &[65, 0, 3, 0],
        &[1, 1, 4],
        102,
    );
}

/// One plan, reused for every step: inputs rewritten through the queue, slots switched from
/// fresh to resumed — the decode loop of a server.
#[test]
fn one_plan_reused_for_every_step() {
    let Some(ctx) = gpu() else { return };
    let (n, steps) = (3, 5);
    let whole = dense(n, steps, 1, 2, 32, 32);
    let inputs = spec(110).generate(&whole);
    let expected = reference::forward(&whole, &inputs.as_ref()).unwrap();

    let step_problem = dense(n, 1, 1, 2, 32, 32);
    let column = |t: usize| -> Vec<Range<usize>> {
        (0..n).map(|b| b * steps + t..b * steps + t + 1).collect()
    };
    let (_, first) = select_tokens(&whole, &inputs, &column(0), true);
    let buffers = upload_inputs(ctx, &first);
    let pool = StatePool::for_problem(ctx, &step_problem, 4).unwrap();
    let o = GpuTensor::filled(ctx, "o", &step_problem.v_shape(), DType::F32, f32::NAN).unwrap();
    let all_o = GpuTensor::filled(ctx, "all o", &whole.v_shape(), DType::F32, f32::NAN).unwrap();
    let slots = [1u32, 3, 0];
    let fresh: Vec<StateSlot> = slots.iter().map(|&s| Fresh(s)).collect();
    let resume: Vec<StateSlot> = slots.iter().map(|&s| Resume(s)).collect();
    let mut plan = DecodePlan::new(
        ctx,
        &step_problem,
        &buffers.as_ref(),
        &pool,
        &fresh,
        &DecodeOutputs {
            o: &o,
            per_token_states: None,
        },
    )
    .unwrap();
    let row = 4 * (whole.heads_v * whole.value_dim) as u64;
    for t in 0..steps {
        let (_, step_inputs) = select_tokens(&whole, &inputs, &column(t), true);
        for (buffer, host) in [
            (&buffers.q, &step_inputs.q),
            (&buffers.k, &step_inputs.k),
            (&buffers.v, &step_inputs.v),
            (&buffers.g, &step_inputs.g),
            (&buffers.beta, &step_inputs.beta),
        ] {
            ctx.queue
                .write_buffer(&buffer.buffer, 0, bytemuck::cast_slice(&host.data));
        }
        plan.set_slots(ctx, if t == 0 { &fresh } else { &resume })
            .unwrap();
        let mut encoder = ctx.create_encoder("step");
        plan.record(&mut encoder);
        for b in 0..n {
            encoder.copy_buffer_to_buffer(
                &o.buffer,
                b as u64 * row,
                &all_o.buffer,
                (b * steps + t) as u64 * row,
                row,
            );
        }
        ctx.queue.submit([encoder.finish()]);
    }
    let all_o = all_o.download_blocking(ctx).unwrap();
    let pool_host = pool.tensor().download_blocking(ctx).unwrap();
    let len = state_len(&whole);
    let states: Vec<f32> = slots
        .iter()
        .flat_map(|&s| pool_host.data[s as usize * len..(s as usize + 1) * len].to_vec())
        .collect();
    let (e_o, e_s) = (
        relative_l2(&all_o.data, &expected.o),
        relative_l2(&states, &expected.final_state),
    );
    eprintln!("plan reused for {steps} steps: rel-L2 o {e_o:.3e}, states {e_s:.3e}");
    let (tol_o, tol_s) = tol_o_state(Case::new(Op::Decode, DType::F32));
    assert!(e_o <= tol_o && e_s <= tol_s, "o {e_o:e}, states {e_s:e}");
    assert!(
        pool_host.data[2 * len..3 * len].iter().all(|&x| x == 0.0),
        "unaddressed slot 2 changed"
    );
}

#[test]
fn decode_host_token_by_token_matches_the_oracle() {
    let Some(ctx) = gpu() else { return };
    let o = Options {
        gate_in_kernel: true,
        beta_sigmoid: true,
        ..Options::default()
    };
    let cases = [
        (
            problem(1, 12, 1, 2, 32, 32, Some(vec![0, 5, 5, 6, 12]), o),
            true,
        ),
        (
            problem(
                2,
                4,
                1,
                2,
                16,
                32,
                None,
                Options {
                    state_v_first: true,
                    ..Options::default()
                },
            ),
            false,
        ),
    ];
    for (i, (p, h0)) in cases.into_iter().enumerate() {
        let inputs = RandomSpec {
            initial_state: h0,
            ..spec(120 + i as u64)
        }
        .generate(&p);
        let expected = reference::forward(&p, &inputs.as_ref()).unwrap();
        let case = Case::new(Op::Decode, DType::F32).with_l2norm(p.options.l2norm_qk);
        let (tol_o, tol_s) = tol_o_state(case);
        for tokens_per_step in [1, 3] {
            let out = decode_host(ctx, &p, &inputs.as_ref(), tokens_per_step).unwrap();
            let (e_o, e_s) = (
                relative_l2(&out.o.data, &expected.o),
                relative_l2(&out.final_state.data, &expected.final_state),
            );
            eprintln!(
                "decode_host {tokens_per_step} tokens per step: o {e_o:.3e}, state {e_s:.3e}"
            );
            assert!(
                e_o <= tol_o && e_s <= tol_s,
                "{p:?}: o {e_o:e}, state {e_s:e}"
            );
        }
    }
}

// ---- bf16 state pool ----

/// A bf16 pool against the oracle (started from the pool's rounded states) on both kernels:
/// T = 1 at head dim 128 in both layouts, every tiling at a small head dim, verification with
/// per-token states (bf16 too), every option, varlen, fresh and padding slots, bf16 q, k, v.
/// States are within the f32 bound plus one bf16 rounding (2e-3); o sees no rounding.
#[test]
fn bf16_pool_against_the_oracle() {
    let Some(ctx) = gpu() else { return };
    let bf16 = DType::BF16;
    for (i, v_first) in [false, true].into_iter().enumerate() {
        let o = Options {
            state_v_first: v_first,
            ..Options::default()
        };
        let p = problem(2, 1, 1, 2, 128, 128, None, o);
        for tiles in kernels(ctx, &p) {
            let slots = [Resume(2), Resume(0)];
            check_decode_in(
                ctx,
                &p,
                400 + i as u64,
                3,
                &slots,
                false,
                tiles,
                DType::F32,
                bf16,
            );
        }
        let small = problem(2, 2, 1, 2, 32, 32, None, o);
        for t in RecurrentStepTiles::all_candidates(ctx, &small) {
            let slots = [Resume(2), Fresh(0)];
            check_decode_in(
                ctx,
                &small,
                410 + i as u64,
                3,
                &slots,
                false,
                Some(t),
                DType::F32,
                bf16,
            );
        }
    }
    let all = Options {
        scale: Some(0.2),
        l2norm_qk: true,
        beta_sigmoid: true,
        allow_neg_eigval: true,
        gate_in_kernel: true,
        state_v_first: true,
    };
    let k_first = Options {
        state_v_first: false,
        ..all
    };
    let p = problem(1, 9, 2, 4, 32, 48, Some(vec![0, 1, 9]), all);
    let q = problem(1, 21, 1, 2, 48, 32, Some(vec![0, 1, 5, 5, 21]), k_first);
    for tiles in kernels(ctx, &p) {
        check_decode_in(
            ctx,
            &p,
            420,
            4,
            &[Fresh(2), Resume(0)],
            true,
            tiles,
            bf16,
            bf16,
        );
    }
    for tiles in kernels(ctx, &q) {
        let slots = [Resume(3), Fresh(0), Padding, Resume(1)];
        check_decode_in(ctx, &q, 421, 6, &slots, true, tiles, DType::F32, bf16);
    }
}

/// Token by token through a bf16 pool (one call, so one rounding of every state, per step)
/// for 64 steps against the oracle run in f64 from the same rounded h0, with a v-head that
/// never decays (g = 0): the roundings add up, and only the β kkᵀ updates forget them there.
/// Bound: the 4096-step run of `examples/decode --accuracy 4096` (lavapipe, 2026-12-01,
/// docs/accuracy.md) saturated at 1.1e-2 for o and the states (from ~256 steps on, the
/// no-decay head dominating); 2e-2 leaves ~2× over that plateau.
#[test]
fn bf16_pool_over_64_decode_steps() {
    let Some(ctx) = gpu() else { return };
    for (i, v_first) in [false, true].into_iter().enumerate() {
        let o = Options {
            state_v_first: v_first,
            ..Options::default()
        };
        let p = problem(2, 64, 1, 2, 32, 32, None, o);
        let mut inputs = RandomSpec {
            initial_state: true,
            zero_gate_heads: 1,
            ..spec(430 + i as u64)
        }
        .generate(&p);
        // h0 holds bf16 values (f32 storage): the pool's own rounding of it is then exact.
        inputs.initial_state = inputs.initial_state.map(|h| HostTensor {
            dtype: DType::F32,
            ..h.with_dtype(DType::BF16)
        });
        let expected = reference::forward(&p, &inputs.as_ref()).unwrap();
        let out = decode_host_in(ctx, &p, &inputs.as_ref(), 1, DType::BF16).unwrap();
        let (e_o, e_s) = (
            relative_l2(&out.o.data, &expected.o),
            relative_l2(&out.final_state.data, &expected.final_state),
        );
        eprintln!("bf16 pool, 64 steps, v_first {v_first}: o {e_o:.3e}, state {e_s:.3e}");
        assert!(
            e_o <= BF16_POOL_STEPS_O && e_s <= BF16_POOL_STEPS_STATE,
            "o {e_o:e}, state {e_s:e}"
        );
    }
}

/// Bounds of [`bf16_pool_over_64_decode_steps`].
const BF16_POOL_STEPS_O: f64 = 2e-2;
const BF16_POOL_STEPS_STATE: f64 = 2e-2;
