// prepare_gate: per (chunk, v-head) — β activation (optional sigmoid, ×2 for negative
// eigenvalues), gate activation (optional −exp(A_log)·softplus(g + dt_bias)) and the
// chunk-local inclusive cumsum G of the log-decays, in f32. Writes (G, β) per token.
// One invocation walks one chunk's ≤ 64 tokens; the work is tiny next to the scan.

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> g_in: array<f32>;          // [B·T, HV]
@group(0) @binding(2) var<storage, read> beta_in: array<f32>;       // [B·T, HV]
@group(0) @binding(3) var<storage, read> gate_params: array<f32>;   // [HV] A_log then [HV] dt_bias
@group(0) @binding(4) var<storage, read> chunks: array<u32>;        // per chunk: start, length
@group(0) @binding(5) var<storage, read_write> gate_beta: array<vec2<f32>>; // [B·T, HV]: (G, β)

fn softplus(x: f32) -> f32 {
    if (x > 20.0) {
        return x;
    }
    return log(1.0 + exp(x));
}

@compute @workgroup_size(64)
fn prepare_gate(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let item = flat_index(gid, nwg);
    let hv_count = params.heads_v;
    if (item >= params.num_chunks * hv_count) {
        return;
    }
    let chunk = item / hv_count;
    let hv = item % hv_count;
    let start = chunks[2u * chunk];
    let len = chunks[2u * chunk + 1u];
    let flags = params.flags;
    var cum = 0.0;
    for (var i = 0u; i < len; i++) {
        let idx = (start + i) * hv_count + hv;
        var g = g_in[idx];
        if (has_flag(flags, FLAG_GATE_IN_KERNEL)) {
            g = -exp(gate_params[hv]) * softplus(g + gate_params[hv_count + hv]);
        }
        var beta = beta_in[idx];
        if (has_flag(flags, FLAG_BETA_SIGMOID)) {
            beta = 1.0 / (1.0 + exp(-beta));
        }
        if (has_flag(flags, FLAG_NEG_EIGVAL)) {
            beta = 2.0 * beta;
        }
        cum += g;
        gate_beta[idx] = vec2<f32>(cum, beta);
    }
}
