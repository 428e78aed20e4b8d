// state_scan's workgroup-memory operands for the scalar path: f32, multiplied in f32, one row
// (or token) per step of the triangle loops and the state update — exactly the scalar loops
// (`mac(acc, rows, coefs)` is `acc + coefs * rows`, one fused multiply-add per lane).
alias Operand = f32;
const STEP: u32 = 1u;
// One row of a V-block tile at the invocation's columns, and its coefficient.
alias Rows = vec4<f32>;
alias Coefs = f32;

fn mac(acc: vec4<f32>, rows: Rows, coefs: Coefs) -> vec4<f32> {
    return acc + coefs * rows;
}

// Row j of the W/V' tile (at 0).
fn tile_rows(j: u32, c: u32) -> Rows {
    return cols4(j * V_BLOCK, c);
}

// Entry (i, j) of a packed lower triangle.
fn tri_coefs(base: u32, i: u32, j: u32) -> Coefs {
    return tri_or_zero(base, i, j);
}

// (γ_C/γ_i) ⊙ V' row i.
fn decayed_rows(i: u32, c: u32) -> Rows {
    return dec_s[i] * cols4(i * V_BLOCK, c);
}

// K rows k..k+3 of the token-slice row at `krow`: lane ii is state row k + ii's coefficient.
fn token_krows(krow: u32, k: u32) -> vec4<f32> {
    return krow4(krow, k);
}

// Value n of an f32 array at `base` in workgroup memory (the packed-o exchange): one word.
fn put_f32(base: u32, n: u32, x: f32) {
    arena[base + n] = x;
}

fn get_f32(base: u32, n: u32) -> f32 {
    return arena[base + n];
}
