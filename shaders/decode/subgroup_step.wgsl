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
// - A workgroup is WG / 8 teams: WG / 2 consecutive columns of one head; columns past V idle
//   (they still take part in the shuffles, which stay in uniform control flow).
//
// Needs subgroups of at least 8 invocations laid out along local_invocation_index (so that a
// team's 8 lanes share a subgroup and lane kl ^ m is invocation t ^ m), as every Vulkan, Metal
// and D3D12 implementation we know lays out 1-D workgroups; the launcher uses this kernel only
// where SUBGROUP is available with a minimum subgroup size ≥ 8, and the tests compare it with
// the oracle on every adapter they run on. recurrent_step.wgsl is the fallback.
//
// Storage dtypes: q, k, v, o in `Elem`; the state in `State4` (f32, or bf16 rounded on store);
// f32 arithmetic. Bindings, slot codes, pool windows and the gate: step_common.wgsl.

override WG: u32;                 // invocations, a multiple of 8
override K_DIM: u32;
override K_GROUPS: u32;           // ceil(K / 32) ≤ 8: quads of state per lane
override V_FIRST: bool;
override PER_TOKEN_STATES: bool;

// Four vec4 registers of state: K-first rows 32 gi + 4 kl + e, V-first columns c.
struct Quad {
    x0: vec4<f32>,
    x1: vec4<f32>,
    x2: vec4<f32>,
    x3: vec4<f32>,
}

// A lane's partial sums: a = Sᵀk and b = Sᵀq per column, c = (Σk², Σq², k·q, 0).
struct Sums {
    a: vec4<f32>,
    b: vec4<f32>,
    c: vec4<f32>,
}

fn zero_quad() -> Quad {
    return Quad(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
}

// Whether quad gi of lane kl holds state (K is a multiple of 16: a group of 4 is all in or
// all out).
fn group_in(gi: u32, kl: u32) -> bool {
    return gi < K_GROUPS && 32u * gi + 4u * kl < K_DIM;
}

// State4 index of register r of quad gi, lane kl, columns col..col + 3, in the slice at `base`.
fn state_index(base: u32, gi: u32, kl: u32, col: u32, r: u32) -> u32 {
    if (V_FIRST) {
        return base + (col + r) * (K_DIM / 4u) + 8u * gi + kl;
    }
    return base + (32u * gi + 4u * kl + r) * (params.value_dim / 4u) + col / 4u;
}

fn load_quad(base: u32, gi: u32, kl: u32, col: u32, on: bool) -> Quad {
    if (!on || !group_in(gi, kl)) {
        return zero_quad();
    }
    return Quad(state_in(pool[state_index(base, gi, kl, col, 0u)]),
                state_in(pool[state_index(base, gi, kl, col, 1u)]),
                state_in(pool[state_index(base, gi, kl, col, 2u)]),
                state_in(pool[state_index(base, gi, kl, col, 3u)]));
}

fn store_quad(to_pool: bool, base: u32, gi: u32, kl: u32, col: u32, on: bool, q: Quad) {
    if (!on || !group_in(gi, kl)) {
        return;
    }
    if (to_pool) {
        pool[state_index(base, gi, kl, col, 0u)] = state_out(q.x0);
        pool[state_index(base, gi, kl, col, 1u)] = state_out(q.x1);
        pool[state_index(base, gi, kl, col, 2u)] = state_out(q.x2);
        pool[state_index(base, gi, kl, col, 3u)] = state_out(q.x3);
    } else {
        token_states[state_index(base, gi, kl, col, 0u)] = state_out(q.x0);
        token_states[state_index(base, gi, kl, col, 1u)] = state_out(q.x1);
        token_states[state_index(base, gi, kl, col, 2u)] = state_out(q.x2);
        token_states[state_index(base, gi, kl, col, 3u)] = state_out(q.x3);
    }
}

fn elem_at(is_k: bool, i: u32) -> f32 {
    if (is_k) {
        return load_elem(k_buf[elem_word(i)], i);
    }
    return load_elem(q_buf[elem_word(i)], i);
}

// Elements 32 gi + 4 kl .. + 3 of a k (q) row starting at element `row` (0 past K).
fn load_group(is_k: bool, row: u32, gi: u32, kl: u32) -> vec4<f32> {
    if (!group_in(gi, kl)) {
        return vec4<f32>(0.0);
    }
    let i = row + 32u * gi + 4u * kl;
    return vec4<f32>(elem_at(is_k, i), elem_at(is_k, i + 1u), elem_at(is_k, i + 2u),
                     elem_at(is_k, i + 3u));
}

fn quad_sums(acc: Sums, s: Quad, kv: vec4<f32>, qv: vec4<f32>, gi: u32) -> Sums {
    if (gi >= K_GROUPS) {
        return acc;
    }
    let c = acc.c + vec4<f32>(dot(kv, kv), dot(qv, qv), dot(kv, qv), 0.0);
    if (V_FIRST) {
        let a = vec4<f32>(dot(s.x0, kv), dot(s.x1, kv), dot(s.x2, kv), dot(s.x3, kv));
        let b = vec4<f32>(dot(s.x0, qv), dot(s.x1, qv), dot(s.x2, qv), dot(s.x3, qv));
        return Sums(acc.a + a, acc.b + b, c);
    }
    let a = s.x0 * kv.x + s.x1 * kv.y + s.x2 * kv.z + s.x3 * kv.w;
    let b = s.x0 * qv.x + s.x1 * qv.y + s.x2 * qv.z + s.x3 * qv.w;
    return Sums(acc.a + a, acc.b + b, c);
}

// S ← α S + k uᵀ on a quad, with k already scaled by its norm factor.
fn quad_update(s: Quad, kv: vec4<f32>, alpha: f32, u: vec4<f32>, gi: u32) -> Quad {
    if (gi >= K_GROUPS) {
        return s;
    }
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

@compute @workgroup_size(WG)
fn subgroup_step(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let hv = wid.y;
    let n = wid.z;
    let hv_count = params.heads_v;
    let h = hv / (hv_count / params.heads_qk);
    let v_dim = params.value_dim;
    let kl = t % 8u;
    let col = wid.x * (WG / 2u) + 4u * (t / 8u);
    let on = col < v_dim;
    let slice = K_DIM * v_dim / 4u;
    let sq = sequence_of(n, hv);

    // The whole slice in flight at once.
    let read = on && sq.read_slot >= 0;
    let read_base = (u32(max(sq.read_slot, 0)) * hv_count + hv) * slice;
    var s0 = load_quad(read_base, 0u, kl, col, read);
    var s1 = load_quad(read_base, 1u, kl, col, read);
    var s2 = load_quad(read_base, 2u, kl, col, read);
    var s3 = load_quad(read_base, 3u, kl, col, read);
    var s4 = load_quad(read_base, 4u, kl, col, read);
    var s5 = load_quad(read_base, 5u, kl, col, read);
    var s6 = load_quad(read_base, 6u, kl, col, read);
    var s7 = load_quad(read_base, 7u, kl, col, read);

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
        let q4 = load_group(false, row, 4u, kl);
        let q5 = load_group(false, row, 5u, kl);
        let q6 = load_group(false, row, 6u, kl);
        let q7 = load_group(false, row, 7u, kl);
        let v_row = (tok * hv_count + hv) * v_dim + col;
        var v = vec4<f32>(0.0);
        if (on) {
            v = vec4<f32>(load_elem(v_buf[elem_word(v_row)], v_row),
                          load_elem(v_buf[elem_word(v_row + 1u)], v_row + 1u),
                          load_elem(v_buf[elem_word(v_row + 2u)], v_row + 2u),
                          load_elem(v_buf[elem_word(v_row + 3u)], v_row + 3u));
        }
        let gate = gate_of(tok, hv, sq.a_log, sq.dt_bias);

        var acc = Sums(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
        acc = quad_sums(acc, s0, k0, q0, 0u);
        acc = quad_sums(acc, s1, k1, q1, 1u);
        acc = quad_sums(acc, s2, k2, q2, 2u);
        acc = quad_sums(acc, s3, k3, q3, 3u);
        acc = quad_sums(acc, s4, k4, q4, 4u);
        acc = quad_sums(acc, s5, k5, q5, 5u);
        acc = quad_sums(acc, s6, k6, q6, 6u);
        acc = quad_sums(acc, s7, k7, q7, 7u);
        let a = team_sum(acc.a);
        let b = team_sum(acc.b);
        let c = team_sum(acc.c);

        var rk = 1.0;
        var rq = 1.0;
        if (has_flag(params.flags, FLAG_L2NORM)) {
            rk = 1.0 / sqrt(c.x + 1e-6);
            rq = 1.0 / sqrt(c.y + 1e-6);
        }
        let alpha = gate.x;
        let beta = gate.y;
        let u = beta * (v - alpha * rk * a);
        if (on && kl == 0u) {
            let o = params.scale * (alpha * rq * b + u * (c.z * rk * rq));
            if (ELEMS_PER_WORD == 2u) {
                o_buf[elem_word(v_row)] = pack_pair(o.x, o.y);
                o_buf[elem_word(v_row + 2u)] = pack_pair(o.z, o.w);
            } else {
                o_buf[v_row] = pack_elem(o.x);
                o_buf[v_row + 1u] = pack_elem(o.y);
                o_buf[v_row + 2u] = pack_elem(o.z);
                o_buf[v_row + 3u] = pack_elem(o.w);
            }
        }

        // S ← α S + k uᵀ in registers (k scaled by its norm factor).
        s0 = quad_update(s0, k0 * rk, alpha, u, 0u);
        s1 = quad_update(s1, k1 * rk, alpha, u, 1u);
        s2 = quad_update(s2, k2 * rk, alpha, u, 2u);
        s3 = quad_update(s3, k3 * rk, alpha, u, 3u);
        s4 = quad_update(s4, k4 * rk, alpha, u, 4u);
        s5 = quad_update(s5, k5 * rk, alpha, u, 5u);
        s6 = quad_update(s6, k6 * rk, alpha, u, 6u);
        s7 = quad_update(s7, k7 * rk, alpha, u, 7u);
        if (PER_TOKEN_STATES) {
            let base = (tok * hv_count + hv) * slice;
            store_quad(false, base, 0u, kl, col, on, s0);
            store_quad(false, base, 1u, kl, col, on, s1);
            store_quad(false, base, 2u, kl, col, on, s2);
            store_quad(false, base, 3u, kl, col, on, s3);
            store_quad(false, base, 4u, kl, col, on, s4);
            store_quad(false, base, 5u, kl, col, on, s5);
            store_quad(false, base, 6u, kl, col, on, s6);
            store_quad(false, base, 7u, kl, col, on, s7);
        }
    }

    let write = sq.write_slot >= 0;
    let base = (u32(max(sq.write_slot, 0)) * hv_count + hv) * slice;
    store_quad(true, base, 0u, kl, col, on && write, s0);
    store_quad(true, base, 1u, kl, col, on && write, s1);
    store_quad(true, base, 2u, kl, col, on && write, s2);
    store_quad(true, base, 3u, kl, col, on && write, s3);
    store_quad(true, base, 4u, kl, col, on && write, s4);
    store_quad(true, base, 5u, kl, col, on && write, s5);
    store_quad(true, base, 6u, kl, col, on && write, s6);
    store_quad(true, base, 7u, kl, col, on && write, s7);
}
