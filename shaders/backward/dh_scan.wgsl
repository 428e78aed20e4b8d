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
// (r, c) = (t / 16, t % 16) owns rows 4r..4r+3 of the 64-row tiles and of the dS blocks at
// columns c + 16j (j < TC), in named vec4 registers with lanes = rows (all lanes live at every
// V-block width); loads are batched and the next K slice is prefetched into registers. The
// transposed products (Pgᵀ, Agᵀ) read the packed lower triangle by columns: entry (j, i) for
// j ≥ i.
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

fn do_at(i: u32) -> f32 {
    return load_elem(do_buf[elem_word(i)], i);
}

// Entry (j, i) of the packed lower triangle at `base` (column i, row j), 0 when j < i.
fn tri_t_or_zero(base: u32, j: u32, i: u32) -> f32 {
    return select(0.0, arena[base + tri(j, min(i, j))], i <= j);
}

// dS rows k..k+3 at column v (lanes = rows; 0 past K; K is a multiple of 16).
fn load_state_rows(base: u32, k: u32, v: u32, v_first: bool) -> vec4<f32> {
    let kc = min(k, K_DIM - 4u);
    let x = vec4<f32>(dstates[state_index(base, kc, v, v_first)], dstates[state_index(base, kc + 1u, v, v_first)],
                      dstates[state_index(base, kc + 2u, v, v_first)], dstates[state_index(base, kc + 3u, v, v_first)]);
    return select(vec4<f32>(0.0), x, vec4<bool>(k < K_DIM));
}

fn store_state_rows(base: u32, k: u32, v: u32, v_first: bool, x: vec4<f32>) {
    if (k < K_DIM) {
        dstates[state_index(base, k, v, v_first)] = x.x;
        dstates[state_index(base, k + 1u, v, v_first)] = x.y;
        dstates[state_index(base, k + 2u, v, v_first)] = x.z;
        dstates[state_index(base, k + 3u, v, v_first)] = x.w;
    }
}

// Rows i..i+3 of dO at column v (lanes = rows), 0 past the chunk (batched, clamped, masked).
fn load_do_rows(base: u32, i: u32, len: u32, hv: u32, v: u32) -> vec4<f32> {
    let last = len - 1u;
    let hvc = params.heads_v;
    let vd = params.value_dim;
    let x = vec4<f32>(do_at(((base + min(i, last)) * hvc + hv) * vd + v), do_at(((base + min(i + 1u, last)) * hvc + hv) * vd + v),
                      do_at(((base + min(i + 2u, last)) * hvc + hv) * vd + v), do_at(((base + min(i + 3u, last)) * hvc + hv) * vd + v));
    return select(vec4<f32>(0.0), x, vec4<u32>(i, i + 1u, i + 2u, i + 3u) < vec4<u32>(len));
}

// Rows i..i+3 of dV' (half 0) or dv (half 1) at column v, those in the chunk.
fn store_rows(half: u32, base: u32, i: u32, len: u32, hv: u32, v: u32, x: vec4<f32>) {
    let at = half * params.total_tokens * params.heads_v * params.value_dim
        + ((base + i) * params.heads_v + hv) * params.value_dim + v;
    let step = params.heads_v * params.value_dim;
    if (i < len) {
        dvnew_dv[at] = x.x;
    }
    if (i + 1u < len) {
        dvnew_dv[at + step] = x.y;
    }
    if (i + 2u < len) {
        dvnew_dv[at + 2u * step] = x.z;
    }
    if (i + 3u < len) {
        dvnew_dv[at + 3u * step] = x.w;
    }
}

// Entries (j, i..i+3) of the packed lower triangle at `tr` (column i.., row j; lanes = the
// columns), 0 where j < i.
fn tri_t_rows(tr: u32, j: u32, i: u32) -> vec4<f32> {
    return vec4<f32>(tri_t_or_zero(tr, j, i), tri_t_or_zero(tr, j, i + 1u), tri_t_or_zero(tr, j, i + 2u),
                     tri_t_or_zero(tr, j, i + 3u));
}

// Row i of a gated matrix (`half` 0: Γ⊙A⊙β, 1: Γ⊙QKᵀ) at columns c + 16 jj, 0 past the chunk.
fn load_gated(base: u32, i: u32, len: u32, hv: u32, c: u32, half: u32) -> vec4<f32> {
    let row = ((base + min(i, len - 1u)) * params.heads_v + hv) * 2u * CHUNK + half * CHUNK + c;
    let x = vec4<f32>(gated[row], gated[row + 16u], gated[row + 32u], gated[row + 48u]);
    return select(vec4<f32>(0.0), x, vec4<bool>(i < len));
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

    // dS rows row0 + 64 kb .. + 3 at column c + 16 j: s{kb}{j} (lanes = rows). Registers
    // past KB or TC are never touched, so they cost nothing.
    let sb = ((params.num_chunks + sequence) * hv_count + hv) * kv;
    var s00 = vec4<f32>(0.0); var s01 = vec4<f32>(0.0); var s02 = vec4<f32>(0.0); var s03 = vec4<f32>(0.0);
    var s10 = vec4<f32>(0.0); var s11 = vec4<f32>(0.0); var s12 = vec4<f32>(0.0); var s13 = vec4<f32>(0.0);
    var s20 = vec4<f32>(0.0); var s21 = vec4<f32>(0.0); var s22 = vec4<f32>(0.0); var s23 = vec4<f32>(0.0);
    var s30 = vec4<f32>(0.0); var s31 = vec4<f32>(0.0); var s32 = vec4<f32>(0.0); var s33 = vec4<f32>(0.0);
    s00 = load_state_rows(sb, row0 + 0u, v0 + c + 0u, v_first);
    if (TC > 1u) { s01 = load_state_rows(sb, row0 + 0u, v0 + c + 16u, v_first); }
    if (TC > 2u) { s02 = load_state_rows(sb, row0 + 0u, v0 + c + 32u, v_first); }
    if (TC > 3u) { s03 = load_state_rows(sb, row0 + 0u, v0 + c + 48u, v_first); }
    if (KB > 1u) { s10 = load_state_rows(sb, row0 + 64u, v0 + c + 0u, v_first); }
    if (KB > 1u && TC > 1u) { s11 = load_state_rows(sb, row0 + 64u, v0 + c + 16u, v_first); }
    if (KB > 1u && TC > 2u) { s12 = load_state_rows(sb, row0 + 64u, v0 + c + 32u, v_first); }
    if (KB > 1u && TC > 3u) { s13 = load_state_rows(sb, row0 + 64u, v0 + c + 48u, v_first); }
    if (KB > 2u) { s20 = load_state_rows(sb, row0 + 128u, v0 + c + 0u, v_first); }
    if (KB > 2u && TC > 1u) { s21 = load_state_rows(sb, row0 + 128u, v0 + c + 16u, v_first); }
    if (KB > 2u && TC > 2u) { s22 = load_state_rows(sb, row0 + 128u, v0 + c + 32u, v_first); }
    if (KB > 2u && TC > 3u) { s23 = load_state_rows(sb, row0 + 128u, v0 + c + 48u, v_first); }
    if (KB > 3u) { s30 = load_state_rows(sb, row0 + 192u, v0 + c + 0u, v_first); }
    if (KB > 3u && TC > 1u) { s31 = load_state_rows(sb, row0 + 192u, v0 + c + 16u, v_first); }
    if (KB > 3u && TC > 2u) { s32 = load_state_rows(sb, row0 + 192u, v0 + c + 32u, v_first); }
    if (KB > 3u && TC > 3u) { s33 = load_state_rows(sb, row0 + 192u, v0 + c + 48u, v_first); }

    let n_chunks = (seg_len + CHUNK - 1u) / CHUNK;
    for (var cr = 0u; cr < n_chunks; cr++) {
        let ci = n_chunks - 1u - cr;
        let base = seg_start + ci * CHUNK;
        let len = min(CHUNK, seg_len - ci * CHUNK);
        let cb = ((first_chunk + ci) * hv_count + hv) * kv;
        store_state_rows(cb, row0 + 0u, v0 + c + 0u, v_first, s00);
        if (TC > 1u) { store_state_rows(cb, row0 + 0u, v0 + c + 16u, v_first, s01); }
        if (TC > 2u) { store_state_rows(cb, row0 + 0u, v0 + c + 32u, v_first, s02); }
        if (TC > 3u) { store_state_rows(cb, row0 + 0u, v0 + c + 48u, v_first, s03); }
        if (KB > 1u) { store_state_rows(cb, row0 + 64u, v0 + c + 0u, v_first, s10); }
        if (KB > 1u && TC > 1u) { store_state_rows(cb, row0 + 64u, v0 + c + 16u, v_first, s11); }
        if (KB > 1u && TC > 2u) { store_state_rows(cb, row0 + 64u, v0 + c + 32u, v_first, s12); }
        if (KB > 1u && TC > 3u) { store_state_rows(cb, row0 + 64u, v0 + c + 48u, v_first, s13); }
        if (KB > 2u) { store_state_rows(cb, row0 + 128u, v0 + c + 0u, v_first, s20); }
        if (KB > 2u && TC > 1u) { store_state_rows(cb, row0 + 128u, v0 + c + 16u, v_first, s21); }
        if (KB > 2u && TC > 2u) { store_state_rows(cb, row0 + 128u, v0 + c + 32u, v_first, s22); }
        if (KB > 2u && TC > 3u) { store_state_rows(cb, row0 + 128u, v0 + c + 48u, v_first, s23); }
        if (KB > 3u) { store_state_rows(cb, row0 + 192u, v0 + c + 0u, v_first, s30); }
        if (KB > 3u && TC > 1u) { store_state_rows(cb, row0 + 192u, v0 + c + 16u, v_first, s31); }
        if (KB > 3u && TC > 2u) { store_state_rows(cb, row0 + 192u, v0 + c + 32u, v_first, s32); }
        if (KB > 3u && TC > 3u) { store_state_rows(cb, row0 + 192u, v0 + c + 48u, v_first, s33); }
        let g_last = gate_beta[(base + len - 1u) * hv_count + hv].x;
        let gam_c = exp(g_last);
        workgroupBarrier();
        if (t < CHUNK) {
            let g = select(g_last, gate_beta[(base + min(t, len - 1u)) * hv_count + hv].x, t < len);
            gam_s[t] = exp(g);
            dec_s[t] = exp(g_last - g);
        }

        // Loads for after the GEMM, issued now so their latency hides behind it: scale·dO
        // (d{j}: column c + 16 j, lanes = rows) and the rows of Pg and Ag.
        var d0 = vec4<f32>(0.0); var d1 = vec4<f32>(0.0); var d2 = vec4<f32>(0.0); var d3 = vec4<f32>(0.0);
        d0 = scale * load_do_rows(base, row0, len, hv, v0 + c + 0u);
        if (TC > 1u) { d1 = scale * load_do_rows(base, row0, len, hv, v0 + c + 16u); }
        if (TC > 2u) { d2 = scale * load_do_rows(base, row0, len, hv, v0 + c + 32u); }
        if (TC > 3u) { d3 = scale * load_do_rows(base, row0, len, hv, v0 + c + 48u); }
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
                    case 0u: {
                        store_tile_rows(dst, c + 0u, s00);
                        if (TC > 1u) { store_tile_rows(dst, c + 16u, s01); }
                        if (TC > 2u) { store_tile_rows(dst, c + 32u, s02); }
                        if (TC > 3u) { store_tile_rows(dst, c + 48u, s03); }
                    }
                    case 1u: {
                        store_tile_rows(dst, c + 0u, s10);
                        if (TC > 1u) { store_tile_rows(dst, c + 16u, s11); }
                        if (TC > 2u) { store_tile_rows(dst, c + 32u, s12); }
                        if (TC > 3u) { store_tile_rows(dst, c + 48u, s13); }
                    }
                    case 2u: {
                        store_tile_rows(dst, c + 0u, s20);
                        if (TC > 1u) { store_tile_rows(dst, c + 16u, s21); }
                        if (TC > 2u) { store_tile_rows(dst, c + 32u, s22); }
                        if (TC > 3u) { store_tile_rows(dst, c + 48u, s23); }
                    }
                    default: {
                        store_tile_rows(dst, c + 0u, s30);
                        if (TC > 1u) { store_tile_rows(dst, c + 16u, s31); }
                        if (TC > 2u) { store_tile_rows(dst, c + 32u, s32); }
                        if (TC > 3u) { store_tile_rows(dst, c + 48u, s33); }
                    }
                }
            }
            workgroupBarrier();
            for (var kk = 0u; kk < K_SLICE; kk++) {
                let kr = rows4(kc, row0, K_PITCH, kk);
                let sv = cols4(ss + kk * V_BLOCK, c);
                u0 += kr * sv.x;
                if (TC > 1u) { u1 += kr * sv.y; }
                if (TC > 2u) { u2 += kr * sv.z; }
                if (TC > 3u) { u3 += kr * sv.w; }
            }
        }
        workgroupBarrier();

        // scale·dO into tile X, Pg into the triangle.
        store_tile_rows(xs + row0 * V_BLOCK, c + 0u, d0);
        if (TC > 1u) { store_tile_rows(xs + row0 * V_BLOCK, c + 16u, d1); }
        if (TC > 2u) { store_tile_rows(xs + row0 * V_BLOCK, c + 32u, d2); }
        if (TC > 3u) { store_tile_rows(xs + row0 * V_BLOCK, c + 48u, d3); }
        store_tri_row(tr, row0, c, gp0);
        store_tri_row(tr, row0 + 1u, c, gp1);
        store_tri_row(tr, row0 + 2u, c, gp2);
        store_tri_row(tr, row0 + 3u, c, gp3);
        workgroupBarrier();

        // dV'_i = (γ_C/γ_i) U_i + Σ_{j ≥ i} Pg_ji scale·dO_j, into u* (and kept).
        let dec4 = vec4<f32>(dec_s[row0], dec_s[row0 + 1u], dec_s[row0 + 2u], dec_s[row0 + 3u]);
        u0 *= dec4;
        if (TC > 1u) { u1 *= dec4; }
        if (TC > 2u) { u2 *= dec4; }
        if (TC > 3u) { u3 *= dec4; }
        for (var jp = row0; jp < CHUNK; jp++) {
            let a = tri_t_rows(tr, jp, row0);
            let x = cols4(xs + jp * V_BLOCK, c);
            u0 += a * x.x;
            if (TC > 1u) { u1 += a * x.y; }
            if (TC > 2u) { u2 += a * x.z; }
            if (TC > 3u) { u3 += a * x.w; }
        }
        store_rows(0u, base, row0, len, hv, v0 + c + 0u, u0);
        if (TC > 1u) { store_rows(0u, base, row0, len, hv, v0 + c + 16u, u1); }
        if (TC > 2u) { store_rows(0u, base, row0, len, hv, v0 + c + 32u, u2); }
        if (TC > 3u) { store_rows(0u, base, row0, len, hv, v0 + c + 48u, u3); }
        workgroupBarrier();

        // dV' into tile X, Ag into the triangle.
        store_tile_rows(xs + row0 * V_BLOCK, c + 0u, u0);
        if (TC > 1u) { store_tile_rows(xs + row0 * V_BLOCK, c + 16u, u1); }
        if (TC > 2u) { store_tile_rows(xs + row0 * V_BLOCK, c + 32u, u2); }
        if (TC > 3u) { store_tile_rows(xs + row0 * V_BLOCK, c + 48u, u3); }
        store_tri_row(tr, row0, c, ga0);
        store_tri_row(tr, row0 + 1u, c, ga1);
        store_tri_row(tr, row0 + 2u, c, ga2);
        store_tri_row(tr, row0 + 3u, c, ga3);
        workgroupBarrier();

        // dv_i = Σ_{j ≥ i} Ag_ji dV'_j.
        var e0 = vec4<f32>(0.0); var e1 = vec4<f32>(0.0); var e2 = vec4<f32>(0.0); var e3 = vec4<f32>(0.0);
        for (var jp = row0; jp < CHUNK; jp++) {
            let a = tri_t_rows(tr, jp, row0);
            let x = cols4(xs + jp * V_BLOCK, c);
            e0 += a * x.x;
            if (TC > 1u) { e1 += a * x.y; }
            if (TC > 2u) { e2 += a * x.z; }
            if (TC > 3u) { e3 += a * x.w; }
        }
        store_rows(1u, base, row0, len, hv, v0 + c + 0u, e0);
        if (TC > 1u) { store_rows(1u, base, row0, len, hv, v0 + c + 16u, e1); }
        if (TC > 2u) { store_rows(1u, base, row0, len, hv, v0 + c + 32u, e2); }
        if (TC > 3u) { store_rows(1u, base, row0, len, hv, v0 + c + 48u, e3); }
        workgroupBarrier();

        // −γ ⊙ dv into tile X, γ ⊙ scale·dO into tile Y.
        let gam4 = vec4<f32>(gam_s[row0], gam_s[row0 + 1u], gam_s[row0 + 2u], gam_s[row0 + 3u]);
        store_tile_rows(xs + row0 * V_BLOCK, c + 0u, -gam4 * e0);
        if (TC > 1u) { store_tile_rows(xs + row0 * V_BLOCK, c + 16u, -gam4 * e1); }
        if (TC > 2u) { store_tile_rows(xs + row0 * V_BLOCK, c + 32u, -gam4 * e2); }
        if (TC > 3u) { store_tile_rows(xs + row0 * V_BLOCK, c + 48u, -gam4 * e3); }
        store_tile_rows(ys + row0 * V_BLOCK, c + 0u, gam4 * d0);
        if (TC > 1u) { store_tile_rows(ys + row0 * V_BLOCK, c + 16u, gam4 * d1); }
        if (TC > 2u) { store_tile_rows(ys + row0 * V_BLOCK, c + 32u, gam4 * d2); }
        if (TC > 3u) { store_tile_rows(ys + row0 * V_BLOCK, c + 48u, gam4 * d3); }

        // dS ← γ_C dS + Kᵀ X + Qᵀ Y, K and Q staged in T_SLICE-token slices.
        s00 *= gam_c;
        if (TC > 1u) { s01 *= gam_c; }
        if (TC > 2u) { s02 *= gam_c; }
        if (TC > 3u) { s03 *= gam_c; }
        if (KB > 1u) { s10 *= gam_c; }
        if (KB > 1u && TC > 1u) { s11 *= gam_c; }
        if (KB > 1u && TC > 2u) { s12 *= gam_c; }
        if (KB > 1u && TC > 3u) { s13 *= gam_c; }
        if (KB > 2u) { s20 *= gam_c; }
        if (KB > 2u && TC > 1u) { s21 *= gam_c; }
        if (KB > 2u && TC > 2u) { s22 *= gam_c; }
        if (KB > 2u && TC > 3u) { s23 *= gam_c; }
        if (KB > 3u) { s30 *= gam_c; }
        if (KB > 3u && TC > 1u) { s31 *= gam_c; }
        if (KB > 3u && TC > 2u) { s32 *= gam_c; }
        if (KB > 3u && TC > 3u) { s33 *= gam_c; }
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
                    let kx = krow4(krow, row0 + 0u);
                    let qx = krow4(qrow, row0 + 0u);
                    s00 += kx * x.x + qx * y.x;
                    if (TC > 1u) { s01 += kx * x.y + qx * y.y; }
                    if (TC > 2u) { s02 += kx * x.z + qx * y.z; }
                    if (TC > 3u) { s03 += kx * x.w + qx * y.w; }
                }
                if (KB > 1u && row0 + 64u < K_DIM) {
                    let kx = krow4(krow, row0 + 64u);
                    let qx = krow4(qrow, row0 + 64u);
                    s10 += kx * x.x + qx * y.x;
                    if (TC > 1u) { s11 += kx * x.y + qx * y.y; }
                    if (TC > 2u) { s12 += kx * x.z + qx * y.z; }
                    if (TC > 3u) { s13 += kx * x.w + qx * y.w; }
                }
                if (KB > 2u && row0 + 128u < K_DIM) {
                    let kx = krow4(krow, row0 + 128u);
                    let qx = krow4(qrow, row0 + 128u);
                    s20 += kx * x.x + qx * y.x;
                    if (TC > 1u) { s21 += kx * x.y + qx * y.y; }
                    if (TC > 2u) { s22 += kx * x.z + qx * y.z; }
                    if (TC > 3u) { s23 += kx * x.w + qx * y.w; }
                }
                if (KB > 3u && row0 + 192u < K_DIM) {
                    let kx = krow4(krow, row0 + 192u);
                    let qx = krow4(qrow, row0 + 192u);
                    s30 += kx * x.x + qx * y.x;
                    if (TC > 1u) { s31 += kx * x.y + qx * y.y; }
                    if (TC > 2u) { s32 += kx * x.z + qx * y.z; }
                    if (TC > 3u) { s33 += kx * x.w + qx * y.w; }
                }
            }
        }
    }

    store_state_rows(sb, row0 + 0u, v0 + c + 0u, v_first, s00);
    if (TC > 1u) { store_state_rows(sb, row0 + 0u, v0 + c + 16u, v_first, s01); }
    if (TC > 2u) { store_state_rows(sb, row0 + 0u, v0 + c + 32u, v_first, s02); }
    if (TC > 3u) { store_state_rows(sb, row0 + 0u, v0 + c + 48u, v_first, s03); }
    if (KB > 1u) { store_state_rows(sb, row0 + 64u, v0 + c + 0u, v_first, s10); }
    if (KB > 1u && TC > 1u) { store_state_rows(sb, row0 + 64u, v0 + c + 16u, v_first, s11); }
    if (KB > 1u && TC > 2u) { store_state_rows(sb, row0 + 64u, v0 + c + 32u, v_first, s12); }
    if (KB > 1u && TC > 3u) { store_state_rows(sb, row0 + 64u, v0 + c + 48u, v_first, s13); }
    if (KB > 2u) { store_state_rows(sb, row0 + 128u, v0 + c + 0u, v_first, s20); }
    if (KB > 2u && TC > 1u) { store_state_rows(sb, row0 + 128u, v0 + c + 16u, v_first, s21); }
    if (KB > 2u && TC > 2u) { store_state_rows(sb, row0 + 128u, v0 + c + 32u, v_first, s22); }
    if (KB > 2u && TC > 3u) { store_state_rows(sb, row0 + 128u, v0 + c + 48u, v_first, s23); }
    if (KB > 3u) { store_state_rows(sb, row0 + 192u, v0 + c + 0u, v_first, s30); }
    if (KB > 3u && TC > 1u) { store_state_rows(sb, row0 + 192u, v0 + c + 16u, v_first, s31); }
    if (KB > 3u && TC > 2u) { store_state_rows(sb, row0 + 192u, v0 + c + 32u, v_first, s32); }
    if (KB > 3u && TC > 3u) { store_state_rows(sb, row0 + 192u, v0 + c + 48u, v_first, s33); }
}
