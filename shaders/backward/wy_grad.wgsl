// wy_grad: per (chunk, v-head) the gradients through Ab = A·diag(β) and the gate-free WY
// inverse A = (I + strict_lower(diag(β) K Kᵀ))⁻¹, from dP and dAb of value_grams:
//     E    = P ⊙ dP + Ab ⊙ dAb (strictly lower)    dG_i  = rowsum(E)_i − colsum(E)_i
//     dβ_j = Σ_i dAb_ij A_ij                        dAr   = dAb · diag(β)
//     dL   = −strict_lower(Aᵀ dAr Aᵀ)               dβ_i += Σ_j dL_ij (k_i·k_j)
//     dAt  = diag(β) dL                              (dk gets (dAt + dAtᵀ) K in qk_grad)
// P ⊙ dP equals Pg ⊙ dPg of the gated form (the Γ and scale moved onto dP). Writes (dG, dβ)
// per token — dG is the Γ-mask part of the cumulative-gate gradient; dβ is complete (w.r.t.
// the activated β) — and replaces dAb by dAt in `mats`.
//
// The products with A use only the lower triangles they need: X = dAr Aᵀ is needed at m > j
// only (X_mj = Σ_{p≤j} dAr_mp A_jp), and (Aᵀ X)_ij = Σ_{m≥i} A_mi X_mj for i > j. Row and
// column sums go through a packed triangle in workgroup memory, summed in a fixed order.
//
// Invocation t owns row t/4 and columns t%4 + 4n (n < 16). Workgroup memory: the 64×16 Q and
// K slices of the Gram products, then the packed triangle (2080 words): 8.5 KiB.

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> q_buf: array<Elem>;              // [B·T, H, K]
@group(0) @binding(2) var<storage, read> k_buf: array<Elem>;              // [B·T, H, K]
@group(0) @binding(3) var<storage, read> a_buf: array<f32>;               // [B·T, HV, 64]
@group(0) @binding(4) var<storage, read> gate_beta: array<vec2<f32>>;     // [B·T, HV]: (G, β)
@group(0) @binding(5) var<storage, read> chunks: array<u32>;              // per chunk: start, length
@group(0) @binding(6) var<storage, read_write> mats: array<f32>;          // [2, B·T, HV, 64]: dP, dAb → dAt
@group(0) @binding(7) var<storage, read_write> dg_dbeta: array<vec2<f32>>; // [B·T, HV]: (dG, dβ)

override K_DIM: u32;
const K_SLICE: u32 = 16u;

var<workgroup> arena: array<f32, 2080>;
var<workgroup> b_s: array<f32, 64>;

fn tri(i: u32, j: u32) -> u32 {
    return i * (i + 1u) / 2u + j;
}

@compute @workgroup_size(256)
fn wy_grad(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let chunk = wid.x;
    let hv = wid.y;
    let start = chunks[2u * chunk];
    let len = chunks[2u * chunk + 1u];
    let hv_count = params.heads_v;
    let h_count = params.heads_qk;
    let h = hv / (hv_count / h_count);
    let row = t / 4u;
    let cg = t % 4u;
    let mats_half = params.total_tokens * hv_count * CHUNK;

    if (t < CHUNK) {
        var b = 0.0;
        if (t < len) {
            b = gate_beta[(start + t) * hv_count + hv].y;
        }
        b_s[t] = b;
    }

    // P = Q Kᵀ and K Kᵀ at (row, j), over 16-column slices of K.
    var p: array<f32, 16>;
    var kk: array<f32, 16>;
    for (var n = 0u; n < 16u; n++) {
        p[n] = 0.0;
        kk[n] = 0.0;
    }
    for (var k0 = 0u; k0 < K_DIM; k0 += K_SLICE) {
        workgroupBarrier();
        for (var e = t; e < 64u * K_SLICE; e += 256u) {
            let i = e / K_SLICE;
            var qx = 0.0;
            var kx = 0.0;
            if (i < len) {
                let gi = ((start + i) * h_count + h) * K_DIM + k0 + e % K_SLICE;
                qx = elem_to_f32(q_buf[gi]);
                kx = elem_to_f32(k_buf[gi]);
            }
            arena[e] = qx;
            arena[1024u + e] = kx;
        }
        workgroupBarrier();
        for (var c = 0u; c < K_SLICE; c++) {
            let qr = arena[row * K_SLICE + c];
            let kr = arena[1024u + row * K_SLICE + c];
            for (var n = 0u; n < 16u; n++) {
                let kj = arena[1024u + (cg + 4u * n) * K_SLICE + c];
                p[n] += qr * kj;
                kk[n] += kr * kj;
            }
        }
    }

    // This invocation's entries of A, dP, dAb (zero outside the chunk's lower triangle).
    let valid_row = row < len;
    let own_row = ((start + row) * hv_count + hv) * CHUNK;
    var a: array<f32, 16>;
    var dab: array<f32, 16>;
    var e: array<f32, 16>;
    for (var n = 0u; n < 16u; n++) {
        let j = cg + 4u * n;
        a[n] = 0.0;
        dab[n] = 0.0;
        e[n] = 0.0;
        if (valid_row && j <= row) {
            a[n] = a_buf[own_row + j];
            dab[n] = mats[mats_half + own_row + j];
            if (j < row) {
                e[n] = p[n] * mats[own_row + j] + a[n] * b_s[j] * dab[n];
            }
        }
    }

    // dG_i = rowsum(E)_i − colsum(E)_i.
    workgroupBarrier();
    for (var n = 0u; n < 16u; n++) {
        let j = cg + 4u * n;
        if (j <= row) {
            arena[tri(row, j)] = e[n];
        }
    }
    workgroupBarrier();
    var dg = 0.0;
    var db = 0.0;
    if (t < CHUNK) {
        for (var j = 0u; j <= t; j++) {
            dg += arena[tri(t, j)];
        }
        for (var i = t; i < CHUNK; i++) {
            dg -= arena[tri(i, t)];
        }
    }

    // dβ_j = colsum(dAb ⊙ A)_j (the diagonal included: Ab_jj = β_j).
    workgroupBarrier();
    for (var n = 0u; n < 16u; n++) {
        let j = cg + 4u * n;
        if (j <= row) {
            arena[tri(row, j)] = dab[n] * a[n];
        }
    }
    workgroupBarrier();
    if (t < CHUNK) {
        for (var i = t; i < CHUNK; i++) {
            db += arena[tri(i, t)];
        }
    }

    // dAr = dAb · diag(β) into the triangle.
    workgroupBarrier();
    for (var n = 0u; n < 16u; n++) {
        let j = cg + 4u * n;
        if (j <= row) {
            arena[tri(row, j)] = dab[n] * b_s[j];
        }
    }
    workgroupBarrier();

    // X_ij = Σ_{p≤j} dAr_ip A_jp for j < i (rows j < i < len are valid).
    var x: array<f32, 16>;
    for (var n = 0u; n < 16u; n++) {
        let j = cg + 4u * n;
        var acc = 0.0;
        if (valid_row && j < row) {
            let a_row_j = ((start + j) * hv_count + hv) * CHUNK;
            for (var q = 0u; q <= j; q++) {
                acc += arena[tri(row, q)] * a_buf[a_row_j + q];
            }
        }
        x[n] = acc;
    }
    workgroupBarrier();
    for (var n = 0u; n < 16u; n++) {
        let j = cg + 4u * n;
        if (j <= row) {
            arena[tri(row, j)] = x[n];
        }
    }
    workgroupBarrier();

    // dL_ij = −Σ_{m=i}^{len−1} A_mi X_mj for j < i; dAt = diag(β) dL; dL ⊙ KKᵀ for dβ.
    var dl: array<f32, 16>;
    for (var n = 0u; n < 16u; n++) {
        let j = cg + 4u * n;
        var acc = 0.0;
        if (valid_row && j < row) {
            for (var m = row; m < len; m++) {
                acc += a_buf[((start + m) * hv_count + hv) * CHUNK + row] * arena[tri(m, j)];
            }
        }
        dl[n] = -acc;
    }
    if (valid_row) {
        for (var n = 0u; n < 16u; n++) {
            let j = cg + 4u * n;
            mats[mats_half + own_row + j] = b_s[row] * dl[n];
        }
    }
    workgroupBarrier();
    for (var n = 0u; n < 16u; n++) {
        let j = cg + 4u * n;
        if (j <= row) {
            arena[tri(row, j)] = dl[n] * kk[n];
        }
    }
    workgroupBarrier();
    if (t < len) {
        for (var j = 0u; j < t; j++) {
            db += arena[tri(t, j)];
        }
        dg_dbeta[(start + t) * hv_count + hv] = vec2<f32>(dg, db);
    }
}
