// state_grad: per (chunk, v-head) the gradient terms that go through the chunk-start state
// S0 (from state_recompute) and the chunk-end state gradient dS1 (from dh_scan), all products
// over V of a 64×V token tile with a K×V state:
//     dQs = scale · γ ⊙ (dO S0ᵀ)          (dq's state part)
//     dKs = (γ_C/γ) ⊙ (V' dS1ᵀ)           (dk's state part)
//     X   = (−γ ⊙ dv) S0ᵀ                 (dk's part through W = V − γ ⊙ K S0)
//     c   = γ_C · Σ S0 ⊙ dS1              (a cumulative-gate term of the chunk's last token)
// stored per token as [dQs | dKs | X | c] (3K + 1 floats; c is 0 except on the last token).
//
// Register tiles: invocation (r, c) = (t / 16, t % 16) owns token rows 4r..4r+3 and K columns
// kb + 4c..kb + 4c + 3 of each 64-wide K block, as named vec4 accumulators (lanes = K
// columns; no private arrays indexed in loops). V is streamed in 8-wide slices of the five
// operands, the next slice loaded into registers while the current one is used. The slices
// are stored transposed, as vec4s of four consecutive rows per value column (column pitch 17
// vec4s, so the transposing stores do not collide on banks): a product step reads five vec4s
// instead of twenty scalars (the step was bound by workgroup loads, not FMAs). 12 KiB of
// workgroup memory.

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
const V_SLICE: u32 = 8u;
const PITCH: u32 = 17u;   // vec4s per value column of a slice (16 row groups + 1)
// Slices of 64 rows × V_SLICE, transposed: dO, V', dv (token rows), S0, dS1 (K rows).
const DO_AT: u32 = 0u;
const VNEW_AT: u32 = 136u;
const DV_AT: u32 = 272u;
const S0_AT: u32 = 408u;
const DS1_AT: u32 = 544u;

var<workgroup> arena: array<vec4<f32>, 680>;
var<workgroup> partial: array<f32, 256>;
var<workgroup> gam_s: array<f32, 64>;
var<workgroup> dec_s: array<f32, 64>;

fn do_at(i: u32) -> f32 {
    return load_elem(do_buf[elem_word(i)], i);
}

fn state_index(base: u32, k: u32, v: u32, v_first: bool) -> u32 {
    if (v_first) {
        return base + v * K_DIM + k;
    }
    return base + k * params.value_dim + v;
}

// Rows 4q..4q+3 of a slice's column vv.
fn rows4(base: u32, q: u32, vv: u32) -> vec4<f32> {
    return arena[base + vv * PITCH + q];
}

// One slice's operands for invocation t: row t / 4, columns v0 + 2 (t % 4) and + 1: dO, V',
// dv of token row t / 4 (0 past the chunk), S0, dS1 of K row k0 + t / 4 (0 past K).
struct Slice {
    tok: vec4<f32>,   // dO (x, y), V' (z, w)
    dv: vec2<f32>,
    s0: vec2<f32>,
    ds1: vec2<f32>,
}

fn load_slice(start: u32, len: u32, hv: u32, state_base: u32, k0: u32, v0: u32, t: u32, v_first: bool) -> Slice {
    let i = t / 4u;
    let v = v0 + 2u * (t % 4u);
    let at = ((start + min(i, len - 1u)) * params.heads_v + hv) * params.value_dim + v;
    let half = params.total_tokens * params.heads_v * params.value_dim;
    let tok = vec4<f32>(do_at(at), do_at(at + 1u), w_vnew[half + at], w_vnew[half + at + 1u]);
    let dv = vec2<f32>(dvnew_dv[half + at], dvnew_dv[half + at + 1u]);
    let k = k0 + i;
    let s_at0 = state_index(state_base, min(k, K_DIM - 1u), v, v_first);
    let s_at1 = state_index(state_base, min(k, K_DIM - 1u), v + 1u, v_first);
    let s0 = vec2<f32>(states[s_at0], states[s_at1]);
    let ds1 = vec2<f32>(dstates[s_at0], dstates[s_at1]);
    let tok_ok = i < len;
    let k_ok = k < K_DIM;
    return Slice(select(vec4<f32>(0.0), tok, vec4<bool>(tok_ok)), select(vec2<f32>(0.0), dv, vec2<bool>(tok_ok)),
                 select(vec2<f32>(0.0), s0, vec2<bool>(k_ok)), select(vec2<f32>(0.0), ds1, vec2<bool>(k_ok)));
}

fn store_slice(t: u32, s: Slice) {
    // Row i = t / 4, columns vv = 2 (t % 4) and vv + 1 of the slice.
    let i = t / 4u;
    let at = 2u * (t % 4u) * PITCH + i / 4u;
    let l = i % 4u;
    arena[DO_AT + at][l] = s.tok.x;
    arena[DO_AT + at + PITCH][l] = s.tok.y;
    arena[VNEW_AT + at][l] = s.tok.z;
    arena[VNEW_AT + at + PITCH][l] = s.tok.w;
    arena[DV_AT + at][l] = s.dv.x;
    arena[DV_AT + at + PITCH][l] = s.dv.y;
    arena[S0_AT + at][l] = s.s0.x;
    arena[S0_AT + at + PITCH][l] = s.s0.y;
    arena[DS1_AT + at][l] = s.ds1.x;
    arena[DS1_AT + at + PITCH][l] = s.ds1.y;
}

// Row i's dQs, dKs and X at K columns k0 + 4c .. k0 + 4c + 3 (those < K).
fn store_row(i: u32, len: u32, start: u32, hv: u32, k0: u32, c: u32, q: vec4<f32>, k: vec4<f32>, x: vec4<f32>) {
    if (i < len) {
        let out = ((start + i) * params.heads_v + hv) * (3u * K_DIM + 1u) + k0 + 4u * c;
        let dq = params.scale * gam_s[i] * q;
        let dk = dec_s[i] * k;
        let dx = -gam_s[i] * x;
        let inside = vec4<u32>(k0 + 4u * c) + vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(K_DIM);
        if (inside.x) {
            dqk_parts[out] = dq.x;
            dqk_parts[out + K_DIM] = dk.x;
            dqk_parts[out + 2u * K_DIM] = dx.x;
        }
        if (inside.y) {
            dqk_parts[out + 1u] = dq.y;
            dqk_parts[out + K_DIM + 1u] = dk.y;
            dqk_parts[out + 2u * K_DIM + 1u] = dx.y;
        }
        if (inside.z) {
            dqk_parts[out + 2u] = dq.z;
            dqk_parts[out + K_DIM + 2u] = dk.z;
            dqk_parts[out + 2u * K_DIM + 2u] = dx.z;
        }
        if (inside.w) {
            dqk_parts[out + 3u] = dq.w;
            dqk_parts[out + K_DIM + 3u] = dk.w;
            dqk_parts[out + 2u * K_DIM + 3u] = dx.w;
        }
    }
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
    let state_base = (chunk * hv_count + hv) * K_DIM * v_dim;
    let r = t / 16u;
    let c = t % 16u;
    let row0 = 4u * r;

    let g_last = gate_beta[(start + len - 1u) * hv_count + hv].x;
    if (t < CHUNK) {
        let g = gate_beta[(start + min(t, len - 1u)) * hv_count + hv].x;
        gam_s[t] = exp(g);
        dec_s[t] = exp(g_last - g);
    }

    // Σ S0 ⊙ dS1: invocation t adds the elements it stages (each element once).
    var state_dot = 0.0;
    for (var k0 = 0u; k0 < K_DIM; k0 += 64u) {
        var q0 = vec4<f32>(0.0); var q1 = vec4<f32>(0.0); var q2 = vec4<f32>(0.0); var q3 = vec4<f32>(0.0);
        var k0a = vec4<f32>(0.0); var k1a = vec4<f32>(0.0); var k2a = vec4<f32>(0.0); var k3a = vec4<f32>(0.0);
        var x0 = vec4<f32>(0.0); var x1 = vec4<f32>(0.0); var x2 = vec4<f32>(0.0); var x3 = vec4<f32>(0.0);
        var next = load_slice(start, len, hv, state_base, k0, 0u, t, v_first);
        for (var v0 = 0u; v0 < v_dim; v0 += V_SLICE) {
            workgroupBarrier();
            store_slice(t, next);
            state_dot += dot(next.s0, next.ds1);
            if (v0 + V_SLICE < v_dim) {
                next = load_slice(start, len, hv, state_base, k0, v0 + V_SLICE, t, v_first);
            }
            workgroupBarrier();
            for (var vv = 0u; vv < V_SLICE; vv++) {
                let d = rows4(DO_AT, r, vv);
                let vn = rows4(VNEW_AT, r, vv);
                let dv = rows4(DV_AT, r, vv);
                let s = rows4(S0_AT, c, vv);
                let ds = rows4(DS1_AT, c, vv);
                q0 += d.x * s; q1 += d.y * s; q2 += d.z * s; q3 += d.w * s;
                k0a += vn.x * ds; k1a += vn.y * ds; k2a += vn.z * ds; k3a += vn.w * ds;
                x0 += dv.x * s; x1 += dv.y * s; x2 += dv.z * s; x3 += dv.w * s;
            }
        }
        store_row(row0, len, start, hv, k0, c, q0, k0a, x0);
        store_row(row0 + 1u, len, start, hv, k0, c, q1, k1a, x1);
        store_row(row0 + 2u, len, start, hv, k0, c, q2, k2a, x2);
        store_row(row0 + 3u, len, start, hv, k0, c, q3, k3a, x3);
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
        var cc = 0.0;
        if (t == len - 1u) {
            cc = exp(g_last) * partial[0];
        }
        dqk_parts[((start + t) * hv_count + hv) * (3u * K_DIM + 1u) + 3u * K_DIM] = cc;
    }
}
