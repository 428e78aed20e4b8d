// value_grams: per (chunk, v-head) the two 64×64 products over the value dimension that the
// intra-chunk gradients need, masked to the lower triangle (i ≥ j) and gated:
//     dP  = scale · Γ ⊙ (dO V'ᵀ)      (gradient of P = Q Kᵀ)
//     dAb =         Γ ⊙ (dV' Wᵀ)      (gradient of A·diag(β))
// with V', W from state_recompute and dV' from dh_scan. Γ_ij = exp(G_i − G_j) is only taken
// for j ≤ i (exponent ≤ 0). Rows past a partial chunk's end are neither read nor stored.
//
// Register tiles: invocation (r, c) = (t / 16, t % 16) owns rows 4r..4r+3 and columns
// 4c..4c+3 of both matrices, as named vec4 accumulators (one per row, lanes = columns; no
// private arrays indexed in loops). V is streamed in 8-wide slices of the four operands, the
// next slice loaded into registers while the current one is used. The slices are stored
// transposed, as vec4s of four consecutive rows per value column (column pitch 17 vec4s, so
// the transposing stores do not collide on banks): a product step reads four vec4s instead of
// sixteen scalars (the step was bound by workgroup loads, not FMAs). 9 KiB of workgroup
// memory.

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> do_buf: array<Elem>;             // [B·T, HV, V]
@group(0) @binding(2) var<storage, read> w_vnew: array<f32>;              // [2, B·T, HV, V]: W, V'
@group(0) @binding(3) var<storage, read> dvnew_dv: array<f32>;            // [2, B·T, HV, V]: dV', dv
@group(0) @binding(4) var<storage, read> gate_beta: array<vec2<f32>>;     // [B·T, HV]: (G, β)
@group(0) @binding(5) var<storage, read> chunks: array<u32>;              // per chunk: start, length
@group(0) @binding(6) var<storage, read_write> mats: array<f32>;          // [2, B·T, HV, 64]: dP, dAb

const V_SLICE: u32 = 8u;
const PITCH: u32 = 17u;   // vec4s per value column of a slice (16 row groups + 1)
const DO_AT: u32 = 0u;
const VNEW_AT: u32 = 136u;
const DVNEW_AT: u32 = 272u;
const W_AT: u32 = 408u;

var<workgroup> tiles: array<vec4<f32>, 544>;
var<workgroup> g_s: array<f32, 64>;

fn do_at(i: u32) -> f32 {
    return load_elem(do_buf[elem_word(i)], i);
}

// Rows 4q..4q+3 of a tile's column vv.
fn rows4(base: u32, q: u32, vv: u32) -> vec4<f32> {
    return tiles[base + vv * PITCH + q];
}

// One slice's operands for invocation t: row t / 4, columns 2 (t % 4) and + 1, of dO, V', dV'
// and W, as (dO, V') and (dV', W) pairs; 0 past the chunk.
struct Slice {
    a: vec4<f32>,
    b: vec4<f32>,
}

fn load_slice(start: u32, len: u32, hv: u32, v0: u32, t: u32) -> Slice {
    let i = t / 4u;
    let at = ((start + min(i, len - 1u)) * params.heads_v + hv) * params.value_dim + v0 + 2u * (t % 4u);
    let half = params.total_tokens * params.heads_v * params.value_dim;
    let a = vec4<f32>(do_at(at), do_at(at + 1u), w_vnew[half + at], w_vnew[half + at + 1u]);
    let b = vec4<f32>(dvnew_dv[at], dvnew_dv[at + 1u], w_vnew[at], w_vnew[at + 1u]);
    let keep = vec4<bool>(i < len);
    return Slice(select(vec4<f32>(0.0), a, keep), select(vec4<f32>(0.0), b, keep));
}

fn store_slice(t: u32, s: Slice) {
    // Row i = t / 4, columns vv = 2 (t % 4) and vv + 1 of the slice.
    let i = t / 4u;
    let at = 2u * (t % 4u) * PITCH + i / 4u;
    let l = i % 4u;
    tiles[DO_AT + at][l] = s.a.x;
    tiles[DO_AT + at + PITCH][l] = s.a.y;
    tiles[VNEW_AT + at][l] = s.a.z;
    tiles[VNEW_AT + at + PITCH][l] = s.a.w;
    tiles[DVNEW_AT + at][l] = s.b.x;
    tiles[DVNEW_AT + at + PITCH][l] = s.b.y;
    tiles[W_AT + at][l] = s.b.z;
    tiles[W_AT + at + PITCH][l] = s.b.w;
}

// Row i of dP and dAb from the accumulators (columns 4c..4c+3), gated and masked to j ≤ i.
fn store_row(i: u32, len: u32, start: u32, hv: u32, c: u32, p: vec4<f32>, a: vec4<f32>) {
    if (i < len) {
        let j = vec4<u32>(4u * c) + vec4<u32>(0u, 1u, 2u, 3u);
        let gj = vec4<f32>(g_s[j.x], g_s[j.y], g_s[j.z], g_s[j.w]);
        let decay = select(vec4<f32>(0.0), exp(min(vec4<f32>(g_s[i]) - gj, vec4<f32>(0.0))), j <= vec4<u32>(i));
        let dp = params.scale * decay * p;
        let dab = decay * a;
        let out = ((start + i) * params.heads_v + hv) * CHUNK + 4u * c;
        let half = params.total_tokens * params.heads_v * CHUNK;
        mats[out] = dp.x;
        mats[out + 1u] = dp.y;
        mats[out + 2u] = dp.z;
        mats[out + 3u] = dp.w;
        mats[half + out] = dab.x;
        mats[half + out + 1u] = dab.y;
        mats[half + out + 2u] = dab.z;
        mats[half + out + 3u] = dab.w;
    }
}

@compute @workgroup_size(256)
fn value_grams(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let chunk = wid.x;
    let hv = wid.y;
    let start = chunks[2u * chunk];
    let len = chunks[2u * chunk + 1u];
    let r = t / 16u;
    let c = t % 16u;
    let row0 = 4u * r;

    if (t < CHUNK) {
        g_s[t] = gate_beta[(start + min(t, len - 1u)) * params.heads_v + hv].x;
    }

    var p0 = vec4<f32>(0.0); var p1 = vec4<f32>(0.0); var p2 = vec4<f32>(0.0); var p3 = vec4<f32>(0.0);
    var a0 = vec4<f32>(0.0); var a1 = vec4<f32>(0.0); var a2 = vec4<f32>(0.0); var a3 = vec4<f32>(0.0);
    var next = load_slice(start, len, hv, 0u, t);
    for (var v0 = 0u; v0 < params.value_dim; v0 += V_SLICE) {
        workgroupBarrier();
        store_slice(t, next);
        if (v0 + V_SLICE < params.value_dim) {
            next = load_slice(start, len, hv, v0 + V_SLICE, t);
        }
        workgroupBarrier();
        for (var vv = 0u; vv < V_SLICE; vv++) {
            let d = rows4(DO_AT, r, vv);
            let dn = rows4(DVNEW_AT, r, vv);
            let vn = rows4(VNEW_AT, c, vv);
            let w = rows4(W_AT, c, vv);
            p0 += d.x * vn;
            p1 += d.y * vn;
            p2 += d.z * vn;
            p3 += d.w * vn;
            a0 += dn.x * w;
            a1 += dn.y * w;
            a2 += dn.z * w;
            a3 += dn.w * w;
        }
    }

    store_row(row0, len, start, hv, c, p0, a0);
    store_row(row0 + 1u, len, start, hv, c, p1, a1);
    store_row(row0 + 2u, len, start, hv, c, p2, a2);
    store_row(row0 + 3u, len, start, hv, c, p3, a3);
}
