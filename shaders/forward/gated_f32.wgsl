// wy_inverse's gated matrices for the scalar scan: f32.
alias Gated = f32;
