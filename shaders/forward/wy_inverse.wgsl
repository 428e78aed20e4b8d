// wy_inverse: per (chunk, v-head) the gate-free WY inverse
//     A = (I + strict_lower(diag(β) K Kᵀ))⁻¹          (64×64, unit lower triangular)
// solved in 16×16 blocks: forward substitution on the four diagonal blocks, then block
// back-substitution  A_ij = −A_ii · Σ_{m=j}^{i−1} L_im A_mj  for the six blocks below them.
// The gate never enters A (it commutes with every factor and is re-applied as Γ ⊙ A in the
// scan), so A has no exponentials at all. Rows past a partial chunk's end have k = 0 and
// β = 0, so they neither contribute nor are stored.
//
//
// The pass also takes the gate-dependent, state-independent work off the scan's sequential
// path (it is parallel over chunks here): per token row it writes
//     gated[i, 0..64)   = Γ ⊙ A ⊙ β_col       (the scan's V' = gated_A · W)
//     gated[i, 64..128) = Γ ⊙ Q Kᵀ            (the scan's intra-chunk output term)
// both 0 above the diagonal, every exponent ≤ 0. A itself is kept for the backward.
// `Gated` is f32 for the scalar scan and f16 for the coop scan (its GEMM operand type), set by
// the family snippet forward/gated_f32.wgsl or forward/gated_f16.wgsl.
//
// Workgroup memory: ten lower 16×16 blocks (block (bi, bj) at blk(bi, bj)) plus one scratch
// block — 11 KiB, within every WebGPU device's 16 KiB. During the Gram accumulation the
// first 2048 words stage 64×16 slices of K and Q.

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> k_buf: array<Elem>;              // [B·T, H, K]
@group(0) @binding(2) var<storage, read> q_buf: array<Elem>;              // [B·T, H, K]
@group(0) @binding(3) var<storage, read> gate_beta: array<vec2<f32>>;     // [B·T, HV]: (G, β)
@group(0) @binding(4) var<storage, read> chunks: array<u32>;              // per chunk: start, length
@group(0) @binding(5) var<storage, read_write> a_out: array<f32>;         // [B·T, HV, 64]
@group(0) @binding(6) var<storage, read_write> gated_out: array<Gated>;   // [B·T, HV, 128]

override K_DIM: u32;

const K_SLICE: u32 = 16u;
const SCRATCH: u32 = 2560u;
const Q_STAGE: u32 = 1024u;

var<workgroup> arena: array<f32, 2816>;
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
            gated_out[row + j] = Gated(v);
        }
    }
}

// Offset of lower block (bi, bj), bj ≤ bi, in the arena.
fn blk(bi: u32, bj: u32) -> u32 {
    return (bi * (bi + 1u) / 2u + bj) * 256u;
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

    // Gram matrix K Kᵀ, lower blocks only; this invocation owns entry (r, c) of each block.
    // Named accumulators rather than an indexed array: drivers keep them in registers (an
    // array indexed in a loop that is not unrolled lands in local memory).
    var a00 = 0.0; var a10 = 0.0; var a11 = 0.0; var a20 = 0.0; var a21 = 0.0;
    var a22 = 0.0; var a30 = 0.0; var a31 = 0.0; var a32 = 0.0; var a33 = 0.0;
    // Q Kᵀ, same blocks.
    var p00 = 0.0; var p10 = 0.0; var p11 = 0.0; var p20 = 0.0; var p21 = 0.0;
    var p22 = 0.0; var p30 = 0.0; var p31 = 0.0; var p32 = 0.0; var p33 = 0.0;
    for (var k0 = 0u; k0 < K_DIM; k0 += K_SLICE) {
        workgroupBarrier();
        // Element t + 256 j of the 64 × 16 slice is row t / 16 + 16 j, column t % 16. All
        // eight loads are issued before any is used (clamped rows, masked values).
        let rows = vec4<u32>(t / K_SLICE) + vec4<u32>(0u, 16u, 32u, 48u);
        let gi = ((vec4<u32>(start) + min(rows, vec4<u32>(len - 1u))) * params.heads_qk + h) * K_DIM + k0 + t % K_SLICE;
        let inside = rows < vec4<u32>(len);
        let kx = select(vec4<f32>(0.0), vec4<f32>(k_at(gi.x), k_at(gi.y), k_at(gi.z), k_at(gi.w)), inside);
        let qx = select(vec4<f32>(0.0), vec4<f32>(q_at(gi.x), q_at(gi.y), q_at(gi.z), q_at(gi.w)), inside);
        for (var j = 0u; j < 4u; j++) {
            arena[t + 256u * j] = kx[j];
            arena[Q_STAGE + t + 256u * j] = qx[j];
        }
        workgroupBarrier();
        for (var kk = 0u; kk < K_SLICE; kk++) {
            let kr = vec4<f32>(arena[r * K_SLICE + kk], arena[(16u + r) * K_SLICE + kk],
                               arena[(32u + r) * K_SLICE + kk], arena[(48u + r) * K_SLICE + kk]);
            let kc = vec4<f32>(arena[c * K_SLICE + kk], arena[(16u + c) * K_SLICE + kk],
                               arena[(32u + c) * K_SLICE + kk], arena[(48u + c) * K_SLICE + kk]);
            a00 += kr.x * kc.x;
            a10 += kr.y * kc.x;
            a11 += kr.y * kc.y;
            a20 += kr.z * kc.x;
            a21 += kr.z * kc.y;
            a22 += kr.z * kc.z;
            a30 += kr.w * kc.x;
            a31 += kr.w * kc.y;
            a32 += kr.w * kc.z;
            a33 += kr.w * kc.w;
            let qr = vec4<f32>(arena[Q_STAGE + r * K_SLICE + kk], arena[Q_STAGE + (16u + r) * K_SLICE + kk],
                               arena[Q_STAGE + (32u + r) * K_SLICE + kk], arena[Q_STAGE + (48u + r) * K_SLICE + kk]);
            p00 += qr.x * kc.x;
            p10 += qr.y * kc.x;
            p11 += qr.y * kc.y;
            p20 += qr.z * kc.x;
            p21 += qr.z * kc.y;
            p22 += qr.z * kc.z;
            p30 += qr.w * kc.x;
            p31 += qr.w * kc.y;
            p32 += qr.w * kc.z;
            p33 += qr.w * kc.w;
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
    arena[blk(0u, 0u) + t] = beta_s[r] * a00 * strict;
    arena[blk(1u, 0u) + t] = beta_s[16u + r] * a10;
    arena[blk(1u, 1u) + t] = beta_s[16u + r] * a11 * strict;
    arena[blk(2u, 0u) + t] = beta_s[32u + r] * a20;
    arena[blk(2u, 1u) + t] = beta_s[32u + r] * a21;
    arena[blk(2u, 2u) + t] = beta_s[32u + r] * a22 * strict;
    arena[blk(3u, 0u) + t] = beta_s[48u + r] * a30;
    arena[blk(3u, 1u) + t] = beta_s[48u + r] * a31;
    arena[blk(3u, 2u) + t] = beta_s[48u + r] * a32;
    arena[blk(3u, 3u) + t] = beta_s[48u + r] * a33 * strict;
    workgroupBarrier();

    // Diagonal blocks: invocation (d, col) solves column col of (I + L_dd)⁻¹ by forward
    // substitution, x_rr = δ(rr, col) − Σ_{m<rr} L[rr, m] x_m, reading L only (it is 0 for
    // m ≥ rr, so whole rows can be dotted), then overwrites the block once everyone has read.
    // x lives in four vec4 registers updated with lane masks (no indexed private array).
    let d = t / 16u;
    let col = t % 16u;
    var x0 = vec4<f32>(0.0);
    var x1 = vec4<f32>(0.0);
    var x2 = vec4<f32>(0.0);
    var x3 = vec4<f32>(0.0);
    if (t < CHUNK) {
        let base = blk(d, d);
        for (var rr = 0u; rr < 16u; rr++) {
            let row = base + rr * 16u;
            let l0 = vec4<f32>(arena[row], arena[row + 1u], arena[row + 2u], arena[row + 3u]);
            let l1 = vec4<f32>(arena[row + 4u], arena[row + 5u], arena[row + 6u], arena[row + 7u]);
            let l2 = vec4<f32>(arena[row + 8u], arena[row + 9u], arena[row + 10u], arena[row + 11u]);
            let l3 = vec4<f32>(arena[row + 12u], arena[row + 13u], arena[row + 14u], arena[row + 15u]);
            let v = select(0.0, 1.0, rr == col) - dot(l0, x0) - dot(l1, x1) - dot(l2, x2) - dot(l3, x3);
            let lane = vec4<u32>(0u, 1u, 2u, 3u);
            x0 += select(vec4<f32>(0.0), vec4<f32>(v), lane == vec4<u32>(rr));
            x1 += select(vec4<f32>(0.0), vec4<f32>(v), lane + 4u == vec4<u32>(rr));
            x2 += select(vec4<f32>(0.0), vec4<f32>(v), lane + 8u == vec4<u32>(rr));
            x3 += select(vec4<f32>(0.0), vec4<f32>(v), lane + 12u == vec4<u32>(rr));
        }
    }
    workgroupBarrier();
    if (t < CHUNK) {
        let base = blk(d, d) + col;
        for (var q = 0u; q < 4u; q++) {
            arena[base + (q) * 16u] = x0[q];
            arena[base + (q + 4u) * 16u] = x1[q];
            arena[base + (q + 8u) * 16u] = x2[q];
            arena[base + (q + 12u) * 16u] = x3[q];
        }
    }
    workgroupBarrier();

    // Off-diagonal blocks, in an order where every L_im still read is not yet overwritten:
    // A_ij = −A_ii · X,  X = Σ_{m=j}^{i−1} L_im A_mj.
    // o = 0..5 walks (1,0), (2,0), (2,1), (3,0), (3,1), (3,2) (computed, not a table: an
    // indexed private array would live in local memory).
    for (var o = 0u; o < 6u; o++) {
        let bi = select(select(3u, 2u, o < 3u), 1u, o < 1u);
        let bj = o - bi * (bi - 1u) / 2u;
        var xs = 0.0;
        for (var m = bj; m < bi; m++) {
            let lb = blk(bi, m);
            let ab = blk(m, bj);
            for (var a = 0u; a < 16u; a++) {
                xs += arena[lb + r * 16u + a] * arena[ab + a * 16u + c];
            }
        }
        arena[SCRATCH + t] = xs;
        workgroupBarrier();
        let db = blk(bi, bi);
        var y = 0.0;
        for (var a = 0u; a < 16u; a++) {
            y -= arena[db + r * 16u + a] * arena[SCRATCH + a * 16u + c];
        }
        arena[blk(bi, bj) + t] = y;
        workgroupBarrier();
    }

    // Store the valid rows, zeros above the diagonal blocks.
    for (var n = 0u; n < 16u; n++) {
        let e = t + 256u * n;
        let i = e / CHUNK;
        let j = e % CHUNK;
        if (i < len) {
            var a = 0.0;
            if (j / 16u <= i / 16u) {
                a = arena[blk(i / 16u, j / 16u) + (i % 16u) * 16u + j % 16u];
            }
            a_out[((start + i) * hv_count + hv) * CHUNK + j] = a;
            var ag = 0.0;
            if (j <= i) {
                ag = a * exp(g_s[i] - g_s[j]) * beta_s[j];
            }
            gated_out[((start + i) * hv_count + hv) * 2u * CHUNK + j] = Gated(ag);
        }
    }
}
