// qk_finish: per (token, q/k head) the GVA group sum of the per-v-head dq and dk from qk_grad,
// then, with the in-kernel l2norm, its backward w.r.t. the raw vector x (y = x·r,
// r = 1/sqrt(Σx² + 1e-6)):  dx = (dy − (dy·y) y) · r,  r recomputed from x. Stores dq, dk in
// the storage dtype.
//
// 64 invocations per head vector (four vectors per workgroup), each owning the element pairs
// (2l, 2l + 1) and (2l + 128, 2l + 129): the group-sum loads are coalesced, the dot products
// are reduced in workgroup memory in a fixed order, and every store writes a whole pair (bf16
// packs two elements per word).
//
// Entry point `dv_finish` (bindings 0, 6, 7): dv from the f32 workspace into the storage dtype,
// one element pair per invocation.

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> q_raw: array<Elem>;              // [B·T, H, K]
@group(0) @binding(2) var<storage, read> k_raw: array<Elem>;              // [B·T, H, K]
@group(0) @binding(3) var<storage, read> dqk_parts: array<f32>;           // [B·T, HV, 3K + 1]: dq, dk, ..
@group(0) @binding(4) var<storage, read_write> dq_out: array<Elem>;       // [B·T, H, K]
@group(0) @binding(5) var<storage, read_write> dk_out: array<Elem>;       // [B·T, H, K]
@group(0) @binding(6) var<storage, read> dvnew_dv: array<f32>;            // [2, B·T, HV, V]: dV', dv
@group(0) @binding(7) var<storage, read_write> dv_out: array<Elem>;       // [B·T, HV, V]

var<workgroup> red: array<vec4<f32>, 256>;

fn q_at(i: u32) -> f32 {
    return load_elem(q_raw[elem_word(i)], i);
}

fn k_at(i: u32) -> f32 {
    return load_elem(k_raw[elem_word(i)], i);
}

// Elements i, i + 1 (i even) into an output buffer: one packed word, or two elements.
fn store_dq(i: u32, x: vec2<f32>) {
    if (ELEMS_PER_WORD == 2u) {
        dq_out[elem_word(i)] = pack_pair(x.x, x.y);
    } else {
        dq_out[i] = pack_elem(x.x);
        dq_out[i + 1u] = pack_elem(x.y);
    }
}

fn store_dk(i: u32, x: vec2<f32>) {
    if (ELEMS_PER_WORD == 2u) {
        dk_out[elem_word(i)] = pack_pair(x.x, x.y);
    } else {
        dk_out[i] = pack_elem(x.x);
        dk_out[i + 1u] = pack_elem(x.y);
    }
}

@compute @workgroup_size(256)
fn qk_finish(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
             @builtin(num_workgroups) nwg: vec3<u32>) {
    let rows = params.total_tokens * params.heads_qk;
    let row = (wid.x + wid.y * nwg.x) * 4u + t / 64u;
    let lane = t % 64u;
    let valid = row < rows;
    let rc = min(row, rows - 1u);
    let token = rc / params.heads_qk;
    let h = rc % params.heads_qk;
    let dim = params.key_dim;
    let group = params.heads_v / params.heads_qk;
    let stride = 3u * dim + 1u;
    let base = rc * dim;
    // This invocation's pairs: kk0 = 2l, kk1 = 2l + 128 (in range when < K).
    let kk0 = 2u * lane;
    let kk1 = kk0 + 128u;
    let ok0 = valid && kk0 < dim;
    let ok1 = valid && kk1 < dim;
    let c0 = min(kk0, dim - 2u);
    let c1 = min(kk1, dim - 2u);

    var dq0 = vec2<f32>(0.0);
    var dk0 = vec2<f32>(0.0);
    var dq1 = vec2<f32>(0.0);
    var dk1 = vec2<f32>(0.0);
    for (var g = 0u; g < group; g++) {
        let at = (token * params.heads_v + h * group + g) * stride;
        dq0 += vec2<f32>(dqk_parts[at + c0], dqk_parts[at + c0 + 1u]);
        dk0 += vec2<f32>(dqk_parts[at + dim + c0], dqk_parts[at + dim + c0 + 1u]);
        dq1 += vec2<f32>(dqk_parts[at + c1], dqk_parts[at + c1 + 1u]);
        dk1 += vec2<f32>(dqk_parts[at + dim + c1], dqk_parts[at + dim + c1 + 1u]);
    }

    if (has_flag(params.flags, FLAG_L2NORM)) {
        let qx0 = select(vec2<f32>(0.0), vec2<f32>(q_at(base + c0), q_at(base + c0 + 1u)), vec2<bool>(ok0));
        let kx0 = select(vec2<f32>(0.0), vec2<f32>(k_at(base + c0), k_at(base + c0 + 1u)), vec2<bool>(ok0));
        let qx1 = select(vec2<f32>(0.0), vec2<f32>(q_at(base + c1), q_at(base + c1 + 1u)), vec2<bool>(ok1));
        let kx1 = select(vec2<f32>(0.0), vec2<f32>(k_at(base + c1), k_at(base + c1 + 1u)), vec2<bool>(ok1));
        let dq0m = select(vec2<f32>(0.0), dq0, vec2<bool>(ok0));
        let dk0m = select(vec2<f32>(0.0), dk0, vec2<bool>(ok0));
        let dq1m = select(vec2<f32>(0.0), dq1, vec2<bool>(ok1));
        let dk1m = select(vec2<f32>(0.0), dk1, vec2<bool>(ok1));
        // (Σq², Σk², dq·q, dk·k) over the vector: dy·y = r·(dy·x).
        red[t] = vec4<f32>(dot(qx0, qx0) + dot(qx1, qx1), dot(kx0, kx0) + dot(kx1, kx1),
                           dot(dq0m, qx0) + dot(dq1m, qx1), dot(dk0m, kx0) + dot(dk1m, kx1));
        for (var width = 32u; width > 0u; width /= 2u) {
            workgroupBarrier();
            if (lane < width) {
                red[t] += red[t + width];
            }
        }
        workgroupBarrier();
        let s = red[t - lane];
        let q_r = 1.0 / sqrt(s.x + 1e-6);
        let k_r = 1.0 / sqrt(s.y + 1e-6);
        dq0 = (dq0 - s.z * q_r * q_r * qx0) * q_r;
        dq1 = (dq1 - s.z * q_r * q_r * qx1) * q_r;
        dk0 = (dk0 - s.w * k_r * k_r * kx0) * k_r;
        dk1 = (dk1 - s.w * k_r * k_r * kx1) * k_r;
    }
    if (ok0) {
        store_dq(base + kk0, dq0);
        store_dk(base + kk0, dk0);
    }
    if (ok1) {
        store_dq(base + kk1, dq1);
        store_dk(base + kk1, dk1);
    }
}

@compute @workgroup_size(64)
fn dv_finish(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let pair = flat_index(gid, nwg);
    let n = params.total_tokens * params.heads_v * params.value_dim;
    let i = 2u * pair;
    if (i >= n) {
        return;
    }
    let x = vec2<f32>(dvnew_dv[n + i], dvnew_dv[n + i + 1u]);
    if (ELEMS_PER_WORD == 2u) {
        dv_out[elem_word(i)] = pack_pair(x.x, x.y);
    } else {
        dv_out[i] = pack_elem(x.x);
        dv_out[i + 1u] = pack_elem(x.y);
    }
}
