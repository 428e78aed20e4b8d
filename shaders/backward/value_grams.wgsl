// value_grams: per (chunk, v-head) the two 64×64 products over the value dimension that the
// intra-chunk gradients need, masked to the lower triangle (i ≥ j) and gated:
//     dP  = scale · Γ ⊙ (dO V'ᵀ)      (gradient of P = Q Kᵀ)
//     dAb =         Γ ⊙ (dV' Wᵀ)      (gradient of A·diag(β))
// with V', W from state_recompute and dV' from dh_scan. Γ_ij = exp(G_i − G_j) is only taken
// for j ≤ i (exponent ≤ 0). Rows past a partial chunk's end are neither read nor stored.
//
// Invocation t owns row t/4 and columns t%4 + 4n (n < 16) of both matrices. V is streamed in
// 8-wide slices of the four operands (8 KiB of workgroup memory).

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> do_buf: array<Elem>;             // [B·T, HV, V]
@group(0) @binding(2) var<storage, read> w_vnew: array<f32>;              // [2, B·T, HV, V]: W, V'
@group(0) @binding(3) var<storage, read> dvnew_dv: array<f32>;            // [2, B·T, HV, V]: dV', dv
@group(0) @binding(4) var<storage, read> gate_beta: array<vec2<f32>>;     // [B·T, HV]: (G, β)
@group(0) @binding(5) var<storage, read> chunks: array<u32>;              // per chunk: start, length
@group(0) @binding(6) var<storage, read_write> mats: array<f32>;          // [2, B·T, HV, 64]: dP, dAb

const V_SLICE: u32 = 8u;
const TILE: u32 = 512u; // 64 × V_SLICE

// dO, V', dV', W slices, one after the other.
var<workgroup> tiles: array<f32, 2048>;
var<workgroup> g_s: array<f32, 64>;

@compute @workgroup_size(256)
fn value_grams(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let chunk = wid.x;
    let hv = wid.y;
    let start = chunks[2u * chunk];
    let len = chunks[2u * chunk + 1u];
    let hv_count = params.heads_v;
    let v_dim = params.value_dim;
    let half = params.total_tokens * hv_count * v_dim;
    let row = t / 4u;
    let cg = t % 4u;

    if (t < CHUNK) {
        let i = min(t, len - 1u);
        g_s[t] = gate_beta[(start + i) * hv_count + hv].x;
    }

    var acc_p: array<f32, 16>;
    var acc_a: array<f32, 16>;
    for (var n = 0u; n < 16u; n++) {
        acc_p[n] = 0.0;
        acc_a[n] = 0.0;
    }
    for (var v0 = 0u; v0 < v_dim; v0 += V_SLICE) {
        workgroupBarrier();
        for (var e = t; e < TILE; e += 256u) {
            let i = e / V_SLICE;
            var dox = 0.0;
            var vnew = 0.0;
            var dvnew = 0.0;
            var w = 0.0;
            if (i < len) {
                let at = ((start + i) * hv_count + hv) * v_dim + v0 + e % V_SLICE;
                dox = elem_to_f32(do_buf[at]);
                vnew = w_vnew[half + at];
                dvnew = dvnew_dv[at];
                w = w_vnew[at];
            }
            tiles[e] = dox;
            tiles[TILE + e] = vnew;
            tiles[2u * TILE + e] = dvnew;
            tiles[3u * TILE + e] = w;
        }
        workgroupBarrier();
        for (var vv = 0u; vv < V_SLICE; vv++) {
            let dox = tiles[row * V_SLICE + vv];
            let dvnew = tiles[2u * TILE + row * V_SLICE + vv];
            for (var n = 0u; n < 16u; n++) {
                let j = cg + 4u * n;
                acc_p[n] += dox * tiles[TILE + j * V_SLICE + vv];
                acc_a[n] += dvnew * tiles[3u * TILE + j * V_SLICE + vv];
            }
        }
    }
    workgroupBarrier();

    if (row < len) {
        let out_row = ((start + row) * hv_count + hv) * CHUNK;
        let mats_half = params.total_tokens * hv_count * CHUNK;
        for (var n = 0u; n < 16u; n++) {
            let j = cg + 4u * n;
            var dp = 0.0;
            var dab = 0.0;
            if (j <= row) {
                let decay = exp(g_s[row] - g_s[j]);
                dp = params.scale * decay * acc_p[n];
                dab = decay * acc_a[n];
            }
            mats[out_row + j] = dp;
            mats[mats_half + out_row + j] = dab;
        }
    }
}
