// state_scan's workgroup-memory operands for the f16-math path (ComputePath::F16Math, needs
// SHADER_F16): K, Q and S slices, the packed gated triangles, the W/V' tile and the state
// update's K slices are held as f16 and multiplied in f16. Every f16 sum spans at most four
// products (one column of a mat4x4<f16> product, or one mat4x4<f16>·vec4<f16>); it is
// converted to f32 and added to an f32 accumulator. The state, the gates, β and every
// accumulator stay f32. Values must fit f16 (|x| < 65504).
alias Operand = f16;
// Four rows (or tokens) per step of the triangle loops and the state update: row0 + 4 and
// T_SLICE are multiples of 4.
const STEP: u32 = 4u;
// Four rows of a V-block tile at the invocation's columns (one per matrix column), and their
// four coefficients.
alias Rows = mat4x4<f16>;
alias Coefs = vec4<f16>;

// acc + Σ_d rows[d]·coefs[d]: a four-term f16 sum per lane, converted, added in f32.
fn mac(acc: vec4<f32>, rows: Rows, coefs: Coefs) -> vec4<f32> {
    return acc + vec4<f32>(rows * coefs);
}

// Rows j..j+3 of the W/V' tile (at 0).
fn tile_rows(j: u32, c: u32) -> Rows {
    return Rows(cols4(j * V_BLOCK, c), cols4((j + 1u) * V_BLOCK, c),
                cols4((j + 2u) * V_BLOCK, c), cols4((j + 3u) * V_BLOCK, c));
}

// Entries (i, j..j+3) of a packed lower triangle.
fn tri_coefs(base: u32, i: u32, j: u32) -> Coefs {
    return Coefs(tri_or_zero(base, i, j), tri_or_zero(base, i, j + 1u),
                 tri_or_zero(base, i, j + 2u), tri_or_zero(base, i, j + 3u));
}

// (γ_C/γ) ⊙ V' rows i..i+3, each scaled in f32 and rounded once.
fn decayed_row(i: u32, c: u32) -> vec4<f16> {
    return vec4<f16>(dec_s[i] * vec4<f32>(cols4(i * V_BLOCK, c)));
}

fn decayed_rows(i: u32, c: u32) -> Rows {
    return Rows(decayed_row(i, c), decayed_row(i + 1u, c), decayed_row(i + 2u, c),
                decayed_row(i + 3u, c));
}

// K rows k..k+3 of the four token-slice rows from `krow`: column ii (after the transpose)
// holds state row k + ii's coefficients, one per token.
fn token_krows(krow: u32, k: u32) -> mat4x4<f16> {
    return transpose(mat4x4<f16>(krow4(krow, k), krow4(krow + T_PITCH, k),
                                 krow4(krow + 2u * T_PITCH, k), krow4(krow + 3u * T_PITCH, k)));
}

// Value n of an f32 array at `base` in f16 workgroup memory (the packed-o exchange of bf16
// storage): an f16 head and the f16 rounding of its remainder in two slots, 22 significant
// bits, ample before the bf16 rounding (8).
fn put_f32(base: u32, n: u32, x: f32) {
    let hi = f16(x);
    arena[base + 2u * n] = hi;
    arena[base + 2u * n + 1u] = f16(x - f32(hi));
}

fn get_f32(base: u32, n: u32) -> f32 {
    return f32(arena[base + 2u * n]) + f32(arena[base + 2u * n + 1u]);
}
