enable f16;
// Storage dtype f16 (needs SHADER_F16): one element per word; arithmetic stays f32.
alias Elem = f16;
const ELEMS_PER_WORD: u32 = 1u;

fn elem_word(i: u32) -> u32 {
    return i;
}

fn load_elem(w: Elem, i: u32) -> f32 {
    return f32(w);
}

fn pack_elem(x: f32) -> Elem {
    return f16(x);
}

fn pack_pair(a: f32, b: f32) -> Elem {
    return f16(a);
}

fn elem_to_f32(x: Elem) -> f32 {
    return f32(x);
}

fn f32_to_elem(x: f32) -> Elem {
    return f16(x);
}

// Four consecutive elements (4-aligned element index) as one vector: one 8-byte access.
alias Elem4 = vec4<f16>;

fn load4(w: Elem4) -> vec4<f32> {
    return vec4<f32>(w);
}

fn pack4(x: vec4<f32>) -> Elem4 {
    return vec4<f16>(x);
}
