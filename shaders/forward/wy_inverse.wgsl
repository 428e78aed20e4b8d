// wy_inverse: per (chunk, q/k head) the Gram products K Kᵀ and Q Kᵀ (they do not depend on
// the v-head: once per GVA group), then for each v-head of the group in turn the gate-free WY
// inverse
//     A = (I + strict_lower(diag(β) K Kᵀ))⁻¹          (64×64, unit lower triangular)
// solved in 16×16 blocks (forward/wy_solve.wgsl). The gate never enters A (it commutes with
// every factor and is re-applied as Γ ⊙ A in the scan), so A has no exponentials at all.
// Rows past a partial chunk's end have k = 0 and β = 0, so they neither contribute nor are
// stored.
//
// The pass also takes the gate-dependent, state-independent work off the scan's sequential
// path (it is parallel over chunks here): per token row it writes
//     gated[i, 0..64)   = Γ ⊙ A ⊙ β_col       (the scan's V' = gated_A · W)
//     gated[i, 64..128) = Γ ⊙ Q Kᵀ            (the scan's intra-chunk output term)
// both 0 above the diagonal, every exponent ≤ 0. A itself is kept for the backward.
// The gated matrices are f32 here; the coop path's pass (wy_inverse_coop.wgsl) writes them
// in f16.
//
// The workgroup layout (13.3 KiB), the Gram products, L and the stores are
// forward/wy_gram.wgsl's, shared with wy_inverse_coop; this file stages K and Q.

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> k_buf: array<Elem>;              // [B·T, H, K]
@group(0) @binding(2) var<storage, read> q_buf: array<Elem>;              // [B·T, H, K]
@group(0) @binding(3) var<storage, read> gate_beta: array<vec2<f32>>;     // [B·T, HV]: (G, β)
@group(0) @binding(4) var<storage, read> chunks: array<u32>;              // per chunk: start, length
@group(0) @binding(5) var<storage, read_write> a_out: array<f32>;         // [B·T, HV, 64]
@group(0) @binding(6) var<storage, read_write> gated_out: array<f32>;   // [B·T, HV, 128]

override K_DIM: u32;

fn k_at(i: u32) -> f32 {
    return load_elem(k_buf[elem_word(i)], i);
}

fn q_at(i: u32) -> f32 {
    return load_elem(q_buf[elem_word(i)], i);
}

fn store_gated(i: u32, x: f32) {
    gated_out[i] = x;
}

@compute @workgroup_size(256)
fn wy_inverse(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let chunk = wid.x;
    let h = wid.y;
    let start = chunks[2u * chunk];
    let len = chunks[2u * chunk + 1u];
    let group = params.heads_v / params.heads_qk;
    let r = t / 16u;
    let c = t % 16u;

    var g = Grams();
    // Staging: invocation t loads row t / 4, columns 4 (t % 4) .. + 3 of each slice.
    let srow = t / 4u;
    let scol = 4u * (t % 4u);
    let inside = srow < len;
    let gbase = ((start + min(srow, len - 1u)) * params.heads_qk + h) * K_DIM + scol;
    let sidx = srow * ROW + scol;
    for (var k0 = 0u; k0 < K_DIM; k0 += K_SLICE) {
        // All eight loads are issued before any is used (clamped rows, masked values).
        let gi = gbase + k0;
        let kx = select(vec4<f32>(0.0), vec4<f32>(k_at(gi), k_at(gi + 1u), k_at(gi + 2u), k_at(gi + 3u)), inside);
        let qx = select(vec4<f32>(0.0), vec4<f32>(q_at(gi), q_at(gi + 1u), q_at(gi + 2u), q_at(gi + 3u)), inside);
        workgroupBarrier();
        arena[sidx / 4u] = kx;
        arena[(Q_STAGE + sidx) / 4u] = qx;
        workgroupBarrier();
        g = gram_slice(g, r, c);
    }
    workgroupBarrier();

    // The Grams are the q/k head's; the gates, the inverse and the gated matrices are each
    // v-head's of its group, in turn.
    for (var j = 0u; j < group; j++) {
        let hv = h * group + j;
        load_gates(t, start, len, hv);
        workgroupBarrier();
        store_grams(t, start, hv, len, g);
        solve_inverse(t);
        store_inverse(t, start, hv, len);
        // Before the next v-head's gates and L overwrite g_s, beta_s and the arena.
        workgroupBarrier();
    }
}
