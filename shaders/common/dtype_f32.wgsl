// Storage dtype f32: q, k, v, o are stored as f32.
alias Elem = f32;

fn elem_to_f32(x: Elem) -> f32 {
    return x;
}

fn f32_to_elem(x: f32) -> Elem {
    return x;
}
