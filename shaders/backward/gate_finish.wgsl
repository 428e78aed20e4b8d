// gate_finish: one workgroup per v-head chains the activations onto the raw inputs and
// reduces the per-head parameter gradients over all tokens:
//     β: sigmoid → dbeta = dβ·σ(x)σ(−x) (×2 with negative eigenvalues), else dbeta = dβ
//     g: in-kernel gate g = −exp(A_log)·softplus(x), x = g_raw + dt_bias →
//        dg_raw = dg·(−exp(A_log)·softplus'(x)),  dA_log = Σ dg·g,  ddt_bias = Σ dg_raw
// (softplus' = 1 above 20, as softplus is the identity there). The sums are per-invocation
// strided partials reduced by a fixed tree: deterministic, no float atomics. They are added to
// `dgate_params` (cleared by the host first): a backward in token windows (docs/windows.md)
// runs this pass once per window, over the window's tokens from `params.rows` on (the rows
// before are alignment slack that belongs to the window before).

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> g_raw: array<f32>;               // [B·T, HV]
@group(0) @binding(2) var<storage, read> beta_raw: array<f32>;            // [B·T, HV]
@group(0) @binding(3) var<storage, read> gate_params: array<f32>;         // [HV] A_log, then [HV] dt_bias
@group(0) @binding(4) var<storage, read> dg_dbeta: array<vec2<f32>>;      // [B·T, HV]: (dg, dβ) activated
@group(0) @binding(5) var<storage, read_write> dg_out: array<f32>;        // [B·T, HV]
@group(0) @binding(6) var<storage, read_write> dbeta_out: array<f32>;     // [B·T, HV]
@group(0) @binding(7) var<storage, read_write> dgate_params: array<f32>;  // [HV] dA_log, then [HV] ddt_bias

var<workgroup> a_part: array<f32, 256>;
var<workgroup> b_part: array<f32, 256>;

// σ(x) without a positive exponent.
fn sigmoid(x: f32) -> f32 {
    if (x >= 0.0) {
        return 1.0 / (1.0 + exp(-x));
    }
    let e = exp(x);
    return e / (1.0 + e);
}

fn softplus(x: f32) -> f32 {
    if (x > 20.0) {
        return x;
    }
    return log(1.0 + exp(x));
}

@compute @workgroup_size(256)
fn gate_finish(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let hv = wid.x;
    let hv_count = params.heads_v;
    let flags = params.flags;
    let gate_in_kernel = has_flag(flags, FLAG_GATE_IN_KERNEL);
    var da_log = 0.0;
    var ddt_bias = 0.0;
    for (var token = params.rows + t; token < params.total_tokens; token += 256u) {
        let at = token * hv_count + hv;
        let grads = dg_dbeta[at];
        var dbeta = grads.y;
        if (has_flag(flags, FLAG_BETA_SIGMOID)) {
            // σ' = σ(x)·σ(−x): 1 − σ(x) would cancel for large logits (x = 10 already loses
            // 1e-3 of σ' in f32; found by tests/properties.rs).
            let x = beta_raw[at];
            dbeta *= sigmoid(x) * sigmoid(-x);
        }
        if (has_flag(flags, FLAG_NEG_EIGVAL)) {
            dbeta *= 2.0;
        }
        dbeta_out[at] = dbeta;
        var dg = grads.x;
        if (gate_in_kernel) {
            let a = exp(gate_params[hv]);
            let x = g_raw[at] + gate_params[hv_count + hv];
            var slope = 1.0;
            if (x <= 20.0) {
                slope = sigmoid(x);
            }
            da_log += grads.x * (-a * softplus(x));
            dg = grads.x * (-a * slope);
            ddt_bias += dg;
        }
        dg_out[at] = dg;
    }
    a_part[t] = da_log;
    b_part[t] = ddt_bias;
    for (var width = 128u; width > 0u; width /= 2u) {
        workgroupBarrier();
        if (t < width) {
            a_part[t] += a_part[t + width];
            b_part[t] += b_part[t + width];
        }
    }
    if (t == 0u) {
        dgate_params[hv] += a_part[0];
        dgate_params[hv_count + hv] += b_part[0];
    }
}
