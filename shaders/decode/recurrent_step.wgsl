// recurrent_step: the token-by-token GDN recurrence over an in-place state pool (decode and
// multi-token verification). One workgroup per (V-block, v-head, sequence) loads its f32
// state slice S (K × V_BLOCK) from the sequence's pool slot once, walks the sequence's tokens
// in FLA's order (§1.1)
//     S ← α S;   u = β (v − Sᵀk);   S ← S + k uᵀ;   o = scale · Sᵀq
// and stores the slice once. Both K-reductions read the *old* state in one pass:
//     a = S_oldᵀk,  b = S_oldᵀq,  u = β (v − α a),  o = scale (α b + u (k·q)),
//     S ← α S_old + k uᵀ
// With l2norm the raw q, k are used and the norms enter as factors (rk, rq), so Σk², Σq²
// and k·q ride along in the same reduction: one workgroup reduction per token.
//
// Thread layout: each invocation owns ROWS_PER_THREAD vec4s of the slice, the vec4 taken
// along the storage-contiguous axis so that consecutive invocations read consecutive 16 B
// (coalesced for either layout):
//   K-first [K,V]: slice rows are k (K of them), a row is V_BLOCK/4 vec4s of v;
//   V-first [V,K]: slice rows are v (V_BLOCK of them), a row is K/4 vec4s of k.
// An invocation is (lane_vec = t % ROW_VECS, row_lane = t / ROW_VECS) and owns rows
// row_lane + ROW_LANES·r. Partial sums go through workgroup memory (no subgroups: this must
// run in browsers), LANES partials per result, summed by RESULTS invocations.
//
// Slot codes (one i32 per sequence, built by the host): c ≥ 0 resumes from pool slot c and
// writes it back; c = -1 is padding (zero state, the pool is not written); c ≤ -2 starts
// from a zero state and writes pool slot -2 - c.

@group(0) @binding(0) var<uniform> params: Params;
// Words: token starts [N + 1], slot codes [N], A_log [HV], dt_bias [HV] (f32 bits).
@group(0) @binding(1) var<uniform> tables: array<vec4<u32>, 4096>;
@group(0) @binding(2) var<storage, read> q_buf: array<Elem>;                       // [B·T, H, K]
@group(0) @binding(3) var<storage, read> k_buf: array<Elem>;                       // [B·T, H, K]
@group(0) @binding(4) var<storage, read> v_buf: array<Elem>;                       // [B·T, HV, V]
@group(0) @binding(5) var<storage, read> g_buf: array<f32>;                        // [B·T, HV]
@group(0) @binding(6) var<storage, read> beta_buf: array<f32>;                     // [B·T, HV]
@group(0) @binding(7) var<storage, read_write> pool: array<vec4<f32>>;             // [P, HV, K, V] or V-first
@group(0) @binding(8) var<storage, read_write> o_buf: array<Elem>;                 // [B·T, HV, V]
@group(0) @binding(9) var<storage, read_write> token_states: array<vec4<f32>>;     // [B·T, HV, K, V] or V-first

const SLOT_PADDING: i32 = -1;
// The register arrays' capacity; the host never asks for more rows per invocation.
const MAX_ROWS_PER_THREAD: u32 = 16u;

override WG: u32;
override K_DIM: u32;
override V_BLOCK: u32;
override ROW_LANES: u32;
override V_FIRST: bool;
override PER_TOKEN_STATES: bool;
// LANES × RESULTS and RESULTS (array sizes must be plain overrides).
override PARTIAL_WORDS: u32;
override RESULTS: u32;

override ROW_VECS: u32 = select(V_BLOCK / 4u, K_DIM / 4u, V_FIRST);
override ROWS_PER_THREAD: u32 = select(K_DIM, V_BLOCK, V_FIRST) / ROW_LANES;
// Partials per result: K-first sums over row lanes (k), V-first over vec4 lanes (k).
override LANES: u32 = select(ROW_LANES, ROW_VECS, V_FIRST);

var<workgroup> k_s: array<f32, K_DIM>;
var<workgroup> q_s: array<f32, K_DIM>;
var<workgroup> v_s: array<f32, V_BLOCK>;
var<workgroup> u_s: array<f32, V_BLOCK>;
var<workgroup> partials: array<f32, PARTIAL_WORDS>;  // [LANES][RESULTS]
// a = S_oldᵀk [V_BLOCK], b = S_oldᵀq [V_BLOCK], then Σk², Σq², k·q.
var<workgroup> sums: array<f32, RESULTS>;
var<workgroup> gate_s: vec2<f32>;                     // (α, β) of the current token

fn table_word(i: u32) -> u32 {
    return tables[i / 4u][i % 4u];
}

fn softplus(x: f32) -> f32 {
    if (x > 20.0) {
        return x;
    }
    return log(1.0 + exp(x));
}

// vec4 index of the invocation's row `row` of the slice whose state starts at vec4 `base`.
fn slice_vec(base: u32, row: u32, lane_vec: u32, v0: u32) -> u32 {
    if (V_FIRST) {
        return base + (v0 + row) * (K_DIM / 4u) + lane_vec;
    }
    return base + row * (params.value_dim / 4u) + v0 / 4u + lane_vec;
}

@compute @workgroup_size(WG)
fn recurrent_step(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let v0 = wid.x * V_BLOCK;
    let hv = wid.y;
    let n = wid.z;
    let sequences = params.num_segments;
    let hv_count = params.heads_v;
    let h = hv / (hv_count / params.heads_qk);
    let v_dim = params.value_dim;
    let flags = params.flags;
    let start = table_word(n);
    let end = table_word(n + 1u);
    let code = bitcast<i32>(table_word(sequences + 1u + n));
    let a_log = bitcast<f32>(table_word(2u * sequences + 1u + hv));
    let dt_bias = bitcast<f32>(table_word(2u * sequences + 1u + hv_count + hv));

    var write_slot = -1;
    if (code >= 0) {
        write_slot = code;
    } else if (code < SLOT_PADDING) {
        write_slot = -2 - code;
    }
    // The host validated the codes; this only keeps a corrupted table inside the pool.
    if (write_slot >= i32(params.rows)) {
        write_slot = -1;
    }

    let lane_vec = t % ROW_VECS;
    let row_lane = t / ROW_VECS;
    let slice_words = K_DIM * v_dim / 4u;

    var s: array<vec4<f32>, MAX_ROWS_PER_THREAD>;
    if (code >= 0 && write_slot >= 0) {
        let base = (u32(code) * hv_count + hv) * slice_words;
        for (var r = 0u; r < ROWS_PER_THREAD; r++) {
            s[r] = pool[slice_vec(base, row_lane + ROW_LANES * r, lane_vec, v0)];
        }
    } else {
        for (var r = 0u; r < ROWS_PER_THREAD; r++) {
            s[r] = vec4<f32>(0.0);
        }
    }

    // K-first keeps its rows' k for the update (k_s is overwritten by the next token).
    var k_rows: array<f32, MAX_ROWS_PER_THREAD>;
    var k_vec = vec4<f32>(0.0);
    let k_base = v0 / 4u;
    for (var tok = start; tok < end; tok++) {
        // Stage the token's inputs. Every reader of the previous token's k_s, q_s, v_s and
        // gate_s passed at least one barrier since (see the update below).
        let qk_row = (tok * params.heads_qk + h) * K_DIM;
        for (var i = t; i < K_DIM; i += WG) {
            k_s[i] = elem_to_f32(k_buf[qk_row + i]);
            q_s[i] = elem_to_f32(q_buf[qk_row + i]);
        }
        let v_row = (tok * hv_count + hv) * v_dim + v0;
        for (var i = t; i < V_BLOCK; i += WG) {
            v_s[i] = elem_to_f32(v_buf[v_row + i]);
        }
        if (t == 0u) {
            let gi = tok * hv_count + hv;
            var g = g_buf[gi];
            if (has_flag(flags, FLAG_GATE_IN_KERNEL)) {
                g = -exp(a_log) * softplus(g + dt_bias);
            }
            var beta = beta_buf[gi];
            if (has_flag(flags, FLAG_BETA_SIGMOID)) {
                beta = 1.0 / (1.0 + exp(-beta));
            }
            if (has_flag(flags, FLAG_NEG_EIGVAL)) {
                beta = 2.0 * beta;
            }
            gate_s = vec2<f32>(exp(g), beta);
        }
        workgroupBarrier();

        // Partial a, b (per column) and Σk², Σq², k·q over the invocation's share of K.
        let gate = gate_s;
        if (V_FIRST) {
            k_vec = vec4<f32>(k_s[4u * lane_vec], k_s[4u * lane_vec + 1u], k_s[4u * lane_vec + 2u], k_s[4u * lane_vec + 3u]);
            let q_vec = vec4<f32>(q_s[4u * lane_vec], q_s[4u * lane_vec + 1u], q_s[4u * lane_vec + 2u], q_s[4u * lane_vec + 3u]);
            let out = lane_vec * RESULTS;
            for (var r = 0u; r < ROWS_PER_THREAD; r++) {
                let row = row_lane + ROW_LANES * r;
                partials[out + row] = dot(s[r], k_vec);
                partials[out + V_BLOCK + row] = dot(s[r], q_vec);
            }
            if (row_lane == 0u) {
                partials[out + 2u * V_BLOCK] = dot(k_vec, k_vec);
                partials[out + 2u * V_BLOCK + 1u] = dot(q_vec, q_vec);
                partials[out + 2u * V_BLOCK + 2u] = dot(k_vec, q_vec);
            }
        } else {
            var a = vec4<f32>(0.0);
            var b = vec4<f32>(0.0);
            var kk = 0.0;
            var qq = 0.0;
            var kq = 0.0;
            for (var r = 0u; r < ROWS_PER_THREAD; r++) {
                let row = row_lane + ROW_LANES * r;
                let kx = k_s[row];
                let qx = q_s[row];
                k_rows[r] = kx;
                a += s[r] * kx;
                b += s[r] * qx;
                kk += kx * kx;
                qq += qx * qx;
                kq += kx * qx;
            }
            let out = row_lane * RESULTS + 4u * lane_vec;
            for (var j = 0u; j < 4u; j++) {
                partials[out + j] = a[j];
                partials[out + V_BLOCK + j] = b[j];
            }
            if (lane_vec == 0u) {
                let tail = row_lane * RESULTS + 2u * V_BLOCK;
                partials[tail] = kk;
                partials[tail + 1u] = qq;
                partials[tail + 2u] = kq;
            }
        }
        workgroupBarrier();

        for (var i = t; i < RESULTS; i += WG) {
            var acc = 0.0;
            for (var l = 0u; l < LANES; l++) {
                acc += partials[l * RESULTS + i];
            }
            sums[i] = acc;
        }
        workgroupBarrier();

        var rk = 1.0;
        var rq = 1.0;
        if (has_flag(flags, FLAG_L2NORM)) {
            rk = 1.0 / sqrt(sums[2u * V_BLOCK] + 1e-6);
            rq = 1.0 / sqrt(sums[2u * V_BLOCK + 1u] + 1e-6);
        }
        let alpha = gate.x;
        let kq_normed = sums[2u * V_BLOCK + 2u] * rk * rq;
        for (var i = t; i < V_BLOCK; i += WG) {
            let u = gate.y * (v_s[i] - alpha * rk * sums[i]);
            u_s[i] = u;
            let o = params.scale * (alpha * rq * sums[V_BLOCK + i] + u * kq_normed);
            o_buf[v_row + i] = f32_to_elem(o);
        }
        workgroupBarrier();

        // S ← α S + k uᵀ, from registers and u_s only: k_s may be refilled by fast
        // invocations of the next token while slow ones are still here.
        if (V_FIRST) {
            let k_normed = k_vec * rk;
            for (var r = 0u; r < ROWS_PER_THREAD; r++) {
                s[r] = alpha * s[r] + k_normed * u_s[row_lane + ROW_LANES * r];
            }
        } else {
            let u_vec = vec4<f32>(u_s[4u * lane_vec], u_s[4u * lane_vec + 1u], u_s[4u * lane_vec + 2u], u_s[4u * lane_vec + 3u]);
            for (var r = 0u; r < ROWS_PER_THREAD; r++) {
                s[r] = alpha * s[r] + (k_rows[r] * rk) * u_vec;
            }
        }
        if (PER_TOKEN_STATES) {
            let base = (tok * hv_count + hv) * slice_words;
            for (var r = 0u; r < ROWS_PER_THREAD; r++) {
                token_states[slice_vec(base, row_lane + ROW_LANES * r, lane_vec, v0)] = s[r];
            }
        }
    }

    if (write_slot >= 0) {
        let base = (u32(write_slot) * hv_count + hv) * slice_words;
        for (var r = 0u; r < ROWS_PER_THREAD; r++) {
            pool[slice_vec(base, row_lane + ROW_LANES * r, lane_vec, v0)] = s[r];
        }
    }
}
