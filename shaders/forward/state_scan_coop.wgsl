// state_scan_coop: the sequential inter-chunk scan (same math as state_scan.wgsl) with every
// chunk GEMM on cooperative matrices — f16 16×16×16 operands, f32 accumulators (tensor cores
// on NVIDIA). One workgroup of four 32-wide subgroups per (segment, v-head, V-block of BV = 32
// columns) walks the segment's chunks; per chunk of ≤ 64 tokens:
//     U  = K S,   P0 = (γ ⊙ Q) S                  (subgroup g: rows 16g..16g+15)
//     W  = V − γ ⊙ U                              (invocations, f32, rounded to f16 once)
//     V' = (Γ ⊙ A ⊙ β_col) W
//     O  = scale · (P0 + (Γ ⊙ Q Kᵀ) V')
//     S  ← γ_C S + Kᵀ ((γ_C/γ) ⊙ V')              (subgroup g: state rows 32g..32g+31)
// The state S (K × BV, K = 128) lives in f32 accumulators for the whole segment; each chunk
// it is published to workgroup memory rounded to f16 as the B operand of K S and Q S. So the
// only f16 roundings are of operands (γ⊙q, k, S, W, V', the gated matrices); every sum is f32.
// Γ⊙A⊙β and Γ⊙QKᵀ come precomputed in f16 from wy_inverse (its coop variant), γ⊙q per v-head
// from gate_q, so P0 accumulates straight into O and never goes through memory.
//
// What the H200 showed (T = 32768, bf16; BENCHMARKS.md): a chunk costs a workgroup time in
// proportion to its instructions (a 64-wide V-block took twice as long per chunk, eight
// subgroups instead of four were slower), and with this layout's 21.5 KiB of workgroup memory
// 16/64 heads went from 10.2 to 8.2 ms while 2/8 did not move — consistent with more
// workgroups sharing an SM (not measured directly). So
// W, V' and (γ_C/γ) ⊙ V' take turns in one f16 tile, and the f32 staging tile also carries
// the state, half at a time. Staging K and Q in workgroup memory with plain loads and
// 16-wide V-blocks were tried and were slower.
//
// Partial chunks: qg16, k16 and gated16 carry one chunk of padding rows past B·T, so tiles
// never leave their buffers. Rows past the chunk's end hold the next sequence's (finite)
// values: W and V' are zeroed there and O is not stored, so they contribute nothing; the
// gated matrices are 0 above the diagonal, so valid rows never read them.
//
// naga: coopLoad/coopStore are column-major, coopLoadT/coopStoreT row-major; every pointer
// index is bound with `let` first (naga 30's SPIR-V backend panics on a computed index in a
// cooperative store); cooperative ops need uniform control flow, so flags are tested inline
// (naga treats a helper function's result as non-uniform).

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> qg16: array<f16>;                // [B·T + 64, HV, K]: γ ⊙ q
@group(0) @binding(2) var<storage, read> k16: array<K16>;                 // [B·T + 64, H, K]
@group(0) @binding(3) var<storage, read> v_buf: array<Elem>;              // [B·T, HV, V]
@group(0) @binding(4) var<storage, read> gate_beta: array<vec2<f32>>;     // [B·T, HV]: (G, β)
@group(0) @binding(5) var<storage, read> gated16: array<f16>;             // [B·T + 64, HV, 128]
@group(0) @binding(6) var<storage, read> segments: array<u32>;            // start, length, state slot (per segment, or per (segment, v-head))
override SEGMENTS_PER_HEAD: bool = false;
@group(0) @binding(7) var<storage, read_write> state_slots: array<f32>;     // [slots, HV, K, V] or V-first
@group(0) @binding(8) var<storage, read_write> o_buf: array<Elem>;        // [B·T, HV, V]

const BV: u32 = 32u;        // V-block width
const KD: u32 = 128u;       // key dimension (the state tiles below are named registers)
const WG: u32 = 128u;       // invocations
const SP: u32 = BV;         // row pitch of s16 and x16 (unpadded)
const FP: u32 = BV;         // row pitch of stage (unpadded)

var<workgroup> s16: array<f16, 128u * BV>;   // S rounded to f16, [K][BV]
var<workgroup> x16: array<f16, 64u * BV>;    // W, then V', then (γ_C/γ) ⊙ V', [64][BV]
var<workgroup> stage: array<f32, 64u * BV>;  // f32 staging, [64][BV]: U, V', O; or half of S
var<workgroup> zero: array<f32, 256>;
var<workgroup> gam: array<f32, 64>;          // γ_i = exp(G_i)
var<workgroup> dec: array<f32, 64>;          // γ_C/γ_i, 0 past the chunk

fn q_rows(i: u32, stride: u32) -> coop_mat16x16<f16, A> {
    return coopLoadT<coop_mat16x16<f16, A>>(&qg16[i], stride);
}

// Element n of this invocation's V column (chunk row t / BV + n·128/BV), 0 past the chunk.
fn v_or_zero(row0: u32, n: u32, lim: u32, step: u32) -> f32 {
    let inside = n * (WG / BV) < lim;
    let i = select(row0, row0 + n * step, inside);
    return select(0.0, load_elem(v_buf[elem_word(i)], i), inside);
}

// Element (t / BV + n·128/BV, t % BV) of W = V − γ ⊙ U (U in stage).
fn w_elem(t: u32, n: u32, v: f32, lim: u32) {
    let e = t + WG * n;
    x16[e] = f16(select(0.0, v - gam[e / BV] * stage[e], n * (WG / BV) < lim));
}

@compute @workgroup_size(128)
fn state_scan_coop(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {
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
    // A table with a row per (segment, v-head) (segment_window's) may give a pair length 0:
    // no chunks, the state stored back as loaded (naga rejects an early return before
    // cooperative ops: it counts storage loads as non-uniform).
    let seg_row = select(seg, seg * hv_count + hv, SEGMENTS_PER_HEAD);
    let seg_start = segments[3u * seg_row];
    let seg_len = segments[3u * seg_row + 1u];
    let slot = segments[3u * seg_row + 2u];
    let sbase = (slot * hv_count + hv) * KD * vd;

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

    // This invocation's elements of V: column t % BV, rows t / BV + n·(128/BV).
    let vstep = (WG / BV) * hv_count * vd;
    let ui = 16u * sg * BV;                 // this subgroup's row tile in `stage`
    let n_chunks = (seg_len + CHUNK - 1u) / CHUNK;
    let q_off = 16u * sg * hq + hv * KD;
    // This chunk's rows of K and γ ⊙ Q, the A operands of K S and (γ ⊙ Q) S: loaded one
    // chunk ahead (the loads of chunk c + 1 are issued halfway through chunk c).
    var ka0 = k_rows(seg_start, 16u * sg, 0u);
    var ka1 = k_rows(seg_start, 16u * sg, 16u);
    var ka2 = k_rows(seg_start, 16u * sg, 32u);
    var ka3 = k_rows(seg_start, 16u * sg, 48u);
    var ka4 = k_rows(seg_start, 16u * sg, 64u);
    var ka5 = k_rows(seg_start, 16u * sg, 80u);
    var ka6 = k_rows(seg_start, 16u * sg, 96u);
    var ka7 = k_rows(seg_start, 16u * sg, 112u);
    var qa0 = q_rows(seg_start * hq + q_off, hq);
    var qa1 = q_rows(seg_start * hq + q_off + 16u, hq);
    var qa2 = q_rows(seg_start * hq + q_off + 32u, hq);
    var qa3 = q_rows(seg_start * hq + q_off + 48u, hq);
    var qa4 = q_rows(seg_start * hq + q_off + 64u, hq);
    var qa5 = q_rows(seg_start * hq + q_off + 80u, hq);
    var qa6 = q_rows(seg_start * hq + q_off + 96u, hq);
    var qa7 = q_rows(seg_start * hq + q_off + 112u, hq);
    for (var c = 0u; c < n_chunks; c++) {
        let start = seg_start + c * CHUNK;
        let len = min(CHUNK, seg_start + seg_len - start);
        // The next chunk (this one again after the last: a tile must stay inside its buffer).
        let next = select(start, start + CHUNK, c + 1u < n_chunks);
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

        // U = K S and P0 = (γ ⊙ Q) S, row tile sg, both column tiles (written out: every
        // operand is a named register, loaded before its products).
        var u0 = zero_acc();
        var u1 = zero_acc();
        var o0 = zero_acc();
        var o1 = zero_acc();
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
        o0 = coopMultiplyAdd(qa0, b00, o0);
        o1 = coopMultiplyAdd(qa0, b01, o1);
        u0 = coopMultiplyAdd(ka1, b10, u0);
        u1 = coopMultiplyAdd(ka1, b11, u1);
        o0 = coopMultiplyAdd(qa1, b10, o0);
        o1 = coopMultiplyAdd(qa1, b11, o1);
        u0 = coopMultiplyAdd(ka2, b20, u0);
        u1 = coopMultiplyAdd(ka2, b21, u1);
        o0 = coopMultiplyAdd(qa2, b20, o0);
        o1 = coopMultiplyAdd(qa2, b21, o1);
        u0 = coopMultiplyAdd(ka3, b30, u0);
        u1 = coopMultiplyAdd(ka3, b31, u1);
        o0 = coopMultiplyAdd(qa3, b30, o0);
        o1 = coopMultiplyAdd(qa3, b31, o1);
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
        o0 = coopMultiplyAdd(qa4, b40, o0);
        o1 = coopMultiplyAdd(qa4, b41, o1);
        u0 = coopMultiplyAdd(ka5, b50, u0);
        u1 = coopMultiplyAdd(ka5, b51, u1);
        o0 = coopMultiplyAdd(qa5, b50, o0);
        o1 = coopMultiplyAdd(qa5, b51, o1);
        u0 = coopMultiplyAdd(ka6, b60, u0);
        u1 = coopMultiplyAdd(ka6, b61, u1);
        o0 = coopMultiplyAdd(qa6, b60, o0);
        o1 = coopMultiplyAdd(qa6, b61, o1);
        u0 = coopMultiplyAdd(ka7, b70, u0);
        u1 = coopMultiplyAdd(ka7, b71, u1);
        o0 = coopMultiplyAdd(qa7, b70, o0);
        o1 = coopMultiplyAdd(qa7, b71, o1);
        // Staged variant: the next chunk's K words, in flight until k_store below.
        let k_next = k_fetch(t, next);

        // The rest of this chunk's global operands, issued now so that they arrive during
        // the W step: the gated matrices' row tiles and the Kᵀ tiles of the state update.
        let grow = (start + 16u * sg) * gstride + hv * 2u * CHUNK;
        let ga0 = gated_rows(grow, gstride);
        let ga1 = gated_rows(grow + 16u, gstride);
        let ga2 = gated_rows(grow + 32u, gstride);
        let ga3 = gated_rows(grow + 48u, gstride);
        let pa0 = gated_rows(grow + CHUNK, gstride);
        let pa1 = gated_rows(grow + CHUNK + 16u, gstride);
        let pa2 = gated_rows(grow + CHUNK + 32u, gstride);
        let pa3 = gated_rows(grow + CHUNK + 48u, gstride);
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
        store_tile(d0, ui);
        store_tile(d1, ui + 16u);
        workgroupBarrier();
        // Every Kᵀ tile of this chunk is read (before the barriers above); the barrier below
        // orders the next chunk's K before its first K tile read.
        k_store(t, k_next);

        // V' in f16 over W (0 past the chunk); its f32 copy stays in stage.
        for (var n = 0u; n < BV / 2u; n++) {
            let e = t + WG * n;
            x16[e] = f16(select(0.0, stage[e], e / BV < len));
        }
        workgroupBarrier();

        // O = P0 + (Γ ⊙ Q Kᵀ) V' (scaled on store), row tile sg.
        let v00 = x_tile(0u, 0u);
        let v01 = x_tile(0u, 1u);
        let v10 = x_tile(1u, 0u);
        let v11 = x_tile(1u, 1u);
        let v20 = x_tile(2u, 0u);
        let v21 = x_tile(2u, 1u);
        let v30 = x_tile(3u, 0u);
        let v31 = x_tile(3u, 1u);
        o0 = coopMultiplyAdd(pa0, v00, o0);
        o1 = coopMultiplyAdd(pa0, v01, o1);
        o0 = coopMultiplyAdd(pa1, v10, o0);
        o1 = coopMultiplyAdd(pa1, v11, o1);
        o0 = coopMultiplyAdd(pa2, v20, o0);
        o1 = coopMultiplyAdd(pa2, v21, o1);
        o0 = coopMultiplyAdd(pa3, v30, o0);
        o1 = coopMultiplyAdd(pa3, v31, o1);

        // The next chunk's K and γ ⊙ Q rows, in flight through the state update.
        ka0 = k_rows(next, 16u * sg, 0u);
        ka1 = k_rows(next, 16u * sg, 16u);
        ka2 = k_rows(next, 16u * sg, 32u);
        ka3 = k_rows(next, 16u * sg, 48u);
        ka4 = k_rows(next, 16u * sg, 64u);
        ka5 = k_rows(next, 16u * sg, 80u);
        ka6 = k_rows(next, 16u * sg, 96u);
        ka7 = k_rows(next, 16u * sg, 112u);
        qa0 = q_rows(next * hq + q_off, hq);
        qa1 = q_rows(next * hq + q_off + 16u, hq);
        qa2 = q_rows(next * hq + q_off + 32u, hq);
        qa3 = q_rows(next * hq + q_off + 48u, hq);
        qa4 = q_rows(next * hq + q_off + 64u, hq);
        qa5 = q_rows(next * hq + q_off + 80u, hq);
        qa6 = q_rows(next * hq + q_off + 96u, hq);
        qa7 = q_rows(next * hq + q_off + 112u, hq);
        workgroupBarrier();

        // (γ_C/γ) ⊙ V' over V' for the state update.
        for (var n = 0u; n < BV / 2u; n++) {
            let e = t + WG * n;
            x16[e] = f16(stage[e] * dec[e / BV]);
        }
        workgroupBarrier();

        // S ← γ_C S + Kᵀ ((γ_C/γ) ⊙ V'); O to stage (V' there is no longer read).
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
        store_tile(o0, ui);
        store_tile(o1, ui + 16u);
        workgroupBarrier();

        // Store O's valid rows, element pairs (packed storage writes whole words).
        for (var n = 0u; n < BV / 4u; n++) {
            let pr = t + WG * n;
            let i = pr / (BV / 2u);
            let col = 2u * (pr % (BV / 2u));
            if (i < len) {
                let oi = ((start + i) * hv_count + hv) * vd + v0 + col;
                let a = params.scale * stage[i * BV + col];
                let b = params.scale * stage[i * BV + col + 1u];
                if (ELEMS_PER_WORD == 2u) {
                    o_buf[elem_word(oi)] = pack_pair(a, b);
                } else {
                    o_buf[oi] = pack_elem(a);
                    o_buf[oi + 1u] = pack_elem(b);
                }
            }
        }
        workgroupBarrier();
        if (c + 1u < n_chunks) {
            publish_half(t, sg, 0u, s00, s01);
            publish_half(t, sg, 1u, s10, s11);
        }
    }

    state_store(s00, sbase, r0, v0);
    state_store(s01, sbase, r0, v0 + 16u);
    state_store(s10, sbase, r0 + 16u, v0);
    state_store(s11, sbase, r0 + 16u, v0 + 16u);
}
