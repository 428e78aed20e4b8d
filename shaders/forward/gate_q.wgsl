// gate_q: the coop scan's Q operand, γ ⊙ q per v-head in f16:
//     qg[t, hv, :] = f16(exp(G[t, hv]) · q[t, hv / (HV/H), :])
// followed by one chunk of zero rows so that a 64-row tile starting at any token stays inside
// the buffer. Folding γ into the operand lets the scan accumulate (γ ⊙ Q) S straight into O
// instead of staging Q S through workgroup memory to scale its rows. Four elements per
// invocation; G is chunk-local (≤ 0), so γ ≤ 1 and nothing overflows that q did not.

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> q_in: array<Elem>;               // [B·T, H, K]
@group(0) @binding(2) var<storage, read> gate_beta: array<vec2<f32>>;     // [B·T, HV]: (G, β)
@group(0) @binding(3) var<storage, read_write> q_out: array<f16>;         // [B·T + 64, HV, K]

@compute @workgroup_size(64)
fn gate_q(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let kd = params.key_dim;
    let hv_count = params.heads_v;
    let n_out = (params.total_tokens + CHUNK) * hv_count * kd;
    let e = 4u * flat_index(gid, nwg);
    if (e >= n_out) {
        return;
    }
    let row = e / kd;                 // token · HV + v-head
    let token = row / hv_count;
    let hv = row % hv_count;
    var gam = 0.0;
    var src = 0u;
    if (token < params.total_tokens) {
        gam = exp(gate_beta[row].x);
        let hqk = hv / (hv_count / params.heads_qk);
        src = (token * params.heads_qk + hqk) * kd + e % kd;
    }
    for (var i = 0u; i < 4u; i++) {
        var x = 0.0;
        if (token < params.total_tokens) {
            x = gam * load_elem(q_in[elem_word(src + i)], src + i);
        }
        q_out[e + i] = f16(x);
    }
}
