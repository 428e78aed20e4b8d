// state_scan: the sequential inter-chunk pass. One workgroup (256 invocations) per
// (segment, v-head, V-block) walks the segment's chunks with its f32 state slice S
// (K × V_BLOCK) in registers, and per chunk of ≤ 64 tokens computes (FlashQLA's form, no w/u
// materialisation):
//     U  = K S,   QS = Q S,   P = Q Kᵀ                      (K streamed in 16-column slices)
//     W  = V − γ ⊙ U
//     V' = (Γ ⊙ A ⊙ β_col) W                                 (A from wy_inverse)
//     O  = scale · (γ ⊙ QS + (Γ ⊙ P) V')
//     S  ← γ_C S + Kᵀ ((γ_C/γ) ⊙ V')                         (K streamed in 8-token slices)
// with γ = exp(G), Γ_ij = exp(G_i − G_j) for j ≤ i (exponentiated only there, so every
// exponent is ≤ 0), γ_C = exp(G_last). A segment starts from the state in `state[slot]` and
// leaves its end state there: a segment is the unit of sequence parallelism.
//
// Register tiling: invocation (r, c) = (t / 16, t % 16) owns rows 4r..4r+3 of every 64-row
// tile and columns c + 16j (j < TC = V_BLOCK / 16) of the V-block, and rows 4r + ii + 64kb of
// the state. Each shared-memory load feeds several FMAs.
//
// Partial chunks: rows past the end load k = q = v = 0, A = 0, β = 0 and G = G_last, so
// they contribute nothing and γ_C/γ = 1 there. Columns past V (when V is not a multiple of
// V_BLOCK) are computed on zeros and never stored.
//
// Workgroup memory (f32 words, `ARENA` from the host, see `tuning::state_scan_arena_words`):
// the W/V' tile (64 × V_BLOCK), then one region reused by the phases: the K/Q/S slices of the
// first GEMMs, the packed lower triangle (2080 words) of Γ⊙A⊙β and of Γ⊙P, and the 8-token K
// slices of the state update. At V_BLOCK = 16 it is under WebGPU's default 16 KiB.

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> q_buf: array<Elem>;              // [B·T, H, K]
@group(0) @binding(2) var<storage, read> k_buf: array<Elem>;              // [B·T, H, K]
@group(0) @binding(3) var<storage, read> v_buf: array<Elem>;              // [B·T, HV, V]
@group(0) @binding(4) var<storage, read> gate_beta: array<vec2<f32>>;     // [B·T, HV]: (G, β)
@group(0) @binding(5) var<storage, read> a_buf: array<f32>;               // [B·T, HV, 64]
@group(0) @binding(6) var<storage, read> segments: array<u32>;            // start, length, state slot
@group(0) @binding(7) var<storage, read_write> state: array<f32>;         // [slots, HV, K, V] or V-first
@group(0) @binding(8) var<storage, read_write> o_buf: array<Elem>;        // [B·T, HV, V]

override K_DIM: u32;
override V_BLOCK: u32;                    // 16, 32 or 64
override ARENA: u32;
override TC: u32 = V_BLOCK / 16u;         // columns per invocation
override KB: u32 = (K_DIM + 63u) / 64u;   // 64-row state blocks
const K_SLICE: u32 = 16u;
const K_PITCH: u32 = 17u;                 // padded row pitch of the K/Q slices (no bank conflicts)
const T_SLICE: u32 = 8u;                  // tokens per K slice of the state update
override T_PITCH: u32 = K_DIM + 1u;

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

    let r = t / 16u;
    let c = t % 16u;
    let row0 = 4u * r;

    let ws = 0u;
    let kc = 64u * V_BLOCK;
    let qc = kc + 64u * K_PITCH;
    let ss = qc + 64u * K_PITCH;
    let tr = kc;
    let kt = kc;

    // State: s[(kb * 4 + ii) * 4 + j] = S[row0 + ii + 64 kb, v0 + c + 16 j].
    let state_base = (slot * hv_count + hv) * K_DIM * v_dim;
    var s: array<f32, 64>;
    for (var kb = 0u; kb < KB; kb++) {
        for (var ii = 0u; ii < 4u; ii++) {
            for (var j = 0u; j < TC; j++) {
                let k = row0 + ii + 64u * kb;
                let v = v0 + c + 16u * j;
                var x = 0.0;
                if (k < K_DIM && v < v_dim) {
                    x = state[state_index(state_base, k, v, v_first)];
                }
                s[(kb * 4u + ii) * 4u + j] = x;
            }
        }
    }

    var u: array<f32, 16>;    // U, then V'
    var qs: array<f32, 16>;   // Q S, then O
    var p: array<f32, 16>;    // P = Q Kᵀ at rows row0.., columns c + 16 jj
    var gam: array<f32, 16>;  // Γ at the same positions (0 above the diagonal)
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
        for (var n = 0u; n < 16u; n++) {
            u[n] = 0.0;
            qs[n] = 0.0;
            p[n] = 0.0;
        }

        // U = K S, QS = Q S, P = Q Kᵀ over 16-column slices of K.
        for (var k0 = 0u; k0 < K_DIM; k0 += K_SLICE) {
            workgroupBarrier();
            for (var e = t; e < 64u * K_SLICE; e += 256u) {
                let i = e / K_SLICE;
                let kk = e % K_SLICE;
                var kx = 0.0;
                var qx = 0.0;
                if (i < len) {
                    let gi = ((base + i) * h_count + h) * K_DIM + k0 + kk;
                    kx = elem_to_f32(k_buf[gi]);
                    qx = elem_to_f32(q_buf[gi]);
                }
                arena[kc + i * K_PITCH + kk] = kx;
                arena[qc + i * K_PITCH + kk] = qx;
            }
            // The owners of state rows k0..k0+15 publish them.
            let kb0 = k0 / 64u;
            let rr = row0 - k0 % 64u;
            if (row0 >= k0 % 64u && rr < K_SLICE) {
                for (var ii = 0u; ii < 4u; ii++) {
                    for (var j = 0u; j < TC; j++) {
                        arena[ss + (rr + ii) * V_BLOCK + c + 16u * j] = s[(kb0 * 4u + ii) * 4u + j];
                    }
                }
            }
            workgroupBarrier();
            for (var kk = 0u; kk < K_SLICE; kk++) {
                var kr: array<f32, 4>;
                var qr: array<f32, 4>;
                var kcol: array<f32, 4>;
                var sv: array<f32, 4>;
                for (var ii = 0u; ii < 4u; ii++) {
                    kr[ii] = arena[kc + (row0 + ii) * K_PITCH + kk];
                    qr[ii] = arena[qc + (row0 + ii) * K_PITCH + kk];
                    kcol[ii] = arena[kc + (c + 16u * ii) * K_PITCH + kk];
                }
                for (var j = 0u; j < TC; j++) {
                    sv[j] = arena[ss + kk * V_BLOCK + c + 16u * j];
                }
                for (var ii = 0u; ii < 4u; ii++) {
                    for (var j = 0u; j < TC; j++) {
                        u[ii * 4u + j] += kr[ii] * sv[j];
                        qs[ii * 4u + j] += qr[ii] * sv[j];
                    }
                    for (var jj = 0u; jj < 4u; jj++) {
                        p[ii * 4u + jj] += qr[ii] * kcol[jj];
                    }
                }
            }
        }
        workgroupBarrier();

        // W = V − γ ⊙ U into the tile; Γ ⊙ A ⊙ β_col into the triangle.
        for (var ii = 0u; ii < 4u; ii++) {
            let i = row0 + ii;
            let gi = gam_s[i];
            for (var j = 0u; j < TC; j++) {
                let col = c + 16u * j;
                var vx = 0.0;
                if (i < len && v0 + col < v_dim) {
                    vx = elem_to_f32(v_buf[((base + i) * hv_count + hv) * v_dim + v0 + col]);
                }
                arena[ws + i * V_BLOCK + col] = vx - gi * u[ii * 4u + j];
            }
            for (var jj = 0u; jj < 4u; jj++) {
                let j = c + 16u * jj;
                var gm = 0.0;
                if (j <= i) {
                    gm = exp(g_s[i] - g_s[j]);
                    var a = 0.0;
                    if (i < len) {
                        a = a_buf[((base + i) * hv_count + hv) * CHUNK + j];
                    }
                    arena[tr + tri(i, j)] = a * gm * b_s[j];
                }
                gam[ii * 4u + jj] = gm;
            }
        }
        workgroupBarrier();

        // V' = (Γ ⊙ A ⊙ β_col) W over j ≤ i, kept in u.
        for (var n = 0u; n < 16u; n++) {
            u[n] = 0.0;
        }
        for (var j = 0u; j < row0 + 4u; j++) {
            var a: array<f32, 4>;
            for (var ii = 0u; ii < 4u; ii++) {
                let i = row0 + ii;
                a[ii] = select(0.0, arena[tr + tri(i, min(j, i))], j <= i);
            }
            for (var jc = 0u; jc < TC; jc++) {
                let w = arena[ws + j * V_BLOCK + c + 16u * jc];
                for (var ii = 0u; ii < 4u; ii++) {
                    u[ii * 4u + jc] += a[ii] * w;
                }
            }
        }
        workgroupBarrier();
        for (var ii = 0u; ii < 4u; ii++) {
            let i = row0 + ii;
            for (var j = 0u; j < TC; j++) {
                arena[ws + i * V_BLOCK + c + 16u * j] = u[ii * 4u + j];
            }
            for (var jj = 0u; jj < 4u; jj++) {
                let j = c + 16u * jj;
                if (j <= i) {
                    arena[tr + tri(i, j)] = p[ii * 4u + jj] * gam[ii * 4u + jj];
                }
            }
        }
        workgroupBarrier();

        // O = scale · (γ ⊙ QS + (Γ ⊙ P) V').
        for (var ii = 0u; ii < 4u; ii++) {
            let gi = gam_s[row0 + ii];
            for (var j = 0u; j < TC; j++) {
                qs[ii * 4u + j] *= gi;
            }
        }
        for (var j = 0u; j < row0 + 4u; j++) {
            var pm: array<f32, 4>;
            for (var ii = 0u; ii < 4u; ii++) {
                let i = row0 + ii;
                pm[ii] = select(0.0, arena[tr + tri(i, min(j, i))], j <= i);
            }
            for (var jc = 0u; jc < TC; jc++) {
                let vd = arena[ws + j * V_BLOCK + c + 16u * jc];
                for (var ii = 0u; ii < 4u; ii++) {
                    qs[ii * 4u + jc] += pm[ii] * vd;
                }
            }
        }
        for (var ii = 0u; ii < 4u; ii++) {
            let i = row0 + ii;
            for (var j = 0u; j < TC; j++) {
                let col = c + 16u * j;
                if (i < len && v0 + col < v_dim) {
                    o_buf[((base + i) * hv_count + hv) * v_dim + v0 + col] = f32_to_elem(params.scale * qs[ii * 4u + j]);
                }
            }
        }

        // S ← γ_C S + Kᵀ ((γ_C/γ) ⊙ V'), K staged in 8-token slices.
        for (var n = 0u; n < 64u; n++) {
            s[n] *= gam_c;
        }
        for (var i0 = 0u; i0 < CHUNK; i0 += T_SLICE) {
            workgroupBarrier();
            for (var e = t; e < T_SLICE * K_DIM; e += 256u) {
                let i = i0 + e / K_DIM;
                let k = e % K_DIM;
                var kx = 0.0;
                if (i < len) {
                    kx = elem_to_f32(k_buf[((base + i) * h_count + h) * K_DIM + k]);
                }
                arena[kt + (e / K_DIM) * T_PITCH + k] = kx;
            }
            workgroupBarrier();
            for (var di = 0u; di < T_SLICE; di++) {
                let d = dec_s[i0 + di];
                var vd: array<f32, 4>;
                for (var j = 0u; j < TC; j++) {
                    vd[j] = d * arena[ws + (i0 + di) * V_BLOCK + c + 16u * j];
                }
                for (var kb = 0u; kb < KB; kb++) {
                    for (var ii = 0u; ii < 4u; ii++) {
                        let k = min(row0 + ii + 64u * kb, K_DIM - 1u);
                        let kx = arena[kt + di * T_PITCH + k];
                        for (var j = 0u; j < TC; j++) {
                            s[(kb * 4u + ii) * 4u + j] += kx * vd[j];
                        }
                    }
                }
            }
        }
    }

    for (var kb = 0u; kb < KB; kb++) {
        for (var ii = 0u; ii < 4u; ii++) {
            for (var j = 0u; j < TC; j++) {
                let k = row0 + ii + 64u * kb;
                let v = v0 + c + 16u * j;
                if (k < K_DIM && v < v_dim) {
                    state[state_index(state_base, k, v, v_first)] = s[(kb * 4u + ii) * 4u + j];
                }
            }
        }
    }
}
