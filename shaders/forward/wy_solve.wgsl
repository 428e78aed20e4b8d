// Family snippet of wy_inverse and wy_inverse_coop: the 64×64 unit-lower-triangular inverse
// A = (I + L)⁻¹ in f32, in place over L's ten lower 16×16 blocks in `arena` (block (bi, bj)
// at blk(bi, bj), row-major). The includer declares `arena` (f32, at least SOLVE_SCRATCH +
// 768 words) and the constants SOLVE_WG (its invocations, ≥ 64) and SOLVE_SCRATCH.
//
// Two steps, eight barriers in all:
//   1. the four diagonal blocks by forward substitution, one column per invocation;
//   2. block back-substitution by block rows, every block of a row at once:
//        A_ij = −A_ii · X_ij,   X_ij = Σ_{m=j}^{i−1} L_im A_mj     (j < i),
//      whose operands (A_mj, m < i) the previous rows have finished.

// Offset of lower block (bi, bj), bj ≤ bi.
fn blk(bi: u32, bj: u32) -> u32 {
    return (bi * (bi + 1u) / 2u + bj) * 256u;
}

// Four consecutive words of `arena` (a row piece of a block).
fn arena4(i: u32) -> vec4<f32> {
    return vec4<f32>(arena[i], arena[i + 1u], arena[i + 2u], arena[i + 3u]);
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
            arena[base + q * 16u] = x0[q];
            arena[base + (q + 4u) * 16u] = x1[q];
            arena[base + (q + 8u) * 16u] = x2[q];
            arena[base + (q + 12u) * 16u] = x3[q];
        }
    }
    workgroupBarrier();

    // Block rows 1..3. Element e of row bi: block bj = e / 256, entry (r, c). The sums read
    // L_im (m ≥ j) of this row only, which the second half overwrites after a barrier.
    for (var bi = 1u; bi < 4u; bi++) {
        for (var e = t; e < bi * 256u; e += SOLVE_WG) {
            let bj = e / 256u;
            let r = (e % 256u) / 16u;
            let c = e % 16u;
            var xs = 0.0;
            for (var m = bj; m < bi; m++) {
                let lrow = blk(bi, m) + r * 16u;
                let acol = blk(m, bj) + c;
                xs += dot(arena4(lrow), vec4<f32>(arena[acol], arena[acol + 16u], arena[acol + 32u], arena[acol + 48u]))
                    + dot(arena4(lrow + 4u), vec4<f32>(arena[acol + 64u], arena[acol + 80u], arena[acol + 96u], arena[acol + 112u]))
                    + dot(arena4(lrow + 8u), vec4<f32>(arena[acol + 128u], arena[acol + 144u], arena[acol + 160u], arena[acol + 176u]))
                    + dot(arena4(lrow + 12u), vec4<f32>(arena[acol + 192u], arena[acol + 208u], arena[acol + 224u], arena[acol + 240u]));
            }
            arena[SOLVE_SCRATCH + e] = xs;
        }
        workgroupBarrier();
        for (var e = t; e < bi * 256u; e += SOLVE_WG) {
            let bj = e / 256u;
            let r = (e % 256u) / 16u;
            let c = e % 16u;
            let drow = blk(bi, bi) + r * 16u;
            let xcol = SOLVE_SCRATCH + bj * 256u + c;
            let y = dot(arena4(drow), vec4<f32>(arena[xcol], arena[xcol + 16u], arena[xcol + 32u], arena[xcol + 48u]))
                + dot(arena4(drow + 4u), vec4<f32>(arena[xcol + 64u], arena[xcol + 80u], arena[xcol + 96u], arena[xcol + 112u]))
                + dot(arena4(drow + 8u), vec4<f32>(arena[xcol + 128u], arena[xcol + 144u], arena[xcol + 160u], arena[xcol + 176u]))
                + dot(arena4(drow + 12u), vec4<f32>(arena[xcol + 192u], arena[xcol + 208u], arena[xcol + 224u], arena[xcol + 240u]));
            arena[blk(bi, bj) + e % 256u] = -y;
        }
        workgroupBarrier();
    }
}
