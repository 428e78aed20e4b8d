// 8 A tiles from storage per iteration, loaded one iteration ahead (as the scan prefetches
// K and γ ⊙ Q), each feeding one product. LOAD is one of the ld_* helpers above; the probe
// assembles one entry point per helper from this template.
@compute @workgroup_size(WG)
fn LOAD_ENTRY(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    init(t);
    let sg = t / 32u;
    let b = wg_tile(sg, 0u);
    let b1 = wg_tile(sg, 1u);
    var c0 = zero_acc();
    var c1 = zero_acc();
    var c2 = zero_acc();
    var c3 = zero_acc();
    var a0 = LOAD(k_offset(wg.x, sg, 0u, 0u));
    var a1 = LOAD(k_offset(wg.x, sg, 0u, 1u));
    var a2 = LOAD(k_offset(wg.x, sg, 0u, 2u));
    var a3 = LOAD(k_offset(wg.x, sg, 0u, 3u));
    var a4 = LOAD(k_offset(wg.x, sg, 0u, 4u));
    var a5 = LOAD(k_offset(wg.x, sg, 0u, 5u));
    var a6 = LOAD(k_offset(wg.x, sg, 0u, 6u));
    var a7 = LOAD(k_offset(wg.x, sg, 0u, 7u));
    for (var it = 0u; it < ITERS; it++) {
        c0 = coopMultiplyAdd(a0, b, c0);
        c1 = coopMultiplyAdd(a1, b1, c1);
        c2 = coopMultiplyAdd(a2, b, c2);
        c3 = coopMultiplyAdd(a3, b1, c3);
        c0 = coopMultiplyAdd(a4, b1, c0);
        c1 = coopMultiplyAdd(a5, b, c1);
        c2 = coopMultiplyAdd(a6, b1, c2);
        c3 = coopMultiplyAdd(a7, b, c3);
        let n = it + 1u;
        a0 = LOAD(k_offset(wg.x, sg, n, 0u));
        a1 = LOAD(k_offset(wg.x, sg, n, 1u));
        a2 = LOAD(k_offset(wg.x, sg, n, 2u));
        a3 = LOAD(k_offset(wg.x, sg, n, 3u));
        a4 = LOAD(k_offset(wg.x, sg, n, 4u));
        a5 = LOAD(k_offset(wg.x, sg, n, 5u));
        a6 = LOAD(k_offset(wg.x, sg, n, 6u));
        a7 = LOAD(k_offset(wg.x, sg, n, 7u));
    }
    finish(wg.x, sg, c0 + c1 + c2 + c3);
}

