// value_grams_coop: value_grams.wgsl's two products on cooperative matrices — f16 16×16×16
// operands, f32 accumulators — for the coop path's backward. Per (chunk, v-head):
//     dP  = scale · Γ ⊙ (dO V'ᵀ),   dAb = Γ ⊙ (dV' Wᵀ)      (masked to j ≤ i)
// The operands are unscaled; Γ_ij = exp(G_i − G_j) and the scale are applied in f32 as the
// results are stored (an f16 operand carrying a gate factor loses its precision where the
// gate decays fast: state_grad_coop's lesson). V is streamed in 16-wide slices, the four
// token tiles (64 × 16) staged in f16; V', W are read as the Bᵀ operands by column-major
// loads. Subgroup g owns rows 16g..16g+15 of both products (8 accumulators: the tiles above
// the diagonal are computed and masked, which keeps the control flow uniform). Results leave
// through a per-subgroup 16 × 16 f32 tile, so rows past the chunk are never written (they
// belong to the next chunk). 13.3 KiB of workgroup memory.
//
// naga: coopLoad/coopStore are column-major, coopLoadT/coopStoreT row-major; every pointer
// index is bound with `let` first; cooperative ops need uniform control flow.

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> do_buf: array<Elem>;             // [B·T, HV, V]
@group(0) @binding(2) var<storage, read> w_vnew: array<f32>;              // [2, B·T, HV, V]: W, V'
@group(0) @binding(3) var<storage, read> dvnew_dv: array<f32>;            // [2, B·T, HV, V]: dV', dv
@group(0) @binding(4) var<storage, read> gate_beta: array<vec2<f32>>;     // [B·T, HV]: (G, β)
@group(0) @binding(5) var<storage, read> chunks: array<u32>;              // per chunk: start, length
@group(0) @binding(6) var<storage, read_write> mats: array<f32>;          // [2, B·T, HV, 64]: dP, dAb

const VS: u32 = 16u;        // V slice
const WG: u32 = 128u;       // invocations

var<workgroup> a_do: array<f16, CHUNK * VS>;   // dO, [64][VS]
var<workgroup> a_dn: array<f16, CHUNK * VS>;   // dV'
var<workgroup> b_vn: array<f16, CHUNK * VS>;   // V'
var<workgroup> b_w: array<f16, CHUNK * VS>;    // W
var<workgroup> out_tile: array<f32, 1024>;     // per subgroup 16 × 16
var<workgroup> zero: array<f32, 256>;
var<workgroup> g_s: array<f32, 64>;

fn zero_acc() -> coop_mat16x16<f32, C> {
    return coopLoad<coop_mat16x16<f32, C>>(&zero[0], 16u);
}

fn do_tile(rt: u32) -> coop_mat16x16<f16, A> {
    let i = 16u * VS * rt;
    return coopLoadT<coop_mat16x16<f16, A>>(&a_do[i], VS);
}

fn dn_tile(rt: u32) -> coop_mat16x16<f16, A> {
    let i = 16u * VS * rt;
    return coopLoadT<coop_mat16x16<f16, A>>(&a_dn[i], VS);
}

// V'ᵀ, Wᵀ tiles (rows: the slice's V, columns: tokens 16ct..): column-major reads of [64][VS].
fn vn_tile(ct: u32) -> coop_mat16x16<f16, B> {
    let i = 16u * VS * ct;
    return coopLoad<coop_mat16x16<f16, B>>(&b_vn[i], VS);
}

fn w_tile(ct: u32) -> coop_mat16x16<f16, B> {
    let i = 16u * VS * ct;
    return coopLoad<coop_mat16x16<f16, B>>(&b_w[i], VS);
}

// Tile m (rows 16 sg.., columns 16 ct..) of product p (0: dP, 1: dAb) to `mats`, gated and
// masked, rows in the chunk only. Call from uniform control flow (it holds barriers).
fn store_out(m: coop_mat16x16<f32, C>, t: u32, sg: u32, p: u32, ct: u32, len: u32, out_base: u32) {
    let o = 256u * sg;
    coopStoreT(m, &out_tile[o], 16u);
    workgroupBarrier();
    let lane = t % 32u;
    let half = params.total_tokens * params.heads_v * CHUNK;
    let f = select(1.0, params.scale, p == 0u);
    for (var n = 0u; n < 8u; n++) {
        let e = lane + 32u * n;
        let i = 16u * sg + e / 16u;
        let j = 16u * ct + e % 16u;
        if (i < len) {
            let decay = select(0.0, exp(min(g_s[i] - g_s[j], 0.0)), j <= i);
            mats[p * half + out_base + i * params.heads_v * CHUNK + j] = f * decay * out_tile[o + e];
        }
    }
    workgroupBarrier();
}

@compute @workgroup_size(128)
fn value_grams_coop(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let chunk = wid.x;
    let hv = wid.y;
    let sg = t / 32u;
    let start = chunks[2u * chunk];
    let len = chunks[2u * chunk + 1u];
    let hv_count = params.heads_v;
    let vd = params.value_dim;
    let half = params.total_tokens * hv_count * vd;
    let out_base = (start * hv_count + hv) * CHUNK;

    if (t < CHUNK) {
        g_s[t] = gate_beta[(start + min(t, len - 1u)) * hv_count + hv].x;
    }
    zero[t] = 0.0;
    zero[t + WG] = 0.0;
    workgroupBarrier();

    var p0 = zero_acc(); var p1 = zero_acc(); var p2 = zero_acc(); var p3 = zero_acc();
    var a0 = zero_acc(); var a1 = zero_acc(); var a2 = zero_acc(); var a3 = zero_acc();
    for (var v0 = 0u; v0 < vd; v0 += VS) {
        // Element e = t + 128 n (n < 8) of each 64 × 16 tile: row e / 16, column e % 16.
        for (var n = 0u; n < 8u; n++) {
            let e = t + WG * n;
            let i = e / VS;
            let inside = i < len;
            let at = ((start + min(i, len - 1u)) * hv_count + hv) * vd + v0 + e % VS;
            a_do[e] = f16(select(0.0, load_elem(do_buf[elem_word(at)], at), inside));
            a_dn[e] = f16(select(0.0, dvnew_dv[at], inside));
            b_vn[e] = f16(select(0.0, w_vnew[half + at], inside));
            b_w[e] = f16(select(0.0, w_vnew[at], inside));
        }
        workgroupBarrier();
        let ad = do_tile(sg);
        let an = dn_tile(sg);
        let bv0 = vn_tile(0u);
        let bv1 = vn_tile(1u);
        let bv2 = vn_tile(2u);
        let bv3 = vn_tile(3u);
        p0 = coopMultiplyAdd(ad, bv0, p0);
        p1 = coopMultiplyAdd(ad, bv1, p1);
        p2 = coopMultiplyAdd(ad, bv2, p2);
        p3 = coopMultiplyAdd(ad, bv3, p3);
        let bw0 = w_tile(0u);
        let bw1 = w_tile(1u);
        let bw2 = w_tile(2u);
        let bw3 = w_tile(3u);
        a0 = coopMultiplyAdd(an, bw0, a0);
        a1 = coopMultiplyAdd(an, bw1, a1);
        a2 = coopMultiplyAdd(an, bw2, a2);
        a3 = coopMultiplyAdd(an, bw3, a3);
        workgroupBarrier();
    }

    store_out(p0, t, sg, 0u, 0u, len, out_base);
    store_out(p1, t, sg, 0u, 1u, len, out_base);
    store_out(p2, t, sg, 0u, 2u, len, out_base);
    store_out(p3, t, sg, 0u, 3u, len, out_base);
    store_out(a0, t, sg, 1u, 0u, len, out_base);
    store_out(a1, t, sg, 1u, 1u, len, out_base);
    store_out(a2, t, sg, 1u, 2u, len, out_base);
    store_out(a3, t, sg, 1u, 3u, len, out_base);
}
