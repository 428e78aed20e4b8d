// Family snippet of wy_inverse and wy_inverse_coop (with forward/wy_solve.wgsl): their common
// workgroup layout and every step but the staging of K and Q — the gates, the Gram products
// K Kᵀ and Q Kᵀ of a staged slice, L = strict_lower(diag(β) K Kᵀ) into the arena, and the
// stores of A and the gated matrices. The includer declares the bindings (`gate_beta`,
// `a_out`, `gated_out`) and `fn store_gated(i: u32, x: f32)`, which writes element i of
// `gated_out` in its dtype (f32 or f16).
//
// Workgroup memory (13.3 KiB, within every WebGPU device's 16 KiB): during the Gram products
// the first 2560 words stage 64 × 16 slices of K and Q, rows 20 words apart (vec4 reads of
// 20 distinct rows hit distinct banks); then the ten lower blocks of L / A and the solve's
// sums. The arena is declared as vec4s so that every row piece is one 16-byte access (the
// compiler need not prove four scalar accesses adjacent and aligned).

const WG: u32 = 256u;
const K_SLICE: u32 = 16u;
const ROW: u32 = 20u;              // staged row stride (K_SLICE + 4)
const Q_STAGE: u32 = 64u * ROW;
const SOLVE_WG: u32 = WG;
const SOLVE_SCRATCH: u32 = 2560u;

var<workgroup> arena: array<vec4<f32>, 832>;   // 3328 words (wy_solve.wgsl: word, arena4)
var<workgroup> beta_s: array<f32, 64>;
var<workgroup> g_s: array<f32, 64>;

// The chunk's G and β into g_s, beta_s. Padded rows: β = 0, G = G_last (so Γ never sees a
// positive exponent).
fn load_gates(t: u32, start: u32, len: u32, hv: u32) {
    if (t < CHUNK) {
        let hv_count = params.heads_v;
        var gb = vec2<f32>(gate_beta[(start + len - 1u) * hv_count + hv].x, 0.0);
        if (t < len) {
            gb = gate_beta[(start + t) * hv_count + hv];
        }
        g_s[t] = gb.x;
        beta_s[t] = gb.y;
    }
}

// The lower 16×16 blocks of K Kᵀ (a) and Q Kᵀ (p); an invocation owns entry (r, c) of each
// block. Named fields rather than an indexed array: drivers keep them in registers (an array
// indexed in a loop that is not unrolled lands in local memory).
struct Grams {
    a00: f32, a10: f32, a11: f32, a20: f32, a21: f32,
    a22: f32, a30: f32, a31: f32, a32: f32, a33: f32,
    p00: f32, p10: f32, p11: f32, p20: f32, p21: f32,
    p22: f32, p30: f32, p31: f32, p32: f32, p33: f32,
}

// `g` plus the products of the K and Q slices staged in the arena (64 rows of K_SLICE).
fn gram_slice(g0: Grams, r: u32, c: u32) -> Grams {
    var g = g0;
    for (var kk = 0u; kk < K_SLICE; kk += 4u) {
        let kr0 = arena4(r * ROW + kk);
        let kr1 = arena4((16u + r) * ROW + kk);
        let kr2 = arena4((32u + r) * ROW + kk);
        let kr3 = arena4((48u + r) * ROW + kk);
        let kc0 = arena4(c * ROW + kk);
        let kc1 = arena4((16u + c) * ROW + kk);
        let kc2 = arena4((32u + c) * ROW + kk);
        let kc3 = arena4((48u + c) * ROW + kk);
        let qr0 = arena4(Q_STAGE + r * ROW + kk);
        let qr1 = arena4(Q_STAGE + (16u + r) * ROW + kk);
        let qr2 = arena4(Q_STAGE + (32u + r) * ROW + kk);
        let qr3 = arena4(Q_STAGE + (48u + r) * ROW + kk);
        g.a00 += dot(kr0, kc0);
        g.a10 += dot(kr1, kc0);
        g.a11 += dot(kr1, kc1);
        g.a20 += dot(kr2, kc0);
        g.a21 += dot(kr2, kc1);
        g.a22 += dot(kr2, kc2);
        g.a30 += dot(kr3, kc0);
        g.a31 += dot(kr3, kc1);
        g.a32 += dot(kr3, kc2);
        g.a33 += dot(kr3, kc3);
        g.p00 += dot(qr0, kc0);
        g.p10 += dot(qr1, kc0);
        g.p11 += dot(qr1, kc1);
        g.p20 += dot(qr2, kc0);
        g.p21 += dot(qr2, kc1);
        g.p22 += dot(qr2, kc2);
        g.p30 += dot(qr3, kc0);
        g.p31 += dot(qr3, kc1);
        g.p32 += dot(qr3, kc2);
        g.p33 += dot(qr3, kc3);
    }
    return g;
}

// Row i of Γ ⊙ Q Kᵀ at columns c + 16 bj (p holds the four blocks' values); 0 above the
// diagonal, every exponent ≤ 0; rows past the chunk are not stored.
fn store_gated_qk(start: u32, hv: u32, len: u32, i: u32, c: u32, p: vec4<f32>) {
    if (i < len) {
        let row = ((start + i) * params.heads_v + hv) * 2u * CHUNK + CHUNK;
        for (var bj = 0u; bj < 4u; bj++) {
            let j = 16u * bj + c;
            var v = 0.0;
            if (j <= i) {
                v = p[bj] * exp(g_s[i] - g_s[j]);
            }
            store_gated(row + j, v);
        }
    }
}

// After the products (the arena's slices no longer read): Γ ⊙ Q Kᵀ straight from the
// accumulators (blocks above the diagonal are 0), and L = strict_lower(diag(β) K Kᵀ) into
// the arena's blocks. Call from uniform control flow: it ends on a barrier.
fn store_grams(t: u32, start: u32, hv: u32, len: u32, g: Grams) {
    let r = t / 16u;
    let c = t % 16u;
    store_gated_qk(start, hv, len, r, c, vec4<f32>(g.p00, 0.0, 0.0, 0.0));
    store_gated_qk(start, hv, len, 16u + r, c, vec4<f32>(g.p10, g.p11, 0.0, 0.0));
    store_gated_qk(start, hv, len, 32u + r, c, vec4<f32>(g.p20, g.p21, g.p22, 0.0));
    store_gated_qk(start, hv, len, 48u + r, c, vec4<f32>(g.p30, g.p31, g.p32, g.p33));

    let strict = select(0.0, 1.0, c < r);
    set_word(blk(0u, 0u) + t, beta_s[r] * g.a00 * strict);
    set_word(blk(1u, 0u) + t, beta_s[16u + r] * g.a10);
    set_word(blk(1u, 1u) + t, beta_s[16u + r] * g.a11 * strict);
    set_word(blk(2u, 0u) + t, beta_s[32u + r] * g.a20);
    set_word(blk(2u, 1u) + t, beta_s[32u + r] * g.a21);
    set_word(blk(2u, 2u) + t, beta_s[32u + r] * g.a22 * strict);
    set_word(blk(3u, 0u) + t, beta_s[48u + r] * g.a30);
    set_word(blk(3u, 1u) + t, beta_s[48u + r] * g.a31);
    set_word(blk(3u, 2u) + t, beta_s[48u + r] * g.a32);
    set_word(blk(3u, 3u) + t, beta_s[48u + r] * g.a33 * strict);
    workgroupBarrier();
}

// After the solve: A (f32) and Γ ⊙ A ⊙ β (`store_gated`) of the valid rows, zeros above the
// diagonal blocks.
fn store_inverse(t: u32, start: u32, hv: u32, len: u32) {
    let hv_count = params.heads_v;
    for (var n = 0u; n < 16u; n++) {
        let e = t + WG * n;
        let i = e / CHUNK;
        let j = e % CHUNK;
        if (i < len) {
            var a = 0.0;
            if (j / 16u <= i / 16u) {
                a = word(blk(i / 16u, j / 16u) + (i % 16u) * 16u + j % 16u);
            }
            a_out[((start + i) * hv_count + hv) * CHUNK + j] = a;
            var ag = 0.0;
            if (j <= i) {
                ag = a * exp(g_s[i] - g_s[j]) * beta_s[j];
            }
            store_gated(((start + i) * hv_count + hv) * 2u * CHUNK + j, ag);
        }
    }
}
