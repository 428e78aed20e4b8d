// dh_scan: the reverse inter-chunk scan of the state gradient. One workgroup (256 invocations)
// per (segment, v-head, V-block) walks the segment's chunks newest first with dS (K × V_BLOCK,
// the gradient w.r.t. the chunk-END state; dht or 0 at the segment end) in registers:
//     dstates[chunk] ← dS
//     dV' = (γ_C/γ) ⊙ (K dS) + Pgᵀ (scale·dO),   Pg = Γ ⊙ (Q Kᵀ)      (lower, incl. diagonal)
//     dv  = Agᵀ dV',                              Ag = Γ ⊙ A ⊙ β_col   (the gradient of v)
//     dS  ← γ_C dS − Kᵀ (γ ⊙ dv) + Qᵀ (γ ⊙ scale·dO)                  (now w.r.t. the start)
// and leaves dh0 in the tail slot `num_chunks + n`. Pg and Ag come precomputed (`gated` rows,
// the forward's wy_inverse run again by the backward, parallel over chunks), so the sequential
// path holds only the state-dependent work. No chunk-start state is needed: the products with
// S belong to the parallel gradient passes. Every exponent is ≤ 0.
//
// Layout and latency measures as in state_recompute (and the forward scan): invocation
// (r, c) = (t / 16, t % 16) owns rows 4r..4r+3 of the 64-row tiles, columns c + 16j
// (j < TC), and dS rows 4r + ii + 64kb, all in named vec4 registers; loads are batched and
// the next K slice is prefetched into registers. The transposed products (Pgᵀ, Agᵀ) read the
// packed lower triangle by columns: entry (j, i) for j ≥ i.
//
// Partial chunks: rows past the end load q = k = dO = 0 and zero gated rows, G = G_last, so
// they contribute nothing; they are never stored. V_BLOCK divides V.
//
// Workgroup memory (`backward::scan_arena_words`): tile X (64 × V_BLOCK: scale·dO, then dV',
// then −γ⊙dv), then one region reused by the phases: the K slice (64 × 17) and dS slice
// (16 × V_BLOCK) of K dS; the packed triangle (2080 words) of Pg, then Ag; tile Y
// (64 × V_BLOCK: γ⊙scale·dO) plus T_SLICE-token slices of K and Q (T_SLICE·K ≤ 1024 each,
// ≤ 512 where the device's workgroup memory is short) for the state update. At V_BLOCK = 16
// and T_SLICE·K = 512 it is 12.8 KiB.

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> q_buf: array<Elem>;              // [B·T, H, K]
@group(0) @binding(2) var<storage, read> k_buf: array<Elem>;              // [B·T, H, K]
@group(0) @binding(3) var<storage, read> gate_beta: array<vec2<f32>>;     // [B·T, HV]: (G, β)
@group(0) @binding(4) var<storage, read> gated: array<f32>;               // [B·T, HV, 128]: Γ⊙A⊙β | Γ⊙QKᵀ
@group(0) @binding(5) var<storage, read> do_buf: array<Elem>;             // [B·T, HV, V]
@group(0) @binding(6) var<storage, read> segments: array<u32>;            // start, length, first chunk, sequence
@group(0) @binding(7) var<storage, read_write> dstates: array<f32>;       // [chunks + N, HV, K, V] (or V-first)
@group(0) @binding(8) var<storage, read_write> dvnew_dv: array<f32>;      // [2, B·T, HV, V]: dV', then dv

override K_DIM: u32;
override V_BLOCK: u32;                    // 16, 32 or 64
override ARENA: u32;
override TC: u32 = V_BLOCK / 16u;
override KB: u32 = (K_DIM + 63u) / 64u;
const K_SLICE: u32 = 16u;
const K_PITCH: u32 = 17u;
override T_SLICE: u32 = 2u;               // tokens per K/Q slice of the state update (T_SLICE·K ≤ 1024)
override T_PITCH: u32 = K_DIM + 1u;

var<workgroup> arena: array<f32, ARENA>;
var<workgroup> gam_s: array<f32, 64>;  // γ_i = exp(G_i)
var<workgroup> dec_s: array<f32, 64>;  // γ_C/γ_i = exp(G_last − G_i)

fn q_at(i: u32) -> f32 {
    return load_elem(q_buf[elem_word(i)], i);
}

fn k_at(i: u32) -> f32 {
    return load_elem(k_buf[elem_word(i)], i);
}

fn do_at(i: u32) -> f32 {
    return load_elem(do_buf[elem_word(i)], i);
}

fn tri(i: u32, j: u32) -> u32 {
    return i * (i + 1u) / 2u + j;
}

// Entry (j, i) of the packed lower triangle at `base` (column i, row j), 0 when j < i.
fn tri_t_or_zero(base: u32, j: u32, i: u32) -> f32 {
    return select(0.0, arena[base + tri(j, min(i, j))], i <= j);
}

fn cols4(base: u32, c: u32) -> vec4<f32> {
    var x = vec4<f32>(arena[base + c], 0.0, 0.0, 0.0);
    if (TC > 1u) {
        x.y = arena[base + c + 16u];
    }
    if (TC > 2u) {
        x.z = arena[base + c + 32u];
        x.w = arena[base + c + 48u];
    }
    return x;
}

fn store_cols4(base: u32, c: u32, x: vec4<f32>) {
    arena[base + c] = x.x;
    if (TC > 1u) {
        arena[base + c + 16u] = x.y;
    }
    if (TC > 2u) {
        arena[base + c + 32u] = x.z;
        arena[base + c + 48u] = x.w;
    }
}

fn rows4(base: u32, row0: u32, pitch: u32, kk: u32) -> vec4<f32> {
    return vec4<f32>(arena[base + row0 * pitch + kk], arena[base + (row0 + 1u) * pitch + kk],
                     arena[base + (row0 + 2u) * pitch + kk], arena[base + (row0 + 3u) * pitch + kk]);
}

fn state_index(base: u32, k: u32, v: u32, v_first: bool) -> u32 {
    if (v_first) {
        return base + v * K_DIM + k;
    }
    return base + k * params.value_dim + v;
}

fn load_state(base: u32, k: u32, v0: u32, c: u32, v_first: bool) -> vec4<f32> {
    let kc = min(k, K_DIM - 1u);
    let v = v0 + c;
    var x = vec4<f32>(dstates[state_index(base, kc, v, v_first)], 0.0, 0.0, 0.0);
    if (TC > 1u) {
        x.y = dstates[state_index(base, kc, v + 16u, v_first)];
    }
    if (TC > 2u) {
        x.z = dstates[state_index(base, kc, v + 32u, v_first)];
        x.w = dstates[state_index(base, kc, v + 48u, v_first)];
    }
    return select(vec4<f32>(0.0), x, vec4<bool>(k < K_DIM));
}

fn store_state(base: u32, k: u32, v0: u32, c: u32, v_first: bool, x: vec4<f32>) {
    if (k < K_DIM) {
        let v = v0 + c;
        dstates[state_index(base, k, v, v_first)] = x.x;
        if (TC > 1u) {
            dstates[state_index(base, k, v + 16u, v_first)] = x.y;
        }
        if (TC > 2u) {
            dstates[state_index(base, k, v + 32u, v_first)] = x.z;
            dstates[state_index(base, k, v + 48u, v_first)] = x.w;
        }
    }
}

// Row i of dV' (half 0) or dv (half 1) at the invocation's columns, when i is in the chunk.
fn store_row(half: u32, base: u32, i: u32, len: u32, hv: u32, v0: u32, c: u32, x: vec4<f32>) {
    if (i < len) {
        let at = half * params.total_tokens * params.heads_v * params.value_dim
            + ((base + i) * params.heads_v + hv) * params.value_dim + v0 + c;
        dvnew_dv[at] = x.x;
        if (TC > 1u) {
            dvnew_dv[at + 16u] = x.y;
        }
        if (TC > 2u) {
            dvnew_dv[at + 32u] = x.z;
            dvnew_dv[at + 48u] = x.w;
        }
    }
}

fn publish4(dst: u32, c: u32, a: vec4<f32>, b: vec4<f32>, d: vec4<f32>, e: vec4<f32>) {
    store_cols4(dst, c, a);
    store_cols4(dst + V_BLOCK, c, b);
    store_cols4(dst + 2u * V_BLOCK, c, d);
    store_cols4(dst + 3u * V_BLOCK, c, e);
}

fn krow4(base: u32, k: u32) -> vec4<f32> {
    return vec4<f32>(arena[base + k], arena[base + k + 1u], arena[base + k + 2u], arena[base + k + 3u]);
}

// Row i of dO at the invocation's columns, 0 past the chunk (batched, clamped, masked).
fn load_do(base: u32, i: u32, len: u32, hv: u32, v0: u32, c: u32) -> vec4<f32> {
    let at = ((base + min(i, len - 1u)) * params.heads_v + hv) * params.value_dim + v0 + c;
    let x = vec4<f32>(do_at(at), do_at(at + select(0u, 16u, TC > 1u)), do_at(at + select(0u, 32u, TC > 2u)),
                      do_at(at + select(0u, 48u, TC > 2u)));
    let keep = (vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(TC)) & vec4<bool>(i < len);
    return select(vec4<f32>(0.0), x, keep);
}

// Row i of a gated matrix (`half` 0: Γ⊙A⊙β, 1: Γ⊙QKᵀ) at columns c + 16 jj, 0 past the chunk.
fn load_gated(base: u32, i: u32, len: u32, hv: u32, c: u32, half: u32) -> vec4<f32> {
    let row = ((base + min(i, len - 1u)) * params.heads_v + hv) * 2u * CHUNK + half * CHUNK + c;
    let x = vec4<f32>(gated[row], gated[row + 16u], gated[row + 32u], gated[row + 48u]);
    return select(vec4<f32>(0.0), x, vec4<bool>(i < len));
}

fn store_tri_row(tr: u32, i: u32, c: u32, x: vec4<f32>) {
    if (c <= i) {
        arena[tr + tri(i, c)] = x.x;
    }
    if (c + 16u <= i) {
        arena[tr + tri(i, c + 16u)] = x.y;
    }
    if (c + 32u <= i) {
        arena[tr + tri(i, c + 32u)] = x.z;
    }
    if (c + 48u <= i) {
        arena[tr + tri(i, c + 48u)] = x.w;
    }
}

fn load_k4(base: u32, len: u32, h: u32, k0: u32, t: u32) -> vec4<f32> {
    let i = t / 4u;
    let gi = ((base + min(i, len - 1u)) * params.heads_qk + h) * K_DIM + k0 + (t % 4u) * 4u;
    let x = vec4<f32>(k_at(gi), k_at(gi + 1u), k_at(gi + 2u), k_at(gi + 3u));
    return select(vec4<f32>(0.0), x, vec4<bool>(i < len));
}

fn store_slice4(dst: u32, t: u32, x: vec4<f32>) {
    let at = dst + (t / 4u) * K_PITCH + (t % 4u) * 4u;
    arena[at] = x.x;
    arena[at + 1u] = x.y;
    arena[at + 2u] = x.z;
    arena[at + 3u] = x.w;
}

// The state update's token slices: invocation t loads elements 4t..4t+3 of the T_SLICE × K
// slices of K and of Q starting at token i0; 0 past the chunk or the slice.
struct KQ {
    k: vec4<f32>,
    q: vec4<f32>,
}

fn load_kq4(base: u32, len: u32, h: u32, i0: u32, t: u32) -> KQ {
    let e = 4u * t;
    let i = i0 + e / K_DIM;
    let ok = vec4<bool>(e < T_SLICE * K_DIM && i < len);
    let gi = ((base + min(i, len - 1u)) * params.heads_qk + h) * K_DIM + min(e % K_DIM, K_DIM - 4u);
    let k = vec4<f32>(k_at(gi), k_at(gi + 1u), k_at(gi + 2u), k_at(gi + 3u));
    let q = vec4<f32>(q_at(gi), q_at(gi + 1u), q_at(gi + 2u), q_at(gi + 3u));
    return KQ(select(vec4<f32>(0.0), k, ok), select(vec4<f32>(0.0), q, ok));
}

fn store_kq4(ks: u32, qs: u32, t: u32, x: KQ) {
    let e = 4u * t;
    if (e < T_SLICE * K_DIM) {
        let at = (e / K_DIM) * T_PITCH + e % K_DIM;
        arena[ks + at] = x.k.x;
        arena[ks + at + 1u] = x.k.y;
        arena[ks + at + 2u] = x.k.z;
        arena[ks + at + 3u] = x.k.w;
        arena[qs + at] = x.q.x;
        arena[qs + at + 1u] = x.q.y;
        arena[qs + at + 2u] = x.q.z;
        arena[qs + at + 3u] = x.q.w;
    }
}

@compute @workgroup_size(256)
fn dh_scan(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let seg = wid.x;
    let hv = wid.y;
    let v0 = wid.z * V_BLOCK;
    let seg_start = segments[4u * seg];
    let seg_len = segments[4u * seg + 1u];
    let first_chunk = segments[4u * seg + 2u];
    let sequence = segments[4u * seg + 3u];
    let hv_count = params.heads_v;
    let h = hv / (hv_count / params.heads_qk);
    let v_first = has_flag(params.flags, FLAG_STATE_V_FIRST);
    let kv = K_DIM * params.value_dim;
    let scale = params.scale;

    let r = t / 16u;
    let c = t % 16u;
    let row0 = 4u * r;

    let xs = 0u;                          // tile X
    let kc = 64u * V_BLOCK;               // K slice of K dS
    let ss = kc + 64u * K_PITCH;          // dS slice
    let tr = kc;                          // triangle
    let ys = kc;                          // tile Y
    let ks = ys + 64u * V_BLOCK;          // token slice of K
    let qs = ks + T_SLICE * T_PITCH;      // token slice of Q

    let sb = ((params.num_chunks + sequence) * hv_count + hv) * kv;
    var s0 = load_state(sb, row0, v0, c, v_first);
    var s1 = load_state(sb, row0 + 1u, v0, c, v_first);
    var s2 = load_state(sb, row0 + 2u, v0, c, v_first);
    var s3 = load_state(sb, row0 + 3u, v0, c, v_first);
    var s4 = load_state(sb, row0 + 64u, v0, c, v_first);
    var s5 = load_state(sb, row0 + 65u, v0, c, v_first);
    var s6 = load_state(sb, row0 + 66u, v0, c, v_first);
    var s7 = load_state(sb, row0 + 67u, v0, c, v_first);
    var s8 = load_state(sb, row0 + 128u, v0, c, v_first);
    var s9 = load_state(sb, row0 + 129u, v0, c, v_first);
    var s10 = load_state(sb, row0 + 130u, v0, c, v_first);
    var s11 = load_state(sb, row0 + 131u, v0, c, v_first);
    var s12 = load_state(sb, row0 + 192u, v0, c, v_first);
    var s13 = load_state(sb, row0 + 193u, v0, c, v_first);
    var s14 = load_state(sb, row0 + 194u, v0, c, v_first);
    var s15 = load_state(sb, row0 + 195u, v0, c, v_first);

    let n_chunks = (seg_len + CHUNK - 1u) / CHUNK;
    for (var cr = 0u; cr < n_chunks; cr++) {
        let ci = n_chunks - 1u - cr;
        let base = seg_start + ci * CHUNK;
        let len = min(CHUNK, seg_len - ci * CHUNK);
        let cb = ((first_chunk + ci) * hv_count + hv) * kv;
        store_state(cb, row0, v0, c, v_first, s0);
        store_state(cb, row0 + 1u, v0, c, v_first, s1);
        store_state(cb, row0 + 2u, v0, c, v_first, s2);
        store_state(cb, row0 + 3u, v0, c, v_first, s3);
        if (KB > 1u) {
            store_state(cb, row0 + 64u, v0, c, v_first, s4);
            store_state(cb, row0 + 65u, v0, c, v_first, s5);
            store_state(cb, row0 + 66u, v0, c, v_first, s6);
            store_state(cb, row0 + 67u, v0, c, v_first, s7);
        }
        if (KB > 2u) {
            store_state(cb, row0 + 128u, v0, c, v_first, s8);
            store_state(cb, row0 + 129u, v0, c, v_first, s9);
            store_state(cb, row0 + 130u, v0, c, v_first, s10);
            store_state(cb, row0 + 131u, v0, c, v_first, s11);
        }
        if (KB > 3u) {
            store_state(cb, row0 + 192u, v0, c, v_first, s12);
            store_state(cb, row0 + 193u, v0, c, v_first, s13);
            store_state(cb, row0 + 194u, v0, c, v_first, s14);
            store_state(cb, row0 + 195u, v0, c, v_first, s15);
        }
        let g_last = gate_beta[(base + len - 1u) * hv_count + hv].x;
        let gam_c = exp(g_last);
        workgroupBarrier();
        if (t < CHUNK) {
            let g = select(g_last, gate_beta[(base + min(t, len - 1u)) * hv_count + hv].x, t < len);
            gam_s[t] = exp(g);
            dec_s[t] = exp(g_last - g);
        }

        // Loads for after the GEMM, issued now so their latency hides behind it.
        let d0 = scale * load_do(base, row0, len, hv, v0, c);
        let d1 = scale * load_do(base, row0 + 1u, len, hv, v0, c);
        let d2 = scale * load_do(base, row0 + 2u, len, hv, v0, c);
        let d3 = scale * load_do(base, row0 + 3u, len, hv, v0, c);
        let gp0 = load_gated(base, row0, len, hv, c, 1u);
        let gp1 = load_gated(base, row0 + 1u, len, hv, c, 1u);
        let gp2 = load_gated(base, row0 + 2u, len, hv, c, 1u);
        let gp3 = load_gated(base, row0 + 3u, len, hv, c, 1u);
        let ga0 = load_gated(base, row0, len, hv, c, 0u);
        let ga1 = load_gated(base, row0 + 1u, len, hv, c, 0u);
        let ga2 = load_gated(base, row0 + 2u, len, hv, c, 0u);
        let ga3 = load_gated(base, row0 + 3u, len, hv, c, 0u);

        // U = K dS over 16-column slices of K (next slice prefetched into registers).
        var u0 = vec4<f32>(0.0); var u1 = vec4<f32>(0.0); var u2 = vec4<f32>(0.0); var u3 = vec4<f32>(0.0);
        var k_next = load_k4(base, len, h, 0u, t);
        for (var k0 = 0u; k0 < K_DIM; k0 += K_SLICE) {
            workgroupBarrier();
            store_slice4(kc, t, k_next);
            if (k0 + K_SLICE < K_DIM) {
                k_next = load_k4(base, len, h, k0 + K_SLICE, t);
            }
            let in_block = k0 % 64u;
            if (row0 >= in_block && row0 - in_block < K_SLICE) {
                let dst = ss + (row0 - in_block) * V_BLOCK;
                switch (k0 / 64u) {
                    case 0u: { publish4(dst, c, s0, s1, s2, s3); }
                    case 1u: { publish4(dst, c, s4, s5, s6, s7); }
                    case 2u: { publish4(dst, c, s8, s9, s10, s11); }
                    default: { publish4(dst, c, s12, s13, s14, s15); }
                }
            }
            workgroupBarrier();
            for (var kk = 0u; kk < K_SLICE; kk++) {
                let kr = rows4(kc, row0, K_PITCH, kk);
                let sv = cols4(ss + kk * V_BLOCK, c);
                u0 += kr.x * sv;
                u1 += kr.y * sv;
                u2 += kr.z * sv;
                u3 += kr.w * sv;
            }
        }
        workgroupBarrier();

        // scale·dO into tile X, Pg into the triangle.
        store_cols4(xs + row0 * V_BLOCK, c, d0);
        store_cols4(xs + (row0 + 1u) * V_BLOCK, c, d1);
        store_cols4(xs + (row0 + 2u) * V_BLOCK, c, d2);
        store_cols4(xs + (row0 + 3u) * V_BLOCK, c, d3);
        store_tri_row(tr, row0, c, gp0);
        store_tri_row(tr, row0 + 1u, c, gp1);
        store_tri_row(tr, row0 + 2u, c, gp2);
        store_tri_row(tr, row0 + 3u, c, gp3);
        workgroupBarrier();

        // dV'_i = (γ_C/γ_i) U_i + Σ_{j ≥ i} Pg_ji scale·dO_j, into u* (and kept).
        u0 *= dec_s[row0];
        u1 *= dec_s[row0 + 1u];
        u2 *= dec_s[row0 + 2u];
        u3 *= dec_s[row0 + 3u];
        for (var j = row0; j < CHUNK; j++) {
            let x = cols4(xs + j * V_BLOCK, c);
            u0 += tri_t_or_zero(tr, j, row0) * x;
            u1 += tri_t_or_zero(tr, j, row0 + 1u) * x;
            u2 += tri_t_or_zero(tr, j, row0 + 2u) * x;
            u3 += tri_t_or_zero(tr, j, row0 + 3u) * x;
        }
        store_row(0u, base, row0, len, hv, v0, c, u0);
        store_row(0u, base, row0 + 1u, len, hv, v0, c, u1);
        store_row(0u, base, row0 + 2u, len, hv, v0, c, u2);
        store_row(0u, base, row0 + 3u, len, hv, v0, c, u3);
        workgroupBarrier();

        // dV' into tile X, Ag into the triangle.
        store_cols4(xs + row0 * V_BLOCK, c, u0);
        store_cols4(xs + (row0 + 1u) * V_BLOCK, c, u1);
        store_cols4(xs + (row0 + 2u) * V_BLOCK, c, u2);
        store_cols4(xs + (row0 + 3u) * V_BLOCK, c, u3);
        store_tri_row(tr, row0, c, ga0);
        store_tri_row(tr, row0 + 1u, c, ga1);
        store_tri_row(tr, row0 + 2u, c, ga2);
        store_tri_row(tr, row0 + 3u, c, ga3);
        workgroupBarrier();

        // dv_i = Σ_{j ≥ i} Ag_ji dV'_j.
        var e0 = vec4<f32>(0.0); var e1 = vec4<f32>(0.0); var e2 = vec4<f32>(0.0); var e3 = vec4<f32>(0.0);
        for (var j = row0; j < CHUNK; j++) {
            let x = cols4(xs + j * V_BLOCK, c);
            e0 += tri_t_or_zero(tr, j, row0) * x;
            e1 += tri_t_or_zero(tr, j, row0 + 1u) * x;
            e2 += tri_t_or_zero(tr, j, row0 + 2u) * x;
            e3 += tri_t_or_zero(tr, j, row0 + 3u) * x;
        }
        store_row(1u, base, row0, len, hv, v0, c, e0);
        store_row(1u, base, row0 + 1u, len, hv, v0, c, e1);
        store_row(1u, base, row0 + 2u, len, hv, v0, c, e2);
        store_row(1u, base, row0 + 3u, len, hv, v0, c, e3);
        workgroupBarrier();

        // −γ ⊙ dv into tile X, γ ⊙ scale·dO into tile Y.
        let gm0 = gam_s[row0];
        let gm1 = gam_s[row0 + 1u];
        let gm2 = gam_s[row0 + 2u];
        let gm3 = gam_s[row0 + 3u];
        store_cols4(xs + row0 * V_BLOCK, c, -gm0 * e0);
        store_cols4(xs + (row0 + 1u) * V_BLOCK, c, -gm1 * e1);
        store_cols4(xs + (row0 + 2u) * V_BLOCK, c, -gm2 * e2);
        store_cols4(xs + (row0 + 3u) * V_BLOCK, c, -gm3 * e3);
        store_cols4(ys + row0 * V_BLOCK, c, gm0 * d0);
        store_cols4(ys + (row0 + 1u) * V_BLOCK, c, gm1 * d1);
        store_cols4(ys + (row0 + 2u) * V_BLOCK, c, gm2 * d2);
        store_cols4(ys + (row0 + 3u) * V_BLOCK, c, gm3 * d3);

        // dS ← γ_C dS + Kᵀ X + Qᵀ Y, K and Q staged in T_SLICE-token slices.
        s0 *= gam_c; s1 *= gam_c; s2 *= gam_c; s3 *= gam_c;
        s4 *= gam_c; s5 *= gam_c; s6 *= gam_c; s7 *= gam_c;
        s8 *= gam_c; s9 *= gam_c; s10 *= gam_c; s11 *= gam_c;
        s12 *= gam_c; s13 *= gam_c; s14 *= gam_c; s15 *= gam_c;
        var kq_next = load_kq4(base, len, h, 0u, t);
        for (var i0 = 0u; i0 < CHUNK; i0 += T_SLICE) {
            workgroupBarrier();
            store_kq4(ks, qs, t, kq_next);
            if (i0 + T_SLICE < CHUNK) {
                kq_next = load_kq4(base, len, h, i0 + T_SLICE, t);
            }
            workgroupBarrier();
            for (var di = 0u; di < T_SLICE; di++) {
                let x = cols4(xs + (i0 + di) * V_BLOCK, c);
                let y = cols4(ys + (i0 + di) * V_BLOCK, c);
                let krow = ks + di * T_PITCH;
                let qrow = qs + di * T_PITCH;
                if (row0 < K_DIM) {
                    let kx = krow4(krow, row0);
                    let qx = krow4(qrow, row0);
                    s0 += kx.x * x + qx.x * y; s1 += kx.y * x + qx.y * y;
                    s2 += kx.z * x + qx.z * y; s3 += kx.w * x + qx.w * y;
                }
                if (KB > 1u && row0 + 64u < K_DIM) {
                    let kx = krow4(krow, row0 + 64u);
                    let qx = krow4(qrow, row0 + 64u);
                    s4 += kx.x * x + qx.x * y; s5 += kx.y * x + qx.y * y;
                    s6 += kx.z * x + qx.z * y; s7 += kx.w * x + qx.w * y;
                }
                if (KB > 2u && row0 + 128u < K_DIM) {
                    let kx = krow4(krow, row0 + 128u);
                    let qx = krow4(qrow, row0 + 128u);
                    s8 += kx.x * x + qx.x * y; s9 += kx.y * x + qx.y * y;
                    s10 += kx.z * x + qx.z * y; s11 += kx.w * x + qx.w * y;
                }
                if (KB > 3u && row0 + 192u < K_DIM) {
                    let kx = krow4(krow, row0 + 192u);
                    let qx = krow4(qrow, row0 + 192u);
                    s12 += kx.x * x + qx.x * y; s13 += kx.y * x + qx.y * y;
                    s14 += kx.z * x + qx.z * y; s15 += kx.w * x + qx.w * y;
                }
            }
        }
    }

    store_state(sb, row0, v0, c, v_first, s0);
    store_state(sb, row0 + 1u, v0, c, v_first, s1);
    store_state(sb, row0 + 2u, v0, c, v_first, s2);
    store_state(sb, row0 + 3u, v0, c, v_first, s3);
    store_state(sb, row0 + 64u, v0, c, v_first, s4);
    store_state(sb, row0 + 65u, v0, c, v_first, s5);
    store_state(sb, row0 + 66u, v0, c, v_first, s6);
    store_state(sb, row0 + 67u, v0, c, v_first, s7);
    store_state(sb, row0 + 128u, v0, c, v_first, s8);
    store_state(sb, row0 + 129u, v0, c, v_first, s9);
    store_state(sb, row0 + 130u, v0, c, v_first, s10);
    store_state(sb, row0 + 131u, v0, c, v_first, s11);
    store_state(sb, row0 + 192u, v0, c, v_first, s12);
    store_state(sb, row0 + 193u, v0, c, v_first, s13);
    store_state(sb, row0 + 194u, v0, c, v_first, s14);
    store_state(sb, row0 + 195u, v0, c, v_first, s15);
}
