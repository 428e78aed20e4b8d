// wy_inverse: per (chunk, v-head) the gate-free WY inverse
//     A = (I + strict_lower(diag(β) K Kᵀ))⁻¹          (64×64, unit lower triangular)
// solved in 16×16 blocks (forward/wy_solve.wgsl). The gate never enters A (it commutes with
// every factor and is re-applied as Γ ⊙ A in the scan), so A has no exponentials at all.
// Rows past a partial chunk's end have k = 0 and β = 0, so they neither contribute nor are
// stored.
//
// The pass also takes the gate-dependent, state-independent work off the scan's sequential
// path (it is parallel over chunks here): per token row it writes
//     gated[i, 0..64)   = Γ ⊙ A ⊙ β_col       (the scan's V' = gated_A · W)
//     gated[i, 64..128) = Γ ⊙ Q Kᵀ            (the scan's intra-chunk output term)
// both 0 above the diagonal, every exponent ≤ 0. A itself is kept for the backward.
// The gated matrices are f32 here; the coop path's pass (wy_inverse_coop.wgsl) writes them
// in f16.
//
// Workgroup memory (13.3 KiB, within every WebGPU device's 16 KiB): during the Gram products
// the first 2560 words stage 64 × 16 slices of K and Q, rows 20 words apart (vec4 reads of
// 20 distinct rows hit distinct banks); then the ten lower blocks of L / A and the solve's
// sums. The arena is declared as vec4s so that every row piece is one 16-byte access (the
// compiler need not prove four scalar accesses adjacent and aligned).

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> k_buf: array<Elem>;              // [B·T, H, K]
@group(0) @binding(2) var<storage, read> q_buf: array<Elem>;              // [B·T, H, K]
@group(0) @binding(3) var<storage, read> gate_beta: array<vec2<f32>>;     // [B·T, HV]: (G, β)
@group(0) @binding(4) var<storage, read> chunks: array<u32>;              // per chunk: start, length
@group(0) @binding(5) var<storage, read_write> a_out: array<f32>;         // [B·T, HV, 64]
@group(0) @binding(6) var<storage, read_write> gated_out: array<f32>;   // [B·T, HV, 128]

override K_DIM: u32;

const WG: u32 = 256u;
const K_SLICE: u32 = 16u;
const ROW: u32 = 20u;              // staged row stride (K_SLICE + 4)
const Q_STAGE: u32 = 64u * ROW;
const SOLVE_WG: u32 = WG;
const SOLVE_SCRATCH: u32 = 2560u;

var<workgroup> arena: array<vec4<f32>, 832>;   // 3328 words (wy_solve.wgsl: word, arena4)
var<workgroup> beta_s: array<f32, 64>;
var<workgroup> g_s: array<f32, 64>;

fn k_at(i: u32) -> f32 {
    return load_elem(k_buf[elem_word(i)], i);
}

fn q_at(i: u32) -> f32 {
    return load_elem(q_buf[elem_word(i)], i);
}

// Row i of Γ ⊙ Q Kᵀ at columns c + 16 bj (p holds the four blocks' values); 0 above the
// diagonal, every exponent ≤ 0; rows past the chunk are not stored.
fn store_gated_qk(start: u32, hv: u32, len: u32, i: u32, c: u32, p: vec4<f32>) {
    if (i < len) {
        let row = ((start + i) * params.heads_v + hv) * 2u * CHUNK + CHUNK;
        for (var bj = 0u; bj < 4u; bj++) {
            let j = 16u * bj + c;
            var v = 0.0;
            if (j <= i) {
                v = p[bj] * exp(g_s[i] - g_s[j]);
            }
            gated_out[row + j] = v;
        }
    }
}

@compute @workgroup_size(256)
fn wy_inverse(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let chunk = wid.x;
    let hv = wid.y;
    let start = chunks[2u * chunk];
    let len = chunks[2u * chunk + 1u];
    let hv_count = params.heads_v;
    let h = hv / (hv_count / params.heads_qk);
    let r = t / 16u;
    let c = t % 16u;

    if (t < CHUNK) {
        // Padded rows: β = 0, G = G_last (so Γ never sees a positive exponent).
        var gb = vec2<f32>(gate_beta[(start + len - 1u) * hv_count + hv].x, 0.0);
        if (t < len) {
            gb = gate_beta[(start + t) * hv_count + hv];
        }
        g_s[t] = gb.x;
        beta_s[t] = gb.y;
    }

    // Gram matrices K Kᵀ and Q Kᵀ, lower blocks only; this invocation owns entry (r, c) of
    // each block. Named accumulators rather than an indexed array: drivers keep them in
    // registers (an array indexed in a loop that is not unrolled lands in local memory).
    var a00 = 0.0; var a10 = 0.0; var a11 = 0.0; var a20 = 0.0; var a21 = 0.0;
    var a22 = 0.0; var a30 = 0.0; var a31 = 0.0; var a32 = 0.0; var a33 = 0.0;
    var p00 = 0.0; var p10 = 0.0; var p11 = 0.0; var p20 = 0.0; var p21 = 0.0;
    var p22 = 0.0; var p30 = 0.0; var p31 = 0.0; var p32 = 0.0; var p33 = 0.0;
    // Staging: invocation t loads row t / 4, columns 4 (t % 4) .. + 3 of each slice.
    let srow = t / 4u;
    let scol = 4u * (t % 4u);
    let inside = srow < len;
    let gbase = ((start + min(srow, len - 1u)) * params.heads_qk + h) * K_DIM + scol;
    let sidx = srow * ROW + scol;
    for (var k0 = 0u; k0 < K_DIM; k0 += K_SLICE) {
        // All eight loads are issued before any is used (clamped rows, masked values).
        let gi = gbase + k0;
        let kx = select(vec4<f32>(0.0), vec4<f32>(k_at(gi), k_at(gi + 1u), k_at(gi + 2u), k_at(gi + 3u)), inside);
        let qx = select(vec4<f32>(0.0), vec4<f32>(q_at(gi), q_at(gi + 1u), q_at(gi + 2u), q_at(gi + 3u)), inside);
        workgroupBarrier();
        arena[sidx / 4u] = kx;
        arena[(Q_STAGE + sidx) / 4u] = qx;
        workgroupBarrier();
        for (var kk = 0u; kk < K_SLICE; kk += 4u) {
            let kr0 = arena4(r * ROW + kk);
            let kr1 = arena4((16u + r) * ROW + kk);
            let kr2 = arena4((32u + r) * ROW + kk);
            let kr3 = arena4((48u + r) * ROW + kk);
            let kc0 = arena4(c * ROW + kk);
            let kc1 = arena4((16u + c) * ROW + kk);
            let kc2 = arena4((32u + c) * ROW + kk);
            let kc3 = arena4((48u + c) * ROW + kk);
            let qr0 = arena4(Q_STAGE + r * ROW + kk);
            let qr1 = arena4(Q_STAGE + (16u + r) * ROW + kk);
            let qr2 = arena4(Q_STAGE + (32u + r) * ROW + kk);
            let qr3 = arena4(Q_STAGE + (48u + r) * ROW + kk);
            a00 += dot(kr0, kc0);
            a10 += dot(kr1, kc0);
            a11 += dot(kr1, kc1);
            a20 += dot(kr2, kc0);
            a21 += dot(kr2, kc1);
            a22 += dot(kr2, kc2);
            a30 += dot(kr3, kc0);
            a31 += dot(kr3, kc1);
            a32 += dot(kr3, kc2);
            a33 += dot(kr3, kc3);
            p00 += dot(qr0, kc0);
            p10 += dot(qr1, kc0);
            p11 += dot(qr1, kc1);
            p20 += dot(qr2, kc0);
            p21 += dot(qr2, kc1);
            p22 += dot(qr2, kc2);
            p30 += dot(qr3, kc0);
            p31 += dot(qr3, kc1);
            p32 += dot(qr3, kc2);
            p33 += dot(qr3, kc3);
        }
    }
    workgroupBarrier();

    // Γ ⊙ Q Kᵀ straight from the accumulators; blocks above the diagonal are 0.
    store_gated_qk(start, hv, len, r, c, vec4<f32>(p00, 0.0, 0.0, 0.0));
    store_gated_qk(start, hv, len, 16u + r, c, vec4<f32>(p10, p11, 0.0, 0.0));
    store_gated_qk(start, hv, len, 32u + r, c, vec4<f32>(p20, p21, p22, 0.0));
    store_gated_qk(start, hv, len, 48u + r, c, vec4<f32>(p30, p31, p32, p33));

    // L = strict_lower(diag(β) K Kᵀ).
    let strict = select(0.0, 1.0, c < r);
    set_word(blk(0u, 0u) + t, beta_s[r] * a00 * strict);
    set_word(blk(1u, 0u) + t, beta_s[16u + r] * a10);
    set_word(blk(1u, 1u) + t, beta_s[16u + r] * a11 * strict);
    set_word(blk(2u, 0u) + t, beta_s[32u + r] * a20);
    set_word(blk(2u, 1u) + t, beta_s[32u + r] * a21);
    set_word(blk(2u, 2u) + t, beta_s[32u + r] * a22 * strict);
    set_word(blk(3u, 0u) + t, beta_s[48u + r] * a30);
    set_word(blk(3u, 1u) + t, beta_s[48u + r] * a31);
    set_word(blk(3u, 2u) + t, beta_s[48u + r] * a32);
    set_word(blk(3u, 3u) + t, beta_s[48u + r] * a33 * strict);
    workgroupBarrier();

    solve_inverse(t);

    // Store the valid rows, zeros above the diagonal blocks.
    for (var n = 0u; n < 16u; n++) {
        let e = t + WG * n;
        let i = e / CHUNK;
        let j = e % CHUNK;
        if (i < len) {
            var a = 0.0;
            if (j / 16u <= i / 16u) {
                a = word(blk(i / 16u, j / 16u) + (i % 16u) * 16u + j % 16u);
            }
            a_out[((start + i) * hv_count + hv) * CHUNK + j] = a;
            var ag = 0.0;
            if (j <= i) {
                ag = a * exp(g_s[i] - g_s[j]) * beta_s[j];
            }
            gated_out[((start + i) * hv_count + hv) * 2u * CHUNK + j] = ag;
        }
    }
}
