// wy_inverse_coop: the coop path's per-(chunk, v-head) pass, wy_inverse.wgsl with its Gram
// products on cooperative matrices and the scan's f16 operands written on the way:
//     A = (I + strict_lower(diag(β) K Kᵀ))⁻¹      f32, kept for the backward
//     gated[i, 0..64)   = Γ ⊙ A ⊙ β_col          f16, the scan's V' = gated_A · W
//     gated[i, 64..128) = Γ ⊙ Q Kᵀ                f16, the scan's intra-chunk output term
//     k16 = f16(k)       (by the first v-head of each q/k head)
//     qg16 = f16(γ ⊙ q)  per v-head (the scan accumulates (γ ⊙ Q) S straight into O)
// One workgroup of four 32-wide subgroups. K and Q are staged in workgroup memory as f16,
// 32 columns at a time (rows 40 apart: 16-byte aligned, spread over banks); K Kᵀ and Q Kᵀ
// (their ten lower 16×16 blocks each, twenty products) accumulate in f32, five products per
// subgroup. The f16 operands are exact for bf16 and f16 storage (within f16's range, the
// coop path's documented condition) and rounded once for f32. The inverse is f32
// (forward/wy_solve.wgsl).
//
// Rows past a partial chunk's end are staged as zeros (so they contribute nothing) and never
// stored: those rows of k16 and qg16 belong to the next chunk, which writes them.
//
// naga: every pointer index is bound with `let` first (naga 30's SPIR-V backend panics on a
// computed index in a cooperative store); cooperative ops need uniform control flow, so the
// subgroup's products differ only in their addresses.

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> k_buf: array<Elem>;                  // [B·T, H, K]
@group(0) @binding(2) var<storage, read> q_buf: array<Elem>;                  // [B·T, H, K]
@group(0) @binding(3) var<storage, read> gate_beta: array<vec2<f32>>;         // [B·T, HV]: (G, β)
@group(0) @binding(4) var<storage, read> chunks: array<u32>;                  // per chunk: start, length
@group(0) @binding(5) var<storage, read_write> a_out: array<f32>;             // [B·T, HV, 64]
@group(0) @binding(6) var<storage, read_write> gated_out: array<vec2<f16>>;   // [B·T + 64, HV, 128]
@group(0) @binding(7) var<storage, read_write> k16_out: array<vec2<f16>>;     // [B·T + 64, H, K]
@group(0) @binding(8) var<storage, read_write> qg16_out: array<vec2<f16>>;    // [B·T + 64, HV, K]

const WG: u32 = 128u;
const KD: u32 = 128u;              // key dimension (the coop path's)
const SLICE: u32 = 32u;            // K columns staged at a time
const KQS: u32 = 40u;              // staged row stride in f16 (SLICE + 8)
const Q_OFF: u32 = 64u * KQS;      // Q's rows after K's
const P_OFF: u32 = 2560u;          // Q Kᵀ's ten blocks after K Kᵀ's (then the solve's sums)
const SOLVE_WG: u32 = WG;
const SOLVE_SCRATCH: u32 = P_OFF;

var<workgroup> kq: array<f16, 2u * 64u * KQS>;
var<workgroup> arena: array<f32, 5120>;
var<workgroup> beta_s: array<f32, 64>;
var<workgroup> g_s: array<f32, 64>;

fn k_at(i: u32) -> f32 {
    return load_elem(k_buf[elem_word(i)], i);
}

fn q_at(i: u32) -> f32 {
    return load_elem(q_buf[elem_word(i)], i);
}

// Block row of lower block b (0..9, row-major over the lower triangle).
fn block_row(b: u32) -> u32 {
    return select(select(select(3u, 2u, b < 6u), 1u, b < 3u), 0u, b < 1u);
}

// Staged offsets of product p = 0..19 (K Kᵀ blocks, then Q Kᵀ blocks): its A rows (K or Q,
// block row bi) and its B rows (K, block column bj), at column 0 of the slice.
fn a_offset(p: u32) -> u32 {
    let b = p % 10u;
    return select(0u, Q_OFF, p >= 10u) + 16u * block_row(b) * KQS;
}

fn b_offset(p: u32) -> u32 {
    let b = p % 10u;
    let bi = block_row(b);
    return 16u * (b - bi * (bi + 1u) / 2u) * KQS;
}

fn a_tile(i: u32) -> coop_mat16x16<f16, A> {
    return coopLoadT<coop_mat16x16<f16, A>>(&kq[i], KQS);
}

// Kᵀ tile: B[k][n] = K[n][k], a column-major read of the staged rows.
fn bt_tile(i: u32) -> coop_mat16x16<f16, B> {
    return coopLoad<coop_mat16x16<f16, B>>(&kq[i], KQS);
}

fn store_block(m: coop_mat16x16<f32, C>, p: u32) {
    let i = 256u * p;
    coopStoreT(m, &arena[i], 16u);
}

@compute @workgroup_size(128)
fn wy_inverse_coop(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let chunk = wid.x;
    let hv = wid.y;
    let start = chunks[2u * chunk];
    let len = chunks[2u * chunk + 1u];
    let hv_count = params.heads_v;
    let group = hv_count / params.heads_qk;
    let h = hv / group;
    let writes_k = hv % group == 0u;
    let sg = t / 32u;

    if (t < CHUNK) {
        // Padded rows: β = 0, G = G_last (so Γ never sees a positive exponent).
        var gb = vec2<f32>(gate_beta[(start + len - 1u) * hv_count + hv].x, 0.0);
        if (t < len) {
            gb = gate_beta[(start + t) * hv_count + hv];
        }
        g_s[t] = gb.x;
        beta_s[t] = gb.y;
    }
    arena[t] = 0.0;
    arena[t + WG] = 0.0;
    workgroupBarrier();

    // Subgroup sg accumulates products 5 sg .. 5 sg + 4.
    let p0 = 5u * sg;
    let ao0 = a_offset(p0);
    let ao1 = a_offset(p0 + 1u);
    let ao2 = a_offset(p0 + 2u);
    let ao3 = a_offset(p0 + 3u);
    let ao4 = a_offset(p0 + 4u);
    let bo0 = b_offset(p0);
    let bo1 = b_offset(p0 + 1u);
    let bo2 = b_offset(p0 + 2u);
    let bo3 = b_offset(p0 + 3u);
    let bo4 = b_offset(p0 + 4u);
    var acc0 = coopLoad<coop_mat16x16<f32, C>>(&arena[0], 16u);
    var acc1 = acc0;
    var acc2 = acc0;
    var acc3 = acc0;
    var acc4 = acc0;

    // Staging: invocation t holds row t / 2, columns 16 (t % 2) .. + 15 of each slice.
    let srow = t / 2u;
    let scol = 16u * (t % 2u);
    let inside = srow < len;
    let token = start + min(srow, len - 1u);
    let kq_row = (token * params.heads_qk + h) * KD + scol;
    let qg_row = (token * hv_count + hv) * KD + scol;
    let gam = exp(g_s[srow]);
    let sidx = srow * KQS + scol;
    for (var k0 = 0u; k0 < KD; k0 += SLICE) {
        workgroupBarrier();
        for (var e = 0u; e < 16u; e += 2u) {
            let gi = kq_row + k0 + e;
            let kx = select(vec2<f32>(0.0), vec2<f32>(k_at(gi), k_at(gi + 1u)), inside);
            let qx = select(vec2<f32>(0.0), vec2<f32>(q_at(gi), q_at(gi + 1u)), inside);
            let kh = vec2<f16>(kx);
            kq[sidx + e] = kh.x;
            kq[sidx + e + 1u] = kh.y;
            let qh = vec2<f16>(qx);
            kq[Q_OFF + sidx + e] = qh.x;
            kq[Q_OFF + sidx + e + 1u] = qh.y;
            if (inside) {
                if (writes_k) {
                    k16_out[gi / 2u] = kh;
                }
                qg16_out[(qg_row + k0 + e) / 2u] = vec2<f16>(gam * qx);
            }
        }
        workgroupBarrier();
        for (var kk = 0u; kk < SLICE; kk += 16u) {
            let i0 = ao0 + kk;
            let j0 = bo0 + kk;
            let i1 = ao1 + kk;
            let j1 = bo1 + kk;
            let i2 = ao2 + kk;
            let j2 = bo2 + kk;
            let i3 = ao3 + kk;
            let j3 = bo3 + kk;
            let i4 = ao4 + kk;
            let j4 = bo4 + kk;
            let x0 = a_tile(i0);
            let y0 = bt_tile(j0);
            let x1 = a_tile(i1);
            let y1 = bt_tile(j1);
            let x2 = a_tile(i2);
            let y2 = bt_tile(j2);
            let x3 = a_tile(i3);
            let y3 = bt_tile(j3);
            let x4 = a_tile(i4);
            let y4 = bt_tile(j4);
            acc0 = coopMultiplyAdd(x0, y0, acc0);
            acc1 = coopMultiplyAdd(x1, y1, acc1);
            acc2 = coopMultiplyAdd(x2, y2, acc2);
            acc3 = coopMultiplyAdd(x3, y3, acc3);
            acc4 = coopMultiplyAdd(x4, y4, acc4);
        }
    }
    // Products p land at 256 p: K Kᵀ block b at 256 b, Q Kᵀ block b at P_OFF + 256 b.
    store_block(acc0, p0);
    store_block(acc1, p0 + 1u);
    store_block(acc2, p0 + 2u);
    store_block(acc3, p0 + 3u);
    store_block(acc4, p0 + 4u);
    workgroupBarrier();

    // Γ ⊙ Q Kᵀ rows (element pairs; 0 above the diagonal, every exponent ≤ 0), valid rows.
    for (var n = 0u; n < 16u; n++) {
        let e = t + WG * n;
        let i = e / 32u;
        let j = 2u * (e % 32u);
        if (i < len) {
            var v = vec2<f32>(0.0);
            if (j / 16u <= i / 16u) {
                let at = P_OFF + blk(i / 16u, j / 16u) + (i % 16u) * 16u + j % 16u;
                if (j <= i) {
                    v.x = arena[at] * exp(g_s[i] - g_s[j]);
                }
                if (j + 1u <= i) {
                    v.y = arena[at + 1u] * exp(g_s[i] - g_s[j + 1u]);
                }
            }
            gated_out[((start + i) * hv_count + hv) * CHUNK + CHUNK / 2u + e % 32u] = vec2<f16>(v);
        }
    }

    // L = strict_lower(diag(β) K Kᵀ), in place.
    for (var e = t; e < P_OFF; e += WG) {
        let b = e / 256u;
        let bi = block_row(b);
        let r = (e % 256u) / 16u;
        let c = e % 16u;
        let diagonal = b == bi * (bi + 1u) / 2u + bi;
        let keep = !diagonal || c < r;
        arena[e] = select(0.0, beta_s[16u * bi + r] * arena[e], keep);
    }
    workgroupBarrier();

    solve_inverse(t);

    // A (f32) and Γ ⊙ A ⊙ β (f16 pairs) of the valid rows, zeros above the diagonal blocks.
    for (var n = 0u; n < 16u; n++) {
        let e = t + WG * n;
        let i = e / 32u;
        let j = 2u * (e % 32u);
        if (i < len) {
            var a = vec2<f32>(0.0);
            if (j / 16u <= i / 16u) {
                let at = blk(i / 16u, j / 16u) + (i % 16u) * 16u + j % 16u;
                a = vec2<f32>(arena[at], arena[at + 1u]);
            }
            let arow = ((start + i) * hv_count + hv) * CHUNK + j;
            a_out[arow] = a.x;
            a_out[arow + 1u] = a.y;
            var ag = vec2<f32>(0.0);
            if (j <= i) {
                ag.x = a.x * exp(g_s[i] - g_s[j]) * beta_s[j];
            }
            if (j + 1u <= i) {
                ag.y = a.y * exp(g_s[i] - g_s[j + 1u]) * beta_s[j + 1u];
            }
            gated_out[((start + i) * hv_count + hv) * CHUNK + e % 32u] = vec2<f16>(ag);
        }
    }
}
