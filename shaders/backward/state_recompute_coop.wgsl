// state_recompute_coop: the backward's replay of the forward scan (state_recompute.wgsl's
// math) with its chunk GEMMs on cooperative matrices — f16 16×16×16 operands, f32
// accumulators — in the layout of the forward's coop scan (forward/state_scan_coop.wgsl: the
// same tiles, operand buffers and barriers, without Q and O). One workgroup of four 32-wide
// subgroups per (segment, v-head, V-block of BV = 32 columns) walks the segment's chunks; per
// chunk of ≤ 64 tokens:
//     states[chunk] ← S                              (the chunk-start state, f32)
//     U  = K S                                       (subgroup g: rows 16g..16g+15)
//     W  = V − γ ⊙ U,   V' = (Γ ⊙ A ⊙ β_col) W       (both kept in f32 for the gradients)
//     S  ← γ_C S + Kᵀ ((γ_C/γ) ⊙ V')                 (subgroup g: state rows 32g..32g+31)
// S lives in f32 accumulators for the whole segment and is published to workgroup memory
// rounded to f16 as the B operand of K S; the only f16 roundings are of operands (k, S, W,
// (γ_C/γ) ⊙ V', Γ⊙A⊙β); every sum is f32, and W, V' are stored from their f32 values. The
// start state of sequence n is read from the tail slot `num_chunks + n` (h0, a checkpoint or
// zeros); chunk-start states go to the slots the later passes read, in the problem's layout.
//
// Partial chunks: k16 and gated16 carry one chunk of padding rows past the window's rows, so
// tiles never leave their buffers. Rows past the chunk's end hold the next sequence's (finite)
// values or zeros: W is zeroed there and (γ_C/γ) = 0, so they contribute nothing, and neither
// W nor V' is stored there.
//
// naga: coopLoad/coopStore are column-major, coopLoadT/coopStoreT row-major; every pointer
// index is bound with `let` first; cooperative ops need uniform control flow (no early return).

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> k16: array<K16>;                 // [rows + 64, H, K]
@group(0) @binding(2) var<storage, read> v_buf: array<Elem>;              // [rows, HV, V]
@group(0) @binding(3) var<storage, read> gate_beta: array<vec2<f32>>;     // [rows, HV]: (G, β)
@group(0) @binding(4) var<storage, read> gated16: array<f16>;             // [rows + 64, HV, 128]
@group(0) @binding(5) var<storage, read> segments: array<u32>;            // start, length, first chunk, sequence
@group(0) @binding(6) var<storage, read_write> state_slots: array<f32>;     // [chunks + N, HV, K, V] (or V-first)
@group(0) @binding(7) var<storage, read_write> w_vnew: array<f32>;        // [2, rows, HV, V]: W, then V'

const BV: u32 = 32u;        // V-block width
const KD: u32 = 128u;       // key dimension
const WG: u32 = 128u;       // invocations
const SP: u32 = BV;         // row pitch of s16 and x16 (unpadded)
const FP: u32 = BV;         // row pitch of stage (unpadded)

var<workgroup> s16: array<f16, 128u * BV>;   // S rounded to f16, [K][BV]
var<workgroup> x16: array<f16, 64u * BV>;    // W, then (γ_C/γ) ⊙ V', [64][BV]
var<workgroup> stage: array<f32, 64u * BV>;  // f32 staging, [64][BV]: U, V'; or half of S
var<workgroup> zero: array<f32, 256>;
var<workgroup> gam: array<f32, 64>;          // γ_i = exp(G_i)
var<workgroup> dec: array<f32, 64>;          // γ_C/γ_i, 0 past the chunk

// Element n of this invocation's V column (chunk row t / BV + n·128/BV), 0 past the chunk.
fn v_or_zero(row0: u32, n: u32, lim: u32, step: u32) -> f32 {
    let inside = n * (WG / BV) < lim;
    let i = select(row0, row0 + n * step, inside);
    return select(0.0, load_elem(v_buf[elem_word(i)], i), inside);
}

// Element (t / BV + n·128/BV, t % BV) of W = V − γ ⊙ U (U in stage): f16 into x16 (0 past
// the chunk), f32 to W's rows in the chunk (`wrow`: this invocation's first).
fn w_elem(t: u32, n: u32, v: f32, lim: u32, wrow: u32, wstep: u32) {
    let e = t + WG * n;
    let inside = n * (WG / BV) < lim;
    let w = v - gam[e / BV] * stage[e];
    x16[e] = f16(select(0.0, w, inside));
    if (inside) {
        w_vnew[wrow + n * wstep] = w;
    }
}

@compute @workgroup_size(128)
fn state_recompute_coop(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let seg = wid.x;
    let hv = wid.y;
    let v0 = wid.z * BV;
    let sg = t / 32u;
    let hv_count = heads_v_count();
    let vd = params.value_dim;
    let hqk = hv / (hv_count / heads_qk_count());
    k_begin(hqk);
    let gstride = hv_count * 2u * CHUNK;    // token stride of gated16
    let seg_start = segments[4u * seg];
    let seg_len = segments[4u * seg + 1u];
    let first_chunk = segments[4u * seg + 2u];
    let sequence = segments[4u * seg + 3u];
    let kv = KD * vd;
    let sbase = ((params.num_chunks + sequence) * hv_count + hv) * kv;

    zero[t] = 0.0;
    zero[t + WG] = 0.0;
    workgroupBarrier();

    // This subgroup's state tiles s{a}{b}: key rows r0 + 16a, value columns v0 + 16b.
    let r0 = 32u * sg;
    var s00 = state_load(sbase, r0, v0);
    var s01 = state_load(sbase, r0, v0 + 16u);
    var s10 = state_load(sbase, r0 + 16u, v0);
    var s11 = state_load(sbase, r0 + 16u, v0 + 16u);
    // The first chunk's K (staged variant: to workgroup memory; the publish's barriers order it).
    k_store(t, k_fetch(t, seg_start));
    publish_half(t, sg, 0u, s00, s01);
    publish_half(t, sg, 1u, s10, s11);

    // This invocation's elements of V, W and V': column t % BV, rows t / BV + n·(128/BV).
    let vstep = (WG / BV) * hv_count * vd;
    let ui = 16u * sg * BV;                 // this subgroup's row tile in `stage`
    let n_chunks = (seg_len + CHUNK - 1u) / CHUNK;
    let vnew_half = params.total_tokens * hv_count * vd;
    // This chunk's rows of K, the A operand of K S: loaded one chunk ahead.
    var ka0 = k_rows(seg_start, 16u * sg, 0u);
    var ka1 = k_rows(seg_start, 16u * sg, 16u);
    var ka2 = k_rows(seg_start, 16u * sg, 32u);
    var ka3 = k_rows(seg_start, 16u * sg, 48u);
    var ka4 = k_rows(seg_start, 16u * sg, 64u);
    var ka5 = k_rows(seg_start, 16u * sg, 80u);
    var ka6 = k_rows(seg_start, 16u * sg, 96u);
    var ka7 = k_rows(seg_start, 16u * sg, 112u);
    for (var c = 0u; c < n_chunks; c++) {
        let start = seg_start + c * CHUNK;
        let len = min(CHUNK, seg_start + seg_len - start);
        // The next chunk (this one again after the last: a tile must stay inside its buffer).
        let next = select(start, start + CHUNK, c + 1u < n_chunks);

        // The chunk-start state, f32, where the later passes read it.
        let cb = ((first_chunk + c) * hv_count + hv) * kv;
        state_store(s00, cb, r0, v0);
        state_store(s01, cb, r0, v0 + 16u);
        state_store(s10, cb, r0 + 16u, v0);
        state_store(s11, cb, r0 + 16u, v0 + 16u);

        let g_last = gate_beta[(start + len - 1u) * hv_count + hv].x;
        if (t < CHUNK) {
            let g = gate_beta[(start + min(t, len - 1u)) * hv_count + hv].x;
            gam[t] = exp(g);
            dec[t] = select(0.0, exp(g_last - g), t < len);
        }
        let vrow = ((start + t / BV) * hv_count + hv) * vd + v0 + t % BV;
        let lim = select(0u, len - t / BV, len > t / BV);
        let va = vec4<f32>(v_or_zero(vrow, 0u, lim, vstep), v_or_zero(vrow, 1u, lim, vstep),
                           v_or_zero(vrow, 2u, lim, vstep), v_or_zero(vrow, 3u, lim, vstep));
        let vb = vec4<f32>(v_or_zero(vrow, 4u, lim, vstep), v_or_zero(vrow, 5u, lim, vstep),
                           v_or_zero(vrow, 6u, lim, vstep), v_or_zero(vrow, 7u, lim, vstep));
        let vc = vec4<f32>(v_or_zero(vrow, 8u, lim, vstep), v_or_zero(vrow, 9u, lim, vstep),
                           v_or_zero(vrow, 10u, lim, vstep), v_or_zero(vrow, 11u, lim, vstep));
        let vdd = vec4<f32>(v_or_zero(vrow, 12u, lim, vstep), v_or_zero(vrow, 13u, lim, vstep),
                            v_or_zero(vrow, 14u, lim, vstep), v_or_zero(vrow, 15u, lim, vstep));

        // U = K S, row tile sg, both column tiles.
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
        // the W step: the Γ⊙A⊙β row tiles and the Kᵀ tiles of the state update.
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

        // W = V − γ ⊙ U (0 past the chunk), kept in f32.
        w_elem(t, 0u, va.x, lim, vrow, vstep);
        w_elem(t, 1u, va.y, lim, vrow, vstep);
        w_elem(t, 2u, va.z, lim, vrow, vstep);
        w_elem(t, 3u, va.w, lim, vrow, vstep);
        w_elem(t, 4u, vb.x, lim, vrow, vstep);
        w_elem(t, 5u, vb.y, lim, vrow, vstep);
        w_elem(t, 6u, vb.z, lim, vrow, vstep);
        w_elem(t, 7u, vb.w, lim, vrow, vstep);
        w_elem(t, 8u, vc.x, lim, vrow, vstep);
        w_elem(t, 9u, vc.y, lim, vrow, vstep);
        w_elem(t, 10u, vc.z, lim, vrow, vstep);
        w_elem(t, 11u, vc.w, lim, vrow, vstep);
        w_elem(t, 12u, vdd.x, lim, vrow, vstep);
        w_elem(t, 13u, vdd.y, lim, vrow, vstep);
        w_elem(t, 14u, vdd.z, lim, vrow, vstep);
        w_elem(t, 15u, vdd.w, lim, vrow, vstep);
        // Every Kᵀ tile of this chunk is read (before the barrier above); the barrier below
        // orders the next chunk's K before its first K tile read.
        k_store(t, k_next);
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
        store_tile(d0, ui);
        store_tile(d1, ui + 16u);

        // The next chunk's K rows, in flight through the state update.
        ka0 = k_rows(next, 16u * sg, 0u);
        ka1 = k_rows(next, 16u * sg, 16u);
        ka2 = k_rows(next, 16u * sg, 32u);
        ka3 = k_rows(next, 16u * sg, 48u);
        ka4 = k_rows(next, 16u * sg, 64u);
        ka5 = k_rows(next, 16u * sg, 80u);
        ka6 = k_rows(next, 16u * sg, 96u);
        ka7 = k_rows(next, 16u * sg, 112u);
        workgroupBarrier();

        // V' (f32) to its rows in the chunk; (γ_C/γ) ⊙ V' in f16 over W for the state update.
        for (var n = 0u; n < BV / 2u; n++) {
            let e = t + WG * n;
            let x = stage[e];
            x16[e] = f16(x * dec[e / BV]);
            if (n * (WG / BV) < lim) {
                w_vnew[vnew_half + vrow + n * vstep] = x;
            }
        }
        workgroupBarrier();

        // S ← γ_C S + Kᵀ ((γ_C/γ) ⊙ V').
        let gamma_c = exp(g_last);
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
            publish_half(t, sg, 0u, s00, s01);
            publish_half(t, sg, 1u, s10, s11);
        }
    }
}
