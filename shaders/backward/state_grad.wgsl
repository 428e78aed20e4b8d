// state_grad: per (chunk, v-head) the gradient terms that go through the chunk-start state
// S0 (from state_recompute) and the chunk-end state gradient dS1 (from dh_scan), all products
// over V of a 64×V token tile with a K×V state:
//     dQs = scale · γ ⊙ (dO S0ᵀ)          (dq's state part)
//     dKs = (γ_C/γ) ⊙ (V' dS1ᵀ)           (dk's state part)
//     X   = (−γ ⊙ dv) S0ᵀ                 (dk's part through W = V − γ ⊙ K S0)
//     c   = γ_C · Σ S0 ⊙ dS1              (a cumulative-gate term of the chunk's last token)
// stored per token as [dQs | dKs | X | c] (3K + 1 floats; c is 0 except on the last token).
//
// Invocation t owns row t/4 and columns t%4 + 4n (n < 4) of each 16-column block of K;
// V is streamed in 16-wide slices (14 KiB of workgroup memory).

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> do_buf: array<Elem>;             // [B·T, HV, V]
@group(0) @binding(2) var<storage, read> w_vnew: array<f32>;              // [2, B·T, HV, V]: W, V'
@group(0) @binding(3) var<storage, read> dvnew_dv: array<f32>;            // [2, B·T, HV, V]: dV', dv
@group(0) @binding(4) var<storage, read> states: array<f32>;              // [chunks + N, HV, K, V]
@group(0) @binding(5) var<storage, read> dstates: array<f32>;             // [chunks + N, HV, K, V]
@group(0) @binding(6) var<storage, read> gate_beta: array<vec2<f32>>;     // [B·T, HV]: (G, β)
@group(0) @binding(7) var<storage, read> chunks: array<u32>;              // per chunk: start, length
@group(0) @binding(8) var<storage, read_write> dqk_parts: array<f32>;     // [B·T, HV, 3K + 1]

override K_DIM: u32;
const K_BLOCK: u32 = 16u;
const V_SLICE: u32 = 16u;
// Offsets in the arena: S0 and dS1 blocks (K_BLOCK × V_SLICE), dO, V', dv tiles (64 × V_SLICE).
const S0_AT: u32 = 0u;
const DS1_AT: u32 = 256u;
const DO_AT: u32 = 512u;
const VNEW_AT: u32 = 1536u;
const DV_AT: u32 = 2560u;

var<workgroup> arena: array<f32, 3584>;
var<workgroup> partial: array<f32, 256>;
var<workgroup> gam_s: array<f32, 64>;
var<workgroup> dec_s: array<f32, 64>;

fn state_index(base: u32, k: u32, v: u32, v_first: bool) -> u32 {
    if (v_first) {
        return base + v * K_DIM + k;
    }
    return base + k * params.value_dim + v;
}

@compute @workgroup_size(256)
fn state_grad(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let chunk = wid.x;
    let hv = wid.y;
    let start = chunks[2u * chunk];
    let len = chunks[2u * chunk + 1u];
    let hv_count = params.heads_v;
    let v_dim = params.value_dim;
    let v_first = has_flag(params.flags, FLAG_STATE_V_FIRST);
    let half = params.total_tokens * hv_count * v_dim;
    let state_base = (chunk * hv_count + hv) * K_DIM * v_dim;
    let stride = 3u * K_DIM + 1u;
    let row = t / 4u;
    let cg = t % 4u;

    let g_last = gate_beta[(start + len - 1u) * hv_count + hv].x;
    if (t < CHUNK) {
        let g = gate_beta[(start + min(t, len - 1u)) * hv_count + hv].x;
        gam_s[t] = exp(g);
        dec_s[t] = exp(g_last - g);
    }

    // Σ S0 ⊙ dS1: invocation t adds element t of every staged block (each once).
    var state_dot = 0.0;
    for (var k0 = 0u; k0 < K_DIM; k0 += K_BLOCK) {
        var acc_q: array<f32, 4>;
        var acc_k: array<f32, 4>;
        var acc_x: array<f32, 4>;
        for (var n = 0u; n < 4u; n++) {
            acc_q[n] = 0.0;
            acc_k[n] = 0.0;
            acc_x[n] = 0.0;
        }
        for (var v0 = 0u; v0 < v_dim; v0 += V_SLICE) {
            workgroupBarrier();
            {
                let kk = t / V_SLICE;
                let vv = t % V_SLICE;
                let at = state_index(state_base, k0 + kk, v0 + vv, v_first);
                arena[S0_AT + t] = states[at];
                arena[DS1_AT + t] = dstates[at];
            }
            for (var e = t; e < 64u * V_SLICE; e += 256u) {
                let i = e / V_SLICE;
                var dox = 0.0;
                var vnew = 0.0;
                var dv = 0.0;
                if (i < len) {
                    let at = ((start + i) * hv_count + hv) * v_dim + v0 + e % V_SLICE;
                    dox = elem_to_f32(do_buf[at]);
                    vnew = w_vnew[half + at];
                    dv = dvnew_dv[half + at];
                }
                arena[DO_AT + e] = dox;
                arena[VNEW_AT + e] = vnew;
                arena[DV_AT + e] = dv;
            }
            workgroupBarrier();
            state_dot += arena[S0_AT + t] * arena[DS1_AT + t];
            for (var vv = 0u; vv < V_SLICE; vv++) {
                let dox = arena[DO_AT + row * V_SLICE + vv];
                let vnew = arena[VNEW_AT + row * V_SLICE + vv];
                let dv = arena[DV_AT + row * V_SLICE + vv];
                for (var n = 0u; n < 4u; n++) {
                    let kk = cg + 4u * n;
                    let s0 = arena[S0_AT + kk * V_SLICE + vv];
                    acc_q[n] += dox * s0;
                    acc_k[n] += vnew * arena[DS1_AT + kk * V_SLICE + vv];
                    acc_x[n] += dv * s0;
                }
            }
        }
        if (row < len) {
            let out = ((start + row) * hv_count + hv) * stride;
            for (var n = 0u; n < 4u; n++) {
                let col = k0 + cg + 4u * n;
                dqk_parts[out + col] = params.scale * gam_s[row] * acc_q[n];
                dqk_parts[out + K_DIM + col] = dec_s[row] * acc_k[n];
                dqk_parts[out + 2u * K_DIM + col] = -gam_s[row] * acc_x[n];
            }
        }
    }

    // Tree reduction in a fixed order (deterministic).
    partial[t] = state_dot;
    for (var width = 128u; width > 0u; width /= 2u) {
        workgroupBarrier();
        if (t < width) {
            partial[t] += partial[t + width];
        }
    }
    workgroupBarrier();
    if (t < len) {
        var c = 0.0;
        if (t == len - 1u) {
            c = exp(g_last) * partial[0];
        }
        dqk_parts[((start + t) * hv_count + hv) * stride + 3u * K_DIM] = c;
    }
}
