// dh_scan_coop: the reverse inter-chunk scan of the state gradient (dh_scan.wgsl's math) with
// its chunk GEMMs on cooperative matrices — f16 16×16×16 operands, f32 accumulators — in the
// layout of the coop replay (state_recompute_coop.wgsl, after the forward's state_scan_coop).
// One workgroup of four 32-wide subgroups per (segment, v-head, V-block of BV = 32 columns)
// walks the segment's chunks newest first with dS (K × BV, the gradient w.r.t. the chunk-END
// state; dht, a carry or 0 at the segment end) in f32 accumulators; per chunk:
//     dstates[chunk] ← dS
//     dV' = (γ_C/γ) ⊙ (K dS) + Pgᵀ (scale·dO)           (subgroup g: rows 16g..16g+15)
//     dv  = Agᵀ dV'
//     dS  ← γ_C dS − Kᵀ (γ ⊙ dv) + (γ ⊙ Q)ᵀ (scale·dO)   (subgroup g: rows 32g..32g+31)
// and leaves dh0 in the tail slot `num_chunks + n`. Pg = Γ⊙QKᵀ and Ag = Γ⊙A⊙β come in f16
// from wy_inverse_coop (Pgᵀ, Agᵀ tiles are column-major reads of them), γ ⊙ q per v-head
// too (qg16), so every operand of the state update is a tile read. dS is published to
// workgroup memory rounded to f16 as the B operand of K dS; the f16 roundings are of operands
// (k, γ⊙q, dS, scale·dO, dV', γ⊙dv, the gated matrices); every sum is f32, and dV', dv are
// stored from their f32 values.
//
// Partial chunks: k16, qg16 and gated16 carry one chunk of padding rows past the window's
// rows. Rows past the chunk's end hold the next sequence's (finite) values or zeros: dO and
// γ⊙dv are zeroed there and (γ_C/γ) = 0, so they contribute nothing, and nothing is stored.
//
// naga: coopLoad/coopStore are column-major, coopLoadT/coopStoreT row-major; every pointer
// index is bound with `let` first; cooperative ops need uniform control flow (no early return).

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> k16: array<K16>;                 // [rows + 64, H, K]
@group(0) @binding(2) var<storage, read> qg16: array<f16>;                // [rows + 64, HV, K]: γ ⊙ q
@group(0) @binding(3) var<storage, read> gate_beta: array<vec2<f32>>;     // [rows, HV]: (G, β)
@group(0) @binding(4) var<storage, read> gated16: array<f16>;             // [rows + 64, HV, 128]: Ag | Pg
@group(0) @binding(5) var<storage, read> do_buf: array<Elem>;             // [rows, HV, V]
@group(0) @binding(6) var<storage, read> segments: array<u32>;            // start, length, first chunk, sequence
@group(0) @binding(7) var<storage, read_write> state_slots: array<f32>;     // [chunks + N, HV, K, V] (or V-first)
@group(0) @binding(8) var<storage, read_write> dvnew_dv: array<f32>;      // [2, rows, HV, V]: dV', then dv

const BV: u32 = 32u;        // V-block width
const KD: u32 = 128u;       // key dimension
const WG: u32 = 128u;       // invocations
const SP: u32 = BV;         // row pitch of s16 and x16 (unpadded)
const FP: u32 = BV;         // row pitch of stage (unpadded)

var<workgroup> s16: array<f16, 128u * BV>;   // dS rounded to f16, [K][BV]
var<workgroup> x16: array<f16, 64u * BV>;    // scale·dO, then dV', then −γ ⊙ dv, [64][BV]
var<workgroup> stage: array<f32, 64u * BV>;  // f32 staging, [64][BV]: K dS, dV', dv; or half of dS
var<workgroup> zero: array<f32, 256>;
var<workgroup> gam: array<f32, 64>;          // γ_i = exp(G_i), 0 past the chunk
var<workgroup> dec: array<f32, 64>;          // γ_C/γ_i, 0 past the chunk

// (γ ⊙ Q)ᵀ tile: a column-major read.
fn q_cols(i: u32, stride: u32) -> coop_mat16x16<f16, A> {
    return coopLoad<coop_mat16x16<f16, A>>(&qg16[i], stride);
}

@compute @workgroup_size(128)
fn dh_scan_coop(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let seg = wid.x;
    let hv = wid.y;
    let v0 = wid.z * BV;
    let sg = t / 32u;
    let hv_count = heads_v_count();
    let vd = params.value_dim;
    let hqk = hv / (hv_count / heads_qk_count());
    k_begin(hqk);
    let hq = hv_count * KD;                 // token stride of qg16
    let gstride = hv_count * 2u * CHUNK;    // token stride of gated16
    let seg_start = segments[4u * seg];
    let seg_len = segments[4u * seg + 1u];
    let first_chunk = segments[4u * seg + 2u];
    let sequence = segments[4u * seg + 3u];
    let scale = params.scale;
    let kv = KD * vd;
    let sbase = ((params.num_chunks + sequence) * hv_count + hv) * kv;

    zero[t] = 0.0;
    zero[t + WG] = 0.0;
    workgroupBarrier();

    // This subgroup's dS tiles s{a}{b}: key rows r0 + 16a, value columns v0 + 16b.
    let r0 = 32u * sg;
    var s00 = state_load(sbase, r0, v0);
    var s01 = state_load(sbase, r0, v0 + 16u);
    var s10 = state_load(sbase, r0 + 16u, v0);
    var s11 = state_load(sbase, r0 + 16u, v0 + 16u);
    publish_half(t, sg, 0u, s00, s01);
    publish_half(t, sg, 1u, s10, s11);

    // This invocation's elements: column t % BV, rows t / BV + n·(128/BV).
    let step = (WG / BV) * hv_count * vd;
    let ui = 16u * sg * BV;                 // this subgroup's row tile in `stage`
    let n_chunks = (seg_len + CHUNK - 1u) / CHUNK;
    let dv_half = params.total_tokens * hv_count * vd;
    // The newest chunk's rows of K, the A operand of K dS: loaded one chunk ahead.
    let last_start = seg_start + CHUNK * select(0u, n_chunks - 1u, n_chunks > 0u);
    // Staged variant: that chunk's K to workgroup memory, before its first tile read.
    k_store(t, k_fetch(t, last_start));
    if (K_STAGED) {
        workgroupBarrier();
    }
    var ka0 = k_rows(last_start, 16u * sg, 0u);
    var ka1 = k_rows(last_start, 16u * sg, 16u);
    var ka2 = k_rows(last_start, 16u * sg, 32u);
    var ka3 = k_rows(last_start, 16u * sg, 48u);
    var ka4 = k_rows(last_start, 16u * sg, 64u);
    var ka5 = k_rows(last_start, 16u * sg, 80u);
    var ka6 = k_rows(last_start, 16u * sg, 96u);
    var ka7 = k_rows(last_start, 16u * sg, 112u);
    for (var cr = 0u; cr < n_chunks; cr++) {
        let c = n_chunks - 1u - cr;
        let start = seg_start + c * CHUNK;
        let len = min(CHUNK, seg_start + seg_len - start);
        // The previous chunk (this one again after the oldest: a tile must stay inside its buffer).
        let next = select(start, start - CHUNK, c > 0u);

        // dS w.r.t. this chunk's end state, f32, where the later passes read it.
        let cb = ((first_chunk + c) * hv_count + hv) * kv;
        state_store(s00, cb, r0, v0);
        state_store(s01, cb, r0, v0 + 16u);
        state_store(s10, cb, r0 + 16u, v0);
        state_store(s11, cb, r0 + 16u, v0 + 16u);

        let g_last = gate_beta[(start + len - 1u) * hv_count + hv].x;
        if (t < CHUNK) {
            let g = gate_beta[(start + min(t, len - 1u)) * hv_count + hv].x;
            gam[t] = select(0.0, exp(g), t < len);
            dec[t] = select(0.0, exp(g_last - g), t < len);
        }
        // scale·dO in f16 (0 past the chunk): element (t / BV + n·128/BV, t % BV).
        let row0 = ((start + t / BV) * hv_count + hv) * vd + v0 + t % BV;
        let lim = select(0u, len - t / BV, len > t / BV);
        for (var n = 0u; n < BV / 2u; n++) {
            let inside = n * (WG / BV) < lim;
            let i = select(row0, row0 + n * step, inside);
            let x = select(0.0, scale * load_elem(do_buf[elem_word(i)], i), inside);
            x16[t + WG * n] = f16(x);
        }

        // K dS, row tile sg, both column tiles.
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
        // Staged variant: the previous chunk's K words, in flight until k_store below.
        let k_next = k_fetch(t, next);

        // The Pgᵀ and Agᵀ tiles of row block sg, issued now (the state update's tiles come
        // after dv: fewer tiles live at once).
        let gcol = start * gstride + hv * 2u * CHUNK + 16u * sg;
        let pt0 = gated_cols(gcol + CHUNK, gstride);
        let pt1 = gated_cols(gcol + CHUNK + 16u * gstride, gstride);
        let pt2 = gated_cols(gcol + CHUNK + 32u * gstride, gstride);
        let pt3 = gated_cols(gcol + CHUNK + 48u * gstride, gstride);
        let at0 = gated_cols(gcol, gstride);
        let at1 = gated_cols(gcol + 16u * gstride, gstride);
        let at2 = gated_cols(gcol + 32u * gstride, gstride);
        let at3 = gated_cols(gcol + 48u * gstride, gstride);
        store_tile(u0, ui);
        store_tile(u1, ui + 16u);
        workgroupBarrier();

        // scale·dO tiles, kept for Pgᵀ (scale·dO) and the state update; (γ_C/γ) ⊙ K dS.
        let o00 = x_tile(0u, 0u);
        let o01 = x_tile(0u, 1u);
        let o10 = x_tile(1u, 0u);
        let o11 = x_tile(1u, 1u);
        let o20 = x_tile(2u, 0u);
        let o21 = x_tile(2u, 1u);
        let o30 = x_tile(3u, 0u);
        let o31 = x_tile(3u, 1u);
        for (var n = 0u; n < BV / 2u; n++) {
            let e = t + WG * n;
            stage[e] = stage[e] * dec[e / BV];
        }
        workgroupBarrier();

        // dV' = (γ_C/γ) ⊙ K dS + Pgᵀ (scale·dO); the blocks above the diagonal of Pgᵀ's
        // transpose are zero.
        var d0 = stage_tile(ui);
        var d1 = stage_tile(ui + 16u);
        d0 = coopMultiplyAdd(pt0, o00, d0);
        d1 = coopMultiplyAdd(pt0, o01, d1);
        d0 = coopMultiplyAdd(pt1, o10, d0);
        d1 = coopMultiplyAdd(pt1, o11, d1);
        d0 = coopMultiplyAdd(pt2, o20, d0);
        d1 = coopMultiplyAdd(pt2, o21, d1);
        d0 = coopMultiplyAdd(pt3, o30, d0);
        d1 = coopMultiplyAdd(pt3, o31, d1);
        workgroupBarrier();
        store_tile(d0, ui);
        store_tile(d1, ui + 16u);
        workgroupBarrier();

        // dV' (f32) to its rows in the chunk, and in f16 over scale·dO (0 past the chunk).
        for (var n = 0u; n < BV / 2u; n++) {
            let e = t + WG * n;
            let inside = n * (WG / BV) < lim;
            let x = select(0.0, stage[e], inside);
            x16[e] = f16(x);
            if (inside) {
                dvnew_dv[row0 + n * step] = x;
            }
        }
        workgroupBarrier();

        // dv = Agᵀ dV'.
        var e0 = zero_acc();
        var e1 = zero_acc();
        let y00 = x_tile(0u, 0u);
        let y01 = x_tile(0u, 1u);
        let y10 = x_tile(1u, 0u);
        let y11 = x_tile(1u, 1u);
        let y20 = x_tile(2u, 0u);
        let y21 = x_tile(2u, 1u);
        let y30 = x_tile(3u, 0u);
        let y31 = x_tile(3u, 1u);
        e0 = coopMultiplyAdd(at0, y00, e0);
        e1 = coopMultiplyAdd(at0, y01, e1);
        e0 = coopMultiplyAdd(at1, y10, e0);
        e1 = coopMultiplyAdd(at1, y11, e1);
        e0 = coopMultiplyAdd(at2, y20, e0);
        e1 = coopMultiplyAdd(at2, y21, e1);
        e0 = coopMultiplyAdd(at3, y30, e0);
        e1 = coopMultiplyAdd(at3, y31, e1);
        store_tile(e0, ui);
        store_tile(e1, ui + 16u);

        // The Kᵀ and (γ ⊙ Q)ᵀ tiles of the state update, in flight through the dv step.
        let kc00 = k_cols(start, 0u, r0);
        let kc01 = k_cols(start, 0u, r0 + 16u);
        let kc10 = k_cols(start, 16u, r0);
        let kc11 = k_cols(start, 16u, r0 + 16u);
        let kc20 = k_cols(start, 32u, r0);
        let kc21 = k_cols(start, 32u, r0 + 16u);
        let kc30 = k_cols(start, 48u, r0);
        let kc31 = k_cols(start, 48u, r0 + 16u);
        let qt = start * hq + hv * KD + r0;
        let qc00 = q_cols(qt, hq);
        let qc01 = q_cols(qt + 16u, hq);
        let qc10 = q_cols(qt + 16u * hq, hq);
        let qc11 = q_cols(qt + 16u * hq + 16u, hq);
        let qc20 = q_cols(qt + 32u * hq, hq);
        let qc21 = q_cols(qt + 32u * hq + 16u, hq);
        let qc30 = q_cols(qt + 48u * hq, hq);
        let qc31 = q_cols(qt + 48u * hq + 16u, hq);
        // Direct reads: the previous chunk's K rows, in flight through the dv step.
        if (!K_STAGED) {
            ka0 = k_rows(next, 16u * sg, 0u);
            ka1 = k_rows(next, 16u * sg, 16u);
            ka2 = k_rows(next, 16u * sg, 32u);
            ka3 = k_rows(next, 16u * sg, 48u);
            ka4 = k_rows(next, 16u * sg, 64u);
            ka5 = k_rows(next, 16u * sg, 80u);
            ka6 = k_rows(next, 16u * sg, 96u);
            ka7 = k_rows(next, 16u * sg, 112u);
        }
        workgroupBarrier();
        // Every K tile of this chunk is read (before the barrier above); the one below orders
        // the previous chunk's K before its first tile read.
        k_store(t, k_next);

        // dv (f32) to its rows in the chunk; −γ ⊙ dv in f16 over dV' (0 past the chunk).
        for (var n = 0u; n < BV / 2u; n++) {
            let e = t + WG * n;
            let inside = n * (WG / BV) < lim;
            let x = stage[e];
            x16[e] = f16(select(0.0, -gam[e / BV] * x, inside));
            if (inside) {
                dvnew_dv[dv_half + row0 + n * step] = x;
            }
        }
        workgroupBarrier();
        if (K_STAGED) {
            ka0 = k_rows(next, 16u * sg, 0u);
            ka1 = k_rows(next, 16u * sg, 16u);
            ka2 = k_rows(next, 16u * sg, 32u);
            ka3 = k_rows(next, 16u * sg, 48u);
            ka4 = k_rows(next, 16u * sg, 64u);
            ka5 = k_rows(next, 16u * sg, 80u);
            ka6 = k_rows(next, 16u * sg, 96u);
            ka7 = k_rows(next, 16u * sg, 112u);
        }

        // dS ← γ_C dS − Kᵀ (γ ⊙ dv) + (γ ⊙ Q)ᵀ (scale·dO).
        let gamma_c = exp(g_last);
        s00 = gamma_c * s00;
        s01 = gamma_c * s01;
        s10 = gamma_c * s10;
        s11 = gamma_c * s11;
        let w00 = x_tile(0u, 0u);
        let w01 = x_tile(0u, 1u);
        let w10 = x_tile(1u, 0u);
        let w11 = x_tile(1u, 1u);
        let w20 = x_tile(2u, 0u);
        let w21 = x_tile(2u, 1u);
        let w30 = x_tile(3u, 0u);
        let w31 = x_tile(3u, 1u);
        s00 = coopMultiplyAdd(kc00, w00, s00);
        s01 = coopMultiplyAdd(kc00, w01, s01);
        s10 = coopMultiplyAdd(kc01, w00, s10);
        s11 = coopMultiplyAdd(kc01, w01, s11);
        s00 = coopMultiplyAdd(kc10, w10, s00);
        s01 = coopMultiplyAdd(kc10, w11, s01);
        s10 = coopMultiplyAdd(kc11, w10, s10);
        s11 = coopMultiplyAdd(kc11, w11, s11);
        s00 = coopMultiplyAdd(kc20, w20, s00);
        s01 = coopMultiplyAdd(kc20, w21, s01);
        s10 = coopMultiplyAdd(kc21, w20, s10);
        s11 = coopMultiplyAdd(kc21, w21, s11);
        s00 = coopMultiplyAdd(kc30, w30, s00);
        s01 = coopMultiplyAdd(kc30, w31, s01);
        s10 = coopMultiplyAdd(kc31, w30, s10);
        s11 = coopMultiplyAdd(kc31, w31, s11);
        s00 = coopMultiplyAdd(qc00, o00, s00);
        s01 = coopMultiplyAdd(qc00, o01, s01);
        s10 = coopMultiplyAdd(qc01, o00, s10);
        s11 = coopMultiplyAdd(qc01, o01, s11);
        s00 = coopMultiplyAdd(qc10, o10, s00);
        s01 = coopMultiplyAdd(qc10, o11, s01);
        s10 = coopMultiplyAdd(qc11, o10, s10);
        s11 = coopMultiplyAdd(qc11, o11, s11);
        s00 = coopMultiplyAdd(qc20, o20, s00);
        s01 = coopMultiplyAdd(qc20, o21, s01);
        s10 = coopMultiplyAdd(qc21, o20, s10);
        s11 = coopMultiplyAdd(qc21, o21, s11);
        s00 = coopMultiplyAdd(qc30, o30, s00);
        s01 = coopMultiplyAdd(qc30, o31, s01);
        s10 = coopMultiplyAdd(qc31, o30, s10);
        s11 = coopMultiplyAdd(qc31, o31, s11);
        if (c > 0u) {
            publish_half(t, sg, 0u, s00, s01);
            publish_half(t, sg, 1u, s10, s11);
        }
    }

    // dh0 (or the carry of a cut sequence) in the tail slot.
    state_store(s00, sbase, r0, v0);
    state_store(s01, sbase, r0, v0 + 16u);
    state_store(s10, sbase, r0 + 16u, v0);
    state_store(s11, sbase, r0 + 16u, v0 + 16u);
}
