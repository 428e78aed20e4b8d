// Family snippet of wy_inverse and wy_inverse_coop: the 64×64 unit-lower-triangular inverse
// A = (I + L)⁻¹ in f32, in place over L's ten lower 16×16 blocks in `arena` (block (bi, bj)
// at word blk(bi, bj), row-major). `arena` (array<vec4<f32>>, at least SOLVE_SCRATCH + 768
// words: vec4 elements, so that row pieces are single 16-byte accesses) and the constants
// SOLVE_WG (its invocations, ≥ 64) and SOLVE_SCRATCH (a multiple of 4) are declared by
// forward/wy_gram.wgsl, the other snippet of the family.
//
// Two steps, eight barriers in all:
//   1. the four diagonal blocks by forward substitution, one column per invocation;
//   2. block back-substitution by block rows, every block of a row at once:
//        A_ij = −A_ii · X_ij,   X_ij = Σ_{m=j}^{i−1} L_im A_mj     (j < i),
//      whose operands (A_mj, m < i) the previous rows have finished. Each invocation
//      computes a strip of four adjacent columns of one row (as the CUDA prep does,
//      shaders/cuda/chunk.cuh): a 16-byte load of L (four of its terms) feeds 16 FMAs, and the
//      A (or X) rows are 16-byte loads shared by the strip's row neighbours.

// Word offset of lower block (bi, bj), bj ≤ bi.
fn blk(bi: u32, bj: u32) -> u32 {
    return (bi * (bi + 1u) / 2u + bj) * 256u;
}

// Word i of `arena`.
fn word(i: u32) -> f32 {
    return arena[i / 4u][i % 4u];
}

fn set_word(i: u32, x: f32) {
    arena[i / 4u][i % 4u] = x;
}

// Words i .. i + 3 of `arena` (i a multiple of 4: a row piece of a block).
fn arena4(i: u32) -> vec4<f32> {
    return arena[i / 4u];
}

// Σ_q l[q] · (row q of the four rows at `rows`, 16 words apart), columns of this strip.
fn strip_terms(l: vec4<f32>, rows: u32) -> vec4<f32> {
    return l.x * arena4(rows) + l.y * arena4(rows + 16u) + l.z * arena4(rows + 32u)
        + l.w * arena4(rows + 48u);
}

// Call from uniform control flow (barriers); L must be in place and visible.
fn solve_inverse(t: u32) {
    // Diagonal blocks: invocation (d, col) solves column col of (I + L_dd)⁻¹,
    // x_rr = δ(rr, col) − Σ_{m<rr} L[rr, m] x_m, reading L only (0 for m ≥ rr, so whole rows
    // are dotted); x lives in four vec4 registers updated with lane masks (an indexed
    // private array would live in local memory). Written back once every column is solved.
    let d = t / 16u;
    let col = t % 16u;
    var x0 = vec4<f32>(0.0);
    var x1 = vec4<f32>(0.0);
    var x2 = vec4<f32>(0.0);
    var x3 = vec4<f32>(0.0);
    if (t < CHUNK) {
        let base = blk(d, d);
        let lane = vec4<u32>(0u, 1u, 2u, 3u);
        for (var rr = 0u; rr < 16u; rr++) {
            let row = base + rr * 16u;
            let v = select(0.0, 1.0, rr == col) - dot(arena4(row), x0) - dot(arena4(row + 4u), x1)
                - dot(arena4(row + 8u), x2) - dot(arena4(row + 12u), x3);
            x0 += select(vec4<f32>(0.0), vec4<f32>(v), lane == vec4<u32>(rr));
            x1 += select(vec4<f32>(0.0), vec4<f32>(v), lane + 4u == vec4<u32>(rr));
            x2 += select(vec4<f32>(0.0), vec4<f32>(v), lane + 8u == vec4<u32>(rr));
            x3 += select(vec4<f32>(0.0), vec4<f32>(v), lane + 12u == vec4<u32>(rr));
        }
    }
    workgroupBarrier();
    if (t < CHUNK) {
        let base = blk(d, d) + col;
        for (var q = 0u; q < 4u; q++) {
            set_word(base + q * 16u, x0[q]);
            set_word(base + (q + 4u) * 16u, x1[q]);
            set_word(base + (q + 8u) * 16u, x2[q]);
            set_word(base + (q + 12u) * 16u, x3[q]);
        }
    }
    workgroupBarrier();

    // Block rows 1..3. Strip s of row bi: block column bj = s / 64, row r = (s % 64) / 4,
    // columns j4 .. j4 + 3 with j4 = 4 (s % 4). The sums read L_im (m ≥ j) of this row only,
    // which the second half overwrites after a barrier.
    for (var bi = 1u; bi < 4u; bi++) {
        for (var s = t; s < bi * 64u; s += SOLVE_WG) {
            let bj = s / 64u;
            let r = (s % 64u) / 4u;
            let j4 = 4u * (s % 4u);
            var xs = vec4<f32>(0.0);
            for (var m = bj; m < bi; m++) {
                let lrow = blk(bi, m) + r * 16u;
                let acol = blk(m, bj) + j4;
                xs += strip_terms(arena4(lrow), acol) + strip_terms(arena4(lrow + 4u), acol + 64u)
                    + strip_terms(arena4(lrow + 8u), acol + 128u)
                    + strip_terms(arena4(lrow + 12u), acol + 192u);
            }
            arena[(SOLVE_SCRATCH + bj * 256u + r * 16u + j4) / 4u] = xs;
        }
        workgroupBarrier();
        for (var s = t; s < bi * 64u; s += SOLVE_WG) {
            let bj = s / 64u;
            let r = (s % 64u) / 4u;
            let j4 = 4u * (s % 4u);
            let drow = blk(bi, bi) + r * 16u;
            let xcol = SOLVE_SCRATCH + bj * 256u + j4;
            let y = strip_terms(arena4(drow), xcol) + strip_terms(arena4(drow + 4u), xcol + 64u)
                + strip_terms(arena4(drow + 8u), xcol + 128u)
                + strip_terms(arena4(drow + 12u), xcol + 192u);
            arena[(blk(bi, bj) + r * 16u + j4) / 4u] = -y;
        }
        workgroupBarrier();
    }
}
