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
// row_lane + ROW_LANES·r, r < ROWS_PER_THREAD ≤ 8, held in eight named vec4 registers s0..s7
// (never a private array indexed in a loop: drivers do not reliably unroll naga's loops, and
// such an array then lives in local memory); a row helper called with a constant r and a
// guard `r < ROWS_PER_THREAD` folds away after specialization. Partial sums go through
// workgroup memory (no subgroups: this must run in browsers), LANES partials per result,
// summed by RESULTS invocations.
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

override WG: u32;
override K_DIM: u32;
override V_BLOCK: u32;
override ROW_LANES: u32;
override V_FIRST: bool;
override PER_TOKEN_STATES: bool;
// Sizes of workgroup arrays must be plain overrides: 2·K_DIM, LANES × RESULTS, RESULTS.
override K_WORDS: u32;
override PARTIAL_WORDS: u32;
override RESULTS: u32;

override ROW_VECS: u32 = select(V_BLOCK / 4u, K_DIM / 4u, V_FIRST);
override ROWS_PER_THREAD: u32 = select(K_DIM, V_BLOCK, V_FIRST) / ROW_LANES;
// Partials per result: K-first sums over row lanes (k), V-first over vec4 lanes (k).
override LANES: u32 = select(ROW_LANES, ROW_VECS, V_FIRST);

// k of two consecutive tokens (by parity): the state update reads the current token's k
// while invocations that ran ahead already stage the next one.
var<workgroup> k_s: array<f32, K_WORDS>;
var<workgroup> q_s: array<f32, K_DIM>;
var<workgroup> v_s: array<f32, V_BLOCK>;
var<workgroup> u_s: array<f32, V_BLOCK>;
var<workgroup> partials: array<f32, PARTIAL_WORDS>;  // [LANES][RESULTS]
// a = S_oldᵀk [V_BLOCK], b = S_oldᵀq [V_BLOCK], then Σk², Σq², k·q.
var<workgroup> sums: array<f32, RESULTS>;
var<workgroup> gate_s: vec2<f32>;                     // (α, β) of the current token

// Where an invocation sits in the workgroup's state slice.
struct Place {
    lane_vec: u32,
    row_lane: u32,
    v0: u32,
}

// K-first partial sums of one invocation.
struct RowSums {
    a: vec4<f32>,
    b: vec4<f32>,
    kk: f32,
    qq: f32,
    kq: f32,
}

fn table_word(i: u32) -> u32 {
    return tables[i / 4u][i % 4u];
}

fn softplus(x: f32) -> f32 {
    if (x > 20.0) {
        return x;
    }
    return log(1.0 + exp(x));
}

fn row_of(p: Place, r: u32) -> u32 {
    return p.row_lane + ROW_LANES * r;
}

// vec4 index of row r of the invocation in the slice whose state starts at vec4 `base`.
fn slice_vec(base: u32, p: Place, r: u32) -> u32 {
    if (V_FIRST) {
        return base + (p.v0 + row_of(p, r)) * (K_DIM / 4u) + p.lane_vec;
    }
    return base + row_of(p, r) * (params.value_dim / 4u) + p.v0 / 4u + p.lane_vec;
}

fn load_row(base: u32, p: Place, r: u32) -> vec4<f32> {
    if (r >= ROWS_PER_THREAD) {
        return vec4<f32>(0.0);
    }
    return pool[slice_vec(base, p, r)];
}

fn store_pool_row(base: u32, p: Place, r: u32, x: vec4<f32>) {
    if (r < ROWS_PER_THREAD) {
        pool[slice_vec(base, p, r)] = x;
    }
}

fn store_token_row(base: u32, p: Place, r: u32, x: vec4<f32>) {
    if (r < ROWS_PER_THREAD) {
        token_states[slice_vec(base, p, r)] = x;
    }
}

fn vec4_at(buffer_is_k: bool, i: u32) -> vec4<f32> {
    if (buffer_is_k) {
        return vec4<f32>(k_s[i], k_s[i + 1u], k_s[i + 2u], k_s[i + 3u]);
    }
    return vec4<f32>(q_s[i], q_s[i + 1u], q_s[i + 2u], q_s[i + 3u]);
}

// K-first: row r holds 4 columns at one k; accumulate its products with k and q.
fn k_first_sums(acc: RowSums, s: vec4<f32>, p: Place, r: u32, k_base: u32) -> RowSums {
    if (r >= ROWS_PER_THREAD) {
        return acc;
    }
    let row = row_of(p, r);
    let kx = k_s[k_base + row];
    let qx = q_s[row];
    return RowSums(acc.a + s * kx, acc.b + s * qx, acc.kk + kx * kx, acc.qq + qx * qx, acc.kq + kx * qx);
}

// V-first: row r holds 4 k of one column; its dot products are that column's partials.
fn v_first_partials(s: vec4<f32>, p: Place, r: u32, out: u32, k_vec: vec4<f32>, q_vec: vec4<f32>) {
    if (r < ROWS_PER_THREAD) {
        let row = row_of(p, r);
        partials[out + row] = dot(s, k_vec);
        partials[out + V_BLOCK + row] = dot(s, q_vec);
    }
}

// S ← α S + k uᵀ on row r. K-first: k is one scalar of the row, u a vec4 of columns;
// V-first: k is the vec4 of the row, u one scalar.
fn update_row(s: vec4<f32>, p: Place, r: u32, k_base: u32, alpha: f32, rk: f32, u_vec: vec4<f32>, k_normed: vec4<f32>) -> vec4<f32> {
    if (r >= ROWS_PER_THREAD) {
        return s;
    }
    let row = row_of(p, r);
    if (V_FIRST) {
        return alpha * s + k_normed * u_s[row];
    }
    return alpha * s + (k_s[k_base + row] * rk) * u_vec;
}

@compute @workgroup_size(WG)
fn recurrent_step(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {
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

    let p = Place(t % ROW_VECS, t / ROW_VECS, wid.x * V_BLOCK);
    let slice_words = K_DIM * v_dim / 4u;

    var s0 = vec4<f32>(0.0);
    var s1 = vec4<f32>(0.0);
    var s2 = vec4<f32>(0.0);
    var s3 = vec4<f32>(0.0);
    var s4 = vec4<f32>(0.0);
    var s5 = vec4<f32>(0.0);
    var s6 = vec4<f32>(0.0);
    var s7 = vec4<f32>(0.0);
    if (code >= 0 && write_slot >= 0) {
        let base = (u32(code) * hv_count + hv) * slice_words;
        s0 = load_row(base, p, 0u);
        s1 = load_row(base, p, 1u);
        s2 = load_row(base, p, 2u);
        s3 = load_row(base, p, 3u);
        s4 = load_row(base, p, 4u);
        s5 = load_row(base, p, 5u);
        s6 = load_row(base, p, 6u);
        s7 = load_row(base, p, 7u);
    }

    for (var tok = start; tok < end; tok++) {
        // Stage the token's inputs. Every reader of the previous token's q_s, v_s and gate_s
        // passed at least one barrier since; k_s alternates halves by token parity.
        let k_base = (tok % 2u) * K_DIM;
        let qk_row = (tok * params.heads_qk + h) * K_DIM;
        for (var i = t; i < K_DIM; i += WG) {
            k_s[k_base + i] = elem_to_f32(k_buf[qk_row + i]);
            q_s[i] = elem_to_f32(q_buf[qk_row + i]);
        }
        let v_row = (tok * hv_count + hv) * v_dim + p.v0;
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
        var k_vec = vec4<f32>(0.0);
        if (V_FIRST) {
            k_vec = vec4_at(true, k_base + 4u * p.lane_vec);
            let q_vec = vec4_at(false, 4u * p.lane_vec);
            let out = p.lane_vec * RESULTS;
            v_first_partials(s0, p, 0u, out, k_vec, q_vec);
            v_first_partials(s1, p, 1u, out, k_vec, q_vec);
            v_first_partials(s2, p, 2u, out, k_vec, q_vec);
            v_first_partials(s3, p, 3u, out, k_vec, q_vec);
            v_first_partials(s4, p, 4u, out, k_vec, q_vec);
            v_first_partials(s5, p, 5u, out, k_vec, q_vec);
            v_first_partials(s6, p, 6u, out, k_vec, q_vec);
            v_first_partials(s7, p, 7u, out, k_vec, q_vec);
            if (p.row_lane == 0u) {
                partials[out + 2u * V_BLOCK] = dot(k_vec, k_vec);
                partials[out + 2u * V_BLOCK + 1u] = dot(q_vec, q_vec);
                partials[out + 2u * V_BLOCK + 2u] = dot(k_vec, q_vec);
            }
        } else {
            var acc = RowSums(vec4<f32>(0.0), vec4<f32>(0.0), 0.0, 0.0, 0.0);
            acc = k_first_sums(acc, s0, p, 0u, k_base);
            acc = k_first_sums(acc, s1, p, 1u, k_base);
            acc = k_first_sums(acc, s2, p, 2u, k_base);
            acc = k_first_sums(acc, s3, p, 3u, k_base);
            acc = k_first_sums(acc, s4, p, 4u, k_base);
            acc = k_first_sums(acc, s5, p, 5u, k_base);
            acc = k_first_sums(acc, s6, p, 6u, k_base);
            acc = k_first_sums(acc, s7, p, 7u, k_base);
            let out = p.row_lane * RESULTS + 4u * p.lane_vec;
            partials[out] = acc.a.x;
            partials[out + 1u] = acc.a.y;
            partials[out + 2u] = acc.a.z;
            partials[out + 3u] = acc.a.w;
            partials[out + V_BLOCK] = acc.b.x;
            partials[out + V_BLOCK + 1u] = acc.b.y;
            partials[out + V_BLOCK + 2u] = acc.b.z;
            partials[out + V_BLOCK + 3u] = acc.b.w;
            if (p.lane_vec == 0u) {
                let tail = p.row_lane * RESULTS + 2u * V_BLOCK;
                partials[tail] = acc.kk;
                partials[tail + 1u] = acc.qq;
                partials[tail + 2u] = acc.kq;
            }
        }
        workgroupBarrier();

        for (var i = t; i < RESULTS; i += WG) {
            var total = 0.0;
            for (var l = 0u; l < LANES; l++) {
                total += partials[l * RESULTS + i];
            }
            sums[i] = total;
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

        // S ← α S + k uᵀ from registers, u_s and this token's half of k_s.
        var u_vec = vec4<f32>(0.0);
        if (!V_FIRST) {
            let u0 = 4u * p.lane_vec;
            u_vec = vec4<f32>(u_s[u0], u_s[u0 + 1u], u_s[u0 + 2u], u_s[u0 + 3u]);
        }
        let k_normed = k_vec * rk;
        s0 = update_row(s0, p, 0u, k_base, alpha, rk, u_vec, k_normed);
        s1 = update_row(s1, p, 1u, k_base, alpha, rk, u_vec, k_normed);
        s2 = update_row(s2, p, 2u, k_base, alpha, rk, u_vec, k_normed);
        s3 = update_row(s3, p, 3u, k_base, alpha, rk, u_vec, k_normed);
        s4 = update_row(s4, p, 4u, k_base, alpha, rk, u_vec, k_normed);
        s5 = update_row(s5, p, 5u, k_base, alpha, rk, u_vec, k_normed);
        s6 = update_row(s6, p, 6u, k_base, alpha, rk, u_vec, k_normed);
        s7 = update_row(s7, p, 7u, k_base, alpha, rk, u_vec, k_normed);
        if (PER_TOKEN_STATES) {
            let base = (tok * hv_count + hv) * slice_words;
            store_token_row(base, p, 0u, s0);
            store_token_row(base, p, 1u, s1);
            store_token_row(base, p, 2u, s2);
            store_token_row(base, p, 3u, s3);
            store_token_row(base, p, 4u, s4);
            store_token_row(base, p, 5u, s5);
            store_token_row(base, p, 6u, s6);
            store_token_row(base, p, 7u, s7);
        }
    }

    if (write_slot >= 0) {
        let base = (u32(write_slot) * hv_count + hv) * slice_words;
        store_pool_row(base, p, 0u, s0);
        store_pool_row(base, p, 1u, s1);
        store_pool_row(base, p, 2u, s2);
        store_pool_row(base, p, 3u, s3);
        store_pool_row(base, p, 4u, s4);
        store_pool_row(base, p, 5u, s5);
        store_pool_row(base, p, 6u, s6);
        store_pool_row(base, p, 7u, s7);
    }
}
