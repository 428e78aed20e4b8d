// qk_grad_coop: qk_grad.wgsl on cooperative matrices — the three 64×64 × 64×K products on
// f16 16×16×16 operands with f32 accumulators, for the coop path's backward (K = 128):
//     dq = dQs + dP K
//     dk = dKs + X + dPᵀ Q + dAt K + dAtᵀ K
//     dG_i = dG_wy,i + q_i·dQs_i − k_i·dKs_i + k_i·X_i + c_i,  dG_last += Σ_i k_i·dKs_i
//     (the last row's k·dKs cancels exactly and is left out of both)
//     dg_i = Σ_{s ≥ i in the chunk} dG_s      (reverse chunk-local cumsum)
// Per (chunk, v-head), per 64-wide K half: the token axis j is streamed in 16-token slices —
// dP and dAt at columns j (64 × 16, the A operands), at rows j (16 × 64, read column-major as
// the transposed A operands), and K, Q at rows j (16 × 64, the B operands), staged in f16.
// dAt and dAtᵀ are two products so that their sum stays in f32. Subgroup g owns row tile
// g / 2 and K column tiles 2 (g % 2), +1 of the half (2 dq + 2 dk accumulators). Results
// leave through a per-subgroup 16 × 16 f32 tile, where each invocation adds the parts it
// overwrites (rows past the chunk are never written) and, from the same reads, sums its
// share of the gate terms in f32 (8 rows × one column slot each, in registers); the slots
// are summed per row in a fixed order at the end (deterministic). 20.3 KiB of workgroup
// memory.
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

var<workgroup> dp_c: array<f16, CHUNK * JS>;   // dP[i, j], [64][JS]
var<workgroup> dp_r: array<f16, JS * CHUNK>;   // dP[j, i], [JS][64]
var<workgroup> dat_c: array<f16, CHUNK * JS>;  // dAt[i, j]
var<workgroup> dat_r: array<f16, JS * CHUNK>;  // dAt[j, i]
var<workgroup> k_s: array<f16, JS * 64u>;      // K[j, k0 + k], [JS][64]
var<workgroup> q_s: array<f16, JS * 64u>;      // Q[j, k0 + k]
var<workgroup> out_tile: array<f32, 2048>;     // per subgroup 16 × 16; first the gate sums
var<workgroup> dg_s: array<f32, 64>;

fn q_at(i: u32) -> f32 {
    return load_elem(q_buf[elem_word(i)], i);
}

fn k_at(i: u32) -> f32 {
    return load_elem(k_buf[elem_word(i)], i);
}

fn mats_row(start: u32, i: u32, hv: u32) -> u32 {
    return ((start + i) * params.heads_v + hv) * CHUNK;
}

fn zero_acc() -> coop_mat16x16<f32, C> {
    // out_tile[0..256) holds zeros whenever this is called (set before the products).
    return coopLoad<coop_mat16x16<f32, C>>(&out_tile[0], 16u);
}

// Row-major A tiles of [64][JS] (rows 16 rt..), column-major (transposed) A tiles of
// [JS][64] (rows: i = 16 rt.., columns: j), row-major B tiles of [JS][64] (columns 16 ct..).
fn dp_tile(rt: u32) -> coop_mat16x16<f16, A> {
    let i = 16u * JS * rt;
    return coopLoadT<coop_mat16x16<f16, A>>(&dp_c[i], JS);
}

fn dat_tile(rt: u32) -> coop_mat16x16<f16, A> {
    let i = 16u * JS * rt;
    return coopLoadT<coop_mat16x16<f16, A>>(&dat_c[i], JS);
}

fn dp_t(rt: u32) -> coop_mat16x16<f16, A> {
    let i = 16u * rt;
    return coopLoad<coop_mat16x16<f16, A>>(&dp_r[i], CHUNK);
}

fn dat_t(rt: u32) -> coop_mat16x16<f16, A> {
    let i = 16u * rt;
    return coopLoad<coop_mat16x16<f16, A>>(&dat_r[i], CHUNK);
}

fn k_tile(ct: u32) -> coop_mat16x16<f16, B> {
    let i = 16u * ct;
    return coopLoadT<coop_mat16x16<f16, B>>(&k_s[i], 64u);
}

fn q_tile(ct: u32) -> coop_mat16x16<f16, B> {
    let i = 16u * ct;
    return coopLoadT<coop_mat16x16<f16, B>>(&q_s[i], 64u);
}

// Tile m (rows 16 rt.., K columns k0 + 16 ct..) of dq (`is_dk` false: + dQs) or dk (+ dKs + X)
// into part 0 or 1 of `dqk_parts`, rows in the chunk only; the gate terms of the parts read
// go to `gate` (q·dQs + k·X − k·dKs) and `gate_last` (k·dKs), entry n for row
// 16 rt + lane / 16 + 2n (both without k·dKs on the chunk's last row). Call from uniform
// control flow (it holds barriers).
fn store_out(m: coop_mat16x16<f32, C>, t: u32, sg: u32, rt: u32, ct: u32, k0: u32, is_dk: bool,
             start: u32, len: u32, h: u32, out_base: u32,
             gate: ptr<function, array<f32, 8>>, gate_last: ptr<function, array<f32, 8>>) {
    let o = 256u * sg;
    coopStoreT(m, &out_tile[o], 16u);
    workgroupBarrier();
    let lane = t % 32u;
    for (var n = 0u; n < 8u; n++) {
        let e = lane + 32u * n;
        let i = 16u * rt + e / 16u;
        if (i < len) {
            let col = k0 + 16u * ct + e % 16u;
            let at = out_base + i * params.heads_v * (3u * KD + 1u) + col;
            let qk_at = ((start + i) * params.heads_qk + h) * KD + col;
            if (is_dk) {
                let dks = dqk_parts[at + KD];
                let x = dqk_parts[at + 2u * KD];
                let kv = k_at(qk_at);
                let kd = select(kv * dks, 0.0, i == len - 1u);
                (*gate)[n] += kv * x - kd;
                (*gate_last)[n] += kd;
                dqk_parts[at + KD] = dks + x + out_tile[o + e];
            } else {
                let dqs = dqk_parts[at];
                (*gate)[n] += q_at(qk_at) * dqs;
                dqk_parts[at] = dqs + out_tile[o + e];
            }
        }
    }
    workgroupBarrier();
}

@compute @workgroup_size(256)
fn qk_grad_coop(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let chunk = wid.x;
    let hv = wid.y;
    let sg = t / 32u;
    let start = chunks[2u * chunk];
    let len = chunks[2u * chunk + 1u];
    let last = len - 1u;
    let hv_count = params.heads_v;
    let h = hv / (hv_count / params.heads_qk);
    let half = params.total_tokens * hv_count * CHUNK;
    let out_base = (start * hv_count + hv) * (3u * KD + 1u);

    out_tile[t] = 0.0;
    workgroupBarrier();
    let zero = zero_acc();
    workgroupBarrier();
    var gate = array<f32, 8>();
    var gate_last = array<f32, 8>();

    let rt = sg / 2u;
    let ct0 = 2u * (sg % 2u);
    for (var k0 = 0u; k0 < KD; k0 += 64u) {
        var q0 = zero; var q1 = zero;
        var d0 = zero; var d1 = zero;
        for (var j0 = 0u; j0 < CHUNK; j0 += JS) {
            // Element e = t + 256 n (n < 4) of each 1024-entry slice.
            for (var n = 0u; n < 4u; n++) {
                let e = t + WG * n;
                // Columns j of rows i: row i = e / 16, j = j0 + e % 16.
                let ic = e / JS;
                let jc = j0 + e % JS;
                let row_c = mats_row(start, min(ic, last), hv) + jc;
                let in_c = ic < len;
                dp_c[e] = f16(select(0.0, mats[row_c], in_c));
                dat_c[e] = f16(select(0.0, mats[half + row_c], in_c));
                // Rows j: j = j0 + e / 64, i (or K column k) = e % 64.
                let jr = j0 + e / CHUNK;
                let ir = e % CHUNK;
                let in_r = jr < len;
                let row_r = mats_row(start, min(jr, last), hv) + ir;
                dp_r[e] = f16(select(0.0, mats[row_r], in_r));
                dat_r[e] = f16(select(0.0, mats[half + row_r], in_r));
                let gi = ((start + min(jr, last)) * params.heads_qk + h) * KD + k0 + ir;
                k_s[e] = f16(select(0.0, k_at(gi), in_r));
                q_s[e] = f16(select(0.0, q_at(gi), in_r));
            }
            workgroupBarrier();
            let a_dp = dp_tile(rt);
            let a_dat = dat_tile(rt);
            let a_dpt = dp_t(rt);
            let a_datt = dat_t(rt);
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
        store_out(q0, t, sg, rt, ct0, k0, false, start, len, h, out_base, &gate, &gate_last);
        store_out(q1, t, sg, rt, ct0 + 1u, k0, false, start, len, h, out_base, &gate, &gate_last);
        store_out(d0, t, sg, rt, ct0, k0, true, start, len, h, out_base, &gate, &gate_last);
        store_out(d1, t, sg, rt, ct0 + 1u, k0, true, start, len, h, out_base, &gate, &gate_last);
    }

    // The gate terms per row: slot (g % 2) · 16 + lane % 16 of rows 16 (g / 2) + lane / 16 + 2n,
    // each (row, slot) owned by one invocation, summed per row in slot order.
    let lane = t % 32u;
    let slot = 16u * (sg % 2u) + lane % 16u;
    for (var n = 0u; n < 8u; n++) {
        out_tile[(16u * rt + lane / 16u + 2u * n) * 32u + slot] = gate[n];
    }
    workgroupBarrier();
    var dg = 0.0;
    if (t < len) {
        let at = (start + t) * hv_count + hv;
        dg = dg_dbeta[at].x + dqk_parts[out_base + t * hv_count * (3u * KD + 1u) + 3u * KD];
        for (var k = 0u; k < 32u; k++) {
            dg += out_tile[t * 32u + k];
        }
    }
    workgroupBarrier();
    for (var n = 0u; n < 8u; n++) {
        out_tile[(16u * rt + lane / 16u + 2u * n) * 32u + slot] = gate_last[n];
    }
    workgroupBarrier();
    if (t < CHUNK) {
        var kd_row = 0.0;
        for (var k = 0u; k < 32u; k++) {
            kd_row += out_tile[t * 32u + k];
        }
        dg_s[t] = kd_row;
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
    workgroupBarrier();
    if (t < len) {
        var acc = 0.0;
        for (var s = t; s < len; s++) {
            acc += dg_s[s];
        }
        let at = (start + t) * hv_count + hv;
        dg_dbeta[at] = vec2<f32>(acc, dg_dbeta[at].y);
    }
}
