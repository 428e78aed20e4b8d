// subgroup_step: the decode recurrence of recurrent_step.wgsl (same semantics, bindings, slot
// codes and one-pass formulation: a = S_oldᵀk, b = S_oldᵀq, u = β (v − α a),
// o = scale (α b + u (k·q)), S ← α S_old + k uᵀ) with its K-reductions on subgroup shuffles:
// no workgroup memory and no barriers, so a workgroup's life is its loads, a few shuffles and
// its stores. The design of shaders/cuda/decode.cu, with teams of 8 invocations:
//
// - A team (8 consecutive invocations, lane kl = t % 8) owns 4 value columns and the whole K
//   of one (sequence, v-head). Lane kl holds k = 32 gi + 4 kl + e (gi < K_GROUPS, e < 4) for
//   its 4 columns: quad gi of four vec4 registers (16 vec4s, 64 floats at K = 128).
//   K-first [K, V]: register e of quad gi is row 32 gi + 4 kl + e, the team's 4 columns (one
//   16-byte access; a 32-wide subgroup is 4 teams = 16 consecutive columns, 64 B per row).
//   V-first [V, K]: register c of quad gi is column c, k 32 gi + 4 kl .. + 3 (16 bytes; a
//   team reads 128 contiguous bytes of the column's row).
// - q and k come as one group of 4 consecutive elements per quad, so Sᵀk, Sᵀq, Σk², Σq² and
//   k·q are summed in-lane and then over the team by three xor-shuffles (1, 2, 4).
// - Every load of a token (q, k, v, g, β) is independent of the state, and the state is loaded
//   before the token loop: one memory latency, then arithmetic, then the stores.
// - COL_GROUPS = 2 (the `sgVw` tilings) gives every lane a second group of 4 columns, WG / 2
//   columns further on: twice the state per lane (32 vec4s at K = 128) for the same q, k
//   loads and shuffles. A workgroup is WG / 8 teams: 4 · COL_GROUPS · WG / 8 columns of one
//   head; columns past V idle (they still take part in the shuffles, which stay in uniform
//   control flow).
// - q, k, v and o move as `Elem4` vectors (4 consecutive elements, one 16- or 8-byte access),
//   so a lane issues K / 16 loads of k and q per token rather than K / 4.
//
// Needs subgroups of at least 8 invocations laid out along local_invocation_index (so that a
// team's 8 lanes share a subgroup and lane kl ^ m is invocation t ^ m), as every Vulkan, Metal
// and D3D12 implementation we know lays out 1-D workgroups; the launcher offers this kernel
// only where SUBGROUP is available with a minimum subgroup size ≥ 8, and the tests compare it
// with the oracle on every adapter they run on. It is opt-in (`sgV` tilings): on the H200 it
// measured slower than recurrent_step.wgsl for B ≥ 64 and tied at B = 1
// (docs/benchmark-history.md).
//
// Storage dtypes: q, k, v, o in `Elem`; the state in `State4` (f32, or bf16 rounded on store);
// f32 arithmetic. Bindings, slot codes, pool windows and the gate: step_common.wgsl.

@group(0) @binding(2) var<storage, read> q4: array<Elem4>;                 // [B·T, H, K]
@group(0) @binding(3) var<storage, read> k4: array<Elem4>;                 // [B·T, H, K]
@group(0) @binding(4) var<storage, read> v4: array<Elem4>;                 // [B·T, HV, V]
@group(0) @binding(8) var<storage, read_write> o4: array<Elem4>;           // [B·T, HV, V]

override WG: u32;                 // invocations, a multiple of 8
override K_DIM: u32;
override K_GROUPS: u32;           // ceil(K / 32): quads of state per lane and column group
override COL_GROUPS: u32;         // groups of 4 columns per lane (1 or 2); K_GROUPS · COL_GROUPS ≤ 8
override V_FIRST: bool;
override PER_TOKEN_STATES: bool;

// Four vec4 registers of state: K-first rows 32 gi + 4 kl + e, V-first columns c.
struct Quad {
    x0: vec4<f32>,
    x1: vec4<f32>,
    x2: vec4<f32>,
    x3: vec4<f32>,
}

// A column group's partial sums: a = Sᵀk and b = Sᵀq per column.
struct Sums {
    a: vec4<f32>,
    b: vec4<f32>,
}

// Where a lane sits: its team lane, its column groups' first columns and whether they are in V.
struct Lane {
    kl: u32,
    col0: u32,
    col1: u32,
    on0: bool,
    on1: bool,
}

fn zero_quad() -> Quad {
    return Quad(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
}

// Register quad r holds k-group r % K_GROUPS of column group r / K_GROUPS.
fn quad_used(r: u32) -> bool {
    return r < K_GROUPS * COL_GROUPS;
}

fn group_of(r: u32) -> u32 {
    return r % K_GROUPS;
}

fn col_of(l: Lane, r: u32) -> u32 {
    return select(l.col0, l.col1, r >= K_GROUPS);
}

fn on_of(l: Lane, r: u32) -> bool {
    return select(l.on0, l.on1, r >= K_GROUPS);
}

// Whether k-group gi of lane kl holds state (K is a multiple of 16: a group of 4 is all in
// or all out).
fn group_in(gi: u32, kl: u32) -> bool {
    return gi < K_GROUPS && 32u * gi + 4u * kl < K_DIM;
}

// State4 index of register e of quad r in the slice at `base`.
fn state_index(base: u32, l: Lane, r: u32, e: u32) -> u32 {
    let gi = group_of(r);
    let col = col_of(l, r);
    if (V_FIRST) {
        return base + (col + e) * (K_DIM / 4u) + 8u * gi + l.kl;
    }
    return base + (32u * gi + 4u * l.kl + e) * (params.value_dim / 4u) + col / 4u;
}

fn quad_live(l: Lane, r: u32) -> bool {
    return quad_used(r) && on_of(l, r) && group_in(group_of(r), l.kl);
}

fn load_quad(base: u32, l: Lane, r: u32, read: bool) -> Quad {
    if (!read || !quad_live(l, r)) {
        return zero_quad();
    }
    return Quad(state_in(pool[state_index(base, l, r, 0u)]),
                state_in(pool[state_index(base, l, r, 1u)]),
                state_in(pool[state_index(base, l, r, 2u)]),
                state_in(pool[state_index(base, l, r, 3u)]));
}

fn store_quad(to_pool: bool, base: u32, l: Lane, r: u32, write: bool, q: Quad) {
    if (!write || !quad_live(l, r)) {
        return;
    }
    if (to_pool) {
        pool[state_index(base, l, r, 0u)] = state_out(q.x0);
        pool[state_index(base, l, r, 1u)] = state_out(q.x1);
        pool[state_index(base, l, r, 2u)] = state_out(q.x2);
        pool[state_index(base, l, r, 3u)] = state_out(q.x3);
    } else {
        token_states[state_index(base, l, r, 0u)] = state_out(q.x0);
        token_states[state_index(base, l, r, 1u)] = state_out(q.x1);
        token_states[state_index(base, l, r, 2u)] = state_out(q.x2);
        token_states[state_index(base, l, r, 3u)] = state_out(q.x3);
    }
}

// Elements 32 gi + 4 kl .. + 3 of a k (q) row starting at element `row` (0 past K): one
// Elem4 access.
fn load_group(is_k: bool, row: u32, gi: u32, kl: u32) -> vec4<f32> {
    if (!group_in(gi, kl)) {
        return vec4<f32>(0.0);
    }
    let i = (row + 32u * gi + 4u * kl) / 4u;
    if (is_k) {
        return load4(k4[i]);
    }
    return load4(q4[i]);
}

// The k (or q) group of quad r, among the lane's named groups g0..g7.
fn pick(r: u32, g0: vec4<f32>, g1: vec4<f32>, g2: vec4<f32>, g3: vec4<f32>, g4: vec4<f32>,
        g5: vec4<f32>, g6: vec4<f32>, g7: vec4<f32>) -> vec4<f32> {
    switch (group_of(r)) {
        case 0u: { return g0; }
        case 1u: { return g1; }
        case 2u: { return g2; }
        case 3u: { return g3; }
        case 4u: { return g4; }
        case 5u: { return g5; }
        case 6u: { return g6; }
        default: { return g7; }
    }
}

fn quad_sums(acc: Sums, s: Quad, kv: vec4<f32>, qv: vec4<f32>) -> Sums {
    if (V_FIRST) {
        let a = vec4<f32>(dot(s.x0, kv), dot(s.x1, kv), dot(s.x2, kv), dot(s.x3, kv));
        let b = vec4<f32>(dot(s.x0, qv), dot(s.x1, qv), dot(s.x2, qv), dot(s.x3, qv));
        return Sums(acc.a + a, acc.b + b);
    }
    let a = s.x0 * kv.x + s.x1 * kv.y + s.x2 * kv.z + s.x3 * kv.w;
    let b = s.x0 * qv.x + s.x1 * qv.y + s.x2 * qv.z + s.x3 * qv.w;
    return Sums(acc.a + a, acc.b + b);
}

// S ← α S + k uᵀ on a quad, with k already scaled by its norm factor.
fn quad_update(s: Quad, kv: vec4<f32>, alpha: f32, u: vec4<f32>) -> Quad {
    if (V_FIRST) {
        return Quad(alpha * s.x0 + kv * u.x, alpha * s.x1 + kv * u.y, alpha * s.x2 + kv * u.z,
                    alpha * s.x3 + kv * u.w);
    }
    return Quad(alpha * s.x0 + kv.x * u, alpha * s.x1 + kv.y * u, alpha * s.x2 + kv.z * u,
                alpha * s.x3 + kv.w * u);
}

// Sum over the 8 lanes of a team.
fn team_sum(x: vec4<f32>) -> vec4<f32> {
    var s = x + subgroupShuffleXor(x, 1u);
    s += subgroupShuffleXor(s, 2u);
    return s + subgroupShuffleXor(s, 4u);
}

// Accumulate quad r into its column group's sums (quads past the used ones add nothing).
fn add_quad(acc0: ptr<function, Sums>, acc1: ptr<function, Sums>, s: Quad, r: u32,
            kv: vec4<f32>, qv: vec4<f32>) {
    if (!quad_used(r)) {
        return;
    }
    if (r >= K_GROUPS) {
        *acc1 = quad_sums(*acc1, s, kv, qv);
    } else {
        *acc0 = quad_sums(*acc0, s, kv, qv);
    }
}

fn update_quad(s: Quad, r: u32, kv: vec4<f32>, alpha: f32, u0: vec4<f32>, u1: vec4<f32>) -> Quad {
    if (!quad_used(r)) {
        return s;
    }
    return quad_update(s, kv, alpha, select(u0, u1, r >= K_GROUPS));
}

// u and o of a column group starting at `col` from its team sums.
fn column_group(col: u32, on: bool, v_row: u32, ab: Sums, c: vec4<f32>, gate: vec2<f32>,
                rk: f32, rq: f32, kl: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    if (on) {
        v = load4(v4[(v_row + col) / 4u]);
    }
    let alpha = gate.x;
    let u = gate.y * (v - alpha * rk * ab.a);
    if (on && kl == 0u) {
        let o = params.scale * (alpha * rq * ab.b + u * (c.z * rk * rq));
        o4[(v_row + col) / 4u] = pack4(o);
    }
    return u;
}

@compute @workgroup_size(WG)
fn subgroup_step(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let hv = wid.y;
    let n = wid.z;
    let hv_count = params.heads_v;
    let h = hv / (hv_count / params.heads_qk);
    let v_dim = params.value_dim;
    let span = WG / 2u;                                   // columns of one column group
    let col0 = wid.x * span * COL_GROUPS + 4u * (t / 8u);
    let col1 = col0 + span;
    let on1 = (COL_GROUPS > 1u) && (col1 < v_dim);
    let l = Lane(t % 8u, col0, col1, (col0 < v_dim), on1);
    let kl = l.kl;
    let slice = K_DIM * v_dim / 4u;
    let sq = sequence_of(n, hv);

    // The whole slice in flight at once.
    let read = sq.read_slot >= 0;
    let read_base = (u32(max(sq.read_slot, 0)) * hv_count + hv) * slice;
    var s0 = load_quad(read_base, l, 0u, read);
    var s1 = load_quad(read_base, l, 1u, read);
    var s2 = load_quad(read_base, l, 2u, read);
    var s3 = load_quad(read_base, l, 3u, read);
    var s4 = load_quad(read_base, l, 4u, read);
    var s5 = load_quad(read_base, l, 5u, read);
    var s6 = load_quad(read_base, l, 6u, read);
    var s7 = load_quad(read_base, l, 7u, read);

    for (var tok = sq.start; tok < sq.end; tok++) {
        // The token's loads, all independent of the state.
        let row = (tok * params.heads_qk + h) * K_DIM;
        let k0 = load_group(true, row, 0u, kl);
        let k1 = load_group(true, row, 1u, kl);
        let k2 = load_group(true, row, 2u, kl);
        let k3 = load_group(true, row, 3u, kl);
        let k4 = load_group(true, row, 4u, kl);
        let k5 = load_group(true, row, 5u, kl);
        let k6 = load_group(true, row, 6u, kl);
        let k7 = load_group(true, row, 7u, kl);
        let q0 = load_group(false, row, 0u, kl);
        let q1 = load_group(false, row, 1u, kl);
        let q2 = load_group(false, row, 2u, kl);
        let q3 = load_group(false, row, 3u, kl);
        let q4v = load_group(false, row, 4u, kl);
        let q5 = load_group(false, row, 5u, kl);
        let q6 = load_group(false, row, 6u, kl);
        let q7 = load_group(false, row, 7u, kl);
        let gate = gate_of(tok, hv, sq.a_log, sq.dt_bias);

        var acc0 = Sums(vec4<f32>(0.0), vec4<f32>(0.0));
        var acc1 = Sums(vec4<f32>(0.0), vec4<f32>(0.0));
        add_quad(&acc0, &acc1, s0, 0u, pick(0u, k0, k1, k2, k3, k4, k5, k6, k7), pick(0u, q0, q1, q2, q3, q4v, q5, q6, q7));
        add_quad(&acc0, &acc1, s1, 1u, pick(1u, k0, k1, k2, k3, k4, k5, k6, k7), pick(1u, q0, q1, q2, q3, q4v, q5, q6, q7));
        add_quad(&acc0, &acc1, s2, 2u, pick(2u, k0, k1, k2, k3, k4, k5, k6, k7), pick(2u, q0, q1, q2, q3, q4v, q5, q6, q7));
        add_quad(&acc0, &acc1, s3, 3u, pick(3u, k0, k1, k2, k3, k4, k5, k6, k7), pick(3u, q0, q1, q2, q3, q4v, q5, q6, q7));
        add_quad(&acc0, &acc1, s4, 4u, pick(4u, k0, k1, k2, k3, k4, k5, k6, k7), pick(4u, q0, q1, q2, q3, q4v, q5, q6, q7));
        add_quad(&acc0, &acc1, s5, 5u, pick(5u, k0, k1, k2, k3, k4, k5, k6, k7), pick(5u, q0, q1, q2, q3, q4v, q5, q6, q7));
        add_quad(&acc0, &acc1, s6, 6u, pick(6u, k0, k1, k2, k3, k4, k5, k6, k7), pick(6u, q0, q1, q2, q3, q4v, q5, q6, q7));
        add_quad(&acc0, &acc1, s7, 7u, pick(7u, k0, k1, k2, k3, k4, k5, k6, k7), pick(7u, q0, q1, q2, q3, q4v, q5, q6, q7));
        // (Σk², Σq², k·q) over the lane's k, then everything over the team.
        let kk = dot(k0, k0) + dot(k1, k1) + dot(k2, k2) + dot(k3, k3) + dot(k4, k4) + dot(k5, k5) + dot(k6, k6) + dot(k7, k7);
        let qq = dot(q0, q0) + dot(q1, q1) + dot(q2, q2) + dot(q3, q3) + dot(q4v, q4v) + dot(q5, q5) + dot(q6, q6) + dot(q7, q7);
        let kq = dot(k0, q0) + dot(k1, q1) + dot(k2, q2) + dot(k3, q3) + dot(k4, q4v) + dot(k5, q5) + dot(k6, q6) + dot(k7, q7);
        let c = team_sum(vec4<f32>(kk, qq, kq, 0.0));
        let ab0 = Sums(team_sum(acc0.a), team_sum(acc0.b));
        var ab1 = ab0;
        if (COL_GROUPS > 1u) {
            ab1 = Sums(team_sum(acc1.a), team_sum(acc1.b));
        }

        var rk = 1.0;
        var rq = 1.0;
        if (has_flag(params.flags, FLAG_L2NORM)) {
            rk = 1.0 / sqrt(c.x + 1e-6);
            rq = 1.0 / sqrt(c.y + 1e-6);
        }
        let v_row = (tok * hv_count + hv) * v_dim;
        let u0 = column_group(col0, l.on0, v_row, ab0, c, gate, rk, rq, kl);
        var u1 = u0;
        if (COL_GROUPS > 1u) {
            u1 = column_group(col1, l.on1, v_row, ab1, c, gate, rk, rq, kl);
        }

        // S ← α S + k uᵀ in registers (k scaled by its norm factor).
        let alpha = gate.x;
        s0 = update_quad(s0, 0u, pick(0u, k0, k1, k2, k3, k4, k5, k6, k7) * rk, alpha, u0, u1);
        s1 = update_quad(s1, 1u, pick(1u, k0, k1, k2, k3, k4, k5, k6, k7) * rk, alpha, u0, u1);
        s2 = update_quad(s2, 2u, pick(2u, k0, k1, k2, k3, k4, k5, k6, k7) * rk, alpha, u0, u1);
        s3 = update_quad(s3, 3u, pick(3u, k0, k1, k2, k3, k4, k5, k6, k7) * rk, alpha, u0, u1);
        s4 = update_quad(s4, 4u, pick(4u, k0, k1, k2, k3, k4, k5, k6, k7) * rk, alpha, u0, u1);
        s5 = update_quad(s5, 5u, pick(5u, k0, k1, k2, k3, k4, k5, k6, k7) * rk, alpha, u0, u1);
        s6 = update_quad(s6, 6u, pick(6u, k0, k1, k2, k3, k4, k5, k6, k7) * rk, alpha, u0, u1);
        s7 = update_quad(s7, 7u, pick(7u, k0, k1, k2, k3, k4, k5, k6, k7) * rk, alpha, u0, u1);
        if (PER_TOKEN_STATES) {
            let base = (tok * hv_count + hv) * slice;
            store_quad(false, base, l, 0u, true, s0);
            store_quad(false, base, l, 1u, true, s1);
            store_quad(false, base, l, 2u, true, s2);
            store_quad(false, base, l, 3u, true, s3);
            store_quad(false, base, l, 4u, true, s4);
            store_quad(false, base, l, 5u, true, s5);
            store_quad(false, base, l, 6u, true, s6);
            store_quad(false, base, l, 7u, true, s7);
        }
    }

    let write = sq.write_slot >= 0;
    let base = (u32(max(sq.write_slot, 0)) * hv_count + hv) * slice;
    store_quad(true, base, l, 0u, write, s0);
    store_quad(true, base, l, 1u, write, s1);
    store_quad(true, base, l, 2u, write, s2);
    store_quad(true, base, l, 3u, write, s3);
    store_quad(true, base, l, 4u, write, s4);
    store_quad(true, base, l, 5u, write, s5);
    store_quad(true, base, l, 6u, write, s6);
    store_quad(true, base, l, 7u, write, s7);
}
