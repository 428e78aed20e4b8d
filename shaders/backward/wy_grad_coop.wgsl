// wy_grad_coop: wy_grad.wgsl with its four 64×64 products on cooperative matrices — f16
// 16×16×16 operands, f32 accumulators — for the coop path's backward (K = 128):
//     P = Q Kᵀ, Gk = K Kᵀ,   X = dAr Aᵀ,   dL = −strict_lower(Aᵀ X)
// and the rest as wy_grad does, in f32 (dAr = dAb·diag(β) is formed in f32 before its
// rounding; β and the masks are applied in f32):
//     E    = P ⊙ dP + Ab ⊙ dAb (strictly lower)    dG_i  = rowsum(E)_i − colsum(E)_i
//     dβ_j = Σ_i dAb_ij A_ij,  dβ_i += Σ_j dL_ij Gk_ij,  dAt = diag(β) dL (replaces dAb)
// Each product's accumulators (subgroup g: row tile g / 2, column tiles 2 (g % 2), +1) go
// through one 64 × 64 f32 tile in workgroup memory, from which invocation (r, c) = (t / 16,
// t % 16) takes rows 4r..4r+3, columns c + 16jj of every matrix, as wy_grad's register tiles
// do; the row and column sums use the same tile afterwards, in a fixed order (deterministic).
// Operands are staged in f16, 16-wide slices (64 × 16, or 16 × 64 for Aᵀ X). 20.3 KiB of
// workgroup memory.
//
// naga: coopLoad/coopStore are column-major, coopLoadT/coopStoreT row-major; every pointer
// index is bound with `let` first; cooperative ops need uniform control flow.

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> q_buf: array<Elem>;              // [B·T, H, K]
@group(0) @binding(2) var<storage, read> k_buf: array<Elem>;              // [B·T, H, K]
@group(0) @binding(3) var<storage, read> a_buf: array<f32>;               // [B·T, HV, 64]
@group(0) @binding(4) var<storage, read> gate_beta: array<vec2<f32>>;     // [B·T, HV]: (G, β)
@group(0) @binding(5) var<storage, read> chunks: array<u32>;              // per chunk: start, length
@group(0) @binding(6) var<storage, read_write> mats: array<f32>;          // [2, B·T, HV, 64]: dP, dAb → dAt
@group(0) @binding(7) var<storage, read_write> dg_dbeta: array<vec2<f32>>; // [B·T, HV]: (dG, dβ)

const KD: u32 = 128u;       // key dimension
const SL: u32 = 16u;        // slice
const WG: u32 = 256u;       // invocations

var<workgroup> tile: array<f32, 4096>;         // a 64 × 64 result, or the partial sums
var<workgroup> st_a: array<f16, 1024>;         // [64][16] or [16][64]
var<workgroup> st_b: array<f16, 1024>;
var<workgroup> b_s: array<f32, 64>;

fn q_at(i: u32) -> f32 {
    return load_elem(q_buf[elem_word(i)], i);
}

fn k_at(i: u32) -> f32 {
    return load_elem(k_buf[elem_word(i)], i);
}

fn mats_row(start: u32, i: u32, hv: u32) -> u32 {
    return ((start + i) * params.heads_v + hv) * CHUNK;
}

// Row-major A tiles of [64][16] st_a (rows 16 rt..); column-major (transposed) B tiles of
// [64][16] st_b (B(p, j) = st_b[j][p], columns 16 ct..).
fn a_rows(rt: u32) -> coop_mat16x16<f16, A> {
    let i = 16u * SL * rt;
    return coopLoadT<coop_mat16x16<f16, A>>(&st_a[i], SL);
}

fn b_rows(rt: u32) -> coop_mat16x16<f16, A> {
    let i = 16u * SL * rt;
    return coopLoadT<coop_mat16x16<f16, A>>(&st_b[i], SL);
}

fn bt_cols(ct: u32) -> coop_mat16x16<f16, B> {
    let i = 16u * SL * ct;
    return coopLoad<coop_mat16x16<f16, B>>(&st_b[i], SL);
}

// Of [16][64] slices: Aᵀ tiles of st_a (A(i, m) = st_a[m][i], rows 16 rt..) and row-major
// B tiles of st_b (columns 16 ct..).
fn at_rows(rt: u32) -> coop_mat16x16<f16, A> {
    let i = 16u * rt;
    return coopLoad<coop_mat16x16<f16, A>>(&st_a[i], CHUNK);
}

fn b_wide(ct: u32) -> coop_mat16x16<f16, B> {
    let i = 16u * ct;
    return coopLoadT<coop_mat16x16<f16, B>>(&st_b[i], CHUNK);
}

fn zero_acc() -> coop_mat16x16<f32, C> {
    // tile[0..256) holds zeros whenever this is called.
    return coopLoad<coop_mat16x16<f32, C>>(&tile[0], 16u);
}

// The accumulator pair of this subgroup (row tile rt, column tiles ct0, ct0 + 1) into `tile`.
fn put_pair(m0: coop_mat16x16<f32, C>, m1: coop_mat16x16<f32, C>, rt: u32, ct0: u32) {
    let i0 = 16u * CHUNK * rt + 16u * ct0;
    let i1 = i0 + 16u;
    coopStoreT(m0, &tile[i0], CHUNK);
    coopStoreT(m1, &tile[i1], CHUNK);
}

// Row i, columns c + 16 jj of `tile`.
fn tile_row4(i: u32, c: u32) -> vec4<f32> {
    let at = i * CHUNK + c;
    return vec4<f32>(tile[at], tile[at + 16u], tile[at + 32u], tile[at + 48u]);
}

// Entries c + 16 jj of row i of A (`a_buf`) or of a `mats` half; 0 past the chunk.
fn a_row4(start: u32, len: u32, hv: u32, i: u32, c: u32) -> vec4<f32> {
    let at = mats_row(start, min(i, len - 1u), hv) + c;
    let x = vec4<f32>(a_buf[at], a_buf[at + 16u], a_buf[at + 32u], a_buf[at + 48u]);
    return select(vec4<f32>(0.0), x, vec4<bool>(i < len));
}

fn mats_row4(half: u32, start: u32, len: u32, hv: u32, i: u32, c: u32) -> vec4<f32> {
    let at = half + mats_row(start, min(i, len - 1u), hv) + c;
    let x = vec4<f32>(mats[at], mats[at + 16u], mats[at + 32u], mats[at + 48u]);
    return select(vec4<f32>(0.0), x, vec4<bool>(i < len));
}

fn hsum(x: vec4<f32>) -> f32 {
    return (x.x + x.y) + (x.z + x.w);
}

// Row sums of this invocation's 4 columns (at `rs`, 64 × 16) and column sums of its 4 rows
// (at `cs`, 16 × 64) of a register tile.
fn partial_sums(rs: u32, cs: u32, r: u32, c: u32, x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>) {
    let row0 = 4u * r;
    tile[rs + row0 * 16u + c] = hsum(x0);
    tile[rs + (row0 + 1u) * 16u + c] = hsum(x1);
    tile[rs + (row0 + 2u) * 16u + c] = hsum(x2);
    tile[rs + (row0 + 3u) * 16u + c] = hsum(x3);
    let col = (x0 + x1) + (x2 + x3);
    tile[cs + r * 64u + c] = col.x;
    tile[cs + r * 64u + c + 16u] = col.y;
    tile[cs + r * 64u + c + 32u] = col.z;
    tile[cs + r * 64u + c + 48u] = col.w;
}

@compute @workgroup_size(256)
fn wy_grad_coop(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let chunk = wid.x;
    let hv = wid.y;
    let start = chunks[2u * chunk];
    let len = chunks[2u * chunk + 1u];
    let last = len - 1u;
    let hv_count = params.heads_v;
    let h = hv / (hv_count / params.heads_qk);
    let half = params.total_tokens * hv_count * CHUNK;
    let r = t / 16u;
    let c = t % 16u;
    let row0 = 4u * r;
    let cols = vec4<u32>(c, c + 16u, c + 32u, c + 48u);
    let sg = t / 32u;
    let rt = sg / 2u;
    let ct0 = 2u * (sg % 2u);

    if (t < CHUNK) {
        b_s[t] = select(0.0, gate_beta[(start + min(t, last)) * hv_count + hv].y, t < len);
    }
    tile[t] = 0.0;
    workgroupBarrier();
    let zero_m = zero_acc();

    // This invocation's entries of A, dP, dAb (zero outside the chunk's lower triangle).
    let a0 = a_row4(start, len, hv, row0, c);
    let a1 = a_row4(start, len, hv, row0 + 1u, c);
    let a2 = a_row4(start, len, hv, row0 + 2u, c);
    let a3 = a_row4(start, len, hv, row0 + 3u, c);
    let dp0 = mats_row4(0u, start, len, hv, row0, c);
    let dp1 = mats_row4(0u, start, len, hv, row0 + 1u, c);
    let dp2 = mats_row4(0u, start, len, hv, row0 + 2u, c);
    let dp3 = mats_row4(0u, start, len, hv, row0 + 3u, c);
    let db0 = mats_row4(half, start, len, hv, row0, c);
    let db1 = mats_row4(half, start, len, hv, row0 + 1u, c);
    let db2 = mats_row4(half, start, len, hv, row0 + 2u, c);
    let db3 = mats_row4(half, start, len, hv, row0 + 3u, c);

    // P = Q Kᵀ and Gk = K Kᵀ over 16-column slices of K: st_a = Q, st_b = K, [64][16].
    var mp0 = zero_m; var mp1 = zero_m; var mg0 = zero_m; var mg1 = zero_m;
    for (var k0 = 0u; k0 < KD; k0 += SL) {
        for (var n = 0u; n < 4u; n++) {
            let e = t + WG * n;
            let i = e / SL;
            let gi = ((start + min(i, last)) * params.heads_qk + h) * KD + k0 + e % SL;
            let inside = i < len;
            st_a[e] = f16(select(0.0, q_at(gi), inside));
            st_b[e] = f16(select(0.0, k_at(gi), inside));
        }
        workgroupBarrier();
        let aq = a_rows(rt);
        let ak = b_rows(rt);
        let bk0 = bt_cols(ct0);
        let bk1 = bt_cols(ct0 + 1u);
        mp0 = coopMultiplyAdd(aq, bk0, mp0);
        mp1 = coopMultiplyAdd(aq, bk1, mp1);
        mg0 = coopMultiplyAdd(ak, bk0, mg0);
        mg1 = coopMultiplyAdd(ak, bk1, mg1);
        workgroupBarrier();
    }
    put_pair(mp0, mp1, rt, ct0);
    workgroupBarrier();
    let p0 = tile_row4(row0, c);
    let p1 = tile_row4(row0 + 1u, c);
    let p2 = tile_row4(row0 + 2u, c);
    let p3 = tile_row4(row0 + 3u, c);
    workgroupBarrier();
    put_pair(mg0, mg1, rt, ct0);
    workgroupBarrier();
    let g0 = tile_row4(row0, c);
    let g1 = tile_row4(row0 + 1u, c);
    let g2 = tile_row4(row0 + 2u, c);
    let g3 = tile_row4(row0 + 3u, c);
    workgroupBarrier();

    // E (strictly lower) and dAb ⊙ A; dG = rowsum(E) − colsum(E), dβ = colsum(dAb ⊙ A).
    let bcol = vec4<f32>(b_s[c], b_s[c + 16u], b_s[c + 32u], b_s[c + 48u]);
    let zero = vec4<f32>(0.0);
    let e0 = select(zero, p0 * dp0 + a0 * bcol * db0, cols < vec4<u32>(row0));
    let e1 = select(zero, p1 * dp1 + a1 * bcol * db1, cols < vec4<u32>(row0 + 1u));
    let e2 = select(zero, p2 * dp2 + a2 * bcol * db2, cols < vec4<u32>(row0 + 2u));
    let e3 = select(zero, p3 * dp3 + a3 * bcol * db3, cols < vec4<u32>(row0 + 3u));
    partial_sums(0u, 1024u, r, c, e0, e1, e2, e3);
    let f = (db0 * a0 + db1 * a1) + (db2 * a2 + db3 * a3);
    tile[2048u + r * 64u + c] = f.x;
    tile[2048u + r * 64u + c + 16u] = f.y;
    tile[2048u + r * 64u + c + 32u] = f.z;
    tile[2048u + r * 64u + c + 48u] = f.w;
    workgroupBarrier();
    var dg = 0.0;
    var db = 0.0;
    if (t < CHUNK) {
        for (var k = 0u; k < 16u; k++) {
            dg += tile[t * 16u + k] - tile[1024u + k * 64u + t];
            db += tile[2048u + k * 64u + t];
        }
    }

    // X = dAr Aᵀ over 16-column slices p: st_a = dAr = dAb·diag(β), st_b = A, [64][16].
    var mx0 = zero_m; var mx1 = zero_m;
    for (var p0s = 0u; p0s < CHUNK; p0s += SL) {
        for (var n = 0u; n < 4u; n++) {
            let e = t + WG * n;
            let i = e / SL;
            let p = p0s + e % SL;
            let at = mats_row(start, min(i, last), hv) + p;
            let inside = i < len;
            st_a[e] = f16(select(0.0, b_s[p] * mats[half + at], inside));
            st_b[e] = f16(select(0.0, a_buf[at], inside));
        }
        workgroupBarrier();
        let ad = a_rows(rt);
        let ba0 = bt_cols(ct0);
        let ba1 = bt_cols(ct0 + 1u);
        mx0 = coopMultiplyAdd(ad, ba0, mx0);
        mx1 = coopMultiplyAdd(ad, ba1, mx1);
        workgroupBarrier();
    }
    // (dg and db have read the partial sums: every invocation is past the barriers above.)
    put_pair(mx0, mx1, rt, ct0);
    workgroupBarrier();

    // dL = −Aᵀ X over 16-row slices m: st_a = A rows m, st_b = X rows m, [16][64].
    var ml0 = zero_m; var ml1 = zero_m;
    for (var m0 = 0u; m0 < CHUNK; m0 += SL) {
        for (var n = 0u; n < 4u; n++) {
            let e = t + WG * n;
            let m = m0 + e / CHUNK;
            let at = mats_row(start, min(m, last), hv) + e % CHUNK;
            st_a[e] = f16(select(0.0, a_buf[at], m < len));
            st_b[e] = f16(tile[m * CHUNK + e % CHUNK]);
        }
        workgroupBarrier();
        let aa = at_rows(rt);
        let bx0 = b_wide(ct0);
        let bx1 = b_wide(ct0 + 1u);
        ml0 = coopMultiplyAdd(aa, bx0, ml0);
        ml1 = coopMultiplyAdd(aa, bx1, ml1);
        workgroupBarrier();
    }
    put_pair(ml0, ml1, rt, ct0);
    workgroupBarrier();
    let l0 = select(zero, -tile_row4(row0, c), cols < vec4<u32>(row0));
    let l1 = select(zero, -tile_row4(row0 + 1u, c), cols < vec4<u32>(row0 + 1u));
    let l2 = select(zero, -tile_row4(row0 + 2u, c), cols < vec4<u32>(row0 + 2u));
    let l3 = select(zero, -tile_row4(row0 + 3u, c), cols < vec4<u32>(row0 + 3u));

    // dAt = diag(β) dL replaces dAb (every read of dAb is behind the barriers above).
    if (row0 < len) {
        let at = half + mats_row(start, row0, hv) + c;
        let y = b_s[row0] * l0;
        mats[at] = y.x; mats[at + 16u] = y.y; mats[at + 32u] = y.z; mats[at + 48u] = y.w;
    }
    if (row0 + 1u < len) {
        let at = half + mats_row(start, row0 + 1u, hv) + c;
        let y = b_s[row0 + 1u] * l1;
        mats[at] = y.x; mats[at + 16u] = y.y; mats[at + 32u] = y.z; mats[at + 48u] = y.w;
    }
    if (row0 + 2u < len) {
        let at = half + mats_row(start, row0 + 2u, hv) + c;
        let y = b_s[row0 + 2u] * l2;
        mats[at] = y.x; mats[at + 16u] = y.y; mats[at + 32u] = y.z; mats[at + 48u] = y.w;
    }
    if (row0 + 3u < len) {
        let at = half + mats_row(start, row0 + 3u, hv) + c;
        let y = b_s[row0 + 3u] * l3;
        mats[at] = y.x; mats[at + 16u] = y.y; mats[at + 32u] = y.z; mats[at + 48u] = y.w;
    }

    // dβ_i += Σ_j dL_ij (k_i·k_j).
    workgroupBarrier();
    tile[row0 * 16u + c] = hsum(l0 * g0);
    tile[(row0 + 1u) * 16u + c] = hsum(l1 * g1);
    tile[(row0 + 2u) * 16u + c] = hsum(l2 * g2);
    tile[(row0 + 3u) * 16u + c] = hsum(l3 * g3);
    workgroupBarrier();
    if (t < len) {
        for (var k = 0u; k < 16u; k++) {
            db += tile[t * 16u + k];
        }
        dg_dbeta[(start + t) * hv_count + hv] = vec2<f32>(dg, db);
    }
}
