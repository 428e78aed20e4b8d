// 8 B tiles from workgroup memory per iteration (the scan's S, W, V' operands), each feeding
// one product; the tile moves with `it` so the loads stay in the loop. TILE is wg_tile or
// wg4_tile.
@compute @workgroup_size(WG)
fn WG_ENTRY(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    init(t);
    let sg = t / 32u;
    let a = ld_rt(k_offset(wg.x, sg, 0u, 0u));
    let a1 = ld_rt(k_offset(wg.x, sg, 0u, 1u));
    var c0 = zero_acc();
    var c1 = zero_acc();
    var c2 = zero_acc();
    var c3 = zero_acc();
    for (var it = 0u; it < ITERS; it++) {
        let r = it % 4u;
        let b0 = TILE(r, 0u);
        let b1 = TILE(r, 1u);
        let b2 = TILE(r + 1u, 0u);
        let b3 = TILE(r + 1u, 1u);
        let b4 = TILE(r + 2u, 0u);
        let b5 = TILE(r + 2u, 1u);
        let b6 = TILE(r + 3u, 0u);
        let b7 = TILE(r + 3u, 1u);
        c0 = coopMultiplyAdd(a, b0, c0);
        c1 = coopMultiplyAdd(a, b1, c1);
        c2 = coopMultiplyAdd(a1, b2, c2);
        c3 = coopMultiplyAdd(a1, b3, c3);
        c0 = coopMultiplyAdd(a, b4, c0);
        c1 = coopMultiplyAdd(a, b5, c1);
        c2 = coopMultiplyAdd(a1, b6, c2);
        c3 = coopMultiplyAdd(a1, b7, c3);
    }
    finish(wg.x, sg, c0 + c1 + c2 + c3);
}

