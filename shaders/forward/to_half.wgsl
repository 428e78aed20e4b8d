// to_half: a q or k tensor `[B·T, H, K]` (any storage dtype) copied to f16, the operand type
// of the coop scan's cooperative-matrix GEMMs, followed by one chunk of zero rows so that a
// 64-row tile starting at any token stays inside the buffer. Four elements per invocation.
// Values are rounded to nearest; |x| ≥ 65520 becomes ±inf (the coop path's documented range).

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x_in: array<Elem>;        // [B·T, H, K]
@group(0) @binding(2) var<storage, read_write> x_out: array<f16>;  // [B·T + 64, H, K]

@compute @workgroup_size(64)
fn to_half(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = params.heads_qk * params.key_dim;
    let n_in = params.total_tokens * row;
    let n_out = n_in + CHUNK * row;
    let e = 4u * flat_index(gid, nwg);
    if (e >= n_out) {
        return;
    }
    for (var i = 0u; i < 4u; i++) {
        let j = e + i;
        var x = 0.0;
        if (j < n_in) {
            x = load_elem(x_in[elem_word(j)], j);
        }
        x_out[j] = f16(x);
    }
}
