// chunk_output_coop: the output of the split coop forward, every chunk at once (the chain,
// state_chain_coop.wgsl, left each chunk's start state S and V' in f16):
//     O = scale · ((γ ⊙ Q) S + (Γ ⊙ Q Kᵀ) V')
// One workgroup of four 32-wide subgroups per (V-block of BV = 32 columns, v-head, chunk);
// subgroup g computes rows 16g..16g+15, both column tiles, on f16 16×16×16 cooperative matrices
// with f32 accumulators: the same operands and roundings as state_scan_coop's O, so the two
// paths agree to f32 summation order.
//
// Rows past the chunk's end: γ ⊙ q and the gated rows carry one chunk of padding past B·T,
// V' one chunk too, so tiles never leave their buffers; Γ ⊙ Q Kᵀ is 0 above the diagonal, so
// valid rows never read V' past the chunk, and O is stored for valid rows only.
// The V-block is the fastest grid dimension, so a chunk's γ ⊙ q and gated rows are read by
// its V-blocks back to back (from L2 after the first).

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> qg16: array<f16>;                // [B·T + 64, HV, K]: γ ⊙ q
@group(0) @binding(2) var<storage, read> gated16: array<f16>;             // [B·T + 64, HV, 128]
@group(0) @binding(3) var<storage, read> chunks: array<u32>;              // start, length per chunk
@group(0) @binding(4) var<storage, read> states16: array<f16>;            // [chunks, HV, K, V]
@group(0) @binding(5) var<storage, read> vprime16: array<f16>;            // [B·T + 64, HV, V]
@group(0) @binding(6) var<storage, read_write> o_buf: array<Elem>;        // [B·T, HV, V]

const BV: u32 = 32u;        // V-block width
const KD: u32 = 128u;       // key dimension
const WG: u32 = 128u;       // invocations

const FP: u32 = 40u;        // row pitch of stage: rows 160 B apart spread the tile stores over the banks

var<workgroup> stage: array<f32, 64u * FP>;  // O in f32, [64][BV]
var<workgroup> zero: array<f32, 256>;

fn q_rows(i: u32, stride: u32) -> coop_mat16x16<f16, A> {
    return coopLoadT<coop_mat16x16<f16, A>>(&qg16[i], stride);
}

fn gated_rows(i: u32, stride: u32) -> coop_mat16x16<f16, A> {
    return coopLoadT<coop_mat16x16<f16, A>>(&gated16[i], stride);
}

// Row-major 16×16 tiles of S (stride V) and of V' (stride HV·V).
fn s_tile(i: u32, stride: u32) -> coop_mat16x16<f16, B> {
    return coopLoadT<coop_mat16x16<f16, B>>(&states16[i], stride);
}

fn v_tile(i: u32, stride: u32) -> coop_mat16x16<f16, B> {
    return coopLoadT<coop_mat16x16<f16, B>>(&vprime16[i], stride);
}

@compute @workgroup_size(128)
fn chunk_output_coop(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let v0 = wid.x * BV;
    let hv = wid.y;
    let chunk = wid.z;
    let sg = t / 32u;
    let hv_count = params.heads_v;
    let vd = params.value_dim;
    let start = chunks[2u * chunk];
    let len = chunks[2u * chunk + 1u];
    let hq = hv_count * KD;                 // token stride of qg16
    let gstride = hv_count * 2u * CHUNK;    // token stride of gated16
    let vstride = hv_count * vd;            // token stride of V'

    zero[t] = 0.0;
    zero[t + WG] = 0.0;
    workgroupBarrier();
    var o0 = coopLoad<coop_mat16x16<f32, C>>(&zero[0], 16u);
    var o1 = coopLoad<coop_mat16x16<f32, C>>(&zero[0], 16u);

    // (γ ⊙ Q) S: this subgroup's 16 rows against the chunk's start state.
    let q0 = (start + 16u * sg) * hq + hv * KD;
    let s0 = (chunk * hv_count + hv) * KD * vd + v0;
    for (var kk = 0u; kk < KD / 16u; kk++) {
        let qa = q_rows(q0 + 16u * kk, hq);
        let si = s0 + 16u * kk * vd;
        let b0 = s_tile(si, vd);
        let b1 = s_tile(si + 16u, vd);
        o0 = coopMultiplyAdd(qa, b0, o0);
        o1 = coopMultiplyAdd(qa, b1, o1);
    }
    // + (Γ ⊙ Q Kᵀ) V'.
    let g0 = (start + 16u * sg) * gstride + hv * 2u * CHUNK + CHUNK;
    let w0 = start * vstride + hv * vd + v0;
    for (var j = 0u; j < CHUNK / 16u; j++) {
        let pa = gated_rows(g0 + 16u * j, gstride);
        let wi = w0 + 16u * j * vstride;
        let b0 = v_tile(wi, vstride);
        let b1 = v_tile(wi + 16u, vstride);
        o0 = coopMultiplyAdd(pa, b0, o0);
        o1 = coopMultiplyAdd(pa, b1, o1);
    }
    let ui = 16u * sg * FP;
    let ui1 = ui + 16u;
    coopStoreT(o0, &stage[ui], FP);
    coopStoreT(o1, &stage[ui1], FP);
    workgroupBarrier();

    // O's valid rows, element pairs (packed storage writes whole words).
    for (var n = 0u; n < BV / 4u; n++) {
        let pr = t + WG * n;
        let i = pr / (BV / 2u);
        let col = 2u * (pr % (BV / 2u));
        if (i < len) {
            let oi = ((start + i) * hv_count + hv) * vd + v0 + col;
            let a = params.scale * stage[i * FP + col];
            let b = params.scale * stage[i * FP + col + 1u];
            if (ELEMS_PER_WORD == 2u) {
                o_buf[elem_word(oi)] = pack_pair(a, b);
            } else {
                o_buf[oi] = pack_elem(a);
                o_buf[oi + 1u] = pack_elem(b);
            }
        }
    }
}
