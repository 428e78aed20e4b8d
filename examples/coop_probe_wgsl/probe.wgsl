// Kernels of examples/coop_probe.rs: each entry point repeats one kind of cooperative-matrix
// op ITERS × 8 times per subgroup, so that GPU time / (ITERS · 8) is the cost of one op of a
// subgroup with WG / 32 subgroups per workgroup and the grid the probe launches. Loads feed
// coopMultiplyAdd (or the result is dead and the op vanishes), so every load mode also pays
// 8 products per iteration: compare it with `mma_ind`, which issues only those.
//
// The data is one zeroed buffer seen two ways: f16 elements (what the scans' coop loads
// point at) and vec4<f16> (8-byte elements: SPIR-V lets a cooperative-matrix load's pointer
// have a vector element type, the stride then counts those; naga 30 takes the matrix's scalar
// from the pointer, so vec4<u32> words would make a u32 matrix). Each subgroup walks K-shaped tiles as state_scan_coop's
// K S does: tokens 64·it + 16·sg .. + 15 (rows, wrapping at P.rows) × keys 128·head + 16·j.

enable f16;
enable wgpu_cooperative_matrix;

struct Probe {
    stride: u32,   // the row stride of src16 in f16 elements (P.stride / 4 in src4)
    rows: u32,     // rows of src16 (tokens), a power of two ≥ 64
    heads: u32,    // qk-heads in a row (stride = 128 · heads)
    pad: u32,
}

@group(0) @binding(0) var<uniform> P: Probe;
@group(0) @binding(1) var<storage, read> src16: array<f16>;
@group(0) @binding(2) var<storage, read> src4: array<vec4<f16>>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

override WG: u32 = 128u;
override ITERS: u32 = 1024u;
const KSTRIDE: u32 = 2048u;   // the stride at 16 qk-heads, as a constant
const SP: u32 = 32u;          // row pitch of the f16 workgroup tile (state_scan_coop's s16)

alias A16 = coop_mat16x16<f16, A>;
alias B16 = coop_mat16x16<f16, B>;
alias C32 = coop_mat16x16<f32, C>;

var<workgroup> zero: array<f32, 256>;
var<workgroup> wg16: array<f16, 128u * SP>;          // [128][32] f16, like s16
var<workgroup> wg4: array<vec4<f16>, 128u * SP / 4u>; // the same shape as 8-byte words
var<workgroup> stage: array<f32, 64u * SP>;          // [64][32] f32, like stage

fn zero_acc() -> C32 {
    return coopLoad<C32>(&zero[0], 16u);
}

// Zero `zero` and the workgroup tiles (every entry point calls it first).
fn init(t: u32) {
    for (var i = t; i < 256u; i += WG) {
        zero[i] = 0.0;
    }
    for (var i = t; i < 128u * SP; i += WG) {
        wg16[i] = f16(0.0);
    }
    for (var i = t; i < 128u * SP / 4u; i += WG) {
        wg4[i] = vec4<f16>(0.0);
    }
    for (var i = t; i < 64u * SP; i += WG) {
        stage[i] = 0.0;
    }
    workgroupBarrier();
}

fn finish(wid: u32, sg: u32, c: C32) {
    let i = (wid * (WG / 32u) + sg) * 256u;
    coopStore(c, &out[i], 16u);
}

// Element offset of tile j (keys 16 j) of the K-shaped tiles of iteration `it`.
fn k_offset(wid: u32, sg: u32, it: u32, j: u32) -> u32 {
    let row = (64u * (it + wid) + 16u * sg) & (P.rows - 1u);
    return row * P.stride + 128u * (wid % P.heads) + 16u * j;
}

fn ld_rt(i: u32) -> A16 {
    let s = P.stride;
    return coopLoadT<A16>(&src16[i], s);
}

fn ld_const(i: u32) -> A16 {
    return coopLoadT<A16>(&src16[i], KSTRIDE);
}

fn ld_col(i: u32) -> A16 {
    let s = P.stride;
    return coopLoad<A16>(&src16[i], s);
}

fn ld_colconst(i: u32) -> A16 {
    return coopLoad<A16>(&src16[i], KSTRIDE);
}

fn ld_v4(i: u32) -> A16 {
    let w = i / 4u;
    let s = P.stride / 4u;
    return coopLoadT<A16>(&src4[w], s);
}

fn ld_v4col(i: u32) -> A16 {
    let w = i / 4u;
    let s = P.stride / 4u;
    return coopLoad<A16>(&src4[w], s);
}

// Tile r (of 8: rows 16 r) of wg16 / wg4, column block c.
fn wg_tile(r: u32, c: u32) -> B16 {
    let i = 16u * (r * SP + c);
    return coopLoadT<B16>(&wg16[i], SP);
}

fn wg4_tile(r: u32, c: u32) -> B16 {
    let i = 4u * (r * SP + c);
    return coopLoadT<B16>(&wg4[i], SP / 4u);
}

// A dependent chain: each product waits for the previous one (latency).
@compute @workgroup_size(WG)
fn mma_dep(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    init(t);
    let sg = t / 32u;
    let a = ld_rt(k_offset(wg.x, sg, 0u, 0u));
    let b = wg_tile(sg, 0u);
    var c = zero_acc();
    for (var it = 0u; it < ITERS; it++) {
        c = coopMultiplyAdd(a, b, c);
        c = coopMultiplyAdd(a, b, c);
        c = coopMultiplyAdd(a, b, c);
        c = coopMultiplyAdd(a, b, c);
        c = coopMultiplyAdd(a, b, c);
        c = coopMultiplyAdd(a, b, c);
        c = coopMultiplyAdd(a, b, c);
        c = coopMultiplyAdd(a, b, c);
    }
    finish(wg.x, sg, c);
}

// Four independent chains of two products each per iteration (the scans' pattern: u0, u1,
// o0, o1).
@compute @workgroup_size(WG)
fn mma_ind(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    init(t);
    let sg = t / 32u;
    let a = ld_rt(k_offset(wg.x, sg, 0u, 0u));
    let a1 = ld_rt(k_offset(wg.x, sg, 0u, 1u));
    let b = wg_tile(sg, 0u);
    let b1 = wg_tile(sg, 1u);
    var c0 = zero_acc();
    var c1 = zero_acc();
    var c2 = zero_acc();
    var c3 = zero_acc();
    for (var it = 0u; it < ITERS; it++) {
        c0 = coopMultiplyAdd(a, b, c0);
        c1 = coopMultiplyAdd(a, b1, c1);
        c2 = coopMultiplyAdd(a1, b, c2);
        c3 = coopMultiplyAdd(a1, b1, c3);
        c0 = coopMultiplyAdd(a1, b1, c0);
        c1 = coopMultiplyAdd(a1, b, c1);
        c2 = coopMultiplyAdd(a, b1, c2);
        c3 = coopMultiplyAdd(a, b, c3);
    }
    finish(wg.x, sg, c0 + c1 + c2 + c3);
}

// The f32 round trip: two accumulator tiles stored to workgroup memory (coopStoreT), a
// barrier, loaded back, a barrier, and two products on them — four of these per iteration
// (8 stores, 8 loads, 8 products, 8 barriers).
@compute @workgroup_size(WG)
fn roundtrip(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    init(t);
    let sg = t / 32u;
    let a = ld_rt(k_offset(wg.x, sg, 0u, 0u));
    let b = wg_tile(sg, 0u);
    var c0 = zero_acc();
    var c1 = zero_acc();
    let base = 16u * SP * (sg % 4u);
    for (var it = 0u; it < ITERS; it++) {
        for (var k = 0u; k < 4u; k++) {
            coopStoreT(c0, &stage[base], SP);
            let i1 = base + 16u;
            coopStoreT(c1, &stage[i1], SP);
            workgroupBarrier();
            c0 = coopLoadT<C32>(&stage[base], SP);
            c1 = coopLoadT<C32>(&stage[i1], SP);
            workgroupBarrier();
            c0 = coopMultiplyAdd(a, b, c0);
            c1 = coopMultiplyAdd(a, b, c1);
        }
    }
    finish(wg.x, sg, c0 + c1);
}

// state_scan_coop's publish + use, once per iteration: both f32 state tiles of this
// subgroup to `stage` (coopStoreT), a barrier, every invocation rounds its share of the
// 64 × 32 tile to f16 into wg16, a barrier, then 8 B tiles of wg16 feed 8 products whose
// sums are the next iteration's state tiles (the scan's dependence through the state).
@compute @workgroup_size(WG)
fn republish(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    init(t);
    let sg = t / 32u;
    let a = ld_rt(k_offset(wg.x, sg, 0u, 0u));
    var s0 = zero_acc();
    var s1 = zero_acc();
    let base = 16u * SP * (sg % 4u);
    for (var it = 0u; it < ITERS; it++) {
        coopStoreT(s0, &stage[base], SP);
        let i1 = base + 16u;
        coopStoreT(s1, &stage[i1], SP);
        workgroupBarrier();
        for (var e = t; e < 64u * SP; e += WG) {
            wg16[e + 64u * SP * (it % 2u)] = f16(stage[e]);
        }
        workgroupBarrier();
        let r = 4u * (it % 2u);
        let b0 = wg_tile(r, 0u);
        let b1 = wg_tile(r, 1u);
        let b2 = wg_tile(r + 1u, 0u);
        let b3 = wg_tile(r + 1u, 1u);
        let b4 = wg_tile(r + 2u, 0u);
        let b5 = wg_tile(r + 2u, 1u);
        let b6 = wg_tile(r + 3u, 0u);
        let b7 = wg_tile(r + 3u, 1u);
        s0 = coopMultiplyAdd(a, b0, s0);
        s1 = coopMultiplyAdd(a, b1, s1);
        s0 = coopMultiplyAdd(a, b2, s0);
        s1 = coopMultiplyAdd(a, b3, s1);
        s0 = coopMultiplyAdd(a, b4, s0);
        s1 = coopMultiplyAdd(a, b5, s1);
        s0 = coopMultiplyAdd(a, b6, s0);
        s1 = coopMultiplyAdd(a, b7, s1);
    }
    finish(wg.x, sg, s0 + s1);
}

// Nothing but the loop's barriers: two per iteration (the floor under `republish`).
@compute @workgroup_size(WG)
fn barriers(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    init(t);
    let sg = t / 32u;
    var acc = 0.0;
    for (var it = 0u; it < ITERS; it++) {
        stage[(t + it) % (64u * SP)] = acc;
        workgroupBarrier();
        acc += stage[(t + 7u * it) % (64u * SP)];
        workgroupBarrier();
    }
    out[(wg.x * (WG / 32u) + sg) * 256u + t % 32u] = acc;
}

// 8 A tiles per iteration staged by hand: each lane loads 16 bytes of every tile (row lane / 2,
// columns 8 (lane % 2) .. + 7; plain vector loads from storage, issued together one iteration
// ahead), writes them to its subgroup's own 8 tiles of workgroup memory, a subgroup barrier,
// then 8 cooperative loads from there (compare with load_const: the same tiles, cooperative
// loads from storage). Constant stride, as the scans'.
var<workgroup> sg_tiles: array<vec4<f16>, 4u * 8u * 64u>;   // per subgroup: 8 tiles of 16 × 16

fn stage_word(i: u32, lane: u32) -> u32 {
    return (i + (lane / 2u) * KSTRIDE + 8u * (lane % 2u)) / 4u;
}

fn put_tile(sg: u32, j: u32, lane: u32, a: vec4<f16>, b: vec4<f16>) {
    let w = (sg * 8u + j) * 64u + 2u * lane;
    sg_tiles[w] = a;
    sg_tiles[w + 1u] = b;
}

fn sg_tile(sg: u32, j: u32) -> A16 {
    let w = (sg * 8u + j) * 64u;
    return coopLoadT<A16>(&sg_tiles[w], 4u);
}

@compute @workgroup_size(WG)
fn stage8(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    init(t);
    let sg = t / 32u;
    let lane = t % 32u;
    let b = wg_tile(sg, 0u);
    let b1 = wg_tile(sg, 1u);
    var c0 = zero_acc();
    var c1 = zero_acc();
    var c2 = zero_acc();
    var c3 = zero_acc();
    var x0 = src4[stage_word(k_offset(wg.x, sg, 0u, 0u), lane)];
    var y0 = src4[stage_word(k_offset(wg.x, sg, 0u, 0u), lane) + 1u];
    var x1 = src4[stage_word(k_offset(wg.x, sg, 0u, 1u), lane)];
    var y1 = src4[stage_word(k_offset(wg.x, sg, 0u, 1u), lane) + 1u];
    var x2 = src4[stage_word(k_offset(wg.x, sg, 0u, 2u), lane)];
    var y2 = src4[stage_word(k_offset(wg.x, sg, 0u, 2u), lane) + 1u];
    var x3 = src4[stage_word(k_offset(wg.x, sg, 0u, 3u), lane)];
    var y3 = src4[stage_word(k_offset(wg.x, sg, 0u, 3u), lane) + 1u];
    var x4 = src4[stage_word(k_offset(wg.x, sg, 0u, 4u), lane)];
    var y4 = src4[stage_word(k_offset(wg.x, sg, 0u, 4u), lane) + 1u];
    var x5 = src4[stage_word(k_offset(wg.x, sg, 0u, 5u), lane)];
    var y5 = src4[stage_word(k_offset(wg.x, sg, 0u, 5u), lane) + 1u];
    var x6 = src4[stage_word(k_offset(wg.x, sg, 0u, 6u), lane)];
    var y6 = src4[stage_word(k_offset(wg.x, sg, 0u, 6u), lane) + 1u];
    var x7 = src4[stage_word(k_offset(wg.x, sg, 0u, 7u), lane)];
    var y7 = src4[stage_word(k_offset(wg.x, sg, 0u, 7u), lane) + 1u];
    for (var it = 0u; it < ITERS; it++) {
        subgroupBarrier();
        put_tile(sg, 0u, lane, x0, y0);
        put_tile(sg, 1u, lane, x1, y1);
        put_tile(sg, 2u, lane, x2, y2);
        put_tile(sg, 3u, lane, x3, y3);
        put_tile(sg, 4u, lane, x4, y4);
        put_tile(sg, 5u, lane, x5, y5);
        put_tile(sg, 6u, lane, x6, y6);
        put_tile(sg, 7u, lane, x7, y7);
        subgroupBarrier();
        let n = it + 1u;
        x0 = src4[stage_word(k_offset(wg.x, sg, n, 0u), lane)];
        y0 = src4[stage_word(k_offset(wg.x, sg, n, 0u), lane) + 1u];
        x1 = src4[stage_word(k_offset(wg.x, sg, n, 1u), lane)];
        y1 = src4[stage_word(k_offset(wg.x, sg, n, 1u), lane) + 1u];
        x2 = src4[stage_word(k_offset(wg.x, sg, n, 2u), lane)];
        y2 = src4[stage_word(k_offset(wg.x, sg, n, 2u), lane) + 1u];
        x3 = src4[stage_word(k_offset(wg.x, sg, n, 3u), lane)];
        y3 = src4[stage_word(k_offset(wg.x, sg, n, 3u), lane) + 1u];
        x4 = src4[stage_word(k_offset(wg.x, sg, n, 4u), lane)];
        y4 = src4[stage_word(k_offset(wg.x, sg, n, 4u), lane) + 1u];
        x5 = src4[stage_word(k_offset(wg.x, sg, n, 5u), lane)];
        y5 = src4[stage_word(k_offset(wg.x, sg, n, 5u), lane) + 1u];
        x6 = src4[stage_word(k_offset(wg.x, sg, n, 6u), lane)];
        y6 = src4[stage_word(k_offset(wg.x, sg, n, 6u), lane) + 1u];
        x7 = src4[stage_word(k_offset(wg.x, sg, n, 7u), lane)];
        y7 = src4[stage_word(k_offset(wg.x, sg, n, 7u), lane) + 1u];
        c0 = coopMultiplyAdd(sg_tile(sg, 0u), b, c0);
        c1 = coopMultiplyAdd(sg_tile(sg, 1u), b1, c1);
        c2 = coopMultiplyAdd(sg_tile(sg, 2u), b, c2);
        c3 = coopMultiplyAdd(sg_tile(sg, 3u), b1, c3);
        c0 = coopMultiplyAdd(sg_tile(sg, 4u), b1, c0);
        c1 = coopMultiplyAdd(sg_tile(sg, 5u), b, c1);
        c2 = coopMultiplyAdd(sg_tile(sg, 6u), b1, c2);
        c3 = coopMultiplyAdd(sg_tile(sg, 7u), b, c3);
    }
    finish(wg.x, sg, c0 + c1 + c2 + c3);
}
