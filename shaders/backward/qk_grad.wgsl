// qk_grad: per (chunk, v-head) assembles dq and dk of this v-head and finishes the gate
// gradient of the chunk:
//     dq = dQs + dP K
//     dk = dKs + X + dPᵀ Q + (dAt + dAtᵀ) K
//     dG_i = dG_wy,i + q_i·dQs_i − k_i·dKs_i + k_i·X_i + c_i,  dG_last += Σ_i k_i·dKs_i
//     dg_i = Σ_{s ≥ i in the chunk} dG_s      (reverse chunk-local cumsum: G restarts per chunk)
// dq, dk overwrite dQs, dKs in `dqk_parts` (each entry is read and written by one invocation);
// dg overwrites dG in `dg_dbeta` (w.r.t. the applied log-decay; dβ is left as it is).
//
// Invocation t owns row t/4 and columns t%4 + 4n (n < 4) of each 16-column block of K; dP and
// dAt are read from memory (rows past the chunk's end are skipped: they belong to the next
// chunk). 8 KiB of workgroup memory.

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> q_buf: array<Elem>;              // [B·T, H, K]
@group(0) @binding(2) var<storage, read> k_buf: array<Elem>;              // [B·T, H, K]
@group(0) @binding(3) var<storage, read> mats: array<f32>;                // [2, B·T, HV, 64]: dP, dAt
@group(0) @binding(4) var<storage, read> chunks: array<u32>;              // per chunk: start, length
@group(0) @binding(5) var<storage, read_write> dqk_parts: array<f32>;     // [B·T, HV, 3K + 1]
@group(0) @binding(6) var<storage, read_write> dg_dbeta: array<vec2<f32>>; // [B·T, HV]: (dG, dβ)

override K_DIM: u32;
const K_BLOCK: u32 = 16u;

var<workgroup> q_s: array<f32, 1024>;   // 64 × K_BLOCK
var<workgroup> k_s: array<f32, 1024>;
var<workgroup> row_part: array<f32, 256>;
var<workgroup> last_part: array<f32, 256>;
var<workgroup> dg_s: array<f32, 64>;

@compute @workgroup_size(256)
fn qk_grad(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let chunk = wid.x;
    let hv = wid.y;
    let start = chunks[2u * chunk];
    let len = chunks[2u * chunk + 1u];
    let hv_count = params.heads_v;
    let h_count = params.heads_qk;
    let h = hv / (hv_count / h_count);
    let stride = 3u * K_DIM + 1u;
    let mats_half = params.total_tokens * hv_count * CHUNK;
    let row = t / 4u;
    let cg = t % 4u;
    let valid_row = row < len;
    let out = ((start + row) * hv_count + hv) * stride;
    let mats_row = ((start + row) * hv_count + hv) * CHUNK;

    var gate_row = 0.0;   // this invocation's share of q·dQs − k·dKs + k·X
    var gate_last = 0.0;  // its share of Σ k·dKs
    for (var k0 = 0u; k0 < K_DIM; k0 += K_BLOCK) {
        workgroupBarrier();
        for (var e = t; e < 64u * K_BLOCK; e += 256u) {
            let i = e / K_BLOCK;
            var qx = 0.0;
            var kx = 0.0;
            if (i < len) {
                let gi = ((start + i) * h_count + h) * K_DIM + k0 + e % K_BLOCK;
                qx = elem_to_f32(q_buf[gi]);
                kx = elem_to_f32(k_buf[gi]);
            }
            q_s[e] = qx;
            k_s[e] = kx;
        }
        workgroupBarrier();
        if (valid_row) {
            var dq: array<f32, 4>;
            var dk: array<f32, 4>;
            for (var n = 0u; n < 4u; n++) {
                let c = cg + 4u * n;
                let col = k0 + c;
                let dqs = dqk_parts[out + col];
                let dks = dqk_parts[out + K_DIM + col];
                let x = dqk_parts[out + 2u * K_DIM + col];
                let qx = q_s[row * K_BLOCK + c];
                let kx = k_s[row * K_BLOCK + c];
                gate_row += qx * dqs - kx * dks + kx * x;
                gate_last += kx * dks;
                dq[n] = dqs;
                dk[n] = dks + x;
            }
            for (var j = 0u; j < len; j++) {
                let jrow = ((start + j) * hv_count + hv) * CHUNK;
                var dp_rj = 0.0;
                if (j <= row) {
                    dp_rj = mats[mats_row + j];
                }
                var dp_jr = 0.0;
                if (j >= row) {
                    dp_jr = mats[jrow + row];
                }
                let at_sym = mats[mats_half + mats_row + j] + mats[mats_half + jrow + row];
                for (var n = 0u; n < 4u; n++) {
                    let c = cg + 4u * n;
                    let kj = k_s[j * K_BLOCK + c];
                    dq[n] += dp_rj * kj;
                    dk[n] += dp_jr * q_s[j * K_BLOCK + c] + at_sym * kj;
                }
            }
            for (var n = 0u; n < 4u; n++) {
                let col = k0 + cg + 4u * n;
                dqk_parts[out + col] = dq[n];
                dqk_parts[out + K_DIM + col] = dk[n];
            }
        }
    }

    // Row sums over the 4 invocations of a row, and the chunk-wide Σ k·dKs, in a fixed order.
    row_part[t] = gate_row;
    last_part[t] = gate_last;
    for (var width = 128u; width > 0u; width /= 2u) {
        workgroupBarrier();
        if (t < width) {
            last_part[t] += last_part[t + width];
        }
    }
    workgroupBarrier();
    if (t < len) {
        let at = (start + t) * hv_count + hv;
        var dg = dg_dbeta[at].x + row_part[4u * t] + row_part[4u * t + 1u] + row_part[4u * t + 2u] + row_part[4u * t + 3u];
        dg += dqk_parts[((start + t) * hv_count + hv) * stride + 3u * K_DIM];
        if (t == len - 1u) {
            dg += last_part[0];
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
