// qk_grad_coop: qk_grad.wgsl on cooperative matrices — the three 64×64 × 64×K products on
// f16 16×16×16 operands with f32 accumulators, for the coop path's backward (K = 128):
//     dq = dQs + dP K
//     dk = dKs + X + dPᵀ Q + dAt K + dAtᵀ K
//     dG_i = dG_wy,i + q_i·dQs_i − k_i·dKs_i + k_i·X_i + c_i,  dG_last += Σ_i k_i·dKs_i
//     (the last row's k·dKs cancels exactly and is left out of both)
//     dg_i = Σ_{s ≥ i in the chunk} dG_s      (reverse chunk-local cumsum)
// Per (chunk, v-head): the gate terms first, in f32 straight from the parts (invocation t sums
// row t / 4 over 32 K columns; the four per row are added in a fixed order), then dP and dAt
// staged whole in f16 (64 × 64 each, read once: both orientations are tile reads of the same
// copy), then per 64-wide K half the token axis j in 16-token slices of K and Q (16 × 64, the
// B operands; the next slice loaded into registers during the products). dAt and dAtᵀ are two
// products so that their sum stays in f32. Subgroup g owns row tile g / 2 and K column tiles
// 2 (g % 2), +1 of the half (2 dq + 2 dk accumulators). The parts each invocation adds to its
// results are loaded at the start of the half; results leave through a per-subgroup 16 × 16
// f32 tile (rows past the chunk are never written). 28.3 KiB of workgroup memory.
//
// naga: coopLoad/coopStore are column-major, coopLoadT/coopStoreT row-major; every pointer
// index is bound with `let` first; cooperative ops need uniform control flow.

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> q_buf: array<Elem>;              // [B·T, H, K]
@group(0) @binding(2) var<storage, read> k_buf: array<Elem>;              // [B·T, H, K]
@group(0) @binding(3) var<storage, read> mats: array<f32>;                // [2, B·T, HV, 64]: dP, dAt
@group(0) @binding(4) var<storage, read> chunks: array<u32>;              // per chunk: start, length
@group(0) @binding(5) var<storage, read_write> dqk_parts: array<f32>;     // [B·T, HV, 3K + 1]
@group(0) @binding(6) var<storage, read_write> dg_dbeta: array<vec2<f32>>; // [B·T, HV]: (dG, dβ)

const KD: u32 = 128u;       // key dimension
const JS: u32 = 16u;        // token slice
const WG: u32 = 256u;       // invocations

var<workgroup> dp_s: array<f16, CHUNK * CHUNK>;   // dP[i, j], [64][64]
var<workgroup> dat_s: array<f16, CHUNK * CHUNK>;  // dAt[i, j]
var<workgroup> k_s: array<f16, JS * 64u>;         // K[j, k0 + k], [JS][64]
var<workgroup> q_s: array<f16, JS * 64u>;         // Q[j, k0 + k]
var<workgroup> out_tile: array<f32, 2048>;        // per subgroup 16 × 16; gate sums first
var<workgroup> dg_s: array<f32, 64>;

fn q_at(i: u32) -> f32 {
    return load_elem(q_buf[elem_word(i)], i);
}

fn k_at(i: u32) -> f32 {
    return load_elem(k_buf[elem_word(i)], i);
}

fn zero_acc() -> coop_mat16x16<f32, C> {
    // out_tile[0..256) holds zeros whenever this is called.
    return coopLoad<coop_mat16x16<f32, C>>(&out_tile[0], 16u);
}

// A tiles (rows i = 16 rt.., columns j = j0..) of dP, dAt: row-major reads of [64][64]; their
// transposes (rows i, columns j: dP[j, i]): column-major reads of the same copy.
fn dp_tile(rt: u32, j0: u32) -> coop_mat16x16<f16, A> {
    let i = 16u * CHUNK * rt + j0;
    return coopLoadT<coop_mat16x16<f16, A>>(&dp_s[i], CHUNK);
}

fn dat_tile(rt: u32, j0: u32) -> coop_mat16x16<f16, A> {
    let i = 16u * CHUNK * rt + j0;
    return coopLoadT<coop_mat16x16<f16, A>>(&dat_s[i], CHUNK);
}

fn dp_t(rt: u32, j0: u32) -> coop_mat16x16<f16, A> {
    let i = CHUNK * j0 + 16u * rt;
    return coopLoad<coop_mat16x16<f16, A>>(&dp_s[i], CHUNK);
}

fn dat_t(rt: u32, j0: u32) -> coop_mat16x16<f16, A> {
    let i = CHUNK * j0 + 16u * rt;
    return coopLoad<coop_mat16x16<f16, A>>(&dat_s[i], CHUNK);
}

// Row-major B tiles of [JS][64] (columns 16 ct..).
fn k_tile(ct: u32) -> coop_mat16x16<f16, B> {
    let i = 16u * ct;
    return coopLoadT<coop_mat16x16<f16, B>>(&k_s[i], 64u);
}

fn q_tile(ct: u32) -> coop_mat16x16<f16, B> {
    let i = 16u * ct;
    return coopLoadT<coop_mat16x16<f16, B>>(&q_s[i], 64u);
}

// Invocation t's share of a K, Q slice: element e = t + 256 n (n < 4) is row j0 + e / 64,
// column k0 + e % 64 (0 past the chunk).
struct KqSlice {
    k: vec4<f32>,
    q: vec4<f32>,
}

fn load_kq(t: u32, j0: u32, k0: u32, start: u32, len: u32, h: u32) -> KqSlice {
    var k = vec4<f32>(0.0);
    var q = vec4<f32>(0.0);
    for (var n = 0u; n < 4u; n++) {
        let e = t + WG * n;
        let j = j0 + e / 64u;
        let gi = ((start + min(j, len - 1u)) * params.heads_qk + h) * KD + k0 + e % 64u;
        k[n] = select(0.0, k_at(gi), j < len);
        q[n] = select(0.0, q_at(gi), j < len);
    }
    return KqSlice(k, q);
}

fn stage_kq(t: u32, s: KqSlice) {
    for (var n = 0u; n < 4u; n++) {
        let e = t + WG * n;
        k_s[e] = f16(s.k[n]);
        q_s[e] = f16(s.q[n]);
    }
}

// The parts lane `lane` adds to its 8 entries (rows 16 rt + lane / 16 + 2 n, column
// k0 + 16 ct + lane % 16) of a dq tile (dQs) or a dk tile (dKs + X); 0 past the chunk.
struct Parts {
    a: vec4<f32>,   // n = 0..3
    b: vec4<f32>,   // n = 4..7
}

fn load_parts(lane: u32, rt: u32, ct: u32, k0: u32, is_dk: bool, len: u32, out_base: u32) -> Parts {
    var a = vec4<f32>(0.0);
    var b = vec4<f32>(0.0);
    let rs = params.heads_v * (3u * KD + 1u);
    let col = k0 + 16u * ct + lane % 16u;
    for (var n = 0u; n < 4u; n++) {
        let i0 = 16u * rt + lane / 16u + 2u * n;
        let i1 = i0 + 8u;
        let at0 = out_base + min(i0, len - 1u) * rs + col;
        let at1 = out_base + min(i1, len - 1u) * rs + col;
        var x0 = dqk_parts[at0];
        var x1 = dqk_parts[at1];
        if (is_dk) {
            x0 = dqk_parts[at0 + KD] + dqk_parts[at0 + 2u * KD];
            x1 = dqk_parts[at1 + KD] + dqk_parts[at1 + 2u * KD];
        }
        a[n] = x0;
        b[n] = x1;
    }
    return Parts(a, b);
}

// Tile m plus the parts `p` into part 0 (dq) or 1 (dk) of `dqk_parts`, rows in the chunk
// only. Call from uniform control flow (it holds barriers).
fn store_out(m: coop_mat16x16<f32, C>, p: Parts, t: u32, sg: u32, rt: u32, ct: u32, k0: u32,
             is_dk: bool, len: u32, out_base: u32) {
    let o = 256u * sg;
    coopStoreT(m, &out_tile[o], 16u);
    workgroupBarrier();
    let lane = t % 32u;
    let rs = params.heads_v * (3u * KD + 1u);
    let col = k0 + 16u * ct + lane % 16u + select(0u, KD, is_dk);
    for (var n = 0u; n < 4u; n++) {
        let e0 = lane + 32u * n;
        let e1 = e0 + 128u;
        let i0 = 16u * rt + e0 / 16u;
        let i1 = 16u * rt + e1 / 16u;
        if (i0 < len) {
            dqk_parts[out_base + i0 * rs + col] = p.a[n] + out_tile[o + e0];
        }
        if (i1 < len) {
            dqk_parts[out_base + i1 * rs + col] = p.b[n] + out_tile[o + e1];
        }
    }
    workgroupBarrier();
}

@compute @workgroup_size(256)
fn qk_grad_coop(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let chunk = wid.x;
    let hv = wid.y;
    let sg = t / 32u;
    let lane = t % 32u;
    let start = chunks[2u * chunk];
    let len = chunks[2u * chunk + 1u];
    let last = len - 1u;
    let hv_count = params.heads_v;
    let h = hv / (hv_count / params.heads_qk);
    let half = params.total_tokens * hv_count * CHUNK;
    let rs = hv_count * (3u * KD + 1u);
    let out_base = (start * hv_count + hv) * (3u * KD + 1u);

    // dP and dAt, whole: element e = t + 256 n (n < 16) is row e / 64, column e % 64 (0 past
    // the chunk). Their loads go out first.
    for (var n = 0u; n < 16u; n++) {
        let e = t + WG * n;
        let i = e / CHUNK;
        let j = e % CHUNK;
        let at = ((start + min(i, last)) * hv_count + hv) * CHUNK + j;
        let inside = i < len && j < len;
        dp_s[e] = f16(select(0.0, mats[at], inside));
        dat_s[e] = f16(select(0.0, mats[half + at], inside));
    }

    // The gate terms of row t / 4 over K columns 32 (t % 4)..+31: q·dQs + k·X − k·dKs and
    // k·dKs (both without k·dKs on the chunk's last row).
    let gr = t / 4u;
    var g_row = 0.0;
    var g_last = 0.0;
    {
        let at = out_base + min(gr, last) * rs + 32u * (t % 4u);
        let qk = ((start + min(gr, last)) * params.heads_qk + h) * KD + 32u * (t % 4u);
        var g_qx = 0.0;
        var g_kd = 0.0;
        for (var c = 0u; c < 32u; c++) {
            let kv = k_at(qk + c);
            g_qx += q_at(qk + c) * dqk_parts[at + c] + kv * dqk_parts[at + 2u * KD + c];
            g_kd += kv * dqk_parts[at + KD + c];
        }
        if (gr < len) {
            let kd = select(g_kd, 0.0, gr == last);
            g_row = g_qx - kd;
            g_last = kd;
        }
    }
    out_tile[t] = g_row;
    out_tile[WG + t] = g_last;
    workgroupBarrier();
    var dg = 0.0;
    if (t < len) {
        let at = (start + t) * hv_count + hv;
        dg = dg_dbeta[at].x + dqk_parts[out_base + t * rs + 3u * KD];
        dg += (out_tile[4u * t] + out_tile[4u * t + 1u]) + (out_tile[4u * t + 2u] + out_tile[4u * t + 3u]);
    }
    if (t < CHUNK) {
        let l = WG + 4u * t;
        dg_s[t] = (out_tile[l] + out_tile[l + 1u]) + (out_tile[l + 2u] + out_tile[l + 3u]);
    }
    workgroupBarrier();
    if (t == last) {
        for (var s = 0u; s < CHUNK; s++) {
            dg += dg_s[s];
        }
    }
    workgroupBarrier();
    if (t < len) {
        dg_s[t] = dg;
    }
    out_tile[t] = 0.0;
    workgroupBarrier();
    if (t < len) {
        var acc = 0.0;
        for (var s = t; s < len; s++) {
            acc += dg_s[s];
        }
        let at = (start + t) * hv_count + hv;
        dg_dbeta[at] = vec2<f32>(acc, dg_dbeta[at].y);
    }

    let rt = sg / 2u;
    let ct0 = 2u * (sg % 2u);
    var next = load_kq(t, 0u, 0u, start, len, h);
    for (var k0 = 0u; k0 < KD; k0 += 64u) {
        let pq0 = load_parts(lane, rt, ct0, k0, false, len, out_base);
        let pq1 = load_parts(lane, rt, ct0 + 1u, k0, false, len, out_base);
        let pk0 = load_parts(lane, rt, ct0, k0, true, len, out_base);
        let pk1 = load_parts(lane, rt, ct0 + 1u, k0, true, len, out_base);
        var q0 = zero_acc(); var q1 = zero_acc();
        var d0 = zero_acc(); var d1 = zero_acc();
        for (var j0 = 0u; j0 < CHUNK; j0 += JS) {
            stage_kq(t, next);
            workgroupBarrier();
            // The next slice (of this half, or the next half's first) during the products.
            if (j0 + JS < CHUNK) {
                next = load_kq(t, j0 + JS, k0, start, len, h);
            } else if (k0 == 0u) {
                next = load_kq(t, 0u, 64u, start, len, h);
            }
            let a_dp = dp_tile(rt, j0);
            let a_dat = dat_tile(rt, j0);
            let a_dpt = dp_t(rt, j0);
            let a_datt = dat_t(rt, j0);
            let bk0 = k_tile(ct0);
            let bk1 = k_tile(ct0 + 1u);
            let bq0 = q_tile(ct0);
            let bq1 = q_tile(ct0 + 1u);
            q0 = coopMultiplyAdd(a_dp, bk0, q0);
            q1 = coopMultiplyAdd(a_dp, bk1, q1);
            d0 = coopMultiplyAdd(a_dpt, bq0, d0);
            d1 = coopMultiplyAdd(a_dpt, bq1, d1);
            d0 = coopMultiplyAdd(a_dat, bk0, d0);
            d1 = coopMultiplyAdd(a_dat, bk1, d1);
            d0 = coopMultiplyAdd(a_datt, bk0, d0);
            d1 = coopMultiplyAdd(a_datt, bk1, d1);
            workgroupBarrier();
        }
        store_out(q0, pq0, t, sg, rt, ct0, k0, false, len, out_base);
        store_out(q1, pq1, t, sg, rt, ct0 + 1u, k0, false, len, out_base);
        store_out(d0, pk0, t, sg, rt, ct0, k0, true, len, out_base);
        store_out(d1, pk1, t, sg, rt, ct0 + 1u, k0, true, len, out_base);
        // Zeros again for the next half's accumulators.
        out_tile[t] = 0.0;
        workgroupBarrier();
    }
}
