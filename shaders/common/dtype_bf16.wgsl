// Storage dtype bf16: WGSL has no bf16, so two elements are packed per u32 word (element 2w
// in the low half, as little-endian memory lays them out) and unpacked to f32 in registers.
// Stores write whole words: kernels write element pairs, rounding to nearest even.
alias Elem = u32;
const ELEMS_PER_WORD: u32 = 2u;

fn elem_word(i: u32) -> u32 {
    return i >> 1u;
}

fn load_elem(w: Elem, i: u32) -> f32 {
    return bitcast<f32>(((w >> ((i & 1u) * 16u)) & 0xffffu) << 16u);
}

// Round an f32 to bf16 bits, to nearest even; NaN stays a (quiet) NaN.
fn bf16_bits(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        return (b >> 16u) | 0x40u;
    }
    return (b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u;
}

// A single element cannot be stored without its neighbour; kernels use pack_pair.
fn pack_elem(x: f32) -> Elem {
    return bf16_bits(x);
}

fn pack_pair(a: f32, b: f32) -> Elem {
    return bf16_bits(a) | (bf16_bits(b) << 16u);
}

// Four consecutive elements (4-aligned element index) as two words: one 8-byte access.
alias Elem4 = vec2<u32>;

fn load4(w: Elem4) -> vec4<f32> {
    return vec4<f32>(bitcast<f32>(w.x << 16u), bitcast<f32>(w.x & 0xffff0000u),
                     bitcast<f32>(w.y << 16u), bitcast<f32>(w.y & 0xffff0000u));
}

fn pack4(x: vec4<f32>) -> Elem4 {
    return vec2<u32>(pack_pair(x.x, x.y), pack_pair(x.z, x.w));
}
