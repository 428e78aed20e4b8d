// state_recompute: the backward's replay of the forward scan. The forward keeps no per-chunk
// state, so one workgroup per (segment, v-head, V-block) walks the segment's chunks again with
// its f32 state slice S (K × V_BLOCK) in registers, and per chunk of ≤ 64 tokens:
//     states[chunk] ← S                                       (the chunk-start state)
//     U  = K S                                                (K streamed in slices)
//     W  = V − γ ⊙ U,   V' = (Γ ⊙ A ⊙ β_col) W                 (both kept for the gradients)
//     S  ← γ_C S + Kᵀ ((γ_C/γ) ⊙ V')
// with γ = exp(G), Γ_ij = exp(G_i − G_j) for j ≤ i only, γ_C = exp(G_last): every exponent
// is ≤ 0. The start state of sequence n is read from the tail slot `num_chunks + n` (a copy of
// h0, or zeros). No output is computed: this is the forward scan minus Q.
//
// Partial chunks: rows past the end load k = v = 0, A = 0, β = 0 and G = G_last, so they
// contribute nothing and γ_C/γ = 1 there; they are never stored.
//
// Workgroup memory (f32 words, `ARENA` from the host, `backward::scan_arena_words`): the W/V'
// tile (64 × V_BLOCK), then one region shared by the K/S slices of U = K S and the packed
// lower triangle (2080 words) of Γ⊙A⊙β. At V_BLOCK = 16 it is 14 KiB.

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> k_buf: array<Elem>;              // [B·T, H, K]
@group(0) @binding(2) var<storage, read> v_buf: array<Elem>;              // [B·T, HV, V]
@group(0) @binding(3) var<storage, read> gate_beta: array<vec2<f32>>;     // [B·T, HV]: (G, β)
@group(0) @binding(4) var<storage, read> a_buf: array<f32>;               // [B·T, HV, 64]
@group(0) @binding(5) var<storage, read> segments: array<u32>;            // start, length, first chunk, sequence
@group(0) @binding(6) var<storage, read_write> states: array<f32>;        // [chunks + N, HV, K, V] (or V-first)
@group(0) @binding(7) var<storage, read_write> w_vnew: array<f32>;        // [2, B·T, HV, V]: W, then V'

const WG: u32 = 256u;
override K_DIM: u32;
override V_BLOCK: u32;
override ARENA: u32;
// One state slice is K_SLICE × V_BLOCK = WG words: one per invocation.
override K_SLICE: u32 = WG / V_BLOCK;
override S_REGS: u32 = K_DIM / K_SLICE;
override O_REGS: u32 = V_BLOCK / 4u;

var<workgroup> arena: array<f32, ARENA>;
var<workgroup> g_s: array<f32, 64>;    // G_i (padded with G_last)
var<workgroup> b_s: array<f32, 64>;    // β_i (0 past the end)
var<workgroup> gam_s: array<f32, 64>;  // γ_i = exp(G_i)
var<workgroup> dec_s: array<f32, 64>;  // γ_C/γ_i = exp(G_last − G_i)

fn tri(i: u32, j: u32) -> u32 {
    return i * (i + 1u) / 2u + j;
}

fn state_index(base: u32, k: u32, v: u32, v_first: bool) -> u32 {
    if (v_first) {
        return base + v * K_DIM + k;
    }
    return base + k * params.value_dim + v;
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
    let h_count = params.heads_qk;
    let v_dim = params.value_dim;
    let h = hv / (hv_count / h_count);
    let v_first = has_flag(params.flags, FLAG_STATE_V_FIRST);
    let kv = K_DIM * v_dim;
    // Offset of V' in w_vnew (W comes first).
    let vnew_offset = params.total_tokens * hv_count * v_dim;

    // Tile ownership: rows of the 64 × V_BLOCK tiles, strided columns.
    let row = t / 4u;
    let cg = t % 4u;
    // State ownership: element (m·K_SLICE + s_k, s_v) for every slice m.
    let s_k = t / V_BLOCK;
    let s_v = t % V_BLOCK;

    let ws = 0u;
    let kc = 64u * V_BLOCK;
    let ss = kc + 64u * K_SLICE;
    let tr = kc;

    let start_base = ((params.num_chunks + sequence) * hv_count + hv) * kv;
    var s: array<f32, 64>;
    for (var m = 0u; m < S_REGS; m++) {
        s[m] = states[state_index(start_base, m * K_SLICE + s_k, v0 + s_v, v_first)];
    }

    var u: array<f32, 16>;
    let n_chunks = (seg_len + CHUNK - 1u) / CHUNK;
    for (var ci = 0u; ci < n_chunks; ci++) {
        let base = seg_start + ci * CHUNK;
        let len = min(CHUNK, seg_len - ci * CHUNK);
        let chunk_base = ((first_chunk + ci) * hv_count + hv) * kv;
        for (var m = 0u; m < S_REGS; m++) {
            states[state_index(chunk_base, m * K_SLICE + s_k, v0 + s_v, v_first)] = s[m];
        }
        let g_last = gate_beta[(base + len - 1u) * hv_count + hv].x;
        let gam_c = exp(g_last);
        workgroupBarrier();
        if (t < CHUNK) {
            var g = g_last;
            var b = 0.0;
            if (t < len) {
                let gb = gate_beta[(base + t) * hv_count + hv];
                g = gb.x;
                b = gb.y;
            }
            g_s[t] = g;
            b_s[t] = b;
            gam_s[t] = exp(g);
            dec_s[t] = exp(g_last - g);
        }

        // U = K S, accumulated over K slices.
        for (var n = 0u; n < 16u; n++) {
            u[n] = 0.0;
        }
        for (var m = 0u; m < S_REGS; m++) {
            workgroupBarrier();
            arena[ss + t] = s[m];
            for (var j = 0u; j < 64u / V_BLOCK; j++) {
                let e = t + WG * j;
                let i = e / K_SLICE;
                var kx = 0.0;
                if (i < len) {
                    kx = elem_to_f32(k_buf[((base + i) * h_count + h) * K_DIM + m * K_SLICE + e % K_SLICE]);
                }
                arena[kc + e] = kx;
            }
            workgroupBarrier();
            for (var kk = 0u; kk < K_SLICE; kk++) {
                let kr = arena[kc + row * K_SLICE + kk];
                for (var n = 0u; n < O_REGS; n++) {
                    u[n] += kr * arena[ss + kk * V_BLOCK + cg + 4u * n];
                }
            }
        }
        workgroupBarrier();

        // W = V − γ ⊙ U into the tile (and kept); Γ ⊙ A ⊙ β_col into the triangle.
        let gam_row = gam_s[row];
        let token_row = ((base + row) * hv_count + hv) * v_dim + v0;
        for (var n = 0u; n < O_REGS; n++) {
            let col = cg + 4u * n;
            var vx = 0.0;
            if (row < len) {
                vx = elem_to_f32(v_buf[token_row + col]);
            }
            let w = vx - gam_row * u[n];
            arena[ws + row * V_BLOCK + col] = w;
            if (row < len) {
                w_vnew[token_row + col] = w;
            }
        }
        let a_row = ((base + row) * hv_count + hv) * CHUNK;
        for (var n = 0u; n < 16u; n++) {
            let j = cg + 4u * n;
            if (j <= row) {
                var a = 0.0;
                if (row < len) {
                    a = a_buf[a_row + j];
                }
                arena[tr + tri(row, j)] = a * exp(g_s[row] - g_s[j]) * b_s[j];
            }
        }
        workgroupBarrier();

        // V' = (Γ ⊙ A ⊙ β_col) W, kept in u and stored.
        for (var n = 0u; n < O_REGS; n++) {
            let col = cg + 4u * n;
            var acc = 0.0;
            for (var j = 0u; j <= row; j++) {
                acc += arena[tr + tri(row, j)] * arena[ws + j * V_BLOCK + col];
            }
            u[n] = acc;
            if (row < len) {
                w_vnew[vnew_offset + token_row + col] = acc;
            }
        }
        workgroupBarrier();
        for (var n = 0u; n < O_REGS; n++) {
            arena[ws + row * V_BLOCK + cg + 4u * n] = u[n];
        }

        // S ← γ_C S + Kᵀ ((γ_C/γ) ⊙ V'), K streamed in slices again.
        for (var m = 0u; m < S_REGS; m++) {
            workgroupBarrier();
            for (var j = 0u; j < 64u / V_BLOCK; j++) {
                let e = t + WG * j;
                let i = e / K_SLICE;
                var kx = 0.0;
                if (i < len) {
                    kx = elem_to_f32(k_buf[((base + i) * h_count + h) * K_DIM + m * K_SLICE + e % K_SLICE]);
                }
                arena[kc + e] = kx;
            }
            workgroupBarrier();
            var acc = 0.0;
            for (var i = 0u; i < CHUNK; i++) {
                acc += arena[kc + i * K_SLICE + s_k] * dec_s[i] * arena[ws + i * V_BLOCK + s_v];
            }
            s[m] = gam_c * s[m] + acc;
        }
    }
}
