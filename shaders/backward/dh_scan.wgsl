// dh_scan: the reverse inter-chunk scan of the state gradient. One workgroup per
// (segment, v-head, V-block) walks the segment's chunks newest first with dS (K × V_BLOCK, the
// gradient w.r.t. the chunk-END state; dht or 0 at the segment end) in registers:
//     dstates[chunk] ← dS
//     dV' = (γ_C/γ) ⊙ (K dS) + Pgᵀ dO,   Pg = scale · Γ ⊙ (Q Kᵀ)   (lower, incl. diagonal)
//     dv  = Agᵀ dV',                      Ag = Γ ⊙ A ⊙ β_col          (the gradient of v)
//     dS  ← γ_C dS − Kᵀ (γ ⊙ dv) + scale · Qᵀ (γ ⊙ dO)               (now w.r.t. the start)
// and leaves dh0 in the tail slot `num_chunks + n`. No chunk-start state is needed: the
// products with S belong to the parallel gradient passes. Every exponent is ≤ 0.
//
// Partial chunks: rows past the end load q = k = dO = 0, A = 0, β = 0, G = G_last, so they
// contribute nothing; they are never stored.
//
// Workgroup memory: the same arena as state_recompute (tile 64 × V_BLOCK, then the K/Q/dS
// slices or the packed triangle of Pg or Ag). The tile holds dO, then dV', then −γ⊙dv, then
// scale·γ⊙dO again (reloaded) so the smallest variant stays within 16 KiB.

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> q_buf: array<Elem>;              // [B·T, H, K]
@group(0) @binding(2) var<storage, read> k_buf: array<Elem>;              // [B·T, H, K]
@group(0) @binding(3) var<storage, read> gate_beta: array<vec2<f32>>;     // [B·T, HV]: (G, β)
@group(0) @binding(4) var<storage, read> a_buf: array<f32>;               // [B·T, HV, 64]
@group(0) @binding(5) var<storage, read> do_buf: array<Elem>;             // [B·T, HV, V]
@group(0) @binding(6) var<storage, read> segments: array<u32>;            // start, length, first chunk, sequence
@group(0) @binding(7) var<storage, read_write> dstates: array<f32>;       // [chunks + N, HV, K, V] (or V-first)
@group(0) @binding(8) var<storage, read_write> dvnew_dv: array<f32>;      // [2, B·T, HV, V]: dV', then dv

const WG: u32 = 256u;
override K_DIM: u32;
override V_BLOCK: u32;
override ARENA: u32;
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

// Stage K (or Q) columns m·K_SLICE.. of the chunk's rows into arena[at..].
fn stage_slice(at: u32, t: u32, m: u32, base: u32, len: u32, h: u32, from_q: bool) {
    for (var j = 0u; j < 64u / V_BLOCK; j++) {
        let e = t + WG * j;
        let i = e / K_SLICE;
        var x = 0.0;
        if (i < len) {
            let gi = ((base + i) * params.heads_qk + h) * K_DIM + m * K_SLICE + e % K_SLICE;
            if (from_q) {
                x = elem_to_f32(q_buf[gi]);
            } else {
                x = elem_to_f32(k_buf[gi]);
            }
        }
        arena[at + e] = x;
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
    let v_dim = params.value_dim;
    let h = hv / (hv_count / params.heads_qk);
    let v_first = has_flag(params.flags, FLAG_STATE_V_FIRST);
    let kv = K_DIM * v_dim;
    let scale = params.scale;
    // Offset of dv in dvnew_dv (dV' comes first).
    let dv_offset = params.total_tokens * hv_count * v_dim;

    let row = t / 4u;
    let cg = t % 4u;
    let s_k = t / V_BLOCK;
    let s_v = t % V_BLOCK;

    let ws = 0u;
    let kc = 64u * V_BLOCK;
    let qc = kc + 64u * K_SLICE;
    let ss = qc + 64u * K_SLICE;
    let tr = kc;

    let end_base = ((params.num_chunks + sequence) * hv_count + hv) * kv;
    var s: array<f32, 64>;
    for (var m = 0u; m < S_REGS; m++) {
        s[m] = dstates[state_index(end_base, m * K_SLICE + s_k, v0 + s_v, v_first)];
    }

    var u: array<f32, 16>;
    var p: array<f32, 16>;
    let n_chunks = (seg_len + CHUNK - 1u) / CHUNK;
    for (var cr = 0u; cr < n_chunks; cr++) {
        let ci = n_chunks - 1u - cr;
        let base = seg_start + ci * CHUNK;
        let len = min(CHUNK, seg_len - ci * CHUNK);
        let chunk_base = ((first_chunk + ci) * hv_count + hv) * kv;
        for (var m = 0u; m < S_REGS; m++) {
            dstates[state_index(chunk_base, m * K_SLICE + s_k, v0 + s_v, v_first)] = s[m];
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

        // K dS and P = Q Kᵀ, accumulated over K slices.
        for (var n = 0u; n < 16u; n++) {
            u[n] = 0.0;
            p[n] = 0.0;
        }
        for (var m = 0u; m < S_REGS; m++) {
            workgroupBarrier();
            arena[ss + t] = s[m];
            stage_slice(kc, t, m, base, len, h, false);
            stage_slice(qc, t, m, base, len, h, true);
            workgroupBarrier();
            for (var kk = 0u; kk < K_SLICE; kk++) {
                let kr = arena[kc + row * K_SLICE + kk];
                let qr = arena[qc + row * K_SLICE + kk];
                for (var n = 0u; n < O_REGS; n++) {
                    u[n] += kr * arena[ss + kk * V_BLOCK + cg + 4u * n];
                }
                for (var n = 0u; n < 16u; n++) {
                    p[n] += qr * arena[kc + (cg + 4u * n) * K_SLICE + kk];
                }
            }
        }
        workgroupBarrier();

        // dO into the tile; Pg = scale · Γ ⊙ P into the triangle.
        let token_row = ((base + row) * hv_count + hv) * v_dim + v0;
        for (var n = 0u; n < O_REGS; n++) {
            let col = cg + 4u * n;
            var dox = 0.0;
            if (row < len) {
                dox = elem_to_f32(do_buf[token_row + col]);
            }
            arena[ws + row * V_BLOCK + col] = dox;
        }
        for (var n = 0u; n < 16u; n++) {
            let j = cg + 4u * n;
            if (j <= row) {
                arena[tr + tri(row, j)] = scale * p[n] * exp(g_s[row] - g_s[j]);
            }
        }
        workgroupBarrier();

        // dV' = (γ_C/γ) ⊙ (K dS) + Pgᵀ dO: column `row` of Pg, rows i ≥ row.
        let dec_row = dec_s[row];
        for (var n = 0u; n < O_REGS; n++) {
            let col = cg + 4u * n;
            var acc = dec_row * u[n];
            for (var i = row; i < CHUNK; i++) {
                acc += arena[tr + tri(i, row)] * arena[ws + i * V_BLOCK + col];
            }
            u[n] = acc;
            if (row < len) {
                dvnew_dv[token_row + col] = acc;
            }
        }
        workgroupBarrier();

        // dV' into the tile; Ag = Γ ⊙ A ⊙ β_col into the triangle.
        for (var n = 0u; n < O_REGS; n++) {
            arena[ws + row * V_BLOCK + cg + 4u * n] = u[n];
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

        // dv = Agᵀ dV'.
        for (var n = 0u; n < O_REGS; n++) {
            let col = cg + 4u * n;
            var acc = 0.0;
            for (var i = row; i < CHUNK; i++) {
                acc += arena[tr + tri(i, row)] * arena[ws + i * V_BLOCK + col];
            }
            u[n] = acc;
            if (row < len) {
                dvnew_dv[dv_offset + token_row + col] = acc;
            }
        }
        workgroupBarrier();
        let gam_row = gam_s[row];
        for (var n = 0u; n < O_REGS; n++) {
            arena[ws + row * V_BLOCK + cg + 4u * n] = -gam_row * u[n];
        }

        // dS ← γ_C dS + Kᵀ (−γ ⊙ dv).
        for (var m = 0u; m < S_REGS; m++) {
            workgroupBarrier();
            stage_slice(kc, t, m, base, len, h, false);
            workgroupBarrier();
            var acc = 0.0;
            for (var i = 0u; i < CHUNK; i++) {
                acc += arena[kc + i * K_SLICE + s_k] * arena[ws + i * V_BLOCK + s_v];
            }
            s[m] = gam_c * s[m] + acc;
        }
        workgroupBarrier();

        // dS += Qᵀ (scale · γ ⊙ dO), dO reloaded into the tile.
        for (var n = 0u; n < O_REGS; n++) {
            let col = cg + 4u * n;
            var dox = 0.0;
            if (row < len) {
                dox = elem_to_f32(do_buf[token_row + col]);
            }
            arena[ws + row * V_BLOCK + col] = scale * gam_row * dox;
        }
        for (var m = 0u; m < S_REGS; m++) {
            workgroupBarrier();
            stage_slice(kc, t, m, base, len, h, true);
            workgroupBarrier();
            var acc = 0.0;
            for (var i = 0u; i < CHUNK; i++) {
                acc += arena[kc + i * K_SLICE + s_k] * arena[ws + i * V_BLOCK + s_v];
            }
            s[m] += acc;
        }
    }

    for (var m = 0u; m < S_REGS; m++) {
        dstates[state_index(end_base, m * K_SLICE + s_k, v0 + s_v, v_first)] = s[m];
    }
}
