// state_recompute: the backward's replay of the forward scan. The forward keeps no per-chunk
// state, so one workgroup (256 invocations) per (segment, v-head, V-block) walks the segment's
// chunks again with its f32 state slice S (K × V_BLOCK) in registers, and per chunk of ≤ 64
// tokens:
//     states[chunk] ← S                                       (the chunk-start state)
//     U  = K S                                                (K streamed in 16-column slices)
//     W  = V − γ ⊙ U,   V' = (Γ ⊙ A ⊙ β_col) W                 (both kept for the gradients)
//     S  ← γ_C S + Kᵀ ((γ_C/γ) ⊙ V')                          (K streamed in token slices)
// with γ = exp(G), Γ_ij = exp(G_i − G_j) for j ≤ i only, γ_C = exp(G_last): every exponent
// is ≤ 0. Γ ⊙ A ⊙ β_col comes precomputed (the forward's wy_inverse, run again by the backward
// in parallel over chunks: `gated` rows, first half), so the sequential path holds only the
// state-dependent work. The start state of sequence n is read from the tail slot
// `num_chunks + n` (a copy of h0, or zeros).
//
// The latency measures are the forward scan's (shaders/forward/state_scan.wgsl): global loads
// are issued in batches (clamped indices, masked results) and the next K slice is fetched into
// registers while the current one is used. Register tiles: invocation (r, c) = (t / 16, t % 16)
// owns rows 4r..4r+3 of every 64-row tile and of every 64-row state block, at columns c + 16j
// (j < TC = V_BLOCK / 16) of the V-block; each (block, column) is one named vec4 register whose
// lanes are the four ROWS. With lanes = columns, V_BLOCK = 16 (the usual choice: it gives the
// most workgroups) would leave three lanes of every register and FMA on zeros; with lanes =
// rows every lane is live at every width, and the registers past KB or TC are never touched.
// No private array is indexed in a loop (drivers do not reliably unroll naga's loops, and an
// indexed private array then lives in local memory).
//
// Partial chunks: rows past the end load k = v = 0 and zero gated rows, with G = G_last, so
// they contribute nothing and γ_C/γ = 1 there; they are never stored. V_BLOCK divides V.
//
// Workgroup memory (f32 words, `ARENA` from the host, `backward::scan_arena_words`): the W/V'
// tile (64 × V_BLOCK), then one region reused by the phases: the K slice (64 × 17) and state
// slice (16 × V_BLOCK) of U = K S, the packed lower triangle (2080 words) of Γ⊙A⊙β, and the
// T_SLICE-token K slice of the state update (T_SLICE·(K+1) ≤ 2080, two vec4 loads per
// invocation). At V_BLOCK = 16 it is 12.8 KiB.

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> k_buf: array<Elem>;              // [B·T, H, K]
@group(0) @binding(2) var<storage, read> v_buf: array<Elem>;              // [B·T, HV, V]
@group(0) @binding(3) var<storage, read> gate_beta: array<vec2<f32>>;     // [B·T, HV]: (G, β)
@group(0) @binding(4) var<storage, read> gated: array<f32>;               // [B·T, HV, 128]: Γ⊙A⊙β | Γ⊙QKᵀ
@group(0) @binding(5) var<storage, read> segments: array<u32>;            // start, length, first chunk, sequence
@group(0) @binding(6) var<storage, read_write> states: array<f32>;        // [chunks + N, HV, K, V] (or V-first)
@group(0) @binding(7) var<storage, read_write> w_vnew: array<f32>;        // [2, B·T, HV, V]: W, then V'

override K_DIM: u32;
override V_BLOCK: u32;                    // 16, 32 or 64
override ARENA: u32;
override TC: u32 = V_BLOCK / 16u;         // columns per invocation: 1, 2 or 4
override KB: u32 = (K_DIM + 63u) / 64u;   // 64-row state blocks: 1..4
const K_SLICE: u32 = 16u;
const K_PITCH: u32 = 17u;                 // padded row pitch of the K slice (no bank conflicts)
override T_SLICE: u32 = 4u;               // tokens per K slice of the state update (T_SLICE·K ≤ 2048)
override T_PITCH: u32 = K_DIM + 1u;

var<workgroup> arena: array<f32, ARENA>;
var<workgroup> gam_s: array<f32, 64>;  // γ_i = exp(G_i)
var<workgroup> dec_s: array<f32, 64>;  // γ_C/γ_i = exp(G_last − G_i)

fn v_at(i: u32) -> f32 {
    return load_elem(v_buf[elem_word(i)], i);
}

// Entry (i, j) of the packed lower triangle at `base`, 0 above the diagonal.
fn tri_or_zero(base: u32, i: u32, j: u32) -> f32 {
    return select(0.0, arena[base + tri(i, min(j, i))], j <= i);
}

// State rows k..k+3 at column v (lanes = rows; 0 past K). K is a multiple of 16, so four
// rows from a multiple of 4 are all in range or all out.
fn load_state_rows(base: u32, k: u32, v: u32, v_first: bool) -> vec4<f32> {
    let kc = min(k, K_DIM - 4u);
    let x = vec4<f32>(states[state_index(base, kc, v, v_first)], states[state_index(base, kc + 1u, v, v_first)],
                      states[state_index(base, kc + 2u, v, v_first)], states[state_index(base, kc + 3u, v, v_first)]);
    return select(vec4<f32>(0.0), x, vec4<bool>(k < K_DIM));
}

fn store_state_rows(base: u32, k: u32, v: u32, v_first: bool, x: vec4<f32>) {
    if (k < K_DIM) {
        states[state_index(base, k, v, v_first)] = x.x;
        states[state_index(base, k + 1u, v, v_first)] = x.y;
        states[state_index(base, k + 2u, v, v_first)] = x.z;
        states[state_index(base, k + 3u, v, v_first)] = x.w;
    }
}

// Rows i..i+3 of v at column v (lanes = rows), 0 past the chunk: independent, unconditional
// loads (clamped indices, masked results).
fn load_v_rows(base: u32, i: u32, len: u32, hv: u32, v: u32) -> vec4<f32> {
    let last = len - 1u;
    let hvc = params.heads_v;
    let vd = params.value_dim;
    let x = vec4<f32>(v_at(((base + min(i, last)) * hvc + hv) * vd + v), v_at(((base + min(i + 1u, last)) * hvc + hv) * vd + v),
                      v_at(((base + min(i + 2u, last)) * hvc + hv) * vd + v), v_at(((base + min(i + 3u, last)) * hvc + hv) * vd + v));
    return select(vec4<f32>(0.0), x, vec4<u32>(i, i + 1u, i + 2u, i + 3u) < vec4<u32>(len));
}

// Rows i..i+3 of W (half 0) or V' (half 1) at column v, those in the chunk.
fn store_w_rows(half: u32, base: u32, i: u32, len: u32, hv: u32, v: u32, x: vec4<f32>) {
    let at = half * params.total_tokens * params.heads_v * params.value_dim
        + ((base + i) * params.heads_v + hv) * params.value_dim + v;
    let step = params.heads_v * params.value_dim;
    if (i < len) {
        w_vnew[at] = x.x;
    }
    if (i + 1u < len) {
        w_vnew[at + step] = x.y;
    }
    if (i + 2u < len) {
        w_vnew[at + 2u * step] = x.z;
    }
    if (i + 3u < len) {
        w_vnew[at + 3u * step] = x.w;
    }
}

// Entries (i..i+3, j) of the packed lower triangle at `tr` (lanes = rows), 0 above it.
fn tri_rows(tr: u32, i: u32, j: u32) -> vec4<f32> {
    return vec4<f32>(tri_or_zero(tr, i, j), tri_or_zero(tr, i + 1u, j), tri_or_zero(tr, i + 2u, j),
                     tri_or_zero(tr, i + 3u, j));
}

// Row i of Γ⊙A⊙β at columns c + 16 jj, 0 past the chunk.
fn load_gated(base: u32, i: u32, len: u32, hv: u32, c: u32) -> vec4<f32> {
    let row = ((base + min(i, len - 1u)) * params.heads_v + hv) * 2u * CHUNK + c;
    let x = vec4<f32>(gated[row], gated[row + 16u], gated[row + 32u], gated[row + 48u]);
    return select(vec4<f32>(0.0), x, vec4<bool>(i < len));
}

// Four consecutive K values (elements e..e+3) of the state update's T_SLICE × K token slice
// starting at token i0; 0 past the chunk or past the slice. Invocation t loads e = 4t and
// 4t + 1024.
fn load_kt4(base: u32, len: u32, h: u32, i0: u32, e: u32) -> vec4<f32> {
    let i = i0 + e / K_DIM;
    let ok = e < T_SLICE * K_DIM && i < len;
    let gi = ((base + min(i, len - 1u)) * params.heads_qk + h) * K_DIM + min(e % K_DIM, K_DIM - 4u);
    let x = vec4<f32>(k_at(gi), k_at(gi + 1u), k_at(gi + 2u), k_at(gi + 3u));
    return select(vec4<f32>(0.0), x, vec4<bool>(ok));
}

fn store_kt4(kt: u32, e: u32, x: vec4<f32>) {
    if (e < T_SLICE * K_DIM) {
        let at = kt + (e / K_DIM) * T_PITCH + e % K_DIM;
        arena[at] = x.x;
        arena[at + 1u] = x.y;
        arena[at + 2u] = x.z;
        arena[at + 3u] = x.w;
    }
}

@compute @workgroup_size(256)
fn state_recompute(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {
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

    let r = t / 16u;
    let c = t % 16u;
    let row0 = 4u * r;

    let ws = 0u;
    let kc = 64u * V_BLOCK;
    let ss = kc + 64u * K_PITCH;
    let tr = kc;
    let kt = kc;

    // State rows row0 + 64 kb .. + 3 at column c + 16 j: s{kb}{j} (lanes = rows). Registers
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
    for (var ci = 0u; ci < n_chunks; ci++) {
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

        // Loads for after the GEMM, issued now so their latency hides behind it.
        var va0 = vec4<f32>(0.0); var va1 = vec4<f32>(0.0); var va2 = vec4<f32>(0.0); var va3 = vec4<f32>(0.0);
        va0 = load_v_rows(base, row0, len, hv, v0 + c + 0u);
        if (TC > 1u) { va1 = load_v_rows(base, row0, len, hv, v0 + c + 16u); }
        if (TC > 2u) { va2 = load_v_rows(base, row0, len, hv, v0 + c + 32u); }
        if (TC > 3u) { va3 = load_v_rows(base, row0, len, hv, v0 + c + 48u); }
        let ga0 = load_gated(base, row0, len, hv, c);
        let ga1 = load_gated(base, row0 + 1u, len, hv, c);
        let ga2 = load_gated(base, row0 + 2u, len, hv, c);
        let ga3 = load_gated(base, row0 + 3u, len, hv, c);

        // U = K S over 16-column slices of K (u{j}: column c + 16 j, lanes = rows); the next
        // slice is loaded into registers while this one is used.
        var u0 = vec4<f32>(0.0); var u1 = vec4<f32>(0.0); var u2 = vec4<f32>(0.0); var u3 = vec4<f32>(0.0);
        var k_next = load_k4(base, len, h, 0u, t);
        for (var k0 = 0u; k0 < K_DIM; k0 += K_SLICE) {
            workgroupBarrier();
            store_slice4(kc, t, k_next);
            if (k0 + K_SLICE < K_DIM) {
                k_next = load_k4(base, len, h, k0 + K_SLICE, t);
            }
            // The owners of state rows k0..k0+15 publish them.
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

        // W = V − γ ⊙ U into the tile (and kept); Γ ⊙ A ⊙ β_col into the triangle.
        let gam4 = vec4<f32>(gam_s[row0], gam_s[row0 + 1u], gam_s[row0 + 2u], gam_s[row0 + 3u]);
        var w0 = vec4<f32>(0.0); var w1 = vec4<f32>(0.0); var w2 = vec4<f32>(0.0); var w3 = vec4<f32>(0.0);
        w0 = va0 - gam4 * u0;
        if (TC > 1u) { w1 = va1 - gam4 * u1; }
        if (TC > 2u) { w2 = va2 - gam4 * u2; }
        if (TC > 3u) { w3 = va3 - gam4 * u3; }
        store_tile_rows(ws + row0 * V_BLOCK, c + 0u, w0);
        if (TC > 1u) { store_tile_rows(ws + row0 * V_BLOCK, c + 16u, w1); }
        if (TC > 2u) { store_tile_rows(ws + row0 * V_BLOCK, c + 32u, w2); }
        if (TC > 3u) { store_tile_rows(ws + row0 * V_BLOCK, c + 48u, w3); }
        store_w_rows(0u, base, row0, len, hv, v0 + c + 0u, w0);
        if (TC > 1u) { store_w_rows(0u, base, row0, len, hv, v0 + c + 16u, w1); }
        if (TC > 2u) { store_w_rows(0u, base, row0, len, hv, v0 + c + 32u, w2); }
        if (TC > 3u) { store_w_rows(0u, base, row0, len, hv, v0 + c + 48u, w3); }
        store_tri_row(tr, row0, c, ga0);
        store_tri_row(tr, row0 + 1u, c, ga1);
        store_tri_row(tr, row0 + 2u, c, ga2);
        store_tri_row(tr, row0 + 3u, c, ga3);
        workgroupBarrier();

        // V' = (Γ ⊙ A ⊙ β_col) W over j ≤ i, into u* (and kept).
        u0 = vec4<f32>(0.0); u1 = vec4<f32>(0.0); u2 = vec4<f32>(0.0); u3 = vec4<f32>(0.0);
        for (var jp = 0u; jp < row0 + 4u; jp++) {
            let a = tri_rows(tr, row0, jp);
            let w = cols4(ws + jp * V_BLOCK, c);
            u0 += a * w.x;
            if (TC > 1u) { u1 += a * w.y; }
            if (TC > 2u) { u2 += a * w.z; }
            if (TC > 3u) { u3 += a * w.w; }
        }
        store_w_rows(1u, base, row0, len, hv, v0 + c + 0u, u0);
        if (TC > 1u) { store_w_rows(1u, base, row0, len, hv, v0 + c + 16u, u1); }
        if (TC > 2u) { store_w_rows(1u, base, row0, len, hv, v0 + c + 32u, u2); }
        if (TC > 3u) { store_w_rows(1u, base, row0, len, hv, v0 + c + 48u, u3); }
        workgroupBarrier();
        store_tile_rows(ws + row0 * V_BLOCK, c + 0u, u0);
        if (TC > 1u) { store_tile_rows(ws + row0 * V_BLOCK, c + 16u, u1); }
        if (TC > 2u) { store_tile_rows(ws + row0 * V_BLOCK, c + 32u, u2); }
        if (TC > 3u) { store_tile_rows(ws + row0 * V_BLOCK, c + 48u, u3); }

        // S ← γ_C S + Kᵀ ((γ_C/γ) ⊙ V'), K staged in T_SLICE-token slices.
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
        var kt_a = load_kt4(base, len, h, 0u, 4u * t);
        var kt_b = load_kt4(base, len, h, 0u, 4u * t + 1024u);
        for (var i0 = 0u; i0 < CHUNK; i0 += T_SLICE) {
            workgroupBarrier();
            store_kt4(kt, 4u * t, kt_a);
            store_kt4(kt, 4u * t + 1024u, kt_b);
            if (i0 + T_SLICE < CHUNK) {
                kt_a = load_kt4(base, len, h, i0 + T_SLICE, 4u * t);
                kt_b = load_kt4(base, len, h, i0 + T_SLICE, 4u * t + 1024u);
            }
            workgroupBarrier();
            for (var di = 0u; di < T_SLICE; di++) {
                let vd = dec_s[i0 + di] * cols4(ws + (i0 + di) * V_BLOCK, c);
                let krow = kt + di * T_PITCH;
                if (row0 < K_DIM) {
                    let kx = krow4(krow, row0 + 0u);
                    s00 += kx * vd.x;
                    if (TC > 1u) { s01 += kx * vd.y; }
                    if (TC > 2u) { s02 += kx * vd.z; }
                    if (TC > 3u) { s03 += kx * vd.w; }
                }
                if (KB > 1u && row0 + 64u < K_DIM) {
                    let kx = krow4(krow, row0 + 64u);
                    s10 += kx * vd.x;
                    if (TC > 1u) { s11 += kx * vd.y; }
                    if (TC > 2u) { s12 += kx * vd.z; }
                    if (TC > 3u) { s13 += kx * vd.w; }
                }
                if (KB > 2u && row0 + 128u < K_DIM) {
                    let kx = krow4(krow, row0 + 128u);
                    s20 += kx * vd.x;
                    if (TC > 1u) { s21 += kx * vd.y; }
                    if (TC > 2u) { s22 += kx * vd.z; }
                    if (TC > 3u) { s23 += kx * vd.w; }
                }
                if (KB > 3u && row0 + 192u < K_DIM) {
                    let kx = krow4(krow, row0 + 192u);
                    s30 += kx * vd.x;
                    if (TC > 1u) { s31 += kx * vd.y; }
                    if (TC > 2u) { s32 += kx * vd.z; }
                    if (TC > 3u) { s33 += kx * vd.w; }
                }
            }
        }
    }
}
