// wy_inverse_coop: the coop path's per-(chunk, q/k head) pass — wy_inverse.wgsl's Gram products
// (once per q/k head: K Kᵀ and Q Kᵀ do not depend on the v-head) and, for each v-head of the
// head's group in turn, the inverse, writing the coop scan's f16 operands on the way:
//     A = (I + strict_lower(diag(β) K Kᵀ))⁻¹      f32, kept for the backward
//     gated[i, 0..64)   = Γ ⊙ A ⊙ β_col          f16, the scan's V' = gated_A · W
//     gated[i, 64..128) = Γ ⊙ Q Kᵀ                f16, the scan's intra-chunk output term
//     k16 = f16(k)
//     qg16 = f16(γ ⊙ q)  per v-head (the scan accumulates (γ ⊙ Q) S straight into O)
// The f16 operands are exact for bf16 and f16 storage (within f16's range, the coop path's
// documented condition) and rounded once for f32. Everything else is f32, as in wy_inverse.
//
// Why not cooperative matrices: an earlier version of this pass ran the Gram products on
// them (one workgroup of four subgroups, the twenty 16×16 products staged through 31 KiB of
// workgroup memory) and took 6.42 ms on the H200 at 16/64 heads × 32768 tokens, bf16, where
// the scalar wy_inverse took 2.86 ms with f32 inputs: the products are a small part of the
// pass, and the larger workgroup memory and half the invocations left the solve and the
// stores with fewer warps per SM. This layout is wy_inverse's: 256 invocations, 13.3 KiB,
// Γ ⊙ Q Kᵀ stored straight from the accumulators; the layout, Gram products, L and stores are
// forward/wy_gram.wgsl's, shared with wy_inverse (this file stages K and Q and writes the
// f16 operands).
//
// Rows past a partial chunk's end are staged as zeros (so they contribute nothing) and never
// stored: those rows of k16 and qg16 belong to the next chunk, which writes them.

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> k_buf: array<Elem4>;                 // [B·T, H, K]
@group(0) @binding(2) var<storage, read> q_buf: array<Elem4>;                 // [B·T, H, K]
@group(0) @binding(3) var<storage, read> gate_beta: array<vec2<f32>>;         // [B·T, HV]: (G, β)
@group(0) @binding(4) var<storage, read> chunks: array<u32>;                  // per chunk: start, length
@group(0) @binding(5) var<storage, read_write> a_out: array<f32>;             // [B·T, HV, 64]
@group(0) @binding(6) var<storage, read_write> gated_out: array<f16>;        // [B·T + 64, HV, 128]
@group(0) @binding(7) var<storage, read_write> k16_out: array<vec4<f16>>;     // [B·T + 64, H, K]
@group(0) @binding(8) var<storage, read_write> qg16_out: array<vec4<f16>>;    // [B·T + 64, HV, K]

const KD: u32 = 128u;              // key dimension (the coop path's)

fn store_gated(i: u32, x: f32) {
    gated_out[i] = f16(x);
}

@compute @workgroup_size(256)
fn wy_inverse_coop(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let chunk = wid.x;
    let h = wid.y;
    let start = chunks[2u * chunk];
    let len = chunks[2u * chunk + 1u];
    let hv_count = params.heads_v;
    let group = hv_count / params.heads_qk;
    let r = t / 16u;
    let c = t % 16u;

    var g = Grams();
    // Staging: invocation t loads row t / 4, columns 4 (t % 4) .. + 3 of each slice, and
    // writes the same elements of k16 (and, per v-head below, of qg16).
    let srow = t / 4u;
    let scol = 4u * (t % 4u);
    let inside = srow < len;
    let token = start + min(srow, len - 1u);
    let kq_base = (token * params.heads_qk + h) * KD + scol;
    let sidx = srow * ROW + scol;
    // The next slice's loads are issued before this slice's products (clamped rows, masked
    // values), so their latency hides behind them.
    var kx = select(vec4<f32>(0.0), load4(k_buf[kq_base / 4u]), inside);
    var qx = select(vec4<f32>(0.0), load4(q_buf[kq_base / 4u]), inside);
    for (var k0 = 0u; k0 < KD; k0 += K_SLICE) {
        if (inside) {
            k16_out[(kq_base + k0) / 4u] = vec4<f16>(kx);
        }
        workgroupBarrier();
        arena[sidx / 4u] = kx;
        arena[(Q_STAGE + sidx) / 4u] = qx;
        workgroupBarrier();
        if (k0 + K_SLICE < KD) {
            let gi = kq_base + k0 + K_SLICE;
            kx = select(vec4<f32>(0.0), load4(k_buf[gi / 4u]), inside);
            qx = select(vec4<f32>(0.0), load4(q_buf[gi / 4u]), inside);
        }
        g = gram_slice(g, r, c);
    }
    workgroupBarrier();

    // The Grams are the q/k head's; the gates, the inverse and the gated matrices are each
    // v-head's of its group, in turn.
    for (var j = 0u; j < group; j++) {
        let hv = h * group + j;
        load_gates(t, start, len, hv);
        workgroupBarrier();
        if (inside) {
            let gam = exp(g_s[srow]);
            let qg_base = (token * hv_count + hv) * KD + scol;
            for (var k0 = 0u; k0 < KD; k0 += K_SLICE) {
                let qv = load4(q_buf[(kq_base + k0) / 4u]);
                qg16_out[(qg_base + k0) / 4u] = vec4<f16>(gam * qv);
            }
        }
        store_grams(t, start, hv, len, g);
        solve_inverse(t);
        store_inverse(t, start, hv, len);
        // Before the next v-head's gates and L overwrite g_s, beta_s and the arena.
        workgroupBarrier();
    }
}
