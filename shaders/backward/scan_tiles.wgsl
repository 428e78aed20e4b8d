// Tile helpers shared by the backward's two scans (state_recompute, dh_scan). The Rust side
// inserts this file before each of those passes (`Pass::family_snippets`); it uses their
// declarations of `arena`, `k_buf`, `K_DIM`, `V_BLOCK`, `TC`, `K_SLICE` and `K_PITCH`.

fn k_at(i: u32) -> f32 {
    return load_elem(k_buf[elem_word(i)], i);
}

fn tri(i: u32, j: u32) -> u32 {
    return i * (i + 1u) / 2u + j;
}

// The invocation's columns c + 16 j (j < TC) of a row starting at `base`; other lanes 0.
fn cols4(base: u32, c: u32) -> vec4<f32> {
    var x = vec4<f32>(arena[base + c], 0.0, 0.0, 0.0);
    if (TC > 1u) {
        x.y = arena[base + c + 16u];
    }
    if (TC > 2u) {
        x.z = arena[base + c + 32u];
        x.w = arena[base + c + 48u];
    }
    return x;
}

// Column `kk` of rows row0..row0+3 of a slice with row pitch `pitch`.
fn rows4(base: u32, row0: u32, pitch: u32, kk: u32) -> vec4<f32> {
    return vec4<f32>(arena[base + row0 * pitch + kk], arena[base + (row0 + 1u) * pitch + kk],
                     arena[base + (row0 + 2u) * pitch + kk], arena[base + (row0 + 3u) * pitch + kk]);
}

fn state_index(base: u32, k: u32, v: u32, v_first: bool) -> u32 {
    if (v_first) {
        return base + v * K_DIM + k;
    }
    return base + k * params.value_dim + v;
}

// Rows i..i+3 (from `at`, pitch V_BLOCK) of a workgroup tile at column `col`.
fn store_tile_rows(at: u32, col: u32, x: vec4<f32>) {
    arena[at + col] = x.x;
    arena[at + V_BLOCK + col] = x.y;
    arena[at + 2u * V_BLOCK + col] = x.z;
    arena[at + 3u * V_BLOCK + col] = x.w;
}

// Rows k..k+3 of the token-slice row at `base` (the state update's K values).
fn krow4(base: u32, k: u32) -> vec4<f32> {
    return vec4<f32>(arena[base + k], arena[base + k + 1u], arena[base + k + 2u], arena[base + k + 3u]);
}

// Entries j = c + 16 jj ≤ i of row i into the packed triangle at `tr`.
fn store_tri_row(tr: u32, i: u32, c: u32, x: vec4<f32>) {
    if (c <= i) {
        arena[tr + tri(i, c)] = x.x;
    }
    if (c + 16u <= i) {
        arena[tr + tri(i, c + 16u)] = x.y;
    }
    if (c + 32u <= i) {
        arena[tr + tri(i, c + 32u)] = x.z;
    }
    if (c + 48u <= i) {
        arena[tr + tri(i, c + 48u)] = x.w;
    }
}

// Four consecutive K values of the 64 × 16 slice at column k0: row t / 4, columns
// (t % 4)·4 … +3; 0 past the chunk.
fn load_k4(base: u32, len: u32, h: u32, k0: u32, t: u32) -> vec4<f32> {
    let i = t / 4u;
    let gi = ((base + min(i, len - 1u)) * params.heads_qk + h) * K_DIM + k0 + (t % 4u) * 4u;
    let x = vec4<f32>(k_at(gi), k_at(gi + 1u), k_at(gi + 2u), k_at(gi + 3u));
    return select(vec4<f32>(0.0), x, vec4<bool>(i < len));
}

fn store_slice4(dst: u32, t: u32, x: vec4<f32>) {
    let at = dst + (t / 4u) * K_PITCH + (t % 4u) * 4u;
    arena[at] = x.x;
    arena[at + 1u] = x.y;
    arena[at + 2u] = x.z;
    arena[at + 3u] = x.w;
}
