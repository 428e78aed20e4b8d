// state_scan: the sequential inter-chunk pass. One workgroup per (segment, v-head, V-block)
// walks the segment's chunks with its f32 state slice S (K × V_BLOCK) held in registers, and
// per chunk of ≤ 64 tokens computes (FlashQLA's form, no w/u materialisation):
//     U  = K S,   QS = Q S,   P = Q Kᵀ                      (K streamed in slices)
//     W  = V − γ ⊙ U
//     V' = (Γ ⊙ A ⊙ β_col) W                                 (A from wy_inverse)
//     O  = scale · (γ ⊙ QS + (Γ ⊙ P) V')
//     S  ← γ_C S + Kᵀ ((γ_C/γ) ⊙ V')
// with γ = exp(G), Γ_ij = exp(G_i − G_j) for j ≤ i (exponentiated only there, so every
// exponent is ≤ 0), γ_C = exp(G_last). A segment starts from the state in `state[slot]` and
// leaves its end state there: a segment is the unit of sequence parallelism.
//
// Partial chunks: rows past the end load k = q = v = 0, A = 0, β = 0 and G = G_last, so
// they contribute nothing and γ_C/γ = 1 there.
//
// Workgroup memory (f32 words, `ARENA` from the host): W/V' tile 64 × V_BLOCK, then a region
// shared by the K/Q/S slices of the GEMM phases and the packed lower triangle (2080 words)
// of Γ⊙A⊙β and Γ⊙P. At V_BLOCK = 16 it is 14 KiB: within WebGPU's default 16 KiB.

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> q_buf: array<Elem>;              // [B·T, H, K]
@group(0) @binding(2) var<storage, read> k_buf: array<Elem>;              // [B·T, H, K]
@group(0) @binding(3) var<storage, read> v_buf: array<Elem>;              // [B·T, HV, V]
@group(0) @binding(4) var<storage, read> gate_beta: array<vec2<f32>>;     // [B·T, HV]: (G, β)
@group(0) @binding(5) var<storage, read> a_buf: array<f32>;               // [B·T, HV, 64]
@group(0) @binding(6) var<storage, read> segments: array<u32>;            // start, length, state slot
@group(0) @binding(7) var<storage, read_write> state: array<f32>;         // [slots, HV, K, V] or V-first
@group(0) @binding(8) var<storage, read_write> o_buf: array<Elem>;        // [B·T, HV, V]

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
fn state_scan(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let seg = wid.x;
    let hv = wid.y;
    let v0 = wid.z * V_BLOCK;
    let seg_start = segments[3u * seg];
    let seg_len = segments[3u * seg + 1u];
    let slot = segments[3u * seg + 2u];
    let hv_count = params.heads_v;
    let h_count = params.heads_qk;
    let v_dim = params.value_dim;
    let h = hv / (hv_count / h_count);
    let v_first = has_flag(params.flags, FLAG_STATE_V_FIRST);

    // Tile ownership: rows of the 64 × V_BLOCK tiles and of P (64 × 64), strided columns.
    let row = t / 4u;
    let cg = t % 4u;
    // State ownership: element (m·K_SLICE + s_k, s_v) for every slice m.
    let s_k = t / V_BLOCK;
    let s_v = t % V_BLOCK;

    let ws = 0u;
    let kc = 64u * V_BLOCK;
    let qc = kc + 64u * K_SLICE;
    let ss = qc + 64u * K_SLICE;
    let tr = kc;

    let state_base = (slot * hv_count + hv) * K_DIM * v_dim;
    var s: array<f32, 64>;
    for (var m = 0u; m < S_REGS; m++) {
        s[m] = state[state_index(state_base, m * K_SLICE + s_k, v0 + s_v, v_first)];
    }

    var u: array<f32, 16>;
    var qs: array<f32, 16>;
    var p: array<f32, 16>;
    let n_chunks = (seg_len + CHUNK - 1u) / CHUNK;
    for (var ci = 0u; ci < n_chunks; ci++) {
        let base = seg_start + ci * CHUNK;
        let len = min(CHUNK, seg_len - ci * CHUNK);
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

        // U = K S, QS = Q S, P = Q Kᵀ, accumulated over K slices.
        for (var n = 0u; n < 16u; n++) {
            u[n] = 0.0;
            qs[n] = 0.0;
            p[n] = 0.0;
        }
        for (var m = 0u; m < S_REGS; m++) {
            workgroupBarrier();
            arena[ss + t] = s[m];
            for (var j = 0u; j < 64u / V_BLOCK; j++) {
                let e = t + WG * j;
                let i = e / K_SLICE;
                var kx = 0.0;
                var qx = 0.0;
                if (i < len) {
                    let gi = ((base + i) * h_count + h) * K_DIM + m * K_SLICE + e % K_SLICE;
                    kx = elem_to_f32(k_buf[gi]);
                    qx = elem_to_f32(q_buf[gi]);
                }
                arena[kc + e] = kx;
                arena[qc + e] = qx;
            }
            workgroupBarrier();
            for (var kk = 0u; kk < K_SLICE; kk++) {
                let kr = arena[kc + row * K_SLICE + kk];
                let qr = arena[qc + row * K_SLICE + kk];
                for (var n = 0u; n < O_REGS; n++) {
                    let sv = arena[ss + kk * V_BLOCK + cg + 4u * n];
                    u[n] += kr * sv;
                    qs[n] += qr * sv;
                }
                for (var n = 0u; n < 16u; n++) {
                    p[n] += qr * arena[kc + (cg + 4u * n) * K_SLICE + kk];
                }
            }
        }
        workgroupBarrier();

        // W = V − γ ⊙ U into the tile; Γ ⊙ A ⊙ β_col into the triangle.
        let gam_row = gam_s[row];
        for (var n = 0u; n < O_REGS; n++) {
            let col = cg + 4u * n;
            var vx = 0.0;
            if (row < len) {
                vx = elem_to_f32(v_buf[((base + row) * hv_count + hv) * v_dim + v0 + col]);
            }
            arena[ws + row * V_BLOCK + col] = vx - gam_row * u[n];
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

        // V' = (Γ ⊙ A ⊙ β_col) W, kept in u.
        for (var n = 0u; n < O_REGS; n++) {
            let col = cg + 4u * n;
            var acc = 0.0;
            for (var j = 0u; j <= row; j++) {
                acc += arena[tr + tri(row, j)] * arena[ws + j * V_BLOCK + col];
            }
            u[n] = acc;
        }
        workgroupBarrier();
        for (var n = 0u; n < O_REGS; n++) {
            arena[ws + row * V_BLOCK + cg + 4u * n] = u[n];
        }
        for (var n = 0u; n < 16u; n++) {
            let j = cg + 4u * n;
            if (j <= row) {
                arena[tr + tri(row, j)] = p[n] * exp(g_s[row] - g_s[j]);
            }
        }
        workgroupBarrier();

        // O = scale · (γ ⊙ QS + (Γ ⊙ P) V').
        if (row < len) {
            for (var n = 0u; n < O_REGS; n++) {
                let col = cg + 4u * n;
                var acc = gam_row * qs[n];
                for (var j = 0u; j <= row; j++) {
                    acc += arena[tr + tri(row, j)] * arena[ws + j * V_BLOCK + col];
                }
                o_buf[((base + row) * hv_count + hv) * v_dim + v0 + col] = f32_to_elem(params.scale * acc);
            }
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

    for (var m = 0u; m < S_REGS; m++) {
        state[state_index(state_base, m * K_SLICE + s_k, v0 + s_v, v_first)] = s[m];
    }
}
