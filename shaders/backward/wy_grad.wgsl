// wy_grad: per (chunk, q/k head) P = Q Kᵀ and K Kᵀ (once per GVA group: they do not depend on
// the v-head), then for each v-head of the group in turn the gradients through Ab = A·diag(β)
// and the gate-free WY inverse A = (I + strict_lower(diag(β) K Kᵀ))⁻¹, from dP and dAb of
// value_grams:
//     E    = P ⊙ dP + Ab ⊙ dAb (strictly lower)    dG_i  = rowsum(E)_i − colsum(E)_i
//     dβ_j = Σ_i dAb_ij A_ij                        dAr   = dAb · diag(β)
//     dL   = −strict_lower(Aᵀ dAr Aᵀ)               dβ_i += Σ_j dL_ij (k_i·k_j)
//     dAt  = diag(β) dL                              (dk gets (dAt + dAtᵀ) K in qk_grad)
// P ⊙ dP equals Pg ⊙ dPg of the gated form (the Γ and scale moved onto dP). Writes (dG, dβ)
// per token — dG is the Γ-mask part of the cumulative-gate gradient; dβ is complete (w.r.t.
// the activated β) — and replaces dAb by dAt in `mats`.
//
// The products with A are dense 64×64×64 GEMMs (A is exactly 0 above its diagonal, so the
// triangular structure comes for free): X = dAr Aᵀ, then dL = −Aᵀ X masked to j < i.
//
// Register tiles: invocation (r, c) = (t / 16, t % 16) owns rows 4r..4r+3 and columns
// 4c..4c+3 of every 64×64 matrix, as named vec4 registers (lanes = columns; no private arrays
// indexed in loops). Operands are staged in 16-wide slices with the next slice prefetched into
// registers, stored as vec4s along the axis the products step through (four rows per vec4,
// 17 vec4s per slice column), so a product step reads two or three vec4s instead of eight or
// twelve scalars (the steps were bound by workgroup loads, not FMAs). Row and column sums go
// through workgroup memory in a fixed order (deterministic). 12 KiB of workgroup memory.

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> q_buf: array<Elem>;              // [B·T, H, K]
@group(0) @binding(2) var<storage, read> k_buf: array<Elem>;              // [B·T, H, K]
@group(0) @binding(3) var<storage, read> a_buf: array<f32>;               // [B·T, HV, 64]
@group(0) @binding(4) var<storage, read> gate_beta: array<vec2<f32>>;     // [B·T, HV]: (G, β)
@group(0) @binding(5) var<storage, read> chunks: array<u32>;              // per chunk: start, length
@group(0) @binding(6) var<storage, read_write> mats: array<f32>;          // [2, B·T, HV, 64]: dP, dAb → dAt
@group(0) @binding(7) var<storage, read_write> dg_dbeta: array<vec2<f32>>; // [B·T, HV]: (dG, dβ)

override K_DIM: u32;
const SLICE: u32 = 16u;
const PITCH: u32 = 17u;        // vec4s per slice column (16 groups of four rows + 1)
const S1: u32 = 272u;          // the second slice (vec4 index)

var<workgroup> arena: array<vec4<f32>, 768>;
var<workgroup> b_s: array<f32, 64>;

// Float i of the arena (the partial sums).
fn word(i: u32) -> f32 {
    return arena[i / 4u][i % 4u];
}

fn set_word(i: u32, x: f32) {
    arena[i / 4u][i % 4u] = x;
}

fn q_at(i: u32) -> f32 {
    return load_elem(q_buf[elem_word(i)], i);
}

fn k_at(i: u32) -> f32 {
    return load_elem(k_buf[elem_word(i)], i);
}

// Rows 4q..4q+3 of a slice's column kk.
fn rows4(base: u32, q: u32, kk: u32) -> vec4<f32> {
    return arena[base + kk * PITCH + q];
}

// Row i = t / 4, columns 4 (t % 4) .. + 3 of a 64 × 16 slice, stored transposed.
fn store_slice(base: u32, t: u32, x: vec4<f32>) {
    let i = t / 4u;
    let at = base + 4u * (t % 4u) * PITCH + i / 4u;
    let l = i % 4u;
    arena[at][l] = x.x;
    arena[at + PITCH][l] = x.y;
    arena[at + 2u * PITCH][l] = x.z;
    arena[at + 3u * PITCH][l] = x.w;
}

fn mats_row(start: u32, i: u32, hv: u32) -> u32 {
    return ((start + i) * params.heads_v + hv) * CHUNK;
}

// Entries 4c .. 4c + 3 of row i of A (`a_buf`) or of a `mats` half; 0 past the chunk.
fn a_row4(start: u32, len: u32, hv: u32, i: u32, c: u32) -> vec4<f32> {
    let at = mats_row(start, min(i, len - 1u), hv) + 4u * c;
    let x = vec4<f32>(a_buf[at], a_buf[at + 1u], a_buf[at + 2u], a_buf[at + 3u]);
    return select(vec4<f32>(0.0), x, vec4<bool>(i < len));
}

fn mats_row4(half: u32, start: u32, len: u32, hv: u32, i: u32, c: u32) -> vec4<f32> {
    let at = half + mats_row(start, min(i, len - 1u), hv) + 4u * c;
    let x = vec4<f32>(mats[at], mats[at + 1u], mats[at + 2u], mats[at + 3u]);
    return select(vec4<f32>(0.0), x, vec4<bool>(i < len));
}

// Four consecutive entries (row t / 4, columns col0 + 4 (t % 4) …) of a 64 × 16 slice.
struct Pair {
    a: vec4<f32>,
    b: vec4<f32>,
}

// Q and K, columns k0.. of the chunk's rows (0 past the chunk).
fn load_qk(start: u32, len: u32, h: u32, k0: u32, t: u32) -> Pair {
    let i = t / 4u;
    let gi = ((start + min(i, len - 1u)) * params.heads_qk + h) * K_DIM + k0 + 4u * (t % 4u);
    let q = vec4<f32>(q_at(gi), q_at(gi + 1u), q_at(gi + 2u), q_at(gi + 3u));
    let k = vec4<f32>(k_at(gi), k_at(gi + 1u), k_at(gi + 2u), k_at(gi + 3u));
    let keep = vec4<bool>(i < len);
    return Pair(select(vec4<f32>(0.0), q, keep), select(vec4<f32>(0.0), k, keep));
}

// dAr = dAb·diag(β) and A, columns p0.. of the chunk's rows.
fn load_dar_a(start: u32, len: u32, hv: u32, p0: u32, t: u32) -> Pair {
    let i = t / 4u;
    let p = p0 + 4u * (t % 4u);
    let at = mats_row(start, min(i, len - 1u), hv) + p;
    let half = params.total_tokens * params.heads_v * CHUNK;
    let b = vec4<f32>(b_s[p], b_s[p + 1u], b_s[p + 2u], b_s[p + 3u]);
    let dar = b * vec4<f32>(mats[half + at], mats[half + at + 1u], mats[half + at + 2u], mats[half + at + 3u]);
    let a = vec4<f32>(a_buf[at], a_buf[at + 1u], a_buf[at + 2u], a_buf[at + 3u]);
    let keep = vec4<bool>(i < len);
    return Pair(select(vec4<f32>(0.0), dar, keep), select(vec4<f32>(0.0), a, keep));
}

// Row m0 + t / 16 of A, columns 4 (t % 16) … + 3 (a 16 × 64 slice); 0 past the chunk.
fn load_a_rows(start: u32, len: u32, hv: u32, m0: u32, t: u32) -> vec4<f32> {
    let m = m0 + t / 16u;
    let at = mats_row(start, min(m, len - 1u), hv) + 4u * (t % 16u);
    let x = vec4<f32>(a_buf[at], a_buf[at + 1u], a_buf[at + 2u], a_buf[at + 3u]);
    return select(vec4<f32>(0.0), x, vec4<bool>(m < len));
}

fn hsum(x: vec4<f32>) -> f32 {
    return (x.x + x.y) + (x.z + x.w);
}

// Row sums of this invocation's 4 columns (floats at `rs`, 64 × 16) and column sums of its 4
// rows (floats at `cs`, 16 × 64) of a register tile.
fn partial_sums(rs: u32, cs: u32, r: u32, c: u32, x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>) {
    let row0 = 4u * r;
    set_word(rs + row0 * 16u + c, hsum(x0));
    set_word(rs + (row0 + 1u) * 16u + c, hsum(x1));
    set_word(rs + (row0 + 2u) * 16u + c, hsum(x2));
    set_word(rs + (row0 + 3u) * 16u + c, hsum(x3));
    arena[(cs + r * 64u) / 4u + c] = (x0 + x1) + (x2 + x3);
}

@compute @workgroup_size(256)
fn wy_grad(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let chunk = wid.x;
    let h = wid.y;
    let start = chunks[2u * chunk];
    let len = chunks[2u * chunk + 1u];
    let hv_count = params.heads_v;
    let group = hv_count / params.heads_qk;
    let half = params.total_tokens * hv_count * CHUNK;
    let r = t / 16u;
    let c = t % 16u;
    let row0 = 4u * r;
    let cols = vec4<u32>(4u * c) + vec4<u32>(0u, 1u, 2u, 3u);

    // P = Q Kᵀ and K Kᵀ over 16-column slices of K.
    var p0 = vec4<f32>(0.0); var p1 = vec4<f32>(0.0); var p2 = vec4<f32>(0.0); var p3 = vec4<f32>(0.0);
    var g0 = vec4<f32>(0.0); var g1 = vec4<f32>(0.0); var g2 = vec4<f32>(0.0); var g3 = vec4<f32>(0.0);
    var qk_next = load_qk(start, len, h, 0u, t);
    for (var k0 = 0u; k0 < K_DIM; k0 += SLICE) {
        workgroupBarrier();
        store_slice(0u, t, qk_next.a);
        store_slice(S1, t, qk_next.b);
        if (k0 + SLICE < K_DIM) {
            qk_next = load_qk(start, len, h, k0 + SLICE, t);
        }
        workgroupBarrier();
        for (var kk = 0u; kk < SLICE; kk++) {
            let qr = rows4(0u, r, kk);
            let kr = rows4(S1, r, kk);
            let kc = rows4(S1, c, kk);
            p0 += qr.x * kc; p1 += qr.y * kc; p2 += qr.z * kc; p3 += qr.w * kc;
            g0 += kr.x * kc; g1 += kr.y * kc; g2 += kr.z * kc; g3 += kr.w * kc;
        }
    }
    workgroupBarrier();

    // P and K Kᵀ are the q/k head's; everything after them is each v-head's of its group, in
    // turn.
    for (var jv = 0u; jv < group; jv++) {
        let hv = h * group + jv;
        if (t < CHUNK) {
            b_s[t] = select(0.0, gate_beta[(start + min(t, len - 1u)) * hv_count + hv].y, t < len);
        }

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
        workgroupBarrier();

        // E (strictly lower) and dAb ⊙ A; dG = rowsum(E) − colsum(E), dβ = colsum(dAb ⊙ A).
        let bcol = vec4<f32>(b_s[cols.x], b_s[cols.y], b_s[cols.z], b_s[cols.w]);
        let zero = vec4<f32>(0.0);
        let e0 = select(zero, p0 * dp0 + a0 * bcol * db0, cols < vec4<u32>(row0));
        let e1 = select(zero, p1 * dp1 + a1 * bcol * db1, cols < vec4<u32>(row0 + 1u));
        let e2 = select(zero, p2 * dp2 + a2 * bcol * db2, cols < vec4<u32>(row0 + 2u));
        let e3 = select(zero, p3 * dp3 + a3 * bcol * db3, cols < vec4<u32>(row0 + 3u));
        partial_sums(0u, 1024u, r, c, e0, e1, e2, e3);
        arena[(2048u + r * 64u) / 4u + c] = (db0 * a0 + db1 * a1) + (db2 * a2 + db3 * a3);
        workgroupBarrier();
        var dg = 0.0;
        var db = 0.0;
        if (t < CHUNK) {
            for (var k = 0u; k < 16u; k++) {
                dg += word(t * 16u + k) - word(1024u + k * 64u + t);
                db += word(2048u + k * 64u + t);
            }
        }

        // X = dAr Aᵀ (rows m, columns j), over 16-column slices p.
        var x0 = vec4<f32>(0.0); var x1 = vec4<f32>(0.0); var x2 = vec4<f32>(0.0); var x3 = vec4<f32>(0.0);
        var da_next = load_dar_a(start, len, hv, 0u, t);
        for (var p0s = 0u; p0s < CHUNK; p0s += SLICE) {
            workgroupBarrier();
            store_slice(0u, t, da_next.a);
            store_slice(S1, t, da_next.b);
            if (p0s + SLICE < CHUNK) {
                da_next = load_dar_a(start, len, hv, p0s + SLICE, t);
            }
            workgroupBarrier();
            for (var pp = 0u; pp < SLICE; pp++) {
                let dr = rows4(0u, r, pp);
                let ac = rows4(S1, c, pp);
                x0 += dr.x * ac; x1 += dr.y * ac; x2 += dr.z * ac; x3 += dr.w * ac;
            }
        }

        // dL = −Aᵀ X (rows i, columns j) over 16-row slices m: the owners of X rows m0..m0+15
        // publish them, A rows m0..m0+15 are staged whole.
        var l0 = vec4<f32>(0.0); var l1 = vec4<f32>(0.0); var l2 = vec4<f32>(0.0); var l3 = vec4<f32>(0.0);
        var a_next = load_a_rows(start, len, hv, 0u, t);
        for (var m0 = 0u; m0 < CHUNK; m0 += SLICE) {
            workgroupBarrier();
            arena[(t / 16u) * PITCH + t % 16u] = a_next;
            if (m0 + SLICE < CHUNK) {
                a_next = load_a_rows(start, len, hv, m0 + SLICE, t);
            }
            if (row0 >= m0 && row0 < m0 + SLICE) {
                let at = S1 + (row0 - m0) * PITCH + c;
                arena[at] = x0;
                arena[at + PITCH] = x1;
                arena[at + 2u * PITCH] = x2;
                arena[at + 3u * PITCH] = x3;
            }
            workgroupBarrier();
            for (var mm = 0u; mm < SLICE; mm++) {
                let a = arena[mm * PITCH + r];
                let xv = arena[S1 + mm * PITCH + c];
                l0 += a.x * xv; l1 += a.y * xv; l2 += a.z * xv; l3 += a.w * xv;
            }
        }
        l0 = select(zero, -l0, cols < vec4<u32>(row0));
        l1 = select(zero, -l1, cols < vec4<u32>(row0 + 1u));
        l2 = select(zero, -l2, cols < vec4<u32>(row0 + 2u));
        l3 = select(zero, -l3, cols < vec4<u32>(row0 + 3u));

        // dAt = diag(β) dL replaces dAb (every read of dAb is behind the barriers above).
        if (row0 < len) {
            let at = half + mats_row(start, row0, hv) + 4u * c;
            let y = b_s[row0] * l0;
            mats[at] = y.x; mats[at + 1u] = y.y; mats[at + 2u] = y.z; mats[at + 3u] = y.w;
        }
        if (row0 + 1u < len) {
            let at = half + mats_row(start, row0 + 1u, hv) + 4u * c;
            let y = b_s[row0 + 1u] * l1;
            mats[at] = y.x; mats[at + 1u] = y.y; mats[at + 2u] = y.z; mats[at + 3u] = y.w;
        }
        if (row0 + 2u < len) {
            let at = half + mats_row(start, row0 + 2u, hv) + 4u * c;
            let y = b_s[row0 + 2u] * l2;
            mats[at] = y.x; mats[at + 1u] = y.y; mats[at + 2u] = y.z; mats[at + 3u] = y.w;
        }
        if (row0 + 3u < len) {
            let at = half + mats_row(start, row0 + 3u, hv) + 4u * c;
            let y = b_s[row0 + 3u] * l3;
            mats[at] = y.x; mats[at + 1u] = y.y; mats[at + 2u] = y.z; mats[at + 3u] = y.w;
        }

        // dβ_i += Σ_j dL_ij (k_i·k_j).
        workgroupBarrier();
        set_word(row0 * 16u + c, hsum(l0 * g0));
        set_word((row0 + 1u) * 16u + c, hsum(l1 * g1));
        set_word((row0 + 2u) * 16u + c, hsum(l2 * g2));
        set_word((row0 + 3u) * 16u + c, hsum(l3 * g3));
        workgroupBarrier();
        if (t < len) {
            for (var k = 0u; k < 16u; k++) {
                db += word(t * 16u + k);
            }
            dg_dbeta[(start + t) * hv_count + hv] = vec2<f32>(dg, db);
        }
        // Before the next v-head's β and sums overwrite b_s and the arena.
        workgroupBarrier();
    }
}
