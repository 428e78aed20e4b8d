// recurrent_step: the token-by-token GDN recurrence over an in-place state pool (decode and
// multi-token verification). One workgroup per (V-block, v-head, sequence) loads its f32
// state slice S (K × V_BLOCK) from the sequence's pool slot once, walks the sequence's tokens
// in FLA's order (§1.1)
//     S ← α S;   u = β (v − Sᵀk);   S ← S + k uᵀ;   o = scale · Sᵀq
// and stores the slice once. Both K-reductions read the *old* state in one pass:
//     a = S_oldᵀk,  b = S_oldᵀq,  u = β (v − α a),  o = scale (α b + u (k·q)),
//     S ← α S_old + k uᵀ
// With l2norm the raw q, k are used and the norms enter as factors (rk, rq), so Σk², Σq²
// and k·q ride along in the same reduction: one workgroup reduction per token.
//
// The kernel is bandwidth-bound (at T = 1 every state byte is read once and written once and
// there are ~2 FLOPs per byte), so the design is about bytes in flight and a short life per
// workgroup:
// - Every invocation owns VEC4S (≤ 32) vec4s of the slice, held in named registers (eight
//   `Quad`s of four vec4s; never a private array indexed in a loop: drivers do not reliably
//   unroll naga's loops, and such an array then lives in local memory). Helpers take a
//   constant register index and a guard `r < VEC4S` that folds away after specialization.
// - Every global load of a token (the state, its share of k and q, its own v, g and β) is
//   issued in straight-line code before any of them is used: one memory latency per
//   workgroup, not a chain of them.
// - Two barriers per token: after staging k and q in workgroup memory, and after the partial
//   sums. After the second, every invocation sums the partials *it* needs itself (a few vec4
//   loads, unrolled by four), computes u for its own columns (K-first) or row (V-first) and
//   updates its registers: no third barrier, no u in workgroup memory.
// - Coalesced vec4 accesses along the storage-contiguous axis: consecutive invocations read
//   consecutive 16 B of a row.
// No subgroup operations: this runs in browsers too (subgroup_step.wgsl is an opt-in
// alternative where subgroups of at least 8 invocations exist; slower on the H200).
//
// Thread layout, t = lane_vec + ROW_VECS · row_lane:
//   K-first [K, V]: the slice's rows are k, a row holds V_BLOCK / 4 vec4s of v. An invocation
//     owns one vec4 column (lane_vec < ROW_VECS = V_BLOCK / 4) of the consecutive rows
//     row_lane · VEC4S + r (r < VEC4S; LANES = K / VEC4S row lanes), so four registers take
//     their k and q as one vec4 from workgroup memory. a, b are summed over k: in registers
//     over the invocation's rows, then over the LANES row lanes.
//   V-first [V, K]: the slice's rows are v, one per row lane (V_BLOCK of them); a row holds
//     K / 4 vec4s of k. An invocation owns vec4s lane_vec + ROW_VECS · r of its row
//     (ROW_VECS = LANES = K / (4 VEC4S)). a, b are dot products along k: in registers, then
//     over the ROW_VECS lanes of the row.
//
// Storage dtypes: q, k, v, o in `Elem` (f32, f16, or bf16 packed two per u32 word, see
// shaders/common/dtype_*.wgsl); the state in `State4` groups of four elements (f32, or bf16
// rounded on store: shaders/decode/state_*.wgsl); the arithmetic is f32. Packed o is written
// as element pairs from one invocation: K-first invocations own four consecutive columns; in
// V-first the lane-0 invocation of an even row also computes its odd neighbour's o.
//
// Bindings, slot codes, pool windows and the gate: shaders/decode/step_common.wgsl.

@group(0) @binding(2) var<storage, read> q_buf: array<Elem>;               // [B·T, H, K]
@group(0) @binding(3) var<storage, read> k_buf: array<Elem>;               // [B·T, H, K]
@group(0) @binding(4) var<storage, read> v_buf: array<Elem>;               // [B·T, HV, V]
@group(0) @binding(8) var<storage, read_write> o_buf: array<Elem>;         // [B·T, HV, V]

override WG: u32;
override K_DIM: u32;
override V_BLOCK: u32;
override VEC4S: u32;              // vec4 registers of state per invocation, ≤ 32
override ROW_VECS: u32;           // invocations along the storage-contiguous axis
override LANES: u32;              // partial sums per result (K-first row lanes, V-first ROW_VECS)
override STAGE: u32;              // words of a k (q) row each invocation stages, ≤ 8
override V_FIRST: bool;
override PER_TOKEN_STATES: bool;
// Sequences per workgroup (SEQS > 1: the grid's z is ⌈N / SEQS⌉ and workgroup z walks
// sequences z, z + nwg.z, …, loading the next sequence's slice while it walks this one's
// tokens; then 2 VEC4S ≤ 32).
override SEQS: u32;
// SEQS > 1 without the next slice in flight: sequences z, z + nwg.z, … one after another,
// each with the whole register budget (then VEC4S ≤ 32).
override PREFETCH: bool = true;
// Every sequence of the pass has at most one token (T = 1 decode): the token loop becomes one
// guarded step and, with SEQS = 1, the kernel has no loop over tokens or sequences.
override ONE_TOKEN: bool = false;
// Sizes of workgroup arrays must be plain overrides: 2 K / 4, K / 4, WG (K-first) or 1.
override K2_VEC4S: u32;
override K_VEC4S: u32;
override PB_VEC4S: u32;

// k of two consecutive tokens (by parity): the state update of one token reads its k while
// invocations that ran ahead already stage the next one. q is read before the second barrier
// only, so one copy suffices; likewise the partials.
var<workgroup> k_s: array<vec4<f32>, K2_VEC4S>;
var<workgroup> q_s: array<vec4<f32>, K_VEC4S>;
var<workgroup> pa: array<vec4<f32>, WG>;          // K-first: a per invocation; V-first: (a, b, 0, 0)
var<workgroup> pb: array<vec4<f32>, PB_VEC4S>;    // K-first: b per invocation
var<workgroup> pc: array<vec4<f32>, LANES>;       // (Σk², Σq², k·q, 0) per reduction lane

// Where an invocation sits in the workgroup's state slice.
struct Place {
    lane_vec: u32,
    row_lane: u32,
    v0: u32,
}

// Four vec4 registers of state: r = 4 g .. 4 g + 3 of quad g.
struct Quad {
    x0: vec4<f32>,
    x1: vec4<f32>,
    x2: vec4<f32>,
    x3: vec4<f32>,
}

// Partial sums of one invocation. K-first: a, b per column, c = (Σk², Σq², k·q, 0) over its
// rows. V-first: a = (a, b, 0, 0) of its row, c over its k.
struct Sums {
    a: vec4<f32>,
    b: vec4<f32>,
    c: vec4<f32>,
}

// A token's inputs, loaded before any is used.
struct Inputs {
    v: vec4<f32>,        // K-first: the invocation's 4 columns; V-first: x = its row, y = the next row
    alpha: f32,
    beta: f32,
}

fn v_at(i: u32) -> f32 {
    return load_elem(v_buf[elem_word(i)], i);
}

fn zero_quad() -> Quad {
    return Quad(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
}

// vec4 index of register r of the invocation in the slice whose state starts at vec4 `base`.
fn slice_vec(base: u32, p: Place, r: u32) -> u32 {
    if (V_FIRST) {
        return base + (p.v0 + p.row_lane) * (K_DIM / 4u) + p.lane_vec + ROW_VECS * r;
    }
    return base + k_row(p, r) * (params.value_dim / 4u) + p.v0 / 4u + p.lane_vec;
}

// K-first: the k row of register r. An invocation owns VEC4S consecutive rows, so a quad's
// four rows take their k (and q) as one vec4 from workgroup memory.
fn k_row(p: Place, r: u32) -> u32 {
    return p.row_lane * VEC4S + r;
}

fn load_reg(base: u32, p: Place, r: u32) -> vec4<f32> {
    if (r >= VEC4S) {
        return vec4<f32>(0.0);
    }
    return state_in(pool[slice_vec(base, p, r)]);
}

fn load_quad(base: u32, p: Place, g: u32) -> Quad {
    if (4u * g >= VEC4S) {
        return zero_quad();
    }
    let r = 4u * g;
    return Quad(load_reg(base, p, r), load_reg(base, p, r + 1u), load_reg(base, p, r + 2u),
                load_reg(base, p, r + 3u));
}

fn store_reg(to_pool: bool, base: u32, p: Place, r: u32, x: vec4<f32>) {
    if (r < VEC4S) {
        if (to_pool) {
            pool[slice_vec(base, p, r)] = state_out(x);
        } else {
            token_states[slice_vec(base, p, r)] = state_out(x);
        }
    }
}

fn store_quad(to_pool: bool, base: u32, p: Place, g: u32, q: Quad) {
    if (4u * g < VEC4S) {
        let r = 4u * g;
        store_reg(to_pool, base, p, r, q.x0);
        store_reg(to_pool, base, p, r + 1u, q.x1);
        store_reg(to_pool, base, p, r + 2u, q.x2);
        store_reg(to_pool, base, p, r + 3u, q.x3);
    }
}

// Word j of the invocation's share of a k or q row (0 past the row).
fn load_word(is_k: bool, row_word: u32, t: u32, j: u32) -> Elem {
    let w = t + WG * j;
    if (j >= STAGE || w >= K_DIM / ELEMS_PER_WORD) {
        return Elem();
    }
    if (is_k) {
        return k_buf[row_word + w];
    }
    return q_buf[row_word + w];
}

// Element i of k (this token's half, `kb` = parity · K / 4) or of q in workgroup memory.
fn k_elem(kb: u32, i: u32) -> f32 {
    return k_s[kb + i / 4u][i % 4u];
}

fn q_elem(i: u32) -> f32 {
    return q_s[i / 4u][i % 4u];
}

// Unpack word j of the invocation's share into workgroup memory.
fn stage_word(is_k: bool, kb: u32, t: u32, j: u32, word: Elem) {
    let w = t + WG * j;
    if (j < STAGE && w < K_DIM / ELEMS_PER_WORD) {
        for (var e = 0u; e < ELEMS_PER_WORD; e++) {
            let i = w * ELEMS_PER_WORD + e;
            let x = load_elem(word, i);
            if (is_k) {
                k_s[kb + i / 4u][i % 4u] = x;
            } else {
                q_s[i / 4u][i % 4u] = x;
            }
        }
    }
}

// K-first: register r holds 4 columns at k = row; accumulate its products with k and q.
// V-first: register r holds 4 k of the row; accumulate its dot products.
fn reg_sums(acc: Sums, x: vec4<f32>, p: Place, r: u32, kb: u32) -> Sums {
    if (r >= VEC4S) {
        return acc;
    }
    if (V_FIRST) {
        let j = p.lane_vec + ROW_VECS * r;
        let kv = k_s[kb + j];
        let qv = q_s[j];
        return Sums(acc.a + vec4<f32>(dot(x, kv), dot(x, qv), 0.0, 0.0), acc.b,
                    acc.c + vec4<f32>(dot(kv, kv), dot(qv, qv), dot(kv, qv), 0.0));
    }
    let row = k_row(p, r);
    let kx = k_elem(kb, row);
    let qx = q_elem(row);
    return Sums(acc.a + x * kx, acc.b + x * qx, acc.c + vec4<f32>(kx * kx, qx * qx, kx * qx, 0.0));
}

fn quad_sums(acc: Sums, q: Quad, p: Place, g: u32, kb: u32) -> Sums {
    if (4u * g >= VEC4S) {
        return acc;
    }
    let r = 4u * g;
    if (!V_FIRST && VEC4S % 4u == 0u) {
        // Rows 4 j .. 4 j + 3: their k and q in one vec4 each.
        let j = k_row(p, r) / 4u;
        let kv = k_s[kb + j];
        let qv = q_s[j];
        let a = acc.a + ((q.x0 * kv.x + q.x1 * kv.y) + (q.x2 * kv.z + q.x3 * kv.w));
        let b = acc.b + ((q.x0 * qv.x + q.x1 * qv.y) + (q.x2 * qv.z + q.x3 * qv.w));
        return Sums(a, b, acc.c + vec4<f32>(dot(kv, kv), dot(qv, qv), dot(kv, qv), 0.0));
    }
    var s = reg_sums(acc, q.x0, p, r, kb);
    s = reg_sums(s, q.x1, p, r + 1u, kb);
    s = reg_sums(s, q.x2, p, r + 2u, kb);
    return reg_sums(s, q.x3, p, r + 3u, kb);
}

// S ← α S + k uᵀ on register r, with rk the k norm factor. K-first: k is the scalar of the
// row and u the vec4 of the invocation's columns (`u4`); V-first: k is a vec4 of the row and
// u the row's scalar (u4.x).
fn reg_update(x: vec4<f32>, p: Place, r: u32, kb: u32, alpha: f32, rk: f32, u4: vec4<f32>) -> vec4<f32> {
    if (r >= VEC4S) {
        return x;
    }
    if (V_FIRST) {
        return alpha * x + k_s[kb + p.lane_vec + ROW_VECS * r] * (rk * u4.x);
    }
    return alpha * x + (k_elem(kb, k_row(p, r)) * rk) * u4;
}

fn quad_update(q: Quad, p: Place, g: u32, kb: u32, alpha: f32, rk: f32, u4: vec4<f32>) -> Quad {
    if (4u * g >= VEC4S) {
        return q;
    }
    let r = 4u * g;
    if (!V_FIRST && VEC4S % 4u == 0u) {
        let kv = k_s[kb + k_row(p, r) / 4u] * rk;
        return Quad(alpha * q.x0 + kv.x * u4, alpha * q.x1 + kv.y * u4, alpha * q.x2 + kv.z * u4,
                    alpha * q.x3 + kv.w * u4);
    }
    return Quad(reg_update(q.x0, p, r, kb, alpha, rk, u4), reg_update(q.x1, p, r + 1u, kb, alpha, rk, u4),
                reg_update(q.x2, p, r + 2u, kb, alpha, rk, u4), reg_update(q.x3, p, r + 3u, kb, alpha, rk, u4));
}

// Σ over `count` partials of array `which` (0: pa, 1: pb, 2: pc) at first + stride · l,
// four independent loads per step.
fn partial_at(which: u32, i: u32) -> vec4<f32> {
    if (which == 0u) {
        return pa[i];
    }
    if (which == 1u) {
        return pb[i];
    }
    return pc[i];
}

fn sum_partials(which: u32, first: u32, stride: u32, count: u32) -> vec4<f32> {
    var s0 = vec4<f32>(0.0);
    var s1 = vec4<f32>(0.0);
    var s2 = vec4<f32>(0.0);
    var s3 = vec4<f32>(0.0);
    for (var l = 0u; l < count; l += 4u) {
        s0 += partial_at(which, first + stride * l);
        if (l + 1u < count) {
            s1 += partial_at(which, first + stride * (l + 1u));
        }
        if (l + 2u < count) {
            s2 += partial_at(which, first + stride * (l + 2u));
        }
        if (l + 3u < count) {
            s3 += partial_at(which, first + stride * (l + 3u));
        }
    }
    return (s0 + s1) + (s2 + s3);
}

// o, u of a V-first row from its summed (a, b), the shared sums c and the token's inputs.
fn v_first_u(ab: vec4<f32>, v: f32, alpha: f32, beta: f32, rk: f32) -> f32 {
    return beta * (v - alpha * rk * ab.x);
}

// An invocation's share of a slice: eight quads (registers 0 .. 31).
struct Slice {
    g0: Quad,
    g1: Quad,
    g2: Quad,
    g3: Quad,
    g4: Quad,
    g5: Quad,
    g6: Quad,
    g7: Quad,
}

fn zero_slice() -> Slice {
    return Slice(zero_quad(), zero_quad(), zero_quad(), zero_quad(), zero_quad(), zero_quad(),
                 zero_quad(), zero_quad());
}

// The invocation's registers of the slice at vec4 `base`, every load issued at once.
fn load_slice(base: u32, p: Place) -> Slice {
    return Slice(load_quad(base, p, 0u), load_quad(base, p, 1u), load_quad(base, p, 2u),
                 load_quad(base, p, 3u), load_quad(base, p, 4u), load_quad(base, p, 5u),
                 load_quad(base, p, 6u), load_quad(base, p, 7u));
}

fn store_slice(to_pool: bool, base: u32, p: Place, s: Slice) {
    store_quad(to_pool, base, p, 0u, s.g0);
    store_quad(to_pool, base, p, 1u, s.g1);
    store_quad(to_pool, base, p, 2u, s.g2);
    store_quad(to_pool, base, p, 3u, s.g3);
    store_quad(to_pool, base, p, 4u, s.g4);
    store_quad(to_pool, base, p, 5u, s.g5);
    store_quad(to_pool, base, p, 6u, s.g6);
    store_quad(to_pool, base, p, 7u, s.g7);
}

// The state a sequence starts from: its slot's slice, or zero.
fn read_state(sq: Sequence, hv: u32, p: Place) -> Slice {
    if (sq.read_slot >= 0) {
        let slice_words = K_DIM * params.value_dim / 4u;
        return load_slice((u32(sq.read_slot) * params.heads_v + hv) * slice_words, p);
    }
    return zero_slice();
}

// One token `tok` of `sq` from state `s0`; `kb` picks k's half of the double buffer.
fn token_step(sq: Sequence, hv: u32, t: u32, p: Place, s0: Slice, tok: u32, kb: u32) -> Slice {
    let hv_count = params.heads_v;
    let h = hv / (hv_count / params.heads_qk);
    let v_dim = params.value_dim;
    let slice_words = K_DIM * v_dim / 4u;
    var s = s0;
    // The token's loads, all issued before any is used: this invocation's words of the k
    // and q rows, its v, g and β.
    let row_word = (tok * params.heads_qk + h) * (K_DIM / ELEMS_PER_WORD);
    let kw0 = load_word(true, row_word, t, 0u);
    let kw1 = load_word(true, row_word, t, 1u);
    let kw2 = load_word(true, row_word, t, 2u);
    let kw3 = load_word(true, row_word, t, 3u);
    let kw4 = load_word(true, row_word, t, 4u);
    let kw5 = load_word(true, row_word, t, 5u);
    let kw6 = load_word(true, row_word, t, 6u);
    let kw7 = load_word(true, row_word, t, 7u);
    let qw0 = load_word(false, row_word, t, 0u);
    let qw1 = load_word(false, row_word, t, 1u);
    let qw2 = load_word(false, row_word, t, 2u);
    let qw3 = load_word(false, row_word, t, 3u);
    let qw4 = load_word(false, row_word, t, 4u);
    let qw5 = load_word(false, row_word, t, 5u);
    let qw6 = load_word(false, row_word, t, 6u);
    let qw7 = load_word(false, row_word, t, 7u);
    let v_row = (tok * hv_count + hv) * v_dim + p.v0;
    var v = vec4<f32>(0.0);
    if (V_FIRST) {
        v.x = v_at(v_row + p.row_lane);
        if (ELEMS_PER_WORD == 2u) {
            v.y = v_at(v_row + min(p.row_lane + 1u, V_BLOCK - 1u));
        }
    } else {
        let c = v_row + 4u * p.lane_vec;
        v = vec4<f32>(v_at(c), v_at(c + 1u), v_at(c + 2u), v_at(c + 3u));
    }
    let gate = gate_of(tok, hv, sq.a_log, sq.dt_bias);

    stage_word(true, kb, t, 0u, kw0);
    stage_word(true, kb, t, 1u, kw1);
    stage_word(true, kb, t, 2u, kw2);
    stage_word(true, kb, t, 3u, kw3);
    stage_word(true, kb, t, 4u, kw4);
    stage_word(true, kb, t, 5u, kw5);
    stage_word(true, kb, t, 6u, kw6);
    stage_word(true, kb, t, 7u, kw7);
    stage_word(false, kb, t, 0u, qw0);
    stage_word(false, kb, t, 1u, qw1);
    stage_word(false, kb, t, 2u, qw2);
    stage_word(false, kb, t, 3u, qw3);
    stage_word(false, kb, t, 4u, qw4);
    stage_word(false, kb, t, 5u, qw5);
    stage_word(false, kb, t, 6u, qw6);
    stage_word(false, kb, t, 7u, qw7);
    workgroupBarrier();

    // Partial a, b and (Σk², Σq², k·q) over the invocation's registers.
    var acc = Sums(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
    acc = quad_sums(acc, s.g0, p, 0u, kb);
    acc = quad_sums(acc, s.g1, p, 1u, kb);
    acc = quad_sums(acc, s.g2, p, 2u, kb);
    acc = quad_sums(acc, s.g3, p, 3u, kb);
    acc = quad_sums(acc, s.g4, p, 4u, kb);
    acc = quad_sums(acc, s.g5, p, 5u, kb);
    acc = quad_sums(acc, s.g6, p, 6u, kb);
    acc = quad_sums(acc, s.g7, p, 7u, kb);
    pa[t] = acc.a;
    if (V_FIRST) {
        if (p.row_lane == 0u) {
            pc[p.lane_vec] = acc.c;
        }
    } else {
        pb[t] = acc.b;
        if (p.lane_vec == 0u) {
            pc[p.row_lane] = acc.c;
        }
    }
    workgroupBarrier();

    // Every invocation sums what it needs: its columns' (K-first) or row's (V-first) a, b.
    let c = sum_partials(2u, 0u, 1u, LANES);
    var rk = 1.0;
    var rq = 1.0;
    if (has_flag(params.flags, FLAG_L2NORM)) {
        rk = 1.0 / sqrt(c.x + 1e-6);
        rq = 1.0 / sqrt(c.y + 1e-6);
    }
    let alpha = gate.x;
    let beta = gate.y;
    let kq = c.z * rk * rq;
    var u4 = vec4<f32>(0.0);
    if (V_FIRST) {
        let ab = sum_partials(0u, ROW_VECS * p.row_lane, 1u, ROW_VECS);
        u4.x = v_first_u(ab, v.x, alpha, beta, rk);
        if (p.lane_vec == 0u) {
            let o = params.scale * (alpha * rq * ab.y + u4.x * kq);
            let i = v_row + p.row_lane;
            if (ELEMS_PER_WORD == 2u) {
                if ((p.row_lane & 1u) == 0u) {
                    let ab1 = sum_partials(0u, ROW_VECS * (p.row_lane + 1u), 1u, ROW_VECS);
                    let u1 = v_first_u(ab1, v.y, alpha, beta, rk);
                    let o1 = params.scale * (alpha * rq * ab1.y + u1 * kq);
                    o_buf[elem_word(i)] = pack_pair(o, o1);
                }
            } else {
                o_buf[i] = pack_elem(o);
            }
        }
    } else {
        let a = sum_partials(0u, p.lane_vec, ROW_VECS, LANES);
        let b = sum_partials(1u, p.lane_vec, ROW_VECS, LANES);
        u4 = beta * (v - alpha * rk * a);
        if (p.row_lane == 0u) {
            let o = params.scale * (alpha * rq * b + u4 * kq);
            let i = v_row + 4u * p.lane_vec;
            if (ELEMS_PER_WORD == 2u) {
                o_buf[elem_word(i)] = pack_pair(o.x, o.y);
                o_buf[elem_word(i + 2u)] = pack_pair(o.z, o.w);
            } else {
                o_buf[i] = pack_elem(o.x);
                o_buf[i + 1u] = pack_elem(o.y);
                o_buf[i + 2u] = pack_elem(o.z);
                o_buf[i + 3u] = pack_elem(o.w);
            }
        }
    }

    // S ← α S + k uᵀ in registers.
    s.g0 = quad_update(s.g0, p, 0u, kb, alpha, rk, u4);
    s.g1 = quad_update(s.g1, p, 1u, kb, alpha, rk, u4);
    s.g2 = quad_update(s.g2, p, 2u, kb, alpha, rk, u4);
    s.g3 = quad_update(s.g3, p, 3u, kb, alpha, rk, u4);
    s.g4 = quad_update(s.g4, p, 4u, kb, alpha, rk, u4);
    s.g5 = quad_update(s.g5, p, 5u, kb, alpha, rk, u4);
    s.g6 = quad_update(s.g6, p, 6u, kb, alpha, rk, u4);
    s.g7 = quad_update(s.g7, p, 7u, kb, alpha, rk, u4);
    if (PER_TOKEN_STATES) {
        store_slice(false, (tok * hv_count + hv) * slice_words, p, s);
    }
    return s;
}

// Walk the tokens of `sq` from state `s0`; `steps` counts the tokens the workgroup walked
// before (the parity of k's double buffer continues across its sequences).
fn walk(sq: Sequence, hv: u32, t: u32, p: Place, s0: Slice, steps: u32) -> Slice {
    if (ONE_TOKEN) {
        if (sq.start < sq.end) {
            return token_step(sq, hv, t, p, s0, sq.start, (steps % 2u) * K_VEC4S);
        }
        return s0;
    }
    var s = s0;
    for (var tok = sq.start; tok < sq.end; tok++) {
        s = token_step(sq, hv, t, p, s, tok, ((steps + tok - sq.start) % 2u) * K_VEC4S);
    }
    return s;
}

@compute @workgroup_size(WG)
fn recurrent_step(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
                  @builtin(num_workgroups) nwg: vec3<u32>) {
    let hv = wid.y;
    let p = Place(t % ROW_VECS, t / ROW_VECS, wid.x * V_BLOCK);
    let slice_words = K_DIM * params.value_dim / 4u;
    let sequences = params.num_segments;

    var n = wid.z;
    var sq = sequence_of(n, hv);
    var s = read_state(sq, hv, p);
    if (SEQS == 1u) {
        // No loop over sequences.
        s = walk(sq, hv, t, p, s, 0u);
        if (sq.write_slot >= 0) {
            store_slice(true, (u32(sq.write_slot) * params.heads_v + hv) * slice_words, p, s);
        }
        return;
    }
    var steps = 0u;
    if (!PREFETCH) {
        for (var i = 0u; i < SEQS; i++) {
            if (i > 0u) {
                n += nwg.z;
                if (n >= sequences) {
                    break;
                }
                sq = sequence_of(n, hv);
                s = read_state(sq, hv, p);
            }
            s = walk(sq, hv, t, p, s, steps);
            steps += sq.end - sq.start;
            if (sq.write_slot >= 0) {
                store_slice(true, (u32(sq.write_slot) * params.heads_v + hv) * slice_words, p, s);
            }
        }
        return;
    }
    for (var i = 0u; i < SEQS; i++) {
        // The next sequence's slice is loaded while this one's tokens are walked.
        let next = n + nwg.z;
        let has_next = SEQS > 1u && i + 1u < SEQS && next < sequences;
        var next_sq = sq;
        var next_s = zero_slice();
        if (has_next) {
            next_sq = sequence_of(next, hv);
            next_s = read_state(next_sq, hv, p);
        }
        s = walk(sq, hv, t, p, s, steps);
        steps += sq.end - sq.start;
        if (sq.write_slot >= 0) {
            store_slice(true, (u32(sq.write_slot) * params.heads_v + hv) * slice_words, p, s);
        }
        if (!has_next) {
            break;
        }
        n = next;
        sq = next_sq;
        s = next_s;
    }
}
