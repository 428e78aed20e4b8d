// state_chain_coop: the sequential chain of the split coop forward (GDN_SCAN_SPLIT=on). Same
// layout and math as state_scan_coop.wgsl, minus everything that does not feed the state:
// per chunk of ≤ 64 tokens it computes only
//     U  = K S,   W = V − γ ⊙ U,   V' = (Γ ⊙ A ⊙ β_col) W
//     S  ← γ_C S + Kᵀ ((γ_C/γ) ⊙ V')
// and, with STORE_CHUNKS, writes the chunk-start state S (f16, exactly the operand the one-pass
// scan multiplies by γ ⊙ Q) and V' (f16, its operand of Γ ⊙ Q Kᵀ) to global memory, so that
// chunk_output_coop computes o = scale · ((γ ⊙ Q) S + (Γ ⊙ Q Kᵀ) V') for every chunk at once.
// Without STORE_CHUNKS (the segmented forward's end-state and transition scans, whose o is
// discarded) it writes only the end states. No γ ⊙ Q rows, no O accumulators, no gated
// QKᵀ rows: fewer registers and instructions per chunk on the chain, four fewer barriers.
//
// Partial chunks, padding rows and naga's rules: as in state_scan_coop.wgsl. V' is stored for
// the chunk's valid rows only (the rows after them belong to the next chunk or sequence).

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> k16: array<K16>;                 // [B·T + 64, H, K]
@group(0) @binding(2) var<storage, read> v_buf: array<Elem>;              // [B·T, HV, V]
@group(0) @binding(3) var<storage, read> gate_beta: array<vec2<f32>>;     // [B·T, HV]: (G, β)
@group(0) @binding(4) var<storage, read> gated16: array<f16>;             // [B·T + 64, HV, 128]
@group(0) @binding(5) var<storage, read> segments: array<u32>;            // start, length, state slot (per segment, or per (segment, v-head))
override SEGMENTS_PER_HEAD: bool = false;
override STORE_CHUNKS: bool = true;
@group(0) @binding(6) var<storage, read_write> state_slots: array<f32>;     // [slots, HV, K, V] or V-first
@group(0) @binding(7) var<storage, read> chunk_base: array<u32>;          // per segment: the ordinal of its first chunk
@group(0) @binding(8) var<storage, read_write> states16: array<f16>;      // [chunks, HV, K, V]: chunk-start states
@group(0) @binding(9) var<storage, read_write> vprime16: array<f16>;      // [B·T + 64, HV, V]: V'

const BV: u32 = 32u;        // V-block width
const KD: u32 = 128u;       // key dimension (the state tiles below are named registers)
const WG: u32 = 128u;       // invocations

// Rows of the workgroup tiles are padded (BV = 32 → 40 elements: 80 B for f16, 160 B for f32)
// so that the 16-row cooperative loads and stores spread over the banks instead of hitting
// the same few (rows 64 B or 128 B apart alias).
const SP: u32 = 40u;        // row pitch of s16 and x16 (f16)
const FP: u32 = 40u;        // row pitch of stage (f32)

var<workgroup> s16: array<f16, 128u * SP>;   // S rounded to f16, [K][BV]
var<workgroup> x16: array<f16, 64u * SP>;    // W, then (γ_C/γ) ⊙ V', [64][BV]
var<workgroup> stage: array<f32, 128u * FP>; // f32 staging: U, V' ([64][BV]); or S ([K][BV])
var<workgroup> zero: array<f32, 256>;
var<workgroup> gam: array<f32, 64>;          // γ_i = exp(G_i)
var<workgroup> dec: array<f32, 64>;          // γ_C/γ_i, 0 past the chunk

// Element n of this invocation's V column (chunk row t / BV + n·128/BV), 0 past the chunk.
fn v_or_zero(row0: u32, n: u32, lim: u32, step: u32) -> f32 {
    let inside = n * (WG / BV) < lim;
    let i = select(row0, row0 + n * step, inside);
    return select(0.0, load_elem(v_buf[elem_word(i)], i), inside);
}

// Element (t / BV + n·128/BV, t % BV) of W = V − γ ⊙ U (U in stage).
fn w_elem(t: u32, n: u32, v: f32, lim: u32) {
    let e = t + WG * n;
    let row = e / BV;
    let col = e % BV;
    x16[row * SP + col] = f16(select(0.0, v - gam[row] * stage[row * FP + col], n * (WG / BV) < lim));
}

// Elements n0 .. n0 + 3 of this invocation's V column (see v_or_zero).
fn v_four(row0: u32, n0: u32, lim: u32, step: u32) -> vec4<f32> {
    return vec4<f32>(v_or_zero(row0, n0, lim, step), v_or_zero(row0, n0 + 1u, lim, step),
                     v_or_zero(row0, n0 + 2u, lim, step), v_or_zero(row0, n0 + 3u, lim, step));
}

// S (subgroup g's tiles s{a}{b}: state rows 32 g + 16 a, columns 16 b) → stage → s16, and
// with `store` to states16 from `dst` (the chunk's state at this workgroup's v-head and
// V-block). Call from uniform control flow (it holds barriers).
fn publish(t: u32, sg: u32, s00: coop_mat16x16<f32, C>, s01: coop_mat16x16<f32, C>,
           s10: coop_mat16x16<f32, C>, s11: coop_mat16x16<f32, C>, store: bool, dst: u32,
           vd: u32) {
    let base = 32u * FP * sg;
    store_tile(s00, base);
    store_tile(s01, base + 16u);
    store_tile(s10, base + 16u * FP);
    store_tile(s11, base + 16u * FP + 16u);
    workgroupBarrier();
    for (var n = 0u; n < BV; n++) {
        let e = t + WG * n;
        let row = e / BV;
        let col = e % BV;
        let x = f16(stage[row * FP + col]);
        s16[row * SP + col] = x;
        if (store) {
            states16[dst + row * vd + col] = x;
        }
    }
    workgroupBarrier();
}

@compute @workgroup_size(128)
fn state_chain_coop(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let seg = wid.x;
    let hv = wid.y;
    let v0 = wid.z * BV;
    let sg = t / 32u;
    let hv_count = heads_v_count();
    let vd = params.value_dim;
    let hqk = hv / (hv_count / heads_qk_count());
    k_begin(hqk);
    let gstride = hv_count * 2u * CHUNK;    // token stride of gated16
    // A table with a row per (segment, v-head) (segment_window's) may give a pair length 0:
    // no chunks, the state stored back as loaded (naga rejects an early return before
    // cooperative ops: it counts storage loads as non-uniform).
    let seg_row = select(seg, seg * hv_count + hv, SEGMENTS_PER_HEAD);
    let seg_start = segments[3u * seg_row];
    let seg_len = segments[3u * seg_row + 1u];
    let slot = segments[3u * seg_row + 2u];
    let sbase = (slot * hv_count + hv) * KD * vd;
    let n_chunks = (seg_len + CHUNK - 1u) / CHUNK;
    // Chunk ordinal `o`'s state at this v-head and V-block starts at o·chunk_stride + cbase.
    let chunk_stride = hv_count * KD * vd;
    var first_chunk = 0u;
    if (STORE_CHUNKS) {
        first_chunk = chunk_base[seg_row];
    }
    let cbase = hv * KD * vd + v0;
    let store0 = STORE_CHUNKS && n_chunks > 0u;

    zero[t] = 0.0;
    zero[t + WG] = 0.0;
    workgroupBarrier();

    // This subgroup's state tiles s{a}{b}: key rows r0 + 16a, value columns v0 + 16b.
    let r0 = 32u * sg;
    var s00 = state_load(sbase, r0, v0);
    var s01 = state_load(sbase, r0, v0 + 16u);
    var s10 = state_load(sbase, r0 + 16u, v0);
    var s11 = state_load(sbase, r0 + 16u, v0 + 16u);
    let dst0 = first_chunk * chunk_stride + cbase;
    // The first chunk's K (staged variant: to workgroup memory; the publish's barriers order it).
    k_store(t, k_fetch(t, seg_start));
    publish(t, sg, s00, s01, s10, s11, store0, dst0, vd);

    // This invocation's elements of V: column t % BV, rows t / BV + n·(128/BV).
    let vstep = (WG / BV) * hv_count * vd;
    let ui = 16u * sg * FP;                 // this subgroup's row tile in `stage`
    // This chunk's rows of K, the A operands of K S: loaded one chunk ahead (the loads of
    // chunk c + 1 are issued during chunk c's state update).
    var ka0 = k_rows(seg_start, 16u * sg, 0u);
    var ka1 = k_rows(seg_start, 16u * sg, 16u);
    var ka2 = k_rows(seg_start, 16u * sg, 32u);
    var ka3 = k_rows(seg_start, 16u * sg, 48u);
    var ka4 = k_rows(seg_start, 16u * sg, 64u);
    var ka5 = k_rows(seg_start, 16u * sg, 80u);
    var ka6 = k_rows(seg_start, 16u * sg, 96u);
    var ka7 = k_rows(seg_start, 16u * sg, 112u);
    // This chunk's gates and V elements, loaded one chunk ahead like the K rows.
    let seg_end = seg_start + seg_len;
    let len0 = min(CHUNK, seg_len);
    // (A row of length 0 reads a clamped token's gates and never uses them.)
    let last_token = max(params.total_tokens, 1u) - 1u;
    let tok_last = min(seg_start + max(len0, 1u) - 1u, last_token);
    let tok_row = min(seg_start + min(t % CHUNK, max(len0, 1u) - 1u), last_token);
    var g_last = gate_beta[tok_last * hv_count + hv].x;
    var g_row = gate_beta[tok_row * hv_count + hv].x;
    let vrow0 = ((seg_start + t / BV) * hv_count + hv) * vd + v0 + t % BV;
    let lim0 = select(0u, len0 - t / BV, len0 > t / BV);
    var va = v_four(vrow0, 0u, lim0, vstep);
    var vb = v_four(vrow0, 4u, lim0, vstep);
    var vc = v_four(vrow0, 8u, lim0, vstep);
    var vdd = v_four(vrow0, 12u, lim0, vstep);
    for (var c = 0u; c < n_chunks; c++) {
        let start = seg_start + c * CHUNK;
        let len = min(CHUNK, seg_end - start);
        // The next chunk (this one again after the last: a tile must stay inside its buffer).
        let next = select(start, start + CHUNK, c + 1u < n_chunks);
        if (t < CHUNK) {
            gam[t] = exp(g_row);
            dec[t] = select(0.0, exp(g_last - g_row), t < len);
        }
        let lim = select(0u, len - t / BV, len > t / BV);

        // U = K S, row tile sg, both column tiles (written out: every operand is a named
        // register, loaded before its products).
        var u0 = zero_acc();
        var u1 = zero_acc();
        let b00 = s_tile(0u, 0u);
        let b01 = s_tile(0u, 1u);
        let b10 = s_tile(1u, 0u);
        let b11 = s_tile(1u, 1u);
        let b20 = s_tile(2u, 0u);
        let b21 = s_tile(2u, 1u);
        let b30 = s_tile(3u, 0u);
        let b31 = s_tile(3u, 1u);
        u0 = coopMultiplyAdd(ka0, b00, u0);
        u1 = coopMultiplyAdd(ka0, b01, u1);
        u0 = coopMultiplyAdd(ka1, b10, u0);
        u1 = coopMultiplyAdd(ka1, b11, u1);
        u0 = coopMultiplyAdd(ka2, b20, u0);
        u1 = coopMultiplyAdd(ka2, b21, u1);
        u0 = coopMultiplyAdd(ka3, b30, u0);
        u1 = coopMultiplyAdd(ka3, b31, u1);
        let b40 = s_tile(4u, 0u);
        let b41 = s_tile(4u, 1u);
        let b50 = s_tile(5u, 0u);
        let b51 = s_tile(5u, 1u);
        let b60 = s_tile(6u, 0u);
        let b61 = s_tile(6u, 1u);
        let b70 = s_tile(7u, 0u);
        let b71 = s_tile(7u, 1u);
        u0 = coopMultiplyAdd(ka4, b40, u0);
        u1 = coopMultiplyAdd(ka4, b41, u1);
        u0 = coopMultiplyAdd(ka5, b50, u0);
        u1 = coopMultiplyAdd(ka5, b51, u1);
        u0 = coopMultiplyAdd(ka6, b60, u0);
        u1 = coopMultiplyAdd(ka6, b61, u1);
        u0 = coopMultiplyAdd(ka7, b70, u0);
        u1 = coopMultiplyAdd(ka7, b71, u1);
        // Staged variant: the next chunk's K words, in flight until k_store below.
        let k_next = k_fetch(t, next);

        // The rest of this chunk's global operands, issued now so that they arrive during
        // the W step: the gated A rows and the Kᵀ tiles of the state update.
        let grow = (start + 16u * sg) * gstride + hv * 2u * CHUNK;
        let ga0 = gated_rows(grow, gstride);
        let ga1 = gated_rows(grow + 16u, gstride);
        let ga2 = gated_rows(grow + 32u, gstride);
        let ga3 = gated_rows(grow + 48u, gstride);
        let kc00 = k_cols(start, 0u, r0);
        let kc01 = k_cols(start, 0u, r0 + 16u);
        let kc10 = k_cols(start, 16u, r0);
        let kc11 = k_cols(start, 16u, r0 + 16u);
        let kc20 = k_cols(start, 32u, r0);
        let kc21 = k_cols(start, 32u, r0 + 16u);
        let kc30 = k_cols(start, 48u, r0);
        let kc31 = k_cols(start, 48u, r0 + 16u);
        store_tile(u0, ui);
        store_tile(u1, ui + 16u);
        workgroupBarrier();

        // W = V − γ ⊙ U (0 past the chunk).
        w_elem(t, 0u, va.x, lim);
        w_elem(t, 1u, va.y, lim);
        w_elem(t, 2u, va.z, lim);
        w_elem(t, 3u, va.w, lim);
        w_elem(t, 4u, vb.x, lim);
        w_elem(t, 5u, vb.y, lim);
        w_elem(t, 6u, vb.z, lim);
        w_elem(t, 7u, vb.w, lim);
        w_elem(t, 8u, vc.x, lim);
        w_elem(t, 9u, vc.y, lim);
        w_elem(t, 10u, vc.z, lim);
        w_elem(t, 11u, vc.w, lim);
        w_elem(t, 12u, vdd.x, lim);
        w_elem(t, 13u, vdd.y, lim);
        w_elem(t, 14u, vdd.z, lim);
        w_elem(t, 15u, vdd.w, lim);
        workgroupBarrier();

        // V' = (Γ ⊙ A ⊙ β_col) W. All four column blocks: cooperative ops need uniform
        // control flow, and the blocks above the diagonal are zero.
        var d0 = zero_acc();
        var d1 = zero_acc();
        let w00 = x_tile(0u, 0u);
        let w01 = x_tile(0u, 1u);
        let w10 = x_tile(1u, 0u);
        let w11 = x_tile(1u, 1u);
        let w20 = x_tile(2u, 0u);
        let w21 = x_tile(2u, 1u);
        let w30 = x_tile(3u, 0u);
        let w31 = x_tile(3u, 1u);
        d0 = coopMultiplyAdd(ga0, w00, d0);
        d1 = coopMultiplyAdd(ga0, w01, d1);
        d0 = coopMultiplyAdd(ga1, w10, d0);
        d1 = coopMultiplyAdd(ga1, w11, d1);
        d0 = coopMultiplyAdd(ga2, w20, d0);
        d1 = coopMultiplyAdd(ga2, w21, d1);
        d0 = coopMultiplyAdd(ga3, w30, d0);
        d1 = coopMultiplyAdd(ga3, w31, d1);
        // Every Kᵀ tile of this chunk is read (before the barriers above); the barrier below
        // orders the next chunk's K before its first K tile read.
        k_store(t, k_next);
        store_tile(d0, ui);
        store_tile(d1, ui + 16u);
        workgroupBarrier();

        // V' to global (the chunk's rows) and (γ_C/γ) ⊙ V' in f16 over W for the state update
        // (dec is 0 past the chunk). The next chunk's K rows are in flight meanwhile.
        ka0 = k_rows(next, 16u * sg, 0u);
        ka1 = k_rows(next, 16u * sg, 16u);
        ka2 = k_rows(next, 16u * sg, 32u);
        ka3 = k_rows(next, 16u * sg, 48u);
        ka4 = k_rows(next, 16u * sg, 64u);
        ka5 = k_rows(next, 16u * sg, 80u);
        ka6 = k_rows(next, 16u * sg, 96u);
        ka7 = k_rows(next, 16u * sg, 112u);
        let gamma_c = exp(g_last);
        let next_len = min(CHUNK, seg_end - next);
        g_last = gate_beta[(next + next_len - 1u) * hv_count + hv].x;
        g_row = gate_beta[(next + min(t % CHUNK, next_len - 1u)) * hv_count + hv].x;
        let vrow = ((next + t / BV) * hv_count + hv) * vd + v0 + t % BV;
        let next_lim = select(0u, next_len - t / BV, next_len > t / BV);
        va = v_four(vrow, 0u, next_lim, vstep);
        vb = v_four(vrow, 4u, next_lim, vstep);
        vc = v_four(vrow, 8u, next_lim, vstep);
        vdd = v_four(vrow, 12u, next_lim, vstep);
        for (var n = 0u; n < BV / 2u; n++) {
            let e = t + WG * n;
            let row = e / BV;
            let col = e % BV;
            let x = stage[row * FP + col];
            if (STORE_CHUNKS && row < len) {
                vprime16[((start + row) * hv_count + hv) * vd + v0 + col] = f16(x);
            }
            x16[row * SP + col] = f16(x * dec[row]);
        }
        workgroupBarrier();

        // S ← γ_C S + Kᵀ ((γ_C/γ) ⊙ V').
        s00 = gamma_c * s00;
        s01 = gamma_c * s01;
        s10 = gamma_c * s10;
        s11 = gamma_c * s11;
        let y00 = x_tile(0u, 0u);
        let y01 = x_tile(0u, 1u);
        let y10 = x_tile(1u, 0u);
        let y11 = x_tile(1u, 1u);
        let y20 = x_tile(2u, 0u);
        let y21 = x_tile(2u, 1u);
        let y30 = x_tile(3u, 0u);
        let y31 = x_tile(3u, 1u);
        s00 = coopMultiplyAdd(kc00, y00, s00);
        s01 = coopMultiplyAdd(kc00, y01, s01);
        s10 = coopMultiplyAdd(kc01, y00, s10);
        s11 = coopMultiplyAdd(kc01, y01, s11);
        s00 = coopMultiplyAdd(kc10, y10, s00);
        s01 = coopMultiplyAdd(kc10, y11, s01);
        s10 = coopMultiplyAdd(kc11, y10, s10);
        s11 = coopMultiplyAdd(kc11, y11, s11);
        s00 = coopMultiplyAdd(kc20, y20, s00);
        s01 = coopMultiplyAdd(kc20, y21, s01);
        s10 = coopMultiplyAdd(kc21, y20, s10);
        s11 = coopMultiplyAdd(kc21, y21, s11);
        s00 = coopMultiplyAdd(kc30, y30, s00);
        s01 = coopMultiplyAdd(kc30, y31, s01);
        s10 = coopMultiplyAdd(kc31, y30, s10);
        s11 = coopMultiplyAdd(kc31, y31, s11);
        if (c + 1u < n_chunks) {
            let dst = (first_chunk + c + 1u) * chunk_stride + cbase;
            publish(t, sg, s00, s01, s10, s11, STORE_CHUNKS, dst, vd);
        }
    }

    state_store(s00, sbase, r0, v0);
    state_store(s01, sbase, r0, v0 + 16u);
    state_store(s10, sbase, r0 + 16u, v0);
    state_store(s11, sbase, r0 + 16u, v0 + 16u);
}
