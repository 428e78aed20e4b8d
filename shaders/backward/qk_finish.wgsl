// qk_finish: per (token, q/k head) the GVA group sum of the per-v-head dq and dk from qk_grad,
// then, with the in-kernel l2norm, its backward w.r.t. the raw vector x (y = x·r,
// r = 1/sqrt(Σx² + 1e-6)):  dx = (dy − (dy·y) y) · r,  r recomputed from x.
// One invocation per head vector; the group sum is recomputed in the second loop rather than
// held (K up to 256 would not fit in registers).

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> q_raw: array<Elem>;              // [B·T, H, K]
@group(0) @binding(2) var<storage, read> k_raw: array<Elem>;              // [B·T, H, K]
@group(0) @binding(3) var<storage, read> dqk_parts: array<f32>;           // [B·T, HV, 3K + 1]: dq, dk, ..
@group(0) @binding(4) var<storage, read_write> dq_out: array<Elem>;       // [B·T, H, K]
@group(0) @binding(5) var<storage, read_write> dk_out: array<Elem>;       // [B·T, H, K]

// Σ over the v-heads of group `h` of the per-v-head gradient at `offset` (0: dq, K: dk).
fn group_sum(token: u32, h: u32, offset: u32, kk: u32) -> f32 {
    let group = params.heads_v / params.heads_qk;
    let stride = 3u * params.key_dim + 1u;
    var acc = 0.0;
    for (var g = 0u; g < group; g++) {
        acc += dqk_parts[(token * params.heads_v + h * group + g) * stride + offset + kk];
    }
    return acc;
}

@compute @workgroup_size(64)
fn qk_finish(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = flat_index(gid, nwg);
    if (row >= params.total_tokens * params.heads_qk) {
        return;
    }
    let token = row / params.heads_qk;
    let h = row % params.heads_qk;
    let dim = params.key_dim;
    let base = row * dim;
    if (!has_flag(params.flags, FLAG_L2NORM)) {
        for (var kk = 0u; kk < dim; kk++) {
            dq_out[base + kk] = f32_to_elem(group_sum(token, h, 0u, kk));
            dk_out[base + kk] = f32_to_elem(group_sum(token, h, dim, kk));
        }
        return;
    }
    var q_ss = 0.0;
    var k_ss = 0.0;
    var q_dot = 0.0;  // dy·x (dy·y = r·dy·x)
    var k_dot = 0.0;
    for (var kk = 0u; kk < dim; kk++) {
        let qx = elem_to_f32(q_raw[base + kk]);
        let kx = elem_to_f32(k_raw[base + kk]);
        q_ss += qx * qx;
        k_ss += kx * kx;
        q_dot += group_sum(token, h, 0u, kk) * qx;
        k_dot += group_sum(token, h, dim, kk) * kx;
    }
    let q_r = 1.0 / sqrt(q_ss + 1e-6);
    let k_r = 1.0 / sqrt(k_ss + 1e-6);
    for (var kk = 0u; kk < dim; kk++) {
        let qy = elem_to_f32(q_raw[base + kk]) * q_r;
        let ky = elem_to_f32(k_raw[base + kk]) * k_r;
        dq_out[base + kk] = f32_to_elem((group_sum(token, h, 0u, kk) - q_dot * q_r * qy) * q_r);
        dk_out[base + kk] = f32_to_elem((group_sum(token, h, dim, kk) - k_dot * k_r * ky) * k_r);
    }
}
