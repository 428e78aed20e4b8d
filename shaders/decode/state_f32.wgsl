// Decode state storage f32: a group of four consecutive state elements is one vec4<f32>.
alias State4 = vec4<f32>;

fn state_in(w: State4) -> vec4<f32> {
    return w;
}

fn state_out(x: vec4<f32>) -> State4 {
    return x;
}
