// state_scan: the sequential inter-chunk pass. One workgroup (256 invocations) per
// (segment, v-head, V-block) walks the segment's chunks with its f32 state slice S
// (K × V_BLOCK) in registers, and per chunk of ≤ 64 tokens computes (FlashQLA's form, no w/u
// materialisation):
//     U  = K S,   QS = Q S                                  (K, Q streamed in 16-column slices)
//     W  = V − γ ⊙ U
//     V' = (Γ ⊙ A ⊙ β_col) W
//     O  = scale · (γ ⊙ QS + (Γ ⊙ Q Kᵀ) V')
// where Γ ⊙ A ⊙ β_col and Γ ⊙ Q Kᵀ come precomputed from wy_inverse (parallel over chunks),
// so the sequential path holds only the state-dependent work.
//     S  ← γ_C S + Kᵀ ((γ_C/γ) ⊙ V')                         (K streamed in 8-token slices)
// with γ = exp(G), Γ_ij = exp(G_i − G_j) for j ≤ i (exponentiated only there, so every
// exponent is ≤ 0), γ_C = exp(G_last). A segment starts from the state in `state[slot]` and
// leaves its end state there: a segment is the unit of sequence parallelism.
//
// Register tiling: invocation (r, c) = (t / 16, t % 16) owns rows 4r..4r+3 of every 64-row
// tile and columns c + 16j (j < TC = V_BLOCK / 16) of the V-block, and rows 4r + ii + 64kb of
// the state. Each shared-memory load feeds several FMAs. Tiles are named vec4 registers (one
// per row, lanes = columns), never private arrays indexed in loops: drivers do not reliably
// unroll naga's loops, and an indexed private array then lives in slow local memory.
//
// Partial chunks: rows past the end load k = q = v = 0 and zero gated matrices, with
// G = G_last, so they contribute nothing and γ_C/γ = 1 there. Columns past V (when V is not a multiple of
// V_BLOCK) are computed on zeros and never stored.
//
// Workgroup memory (`ARENA` slots of type `Operand` from the host, see
// `tuning::state_scan_arena_words`): the W/V' tile (64 × V_BLOCK), then one region reused by
// the phases: the K/Q/S slices of the first GEMMs, the packed lower triangle (2080 slots) of
// Γ⊙A⊙β and of Γ⊙QKᵀ, and the T_SLICE-token K slices of the state update (T_SLICE·K ≤ 1024).
//
// Operand arithmetic: a family snippet sets `Operand`, the type of everything in workgroup
// memory, and the steps of the triangle loops and the state update (`STEP` rows or tokens at
// a time: `tile_rows`, `tri_coefs`, `decayed_rows`, `token_krows`, `mac`).
// forward/scan_operand_f32.wgsl (the scalar path): f32, one row per step, exactly the scalar
// loops. forward/scan_operand_f16.wgsl (the f16-math path): f16 operands multiplied in f16,
// four rows per step, each four-term f16 sum converted to f32 and accumulated in f32; the
// state registers, the gates and o stay f32. The f16 arena is half the bytes of the f32 one.
//
// Latency: global loads are issued in batches (clamped indices, masked results) and the next
// K/Q slice is fetched into registers while the current one is used, because the scan is
// latency-bound: one workgroup per SM walks its chunks one after another. At V_BLOCK = 16 it is under WebGPU's default 16 KiB.

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> q_buf: array<Elem>;              // [B·T, H, K]
@group(0) @binding(2) var<storage, read> k_buf: array<Elem>;              // [B·T, H, K]
@group(0) @binding(3) var<storage, read> v_buf: array<Elem>;              // [B·T, HV, V]
@group(0) @binding(4) var<storage, read> gate_beta: array<vec2<f32>>;     // [B·T, HV]: (G, β)
@group(0) @binding(5) var<storage, read> gated: array<f32>;               // [B·T, HV, 128]: Γ⊙A⊙β | Γ⊙QKᵀ
@group(0) @binding(6) var<storage, read> segments: array<u32>;            // start, length, state slot (per segment, or per (segment, v-head))
@group(0) @binding(7) var<storage, read_write> state: array<f32>;         // [slots, HV, K, V] or V-first
@group(0) @binding(8) var<storage, read_write> o_buf: array<Elem>;        // [B·T, HV, V]

override K_DIM: u32;
override V_BLOCK: u32;                    // 16, 32 or 64
override ARENA: u32;
override TC: u32 = V_BLOCK / 16u;         // columns per invocation: 1, 2 or 4
override KB: u32 = (K_DIM + 63u) / 64u;   // 64-row state blocks: 1..4
const K_SLICE: u32 = 16u;
const K_PITCH: u32 = 68u;                 // pitch of the transposed K/Q slices ([kk][row], 16-byte aligned)
override T_SLICE: u32;                   // tokens per K slice of the state update (T_SLICE·K ≤ 1024)
override T_PITCH: u32 = K_DIM + 4u;      // 16-byte aligned rows
override SEGMENTS_PER_HEAD: bool = false; // `segments` has a row per (segment, v-head)

var<workgroup> arena: array<Operand, ARENA>;
var<workgroup> gam_s: array<f32, 64>;  // γ_i = exp(G_i)
var<workgroup> dec_s: array<f32, 64>;  // γ_C/γ_i = exp(G_last − G_i)

// Element i of q, k, v as f32, whatever the storage dtype.
fn q_at(i: u32) -> f32 {
    return load_elem(q_buf[elem_word(i)], i);
}

fn k_at(i: u32) -> f32 {
    return load_elem(k_buf[elem_word(i)], i);
}

fn v_at(i: u32) -> f32 {
    return load_elem(v_buf[elem_word(i)], i);
}

fn tri(i: u32, j: u32) -> u32 {
    return i * (i + 1u) / 2u + j;
}

// Entry (i, j) of a packed lower triangle at `base`, 0 above the diagonal.
fn tri_or_zero(base: u32, i: u32, j: u32) -> Operand {
    return select(0.0, arena[base + tri(i, min(j, i))], j <= i);
}

// The invocation's columns c + 16 j (j < TC) of a V-block row at `base`; other lanes 0.
// Rows of V-block tiles in workgroup memory are stored column-permuted (column c + 16 j at
// c·TC + j), so an invocation's TC columns are adjacent and read as one wide load.
fn cols4(base: u32, c: u32) -> vec4<Operand> {
    let at = base + c * TC;
    var x = vec4<Operand>(arena[at], 0.0, 0.0, 0.0);
    if (TC > 1u) {
        x.y = arena[at + 1u];
    }
    if (TC > 2u) {
        x.z = arena[at + 2u];
        x.w = arena[at + 3u];
    }
    return x;
}

fn store_cols4(base: u32, c: u32, x: vec4<f32>) {
    let at = base + c * TC;
    arena[at] = Operand(x.x);
    if (TC > 1u) {
        arena[at + 1u] = Operand(x.y);
    }
    if (TC > 2u) {
        arena[at + 2u] = Operand(x.z);
        arena[at + 3u] = Operand(x.w);
    }
}

// Rows row0..row0+3 at column kk of a transposed slice ([kk][row], pitch K_PITCH): adjacent.
fn rows4(base: u32, row0: u32, kk: u32) -> vec4<Operand> {
    let at = base + kk * K_PITCH + row0;
    return vec4<Operand>(arena[at], arena[at + 1u], arena[at + 2u], arena[at + 3u]);
}

fn state_index(base: u32, k: u32, v: u32, v_first: bool) -> u32 {
    if (v_first) {
        return base + v * K_DIM + k;
    }
    return base + k * params.value_dim + v;
}

// State row k at the invocation's columns (0 outside K × V).
fn load_state(base: u32, k: u32, v0: u32, c: u32, v_first: bool) -> vec4<f32> {
    var x = vec4<f32>(0.0);
    if (k < K_DIM) {
        for (var j = 0u; j < TC; j++) {
            let v = v0 + c + 16u * j;
            if (v < params.value_dim) {
                x[j] = state[state_index(base, k, v, v_first)];
            }
        }
    }
    return x;
}

fn store_state(base: u32, k: u32, v0: u32, c: u32, v_first: bool, x: vec4<f32>) {
    if (k < K_DIM) {
        for (var j = 0u; j < TC; j++) {
            let v = v0 + c + 16u * j;
            if (v < params.value_dim) {
                state[state_index(base, k, v, v_first)] = x[j];
            }
        }
    }
}

fn publish4(dst: u32, c: u32, a: vec4<f32>, b: vec4<f32>, d: vec4<f32>, e: vec4<f32>) {
    store_cols4(dst, c, a);
    store_cols4(dst + V_BLOCK, c, b);
    store_cols4(dst + 2u * V_BLOCK, c, d);
    store_cols4(dst + 3u * V_BLOCK, c, e);
}

// Rows row0..row0+3 of the token-slice row at `base` (the state update's K values).
fn krow4(base: u32, k: u32) -> vec4<Operand> {
    return vec4<Operand>(arena[base + k], arena[base + k + 1u], arena[base + k + 2u], arena[base + k + 3u]);
}

// Row i of v at the invocation's columns, 0 past the chunk or past V. The loads are
// independent and unconditional (indices clamped in range, results masked) so they issue
// back to back instead of one round trip each.
fn load_v(base: u32, i: u32, len: u32, hv: u32, v0: u32, c: u32) -> vec4<f32> {
    let vd = params.value_dim;
    let row = ((base + min(i, len - 1u)) * params.heads_v + hv) * vd;
    let v = vec4<u32>(v0 + c, v0 + c + 16u, v0 + c + 32u, v0 + c + 48u);
    let x = vec4<f32>(v_at(row + min(v.x, vd - 1u)), v_at(row + min(v.y, vd - 1u)),
                      v_at(row + min(v.z, vd - 1u)), v_at(row + min(v.w, vd - 1u)));
    let keep = (v < vec4<u32>(vd)) & (vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(TC)) & vec4<bool>(i < len);
    return select(vec4<f32>(0.0), x, keep);
}

// Writes o at row i, columns c + 16 j, one element per word (f32, f16).
fn store_o(base: u32, i: u32, len: u32, hv: u32, v0: u32, c: u32, x: vec4<f32>) {
    if (i < len) {
        let row = ((base + i) * params.heads_v + hv) * params.value_dim;
        for (var j = 0u; j < TC; j++) {
            let v = v0 + c + 16u * j;
            if (v < params.value_dim) {
                o_buf[row + v] = pack_elem(params.scale * x[j]);
            }
        }
    }
}

// Packed storage (two elements per word): the invocation of an even column c writes the
// pair (c, c + 1); its odd neighbour's values come through workgroup memory at `xchg`.
fn share_odd_o(xchg: u32, i: u32, c: u32, x: vec4<f32>) {
    if ((c & 1u) == 1u) {
        for (var j = 0u; j < TC; j++) {
            put_f32(xchg, i * (V_BLOCK / 2u) + c / 2u + 8u * j, x[j]);
        }
    }
}

fn store_o_pairs(xchg: u32, base: u32, i: u32, len: u32, hv: u32, v0: u32, c: u32, x: vec4<f32>) {
    if ((c & 1u) == 0u && i < len) {
        let row = ((base + i) * params.heads_v + hv) * params.value_dim;
        for (var j = 0u; j < TC; j++) {
            let v = v0 + c + 16u * j;
            if (v < params.value_dim) {
                let odd = get_f32(xchg, i * (V_BLOCK / 2u) + c / 2u + 8u * j);
                o_buf[elem_word(row + v)] = pack_pair(params.scale * x[j], params.scale * odd);
            }
        }
    }
}

// Row i of a precomputed gated matrix (`half` 0: Γ⊙A⊙β, 1: Γ⊙QKᵀ) at columns c + 16 jj,
// 0 past the chunk (batched loads as in `load_v`).
fn load_gated(base: u32, i: u32, len: u32, hv: u32, c: u32, half: u32) -> vec4<f32> {
    let row = ((base + min(i, len - 1u)) * params.heads_v + hv) * 2u * CHUNK + half * CHUNK + c;
    let x = vec4<f32>(gated[row], gated[row + 16u], gated[row + 32u], gated[row + 48u]);
    return select(vec4<f32>(0.0), x, vec4<bool>(i < len));
}

// Entries j = c + 16 jj ≤ i of row i into the packed triangle at `tr`.
fn store_tri_row(tr: u32, i: u32, c: u32, x: vec4<f32>) {
    for (var jj = 0u; jj < 4u; jj++) {
        let j = c + 16u * jj;
        if (j <= i) {
            arena[tr + tri(i, j)] = Operand(x[jj]);
        }
    }
}

// Four consecutive K (or Q) values of the 64 × 16 slice at column k0: row t / 4, columns
// (t % 4)·4 … +3; 0 past the chunk.
fn load_k4(base: u32, len: u32, h: u32, k0: u32, t: u32) -> vec4<f32> {
    let i = t / 4u;
    let gi = ((base + min(i, len - 1u)) * params.heads_qk + h) * K_DIM + k0 + (t % 4u) * 4u;
    let x = vec4<f32>(k_at(gi), k_at(gi + 1u), k_at(gi + 2u), k_at(gi + 3u));
    return select(vec4<f32>(0.0), x, vec4<bool>(i < len));
}

fn load_q4(base: u32, len: u32, h: u32, k0: u32, t: u32) -> vec4<f32> {
    let i = t / 4u;
    let gi = ((base + min(i, len - 1u)) * params.heads_qk + h) * K_DIM + k0 + (t % 4u) * 4u;
    let x = vec4<f32>(q_at(gi), q_at(gi + 1u), q_at(gi + 2u), q_at(gi + 3u));
    return select(vec4<f32>(0.0), x, vec4<bool>(i < len));
}

fn store_slice4(dst: u32, t: u32, x: vec4<f32>) {
    // Element (row t / 4, column (t % 4)·4 + q) goes to [column][row].
    let at = dst + (t % 4u) * 4u * K_PITCH + t / 4u;
    arena[at] = Operand(x.x);
    arena[at + K_PITCH] = Operand(x.y);
    arena[at + 2u * K_PITCH] = Operand(x.z);
    arena[at + 3u * K_PITCH] = Operand(x.w);
}

// Four consecutive K values of the state update's T_SLICE × K token slice starting at token
// i0 (element 4t of the slice); 0 past the chunk or past the slice.
fn load_kt4(base: u32, len: u32, h: u32, i0: u32, t: u32) -> vec4<f32> {
    let e = 4u * t;
    let i = i0 + e / K_DIM;
    let ok = e < T_SLICE * K_DIM && i < len;
    let gi = ((base + min(i, len - 1u)) * params.heads_qk + h) * K_DIM + min(e % K_DIM, K_DIM - 4u);
    let x = vec4<f32>(k_at(gi), k_at(gi + 1u), k_at(gi + 2u), k_at(gi + 3u));
    return select(vec4<f32>(0.0), x, vec4<bool>(ok));
}

fn store_kt4(kt: u32, t: u32, x: vec4<f32>) {
    let e = 4u * t;
    if (e < T_SLICE * K_DIM) {
        let at = kt + (e / K_DIM) * T_PITCH + e % K_DIM;
        arena[at] = Operand(x.x);
        arena[at + 1u] = Operand(x.y);
        arena[at + 2u] = Operand(x.z);
        arena[at + 3u] = Operand(x.w);
    }
}

@compute @workgroup_size(256)
fn state_scan(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let seg = wid.x;
    let hv = wid.y;
    let v0 = wid.z * V_BLOCK;
    let hv_count = params.heads_v;
    // A table with a row per (segment, v-head) (segment_window's) may skip a pair entirely.
    let seg_row = select(seg, seg * hv_count + hv, SEGMENTS_PER_HEAD);
    let seg_start = segments[3u * seg_row];
    let seg_len = segments[3u * seg_row + 1u];
    let slot = segments[3u * seg_row + 2u];
    if (SEGMENTS_PER_HEAD && seg_len == 0u) {
        return;
    }
    let h_count = params.heads_qk;
    let h = hv / (hv_count / h_count);
    let v_first = has_flag(params.flags, FLAG_STATE_V_FIRST);

    let r = t / 16u;
    let c = t % 16u;
    let row0 = 4u * r;

    let ws = 0u;
    let kc = 64u * V_BLOCK;
    let qc = kc + K_SLICE * K_PITCH;
    let ss = qc + K_SLICE * K_PITCH;
    let tr = kc;
    let kt = kc;

    // State rows row0 + ii + 64 kb: s[4 kb + ii].
    let sb = (slot * hv_count + hv) * K_DIM * params.value_dim;
    var s0 = load_state(sb, row0, v0, c, v_first);
    var s1 = load_state(sb, row0 + 1u, v0, c, v_first);
    var s2 = load_state(sb, row0 + 2u, v0, c, v_first);
    var s3 = load_state(sb, row0 + 3u, v0, c, v_first);
    var s4 = load_state(sb, row0 + 64u, v0, c, v_first);
    var s5 = load_state(sb, row0 + 65u, v0, c, v_first);
    var s6 = load_state(sb, row0 + 66u, v0, c, v_first);
    var s7 = load_state(sb, row0 + 67u, v0, c, v_first);
    var s8 = load_state(sb, row0 + 128u, v0, c, v_first);
    var s9 = load_state(sb, row0 + 129u, v0, c, v_first);
    var s10 = load_state(sb, row0 + 130u, v0, c, v_first);
    var s11 = load_state(sb, row0 + 131u, v0, c, v_first);
    var s12 = load_state(sb, row0 + 192u, v0, c, v_first);
    var s13 = load_state(sb, row0 + 193u, v0, c, v_first);
    var s14 = load_state(sb, row0 + 194u, v0, c, v_first);
    var s15 = load_state(sb, row0 + 195u, v0, c, v_first);

    let n_chunks = (seg_len + CHUNK - 1u) / CHUNK;
    for (var ci = 0u; ci < n_chunks; ci++) {
        let base = seg_start + ci * CHUNK;
        let len = min(CHUNK, seg_len - ci * CHUNK);
        let g_last = gate_beta[(base + len - 1u) * hv_count + hv].x;
        let gam_c = exp(g_last);
        workgroupBarrier();
        if (t < CHUNK) {
            var g = g_last;
            if (t < len) {
                g = gate_beta[(base + t) * hv_count + hv].x;
            }
            gam_s[t] = exp(g);
            dec_s[t] = exp(g_last - g);
        }

        // Loads for after the GEMMs, issued now so their latency hides behind them.
        let va0 = load_v(base, row0, len, hv, v0, c);
        let va1 = load_v(base, row0 + 1u, len, hv, v0, c);
        let va2 = load_v(base, row0 + 2u, len, hv, v0, c);
        let va3 = load_v(base, row0 + 3u, len, hv, v0, c);
        let ga0 = load_gated(base, row0, len, hv, c, 0u);
        let ga1 = load_gated(base, row0 + 1u, len, hv, c, 0u);
        let ga2 = load_gated(base, row0 + 2u, len, hv, c, 0u);
        let ga3 = load_gated(base, row0 + 3u, len, hv, c, 0u);
        let gp0 = load_gated(base, row0, len, hv, c, 1u);
        let gp1 = load_gated(base, row0 + 1u, len, hv, c, 1u);
        let gp2 = load_gated(base, row0 + 2u, len, hv, c, 1u);
        let gp3 = load_gated(base, row0 + 3u, len, hv, c, 1u);

        // U = K S (u*), QS = Q S (o*) over 16-column slices of K and Q; the next slice is
        // loaded into registers while this one is used.
        var u0 = vec4<f32>(0.0); var u1 = vec4<f32>(0.0); var u2 = vec4<f32>(0.0); var u3 = vec4<f32>(0.0);
        var o0 = vec4<f32>(0.0); var o1 = vec4<f32>(0.0); var o2 = vec4<f32>(0.0); var o3 = vec4<f32>(0.0);
        var k_next = load_k4(base, len, h, 0u, t);
        var q_next = load_q4(base, len, h, 0u, t);
        for (var k0 = 0u; k0 < K_DIM; k0 += K_SLICE) {
            workgroupBarrier();
            store_slice4(kc, t, k_next);
            store_slice4(qc, t, q_next);
            if (k0 + K_SLICE < K_DIM) {
                k_next = load_k4(base, len, h, k0 + K_SLICE, t);
                q_next = load_q4(base, len, h, k0 + K_SLICE, t);
            }
            // The owners of state rows k0..k0+15 publish them.
            let in_block = k0 % 64u;
            if (row0 >= in_block && row0 - in_block < K_SLICE) {
                let dst = ss + (row0 - in_block) * V_BLOCK;
                switch (k0 / 64u) {
                    case 0u: { publish4(dst, c, s0, s1, s2, s3); }
                    case 1u: { publish4(dst, c, s4, s5, s6, s7); }
                    case 2u: { publish4(dst, c, s8, s9, s10, s11); }
                    default: { publish4(dst, c, s12, s13, s14, s15); }
                }
            }
            workgroupBarrier();
            // Four columns at a time: all loads first, then 4×4×4 products as matrices
            // (column ii of U is row row0 + ii of the tile): more independent work per step.
            for (var kk = 0u; kk < K_SLICE; kk += 4u) {
                // (In f16: four-term f16 sums, converted to f32 and accumulated in f32.)
                let kr = mat4x4<Operand>(rows4(kc, row0, kk), rows4(kc, row0, kk + 1u), rows4(kc, row0, kk + 2u), rows4(kc, row0, kk + 3u));
                let qr = mat4x4<Operand>(rows4(qc, row0, kk), rows4(qc, row0, kk + 1u), rows4(qc, row0, kk + 2u), rows4(qc, row0, kk + 3u));
                let sv = mat4x4<Operand>(cols4(ss + kk * V_BLOCK, c), cols4(ss + (kk + 1u) * V_BLOCK, c),
                                         cols4(ss + (kk + 2u) * V_BLOCK, c), cols4(ss + (kk + 3u) * V_BLOCK, c));
                let du = sv * transpose(kr);
                let dq = sv * transpose(qr);
                u0 += vec4<f32>(du[0]);
                u1 += vec4<f32>(du[1]);
                u2 += vec4<f32>(du[2]);
                u3 += vec4<f32>(du[3]);
                o0 += vec4<f32>(dq[0]);
                o1 += vec4<f32>(dq[1]);
                o2 += vec4<f32>(dq[2]);
                o3 += vec4<f32>(dq[3]);
            }
        }
        workgroupBarrier();

        // W = V − γ ⊙ U into the tile; Γ ⊙ A ⊙ β_col into the triangle.
        store_cols4(ws + row0 * V_BLOCK, c, va0 - gam_s[row0] * u0);
        store_cols4(ws + (row0 + 1u) * V_BLOCK, c, va1 - gam_s[row0 + 1u] * u1);
        store_cols4(ws + (row0 + 2u) * V_BLOCK, c, va2 - gam_s[row0 + 2u] * u2);
        store_cols4(ws + (row0 + 3u) * V_BLOCK, c, va3 - gam_s[row0 + 3u] * u3);
        store_tri_row(tr, row0, c, ga0);
        store_tri_row(tr, row0 + 1u, c, ga1);
        store_tri_row(tr, row0 + 2u, c, ga2);
        store_tri_row(tr, row0 + 3u, c, ga3);
        workgroupBarrier();

        // V' = (Γ ⊙ A ⊙ β_col) W over j ≤ i, into u* (STEP divides row0 + 4).
        u0 = vec4<f32>(0.0); u1 = vec4<f32>(0.0); u2 = vec4<f32>(0.0); u3 = vec4<f32>(0.0);
        for (var j = 0u; j < row0 + 4u; j += STEP) {
            let w = tile_rows(j, c);
            u0 = mac(u0, w, tri_coefs(tr, row0, j));
            u1 = mac(u1, w, tri_coefs(tr, row0 + 1u, j));
            u2 = mac(u2, w, tri_coefs(tr, row0 + 2u, j));
            u3 = mac(u3, w, tri_coefs(tr, row0 + 3u, j));
        }
        workgroupBarrier();
        store_cols4(ws + row0 * V_BLOCK, c, u0);
        store_cols4(ws + (row0 + 1u) * V_BLOCK, c, u1);
        store_cols4(ws + (row0 + 2u) * V_BLOCK, c, u2);
        store_cols4(ws + (row0 + 3u) * V_BLOCK, c, u3);
        store_tri_row(tr, row0, c, gp0);
        store_tri_row(tr, row0 + 1u, c, gp1);
        store_tri_row(tr, row0 + 2u, c, gp2);
        store_tri_row(tr, row0 + 3u, c, gp3);
        workgroupBarrier();

        // O = scale · (γ ⊙ QS + (Γ ⊙ Q Kᵀ) V').
        o0 *= gam_s[row0];
        o1 *= gam_s[row0 + 1u];
        o2 *= gam_s[row0 + 2u];
        o3 *= gam_s[row0 + 3u];
        for (var j = 0u; j < row0 + 4u; j += STEP) {
            let vd = tile_rows(j, c);
            o0 = mac(o0, vd, tri_coefs(tr, row0, j));
            o1 = mac(o1, vd, tri_coefs(tr, row0 + 1u, j));
            o2 = mac(o2, vd, tri_coefs(tr, row0 + 2u, j));
            o3 = mac(o3, vd, tri_coefs(tr, row0 + 3u, j));
        }
        if (ELEMS_PER_WORD == 2u) {
            // The triangle is free once everyone has finished reading it.
            workgroupBarrier();
            share_odd_o(tr, row0, c, o0);
            share_odd_o(tr, row0 + 1u, c, o1);
            share_odd_o(tr, row0 + 2u, c, o2);
            share_odd_o(tr, row0 + 3u, c, o3);
            workgroupBarrier();
            store_o_pairs(tr, base, row0, len, hv, v0, c, o0);
            store_o_pairs(tr, base, row0 + 1u, len, hv, v0, c, o1);
            store_o_pairs(tr, base, row0 + 2u, len, hv, v0, c, o2);
            store_o_pairs(tr, base, row0 + 3u, len, hv, v0, c, o3);
        } else {
            store_o(base, row0, len, hv, v0, c, o0);
            store_o(base, row0 + 1u, len, hv, v0, c, o1);
            store_o(base, row0 + 2u, len, hv, v0, c, o2);
            store_o(base, row0 + 3u, len, hv, v0, c, o3);
        }

        // S ← γ_C S + Kᵀ ((γ_C/γ) ⊙ V'), K staged in 8-token slices.
        // Blocks past KB are never touched, so the compiler can drop their registers.
        s0 *= gam_c; s1 *= gam_c; s2 *= gam_c; s3 *= gam_c;
        if (KB > 1u) {
            s4 *= gam_c; s5 *= gam_c; s6 *= gam_c; s7 *= gam_c;
        }
        if (KB > 2u) {
            s8 *= gam_c; s9 *= gam_c; s10 *= gam_c; s11 *= gam_c;
        }
        if (KB > 3u) {
            s12 *= gam_c; s13 *= gam_c; s14 *= gam_c; s15 *= gam_c;
        }
        var kt_next = load_kt4(base, len, h, 0u, t);
        for (var i0 = 0u; i0 < CHUNK; i0 += T_SLICE) {
            workgroupBarrier();
            store_kt4(kt, t, kt_next);
            if (i0 + T_SLICE < CHUNK) {
                kt_next = load_kt4(base, len, h, i0 + T_SLICE, t);
            }
            workgroupBarrier();
            // STEP tokens at a time (STEP divides T_SLICE): kx[ii] holds state row row0 + ii's
            // K values of those tokens.
            for (var di = 0u; di < T_SLICE; di += STEP) {
                let vd = decayed_rows(i0 + di, c);
                let krow = kt + di * T_PITCH;
                if (row0 < K_DIM) {
                    let kx = token_krows(krow, row0);
                    s0 = mac(s0, vd, kx[0]); s1 = mac(s1, vd, kx[1]); s2 = mac(s2, vd, kx[2]); s3 = mac(s3, vd, kx[3]);
                }
                if (KB > 1u && row0 + 64u < K_DIM) {
                    let kx = token_krows(krow, row0 + 64u);
                    s4 = mac(s4, vd, kx[0]); s5 = mac(s5, vd, kx[1]); s6 = mac(s6, vd, kx[2]); s7 = mac(s7, vd, kx[3]);
                }
                if (KB > 2u && row0 + 128u < K_DIM) {
                    let kx = token_krows(krow, row0 + 128u);
                    s8 = mac(s8, vd, kx[0]); s9 = mac(s9, vd, kx[1]); s10 = mac(s10, vd, kx[2]); s11 = mac(s11, vd, kx[3]);
                }
                if (KB > 3u && row0 + 192u < K_DIM) {
                    let kx = token_krows(krow, row0 + 192u);
                    s12 = mac(s12, vd, kx[0]); s13 = mac(s13, vd, kx[1]); s14 = mac(s14, vd, kx[2]); s15 = mac(s15, vd, kx[3]);
                }
            }
        }
    }

    store_state(sb, row0, v0, c, v_first, s0);
    store_state(sb, row0 + 1u, v0, c, v_first, s1);
    store_state(sb, row0 + 2u, v0, c, v_first, s2);
    store_state(sb, row0 + 3u, v0, c, v_first, s3);
    store_state(sb, row0 + 64u, v0, c, v_first, s4);
    store_state(sb, row0 + 65u, v0, c, v_first, s5);
    store_state(sb, row0 + 66u, v0, c, v_first, s6);
    store_state(sb, row0 + 67u, v0, c, v_first, s7);
    store_state(sb, row0 + 128u, v0, c, v_first, s8);
    store_state(sb, row0 + 129u, v0, c, v_first, s9);
    store_state(sb, row0 + 130u, v0, c, v_first, s10);
    store_state(sb, row0 + 131u, v0, c, v_first, s11);
    store_state(sb, row0 + 192u, v0, c, v_first, s12);
    store_state(sb, row0 + 193u, v0, c, v_first, s13);
    store_state(sb, row0 + 194u, v0, c, v_first, s14);
    store_state(sb, row0 + 195u, v0, c, v_first, s15);
}
