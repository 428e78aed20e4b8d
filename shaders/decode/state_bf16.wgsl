// Decode state storage bf16 (opt-in: half the traffic of a bandwidth-bound step): four
// consecutive state elements are two u32 words, element 2w in the low half. The arithmetic
// stays f32; the state is rounded to nearest even once, when it is stored.
alias State4 = vec2<u32>;

fn state_in(w: State4) -> vec4<f32> {
    return vec4<f32>(bitcast<f32>(w.x << 16u), bitcast<f32>(w.x & 0xffff0000u),
                     bitcast<f32>(w.y << 16u), bitcast<f32>(w.y & 0xffff0000u));
}

// An f32 rounded to bf16 bits, to nearest even; NaN stays a (quiet) NaN.
fn state_bf16_bits(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        return (b >> 16u) | 0x40u;
    }
    return (b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u;
}

fn state_out(x: vec4<f32>) -> State4 {
    return vec2<u32>(state_bf16_bits(x.x) | (state_bf16_bits(x.y) << 16u),
                     state_bf16_bits(x.z) | (state_bf16_bits(x.w) << 16u));
}
