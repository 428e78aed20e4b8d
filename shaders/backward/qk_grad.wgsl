// qk_grad: per (chunk, v-head) assembles dq and dk of this v-head and finishes the gate
// gradient of the chunk:
//     dq = dQs + dP K
//     dk = dKs + X + dPᵀ Q + (dAt + dAtᵀ) K
//     dG_i = dG_wy,i + q_i·dQs_i − k_i·dKs_i + k_i·X_i + c_i,  dG_last += Σ_i k_i·dKs_i
//     (the last row's k·dKs cancels exactly and is left out of both)
//     dg_i = Σ_{s ≥ i in the chunk} dG_s      (reverse chunk-local cumsum: G restarts per chunk)
// dq, dk overwrite dQs, dKs in `dqk_parts` (each entry is read and written by one invocation);
// dg overwrites dG in `dg_dbeta` (w.r.t. the applied log-decay; dβ is left as it is).
//
// Register tiles: invocation (r, c) = (t / 16, t % 16) owns token rows 4r..4r+3 and K columns
// k0 + 4c..k0 + 4c + 3 of each 64-wide K block, as named vec4 registers (lanes = K columns).
// The token axis j of the 64×64 products is streamed in 8-token slices: dP and dAt + dAtᵀ at
// columns j (64 × 8), dP at rows j (8 × 64), and K, Q at rows j (8 × 64 of the K block), the
// next slice prefetched into registers. The slices are stored as vec4s along the axis the
// products step through (four rows i, or four K columns), so a product step reads five vec4s
// instead of twenty scalars: the step was bound by workgroup loads, not FMAs. 11 KiB of
// workgroup memory. Rows past the chunk's end read as 0 (they belong to the next chunk) and
// are never stored.

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> q_buf: array<Elem>;              // [B·T, H, K]
@group(0) @binding(2) var<storage, read> k_buf: array<Elem>;              // [B·T, H, K]
@group(0) @binding(3) var<storage, read> mats: array<f32>;                // [2, B·T, HV, 64]: dP, dAt
@group(0) @binding(4) var<storage, read> chunks: array<u32>;              // per chunk: start, length
@group(0) @binding(5) var<storage, read_write> dqk_parts: array<f32>;     // [B·T, HV, 3K + 1]
@group(0) @binding(6) var<storage, read_write> dg_dbeta: array<vec2<f32>>; // [B·T, HV]: (dG, dβ)

override K_DIM: u32;
const J_SLICE: u32 = 8u;
// vec4 slots of the slices, [j][PITCH] each: four rows i per vec4 of dP[i, j] and
// dAt[i, j] + dAt[j, i]; four i per vec4 of dP[j, i]; four K columns per vec4 of K and Q at
// row j. A pitch of 17 vec4s keeps the transposing stores of dP and dAt off each other's banks.
const PITCH: u32 = 17u;
const DPC_AT: u32 = 0u;
const SC_AT: u32 = 136u;
const DPR_AT: u32 = 272u;
const KS_AT: u32 = 408u;
const QS_AT: u32 = 544u;

// After the products the arena holds, as floats: 64 × 16 row partial sums, then 256 partial
// sums of Σ k·dKs.
const ROW_PART: u32 = 0u;
const LAST_PART: u32 = 1024u;

var<workgroup> arena: array<vec4<f32>, 680>;
var<workgroup> dg_s: array<f32, 64>;

// Float i of the arena (the partial sums after the products).
fn part_at(i: u32) -> f32 {
    return arena[i / 4u][i % 4u];
}

fn set_part(i: u32, x: f32) {
    arena[i / 4u][i % 4u] = x;
}

fn q_at(i: u32) -> f32 {
    return load_elem(q_buf[elem_word(i)], i);
}

fn k_at(i: u32) -> f32 {
    return load_elem(k_buf[elem_word(i)], i);
}

fn mats_row(start: u32, i: u32, hv: u32) -> u32 {
    return ((start + i) * params.heads_v + hv) * CHUNK;
}

// Invocation t's share of one slice: dP[i, j..j+1], dAt[i, j..j+1] + dAt[j..j+1, i] for
// i = t / 4, j = j0 + 2 (t % 4); dP[j, kk..kk+1], K and Q [j, k0 + kk..] for j = j0 + t / 32,
// kk = 2 (t % 32). Zero past the chunk (or past K).
struct Slice {
    dpc: vec2<f32>,
    sc: vec2<f32>,
    dpr: vec2<f32>,
    k: vec2<f32>,
    q: vec2<f32>,
}

fn load_slice(start: u32, len: u32, hv: u32, h: u32, j0: u32, k0: u32, t: u32) -> Slice {
    let half = params.total_tokens * params.heads_v * CHUNK;
    let i = t / 4u;
    let j = j0 + 2u * (t % 4u);
    let last = len - 1u;
    let row_i = mats_row(start, min(i, last), hv);
    let row_j0 = mats_row(start, min(j, last), hv);
    let row_j1 = mats_row(start, min(j + 1u, last), hv);
    let dpc = vec2<f32>(mats[row_i + j], mats[row_i + j + 1u]);
    let sc = vec2<f32>(mats[half + row_i + j], mats[half + row_i + j + 1u])
        + select(vec2<f32>(0.0), vec2<f32>(mats[half + row_j0 + i], mats[half + row_j1 + i]), vec2<u32>(j, j + 1u) < vec2<u32>(len));
    let jr = j0 + t / 32u;
    let kk = 2u * (t % 32u);
    let row_jr = mats_row(start, min(jr, last), hv);
    let dpr = vec2<f32>(mats[row_jr + kk], mats[row_jr + kk + 1u]);
    let col = min(k0 + kk, K_DIM - 2u);
    let gi = ((start + min(jr, last)) * params.heads_qk + h) * K_DIM + col;
    let kx = vec2<f32>(k_at(gi), k_at(gi + 1u));
    let qx = vec2<f32>(q_at(gi), q_at(gi + 1u));
    let i_ok = vec2<bool>(i < len);
    let jr_ok = vec2<bool>(jr < len);
    let kq_ok = vec2<bool>(jr < len && k0 + kk < K_DIM);
    return Slice(select(vec2<f32>(0.0), dpc, i_ok), select(vec2<f32>(0.0), sc, i_ok),
                 select(vec2<f32>(0.0), dpr, jr_ok), select(vec2<f32>(0.0), kx, kq_ok),
                 select(vec2<f32>(0.0), qx, kq_ok));
}

fn store_slice(t: u32, s: Slice) {
    // dP and the symmetrised dAt at (i, j), (i, j + 1): i = t / 4, j = 2 (t % 4) in the slice.
    let i = t / 4u;
    let a = 2u * (t % 4u) * PITCH + i / 4u;
    arena[DPC_AT + a][i % 4u] = s.dpc.x;
    arena[DPC_AT + a + PITCH][i % 4u] = s.dpc.y;
    arena[SC_AT + a][i % 4u] = s.sc.x;
    arena[SC_AT + a + PITCH][i % 4u] = s.sc.y;
    // Row j = t / 32 of the slice, entries kk, kk + 1 (kk = 2 (t % 32): one vec4 holds both).
    let kk = 2u * (t % 32u);
    let b = (t / 32u) * PITCH + kk / 4u;
    let l = kk % 4u;
    arena[DPR_AT + b][l] = s.dpr.x;
    arena[DPR_AT + b][l + 1u] = s.dpr.y;
    arena[KS_AT + b][l] = s.k.x;
    arena[KS_AT + b][l + 1u] = s.k.y;
    arena[QS_AT + b][l] = s.q.x;
    arena[QS_AT + b][l + 1u] = s.q.y;
}

// K columns k0 + 4c .. k0 + 4c + 3 (this invocation's lanes).
fn cols4(k0: u32, c: u32) -> vec4<u32> {
    return vec4<u32>(k0 + 4u * c) + vec4<u32>(0u, 1u, 2u, 3u);
}

// This invocation's entries (0 past K) of part `part` (0: dQs, 1: dKs, 2: X) of a row.
fn part4(out: u32, part: u32, k0: u32, c: u32) -> vec4<f32> {
    let at = out + part * K_DIM;
    let kc = cols4(k0, c);
    let m = vec4<u32>(K_DIM - 1u);
    let x = vec4<f32>(dqk_parts[at + min(kc.x, m.x)], dqk_parts[at + min(kc.y, m.y)],
                      dqk_parts[at + min(kc.z, m.z)], dqk_parts[at + min(kc.w, m.w)]);
    return select(vec4<f32>(0.0), x, kc < vec4<u32>(K_DIM));
}

fn qk4(start: u32, i: u32, h: u32, k0: u32, c: u32, from_q: bool) -> vec4<f32> {
    let base = ((start + i) * params.heads_qk + h) * K_DIM;
    let kc = cols4(k0, c);
    let at = vec4<u32>(base) + min(kc, vec4<u32>(K_DIM - 1u));
    var x: vec4<f32>;
    if (from_q) {
        x = vec4<f32>(q_at(at.x), q_at(at.y), q_at(at.z), q_at(at.w));
    } else {
        x = vec4<f32>(k_at(at.x), k_at(at.y), k_at(at.z), k_at(at.w));
    }
    return select(vec4<f32>(0.0), x, kc < vec4<u32>(K_DIM));
}

fn store_part(out: u32, part: u32, k0: u32, c: u32, x: vec4<f32>) {
    let at = out + part * K_DIM + k0 + 4u * c;
    let inside = cols4(k0, c) < vec4<u32>(K_DIM);
    if (inside.x) {
        dqk_parts[at] = x.x;
    }
    if (inside.y) {
        dqk_parts[at + 1u] = x.y;
    }
    if (inside.z) {
        dqk_parts[at + 2u] = x.z;
    }
    if (inside.w) {
        dqk_parts[at + 3u] = x.w;
    }
}

struct RowOut {
    gate_row: f32,   // q·dQs − k·dKs + k·X over this invocation's columns
    gate_last: f32,  // k·dKs over them (both without k·dKs on the chunk's last row)
}

// Finish row i at this K block: add the state terms to dq, dk, store them, and return the
// row's gate contributions.
fn finish_row(start: u32, len: u32, hv: u32, h: u32, i: u32, k0: u32, c: u32, dq: vec4<f32>, dk: vec4<f32>) -> RowOut {
    if (i >= len) {
        return RowOut(0.0, 0.0);
    }
    let out = ((start + i) * params.heads_v + hv) * (3u * K_DIM + 1u);
    let dqs = part4(out, 0u, k0, c);
    let dks = part4(out, 1u, k0, c);
    let x = part4(out, 2u, k0, c);
    let qx = qk4(start, i, h, k0, c, true);
    let kx = qk4(start, i, h, k0, c, false);
    store_part(out, 0u, k0, c, dqs + dq);
    store_part(out, 1u, k0, c, dks + x + dk);
    // The last row's −k·dKs and its share of Σ k·dKs cancel exactly: both are left out (at a
    // strongly decaying head they are large, and the rest of dG_last is tiny).
    let kd = select(dot(kx, dks), 0.0, i == len - 1u);
    return RowOut(dot(qx, dqs) + dot(kx, x) - kd, kd);
}

@compute @workgroup_size(256)
fn qk_grad(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let chunk = wid.x;
    let hv = wid.y;
    let start = chunks[2u * chunk];
    let len = chunks[2u * chunk + 1u];
    let hv_count = params.heads_v;
    let h = hv / (hv_count / params.heads_qk);
    let r = t / 16u;
    let c = t % 16u;
    let row0 = 4u * r;

    var gate_row = vec4<f32>(0.0);  // lanes: rows row0..row0+3
    var gate_last = 0.0;
    for (var k0 = 0u; k0 < K_DIM; k0 += 64u) {
        var q0 = vec4<f32>(0.0); var q1 = vec4<f32>(0.0); var q2 = vec4<f32>(0.0); var q3 = vec4<f32>(0.0);
        var d0 = vec4<f32>(0.0); var d1 = vec4<f32>(0.0); var d2 = vec4<f32>(0.0); var d3 = vec4<f32>(0.0);
        var next = load_slice(start, len, hv, h, 0u, k0, t);
        for (var j0 = 0u; j0 < CHUNK; j0 += J_SLICE) {
            workgroupBarrier();
            store_slice(t, next);
            if (j0 + J_SLICE < CHUNK) {
                next = load_slice(start, len, hv, h, j0 + J_SLICE, k0, t);
            }
            workgroupBarrier();
            for (var jj = 0u; jj < J_SLICE; jj++) {
                let dpc = arena[DPC_AT + jj * PITCH + r];
                let sc = arena[SC_AT + jj * PITCH + r];
                let dpr = arena[DPR_AT + jj * PITCH + r];
                let kv = arena[KS_AT + jj * PITCH + c];
                let qv = arena[QS_AT + jj * PITCH + c];
                q0 += dpc.x * kv; q1 += dpc.y * kv; q2 += dpc.z * kv; q3 += dpc.w * kv;
                d0 += dpr.x * qv + sc.x * kv;
                d1 += dpr.y * qv + sc.y * kv;
                d2 += dpr.z * qv + sc.z * kv;
                d3 += dpr.w * qv + sc.w * kv;
            }
        }
        let f0 = finish_row(start, len, hv, h, row0, k0, c, q0, d0);
        let f1 = finish_row(start, len, hv, h, row0 + 1u, k0, c, q1, d1);
        let f2 = finish_row(start, len, hv, h, row0 + 2u, k0, c, q2, d2);
        let f3 = finish_row(start, len, hv, h, row0 + 3u, k0, c, q3, d3);
        gate_row += vec4<f32>(f0.gate_row, f1.gate_row, f2.gate_row, f3.gate_row);
        gate_last += (f0.gate_last + f1.gate_last) + (f2.gate_last + f3.gate_last);
    }

    // Row sums over the 16 invocations of a row, and the chunk-wide Σ k·dKs, in a fixed order.
    workgroupBarrier();
    set_part(ROW_PART + row0 * 16u + c, gate_row.x);
    set_part(ROW_PART + (row0 + 1u) * 16u + c, gate_row.y);
    set_part(ROW_PART + (row0 + 2u) * 16u + c, gate_row.z);
    set_part(ROW_PART + (row0 + 3u) * 16u + c, gate_row.w);
    set_part(LAST_PART + t, gate_last);
    for (var width = 128u; width > 0u; width /= 2u) {
        workgroupBarrier();
        if (t < width) {
            set_part(LAST_PART + t, part_at(LAST_PART + t) + part_at(LAST_PART + t + width));
        }
    }
    workgroupBarrier();
    if (t < len) {
        let at = (start + t) * hv_count + hv;
        var dg = dg_dbeta[at].x;
        for (var k = 0u; k < 16u; k++) {
            dg += part_at(ROW_PART + t * 16u + k);
        }
        dg += dqk_parts[at * (3u * K_DIM + 1u) + 3u * K_DIM];
        if (t == len - 1u) {
            dg += part_at(LAST_PART);
        }
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
