// wy_inverse_coop: the coop path's per-(chunk, v-head) pass — wy_inverse.wgsl's Gram products
// and inverse, writing the coop scan's f16 operands on the way:
//     A = (I + strict_lower(diag(β) K Kᵀ))⁻¹      f32, kept for the backward
//     gated[i, 0..64)   = Γ ⊙ A ⊙ β_col          f16, the scan's V' = gated_A · W
//     gated[i, 64..128) = Γ ⊙ Q Kᵀ                f16, the scan's intra-chunk output term
//     k16 = f16(k)       (by the first v-head of each q/k head)
//     qg16 = f16(γ ⊙ q)  per v-head (the scan accumulates (γ ⊙ Q) S straight into O)
// The f16 operands are exact for bf16 and f16 storage (within f16's range, the coop path's
// documented condition) and rounded once for f32. Everything else is f32, as in wy_inverse.
//
// Why not cooperative matrices: an earlier version of this pass ran the Gram products on
// them (one workgroup of four subgroups, the twenty 16×16 products staged through 31 KiB of
// workgroup memory) and took 6.42 ms on the H200 at 16/64 heads × 32768 tokens, bf16, where
// the scalar wy_inverse took 2.86 ms with f32 inputs: the products are a small part of the
// pass, and the larger workgroup memory and half the invocations left the solve and the
// stores with fewer warps per SM. This layout is wy_inverse's: 256 invocations, 13.3 KiB,
// Γ ⊙ Q Kᵀ stored straight from the accumulators.
//
// Rows past a partial chunk's end are staged as zeros (so they contribute nothing) and never
// stored: those rows of k16 and qg16 belong to the next chunk, which writes them.

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> k_buf: array<Elem4>;                 // [B·T, H, K]
@group(0) @binding(2) var<storage, read> q_buf: array<Elem4>;                 // [B·T, H, K]
@group(0) @binding(3) var<storage, read> gate_beta: array<vec2<f32>>;         // [B·T, HV]: (G, β)
@group(0) @binding(4) var<storage, read> chunks: array<u32>;                  // per chunk: start, length
@group(0) @binding(5) var<storage, read_write> a_out: array<f32>;             // [B·T, HV, 64]
@group(0) @binding(6) var<storage, read_write> gated_out: array<f16>;        // [B·T + 64, HV, 128]
@group(0) @binding(7) var<storage, read_write> k16_out: array<vec4<f16>>;     // [B·T + 64, H, K]
@group(0) @binding(8) var<storage, read_write> qg16_out: array<vec4<f16>>;    // [B·T + 64, HV, K]

const WG: u32 = 256u;
const KD: u32 = 128u;              // key dimension (the coop path's)
const K_SLICE: u32 = 16u;
const ROW: u32 = 20u;              // staged row stride (K_SLICE + 4)
const Q_STAGE: u32 = 64u * ROW;
const SOLVE_WG: u32 = WG;
const SOLVE_SCRATCH: u32 = 2560u;

var<workgroup> arena: array<vec4<f32>, 832>;   // 3328 words (wy_solve.wgsl: word, arena4)
var<workgroup> beta_s: array<f32, 64>;
var<workgroup> g_s: array<f32, 64>;

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
            gated_out[row + j] = f16(v);
        }
    }
}

@compute @workgroup_size(256)
fn wy_inverse_coop(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let chunk = wid.x;
    let hv = wid.y;
    let start = chunks[2u * chunk];
    let len = chunks[2u * chunk + 1u];
    let hv_count = params.heads_v;
    let group = hv_count / params.heads_qk;
    let h = hv / group;
    let writes_k = hv % group == 0u;
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
    // each block (named accumulators: an indexed array would land in local memory).
    var a00 = 0.0; var a10 = 0.0; var a11 = 0.0; var a20 = 0.0; var a21 = 0.0;
    var a22 = 0.0; var a30 = 0.0; var a31 = 0.0; var a32 = 0.0; var a33 = 0.0;
    var p00 = 0.0; var p10 = 0.0; var p11 = 0.0; var p20 = 0.0; var p21 = 0.0;
    var p22 = 0.0; var p30 = 0.0; var p31 = 0.0; var p32 = 0.0; var p33 = 0.0;
    // Staging: invocation t loads row t / 4, columns 4 (t % 4) .. + 3 of each slice, and
    // writes the same elements of k16 and qg16.
    let srow = t / 4u;
    let scol = 4u * (t % 4u);
    let inside = srow < len;
    let token = start + min(srow, len - 1u);
    let kq_base = (token * params.heads_qk + h) * KD + scol;
    let qg_base = (token * hv_count + hv) * KD + scol;
    let sidx = srow * ROW + scol;
    workgroupBarrier();
    let gam = exp(g_s[srow]);
    // The next slice's loads are issued before this slice's products (clamped rows, masked
    // values), so their latency hides behind them.
    var kx = select(vec4<f32>(0.0), load4(k_buf[kq_base / 4u]), inside);
    var qx = select(vec4<f32>(0.0), load4(q_buf[kq_base / 4u]), inside);
    for (var k0 = 0u; k0 < KD; k0 += K_SLICE) {
        if (inside) {
            if (writes_k) {
                k16_out[(kq_base + k0) / 4u] = vec4<f16>(kx);
            }
            qg16_out[(qg_base + k0) / 4u] = vec4<f16>(gam * qx);
        }
        workgroupBarrier();
        arena[sidx / 4u] = kx;
        arena[(Q_STAGE + sidx) / 4u] = qx;
        workgroupBarrier();
        if (k0 + K_SLICE < KD) {
            let gi = kq_base + k0 + K_SLICE;
            kx = select(vec4<f32>(0.0), load4(k_buf[gi / 4u]), inside);
            qx = select(vec4<f32>(0.0), load4(q_buf[gi / 4u]), inside);
        }
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

    // A (f32) and Γ ⊙ A ⊙ β (f16) of the valid rows, zeros above the diagonal blocks.
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
            gated_out[((start + i) * hv_count + hv) * 2u * CHUNK + j] = f16(ag);
        }
    }
}
