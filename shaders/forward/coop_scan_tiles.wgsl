// Tile helpers shared by the four cooperative-matrix scans: forward/state_scan_coop,
// forward/state_chain_coop, backward/state_recompute_coop and backward/dh_scan_coop. The Rust
// side inserts this file before each of them (`Pass::family_snippets`), then the K operand's
// (coop_k_direct.wgsl or coop_k_staged.wgsl); it uses their declarations of `gated16` (f16
// in storage), `state_slots` (the f32 state tiles: S, or dS in dh_scan), `s16`, `x16` (f16
// tiles, row pitch `SP`), `stage` (f32, row pitch `FP`), `zero`, `BV`, `KD` and `WG`.
//
// naga: coopLoad/coopStore are column-major, coopLoadT/coopStoreT row-major; every pointer
// index is bound with `let` first (naga 30's SPIR-V backend panics on a computed index in a
// cooperative store); cooperative ops need uniform control flow, so flags are tested inline.

// The head counts (params.heads_qk, params.heads_v), set by the launchers as pipeline constants
// so that the storage tiles' strides (H·K, HV·K, HV·2·CHUNK) are compile-time constants: on
// the H200 a cooperative load from storage with a constant stride cost half as much as one
// with the stride from a uniform (examples/coop_probe.rs, docs/compute-paths.md). 0 takes
// them from params (`GDN_COOP_UNIFORM_STRIDES=on`, the A/B switch).
override HEADS_QK_CONST: u32;
override HEADS_V_CONST: u32;

fn heads_qk_count() -> u32 {
    return select(params.heads_qk, HEADS_QK_CONST, HEADS_QK_CONST != 0u);
}

fn heads_v_count() -> u32 {
    return select(params.heads_v, HEADS_V_CONST, HEADS_V_CONST != 0u);
}

// Row tiles of the gated matrices: the A operands of (Γ ⊙ ...) X.
fn gated_rows(i: u32, stride: u32) -> coop_mat16x16<f16, A> {
    return coopLoadT<coop_mat16x16<f16, A>>(&gated16[i], stride);
}

// A tile of a gated matrix's transpose: a column-major read.
fn gated_cols(i: u32, stride: u32) -> coop_mat16x16<f16, A> {
    return coopLoad<coop_mat16x16<f16, A>>(&gated16[i], stride);
}

// Tile (r, c) of s16 or x16.
fn s_tile(r: u32, c: u32) -> coop_mat16x16<f16, B> {
    let i = 16u * (r * SP + c);
    return coopLoadT<coop_mat16x16<f16, B>>(&s16[i], SP);
}

fn x_tile(r: u32, c: u32) -> coop_mat16x16<f16, B> {
    let i = 16u * (r * SP + c);
    return coopLoadT<coop_mat16x16<f16, B>>(&x16[i], SP);
}

fn zero_acc() -> coop_mat16x16<f32, C> {
    return coopLoad<coop_mat16x16<f32, C>>(&zero[0], 16u);
}

// An f32 tile of `stage` at element offset i (row pitch FP).
fn store_tile(m: coop_mat16x16<f32, C>, i: u32) {
    coopStoreT(m, &stage[i], FP);
}

fn stage_tile(i: u32) -> coop_mat16x16<f32, C> {
    return coopLoadT<coop_mat16x16<f32, C>>(&stage[i], FP);
}

// The f32 state tile at key row `row`, value column `col` of the state at `base` in
// `state_slots` ([K][V], or V-first: [V][K]), and its store.
fn state_load(base: u32, row: u32, col: u32) -> coop_mat16x16<f32, C> {
    let vd = params.value_dim;
    let i_vfirst = base + col * KD + row;
    let i_kfirst = base + row * vd + col;
    if ((params.flags & FLAG_STATE_V_FIRST) != 0u) {
        return coopLoad<coop_mat16x16<f32, C>>(&state_slots[i_vfirst], KD);
    }
    return coopLoadT<coop_mat16x16<f32, C>>(&state_slots[i_kfirst], vd);
}

fn state_store(m: coop_mat16x16<f32, C>, base: u32, row: u32, col: u32) {
    let vd = params.value_dim;
    let i_vfirst = base + col * KD + row;
    let i_kfirst = base + row * vd + col;
    if ((params.flags & FLAG_STATE_V_FIRST) != 0u) {
        coopStore(m, &state_slots[i_vfirst], KD);
    } else {
        coopStoreT(m, &state_slots[i_kfirst], vd);
    }
}

// Half of the state (rows 32 g + 16 upper .. + 15 of every subgroup g, whose tiles are s0 and
// s1) → stage → s16. Call from uniform control flow (it holds barriers).
fn publish_half(t: u32, sg: u32, upper: u32, s0: coop_mat16x16<f32, C>, s1: coop_mat16x16<f32, C>) {
    let base = 16u * FP * sg;
    store_tile(s0, base);
    store_tile(s1, base + 16u);
    workgroupBarrier();
    for (var n = 0u; n < BV / 2u; n++) {
        let e = t + WG * n;
        // stage row r = 16 g + r' is state row 32 g + 16 upper + r'.
        let row = e / BV;
        let col = e % BV;
        let g = row / 16u;
        s16[(row + 16u * (g + upper)) * SP + col] = f16(stage[row * FP + col]);
    }
    workgroupBarrier();
}
