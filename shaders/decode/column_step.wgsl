// column_step: the recurrent kernel's token-by-token GDN recurrence (recurrent_step.wgsl:
// same bindings, tables, slot codes and FLA order) with whole value columns per invocation.
// Every invocation owns two columns (t and t + WG of the workgroup's 2·WG) of a (v-head,
// sequence) state slice, all K rows of each in 32 vec4 registers (K ≤ 128), and computes
// what its columns need itself:
//     a = S_oldᵀk, b = S_oldᵀq (its column's),
//     u = β (v − α rk a),  o = scale (α rq b + u rk rq k·q),  S ← α S_old + (rk u) k
// No cross-invocation sums: the workgroup stages the token's k, q and the parts of
// (Σk², Σq², k·q) in workgroup memory; every invocation copies k and q to private memory
// and sums the parts; two barriers per token (after staging; after the copies).
//
// Why it exists: SwiftShader (Chromium's WebGPU without a GPU) turns every memory access
// whose address it cannot resolve when compiling into per-lane branches, and its compile
// time grows faster than their count (64 such loads 90 ms, 128 420 ms; BENCHMARKS.md, "In
// the browser"). Here the per-token code has few of them (the staging, v, g, β, o): k and q
// are read at constant indices, and the state moves in loops over a private array whose
// constant-index elements are plain registers. Its run is bound by moving k and q to the
// SIMD lanes (a workgroup-memory read is a scalar load and a broadcast per component on
// SwiftShader; private memory is a vector load): copied once per token and used for two
// columns, the forward ran 2× faster in Chromium than with one column per invocation and
// k, q read from workgroup memory three times per register (docs/compute-paths.md,
// "Tiling on CPU adapters"). The forward's kernel in the browser on CPU adapters
// (`forward::recurrent_tiles`); elsewhere opt-in (`colV`).
//
// f32 state only, and q, k, v, o of one element per word (f32, f16): each invocation writes
// its own o and the words of its own state columns. K-first [K, V]: register r holds rows
// 4r..4r+3 of column v; V-first [V, K]: the same elements, contiguous. Either way the state
// is read and written one element at a time, once per call.
//
// Bindings, slot codes, pool windows and the gate: shaders/decode/step_common.wgsl.

@group(0) @binding(2) var<storage, read> q_buf: array<Elem>;               // [B·T, H, K]
@group(0) @binding(3) var<storage, read> k_buf: array<Elem>;               // [B·T, H, K]
@group(0) @binding(4) var<storage, read> v_buf: array<Elem>;               // [B·T, HV, V]
@group(0) @binding(8) var<storage, read_write> o_buf: array<Elem>;         // [B·T, HV, V]

override WG: u32;                 // invocations per workgroup, two value columns each
override K_DIM: u32;              // a multiple of 4, ≤ 128
override V_FIRST: bool;
override PER_TOKEN_STATES: bool;
// Sizes of workgroup and private arrays must be plain overrides: K / 4.
override K_VEC4S: u32;

// The token's k and q, staged by the workgroup, read by every invocation at constant indices.
var<workgroup> k_s: array<vec4<f32>, K_VEC4S_MAX>;
var<workgroup> q_s: array<vec4<f32>, K_VEC4S_MAX>;
// The token's k and q copied to every invocation's private memory, once per token: on
// SwiftShader a workgroup-memory read is a scalar load and a broadcast per component, a
// private one a vector load, and a forward read k and q from workgroup memory 3 times per
// state register (the reads were 5/6 of its time).
const K_VEC4S_MAX: u32 = 32u;
var<private> k_p: array<vec4<f32>, K_VEC4S_MAX>;
var<private> q_p: array<vec4<f32>, K_VEC4S_MAX>;
// (Σk², Σq², k·q, 0) of the token over k vec4s p, p + NORM_PARTS, …: staged with k and q, then
// summed by every invocation at constant indices, so no invocation recomputes the norms over
// all of K (that was half of the kernel's arithmetic).
const NORM_PARTS: u32 = 8u;
var<workgroup> norm_s: array<vec4<f32>, NORM_PARTS>;

// Element `row` of column `col` of the slice starting at vec4 `base`: (vec4 index, lane).
fn state_place(base: u32, col: u32, row: u32) -> vec2<u32> {
    var e = row * params.value_dim + col;
    if (V_FIRST) {
        e = col * K_DIM + row;
    }
    return vec2<u32>(base + e / 4u, e % 4u);
}

// Register r (rows 4r..4r+3) of the column, 0 past K.
fn load_reg(base: u32, col: u32, r: u32) -> vec4<f32> {
    var x = vec4<f32>(0.0);
    if (4u * r < K_DIM) {
        for (var i = 0u; i < 4u; i++) {
            let at = state_place(base, col, 4u * r + i);
            x[i] = state_in(pool[at.x])[at.y];
        }
    }
    return x;
}

// f32 state: an element is a word, so invocations of neighbouring columns never share one.
fn store_reg(to_pool: bool, base: u32, col: u32, r: u32, x: vec4<f32>) {
    if (4u * r < K_DIM) {
        for (var i = 0u; i < 4u; i++) {
            let at = state_place(base, col, 4u * r + i);
            if (to_pool) {
                pool[at.x][at.y] = x[i];
            } else {
                token_states[at.x][at.y] = x[i];
            }
        }
    }
}

// 32 registers of the column in a private array, filled and emptied in loops: SwiftShader
// compiles every memory access of straight-line code into per-lane branches, and its
// compile time grows faster than their count; indexed by constants, the array's elements
// are plain registers (loads and stores at static offsets).
struct Column {
    r: array<vec4<f32>, 32>,
}

fn load_column(base: u32, col: u32) -> Column {
    var c: Column;
    for (var r = 0u; r < 32u; r++) {
        c.r[r] = load_reg(base, col, r);
    }
    return c;
}

fn store_column(to_pool: bool, base: u32, col: u32, c: Column) {
    var x = c;
    for (var r = 0u; r < 32u; r++) {
        store_reg(to_pool, base, col, r, x.r[r]);
    }
}

// Eight registers of state: 32 rows of the column.
struct Oct {
    x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>,
    x4: vec4<f32>, x5: vec4<f32>, x6: vec4<f32>, x7: vec4<f32>,
}

fn oct_of(c: ptr<function, Column>, g: u32) -> Oct {
    let r = 8u * g;
    return Oct((*c).r[r], (*c).r[r + 1u], (*c).r[r + 2u], (*c).r[r + 3u],
               (*c).r[r + 4u], (*c).r[r + 5u], (*c).r[r + 6u], (*c).r[r + 7u]);
}

fn set_oct(c: ptr<function, Column>, g: u32, s: Oct) {
    let r = 8u * g;
    (*c).r[r] = s.x0;
    (*c).r[r + 1u] = s.x1;
    (*c).r[r + 2u] = s.x2;
    (*c).r[r + 3u] = s.x3;
    (*c).r[r + 4u] = s.x4;
    (*c).r[r + 5u] = s.x5;
    (*c).r[r + 6u] = s.x6;
    (*c).r[r + 7u] = s.x7;
}

// k (q) rows 4j..4j+3 from workgroup memory, 0 past K.
fn k_at(j: u32) -> vec4<f32> {
    if (j >= K_VEC4S) {
        return vec4<f32>(0.0);
    }
    return k_p[j];
}

fn q_at(j: u32) -> vec4<f32> {
    if (j >= K_VEC4S) {
        return vec4<f32>(0.0);
    }
    return q_p[j];
}

// Stage k and q vec4s p, p + NORM_PARTS, … of the token's rows (element offset `row`) and
// their part of the norms.
fn stage_part(row: u32, p: u32) {
    var part = vec4<f32>(0.0);
    for (var j = p; j < K_VEC4S; j += NORM_PARTS) {
        var k = vec4<f32>(0.0);
        var q = vec4<f32>(0.0);
        for (var e = 0u; e < 4u; e++) {
            let i = row + 4u * j + e;
            let w = elem_word(i);
            k[e] = load_elem(k_buf[w], i);
            q[e] = load_elem(q_buf[w], i);
        }
        k_s[j] = k;
        q_s[j] = q;
        part += vec4<f32>(dot(k, k), dot(q, q), dot(k, q), 0.0);
    }
    norm_s[p] = part;
}

// (Σk², Σq², k·q, 0) of the staged token.
fn norms() -> vec4<f32> {
    return ((norm_s[0] + norm_s[1]) + (norm_s[2] + norm_s[3]))
        + ((norm_s[4] + norm_s[5]) + (norm_s[6] + norm_s[7]));
}

// (a, b) = the column's S_oldᵀk, S_oldᵀq.
alias Sums = vec2<f32>;

fn reg_sums(acc: Sums, s: vec4<f32>, j: u32) -> Sums {
    return acc + vec2<f32>(dot(s, k_at(j)), dot(s, q_at(j)));
}

fn oct_sums(acc: Sums, s: Oct, g: u32) -> Sums {
    let j = 8u * g;
    var a = reg_sums(acc, s.x0, j);
    a = reg_sums(a, s.x1, j + 1u);
    a = reg_sums(a, s.x2, j + 2u);
    a = reg_sums(a, s.x3, j + 3u);
    a = reg_sums(a, s.x4, j + 4u);
    a = reg_sums(a, s.x5, j + 5u);
    a = reg_sums(a, s.x6, j + 6u);
    return reg_sums(a, s.x7, j + 7u);
}

// S ← α S + k (rk u).
fn oct_update(s: Oct, g: u32, alpha: f32, ku: f32) -> Oct {
    let j = 8u * g;
    return Oct(alpha * s.x0 + k_at(j) * ku, alpha * s.x1 + k_at(j + 1u) * ku,
               alpha * s.x2 + k_at(j + 2u) * ku, alpha * s.x3 + k_at(j + 3u) * ku,
               alpha * s.x4 + k_at(j + 4u) * ku, alpha * s.x5 + k_at(j + 5u) * ku,
               alpha * s.x6 + k_at(j + 6u) * ku, alpha * s.x7 + k_at(j + 7u) * ku);
}

// The column's sums (a, b) over its registers.
fn column_sums(s0: Oct, s1: Oct, s2: Oct, s3: Oct) -> Sums {
    var acc = Sums(0.0);
    acc = oct_sums(acc, s0, 0u);
    acc = oct_sums(acc, s1, 1u);
    acc = oct_sums(acc, s2, 2u);
    return oct_sums(acc, s3, 3u);
}

@compute @workgroup_size(WG)
fn column_step(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let hv = wid.y;
    let n = wid.z;
    let hv_count = params.heads_v;
    let h = hv / (hv_count / params.heads_qk);
    let v_dim = params.value_dim;
    // The invocation's two columns: t and t + WG of the workgroup's 2 WG.
    let col = wid.x * 2u * WG + t;
    let col_b = col + WG;
    let sq = sequence_of(n, hv);
    let slice_vec4s = K_DIM * v_dim / 4u;

    var state: Column;
    var state_b: Column;
    if (sq.read_slot >= 0) {
        let base = (u32(sq.read_slot) * hv_count + hv) * slice_vec4s;
        state = load_column(base, col);
        state_b = load_column(base, col_b);
    }
    var s0 = oct_of(&state, 0u);
    var s1 = oct_of(&state, 1u);
    var s2 = oct_of(&state, 2u);
    var s3 = oct_of(&state, 3u);
    var b0 = oct_of(&state_b, 0u);
    var b1 = oct_of(&state_b, 1u);
    var b2 = oct_of(&state_b, 2u);
    var b3 = oct_of(&state_b, 3u);

    let l2norm = has_flag(params.flags, FLAG_L2NORM);
    for (var tok = sq.start; tok < sq.end; tok++) {
        // Stage k, q and the parts of their norms: invocation t the parts t, t + WG, …
        let row = (tok * params.heads_qk + h) * K_DIM;
        for (var p = t; p < NORM_PARTS; p += WG) {
            stage_part(row, p);
        }
        let vi = (tok * hv_count + hv) * v_dim + col;
        let v = load_elem(v_buf[elem_word(vi)], vi);
        let v_b = load_elem(v_buf[elem_word(vi + WG)], vi + WG);
        let gate = gate_of(tok, hv, sq.a_log, sq.dt_bias);
        workgroupBarrier();
        k_p = k_s;
        q_p = q_s;
        let n = norms();
        // The next token's staging may overwrite k, q and the norms now.
        workgroupBarrier();

        var rk = 1.0;
        var rq = 1.0;
        if (l2norm) {
            rk = 1.0 / sqrt(n.x + 1e-6);
            rq = 1.0 / sqrt(n.y + 1e-6);
        }
        let alpha = gate.x;
        let beta = gate.y;
        let kq = n.z * rk * rq;
        let acc = column_sums(s0, s1, s2, s3);
        let acc_b = column_sums(b0, b1, b2, b3);
        let u = beta * (v - alpha * rk * acc.x);
        let u_b = beta * (v_b - alpha * rk * acc_b.x);
        o_buf[elem_word(vi)] = pack_elem(params.scale * (alpha * rq * acc.y + u * kq));
        o_buf[elem_word(vi + WG)] = pack_elem(params.scale * (alpha * rq * acc_b.y + u_b * kq));

        let ku = rk * u;
        s0 = oct_update(s0, 0u, alpha, ku);
        s1 = oct_update(s1, 1u, alpha, ku);
        s2 = oct_update(s2, 2u, alpha, ku);
        s3 = oct_update(s3, 3u, alpha, ku);
        let ku_b = rk * u_b;
        b0 = oct_update(b0, 0u, alpha, ku_b);
        b1 = oct_update(b1, 1u, alpha, ku_b);
        b2 = oct_update(b2, 2u, alpha, ku_b);
        b3 = oct_update(b3, 3u, alpha, ku_b);
        if (PER_TOKEN_STATES) {
            let base = (tok * hv_count + hv) * slice_vec4s;
            set_oct(&state, 0u, s0);
            set_oct(&state, 1u, s1);
            set_oct(&state, 2u, s2);
            set_oct(&state, 3u, s3);
            store_column(false, base, col, state);
            set_oct(&state_b, 0u, b0);
            set_oct(&state_b, 1u, b1);
            set_oct(&state_b, 2u, b2);
            set_oct(&state_b, 3u, b3);
            store_column(false, base, col_b, state_b);
        }
    }

    if (sq.write_slot >= 0) {
        let base = (u32(sq.write_slot) * hv_count + hv) * slice_vec4s;
        set_oct(&state, 0u, s0);
        set_oct(&state, 1u, s1);
        set_oct(&state, 2u, s2);
        set_oct(&state, 3u, s3);
        store_column(true, base, col, state);
        set_oct(&state_b, 0u, b0);
        set_oct(&state_b, 1u, b1);
        set_oct(&state_b, 2u, b2);
        set_oct(&state_b, 3u, b3);
        store_column(true, base, col_b, state_b);
    }
}
