// Storage dtype f32: q, k, v, o (and their gradients) are stored as f32, one per word.
alias Elem = f32;
const ELEMS_PER_WORD: u32 = 1u;

// Word of element i, and element i's value given that word.
fn elem_word(i: u32) -> u32 {
    return i;
}

fn load_elem(w: Elem, i: u32) -> f32 {
    return w;
}

// The word holding one element (one element per word).
fn pack_elem(x: f32) -> Elem {
    return x;
}

// The word holding elements (2i, 2i+1) at two elements per word; unused at one per word.
fn pack_pair(a: f32, b: f32) -> Elem {
    return a;
}

fn elem_to_f32(x: Elem) -> f32 {
    return x;
}

fn f32_to_elem(x: f32) -> Elem {
    return x;
}

// Four consecutive elements (4-aligned element index) as one vector: one 16-byte access.
alias Elem4 = vec4<f32>;

fn load4(w: Elem4) -> vec4<f32> {
    return w;
}

fn pack4(x: vec4<f32>) -> Elem4 {
    return x;
}
