// wy_inverse's gated matrices for the coop scan: f16, its cooperative-matrix operand type.
alias Gated = f16;
