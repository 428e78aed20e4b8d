// prepare_qk: the in-kernel l2norm of q or k, one head vector per invocation:
// x ← x / sqrt(Σx² + 1e-6). Run once for q and once for k; the normalized copy is kept for
// the backward (the caller's tensor is never modified).

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x_in: array<Elem>;
@group(0) @binding(2) var<storage, read_write> x_out: array<Elem>;

@compute @workgroup_size(64)
fn prepare_qk(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = flat_index(gid, nwg);
    if (row >= params.total_tokens * params.heads_qk) {
        return;
    }
    let dim = params.key_dim;
    let base = row * dim;
    var ss = 0.0;
    for (var i = 0u; i < dim; i++) {
        let x = load_elem(x_in[elem_word(base + i)], base + i);
        ss += x * x;
    }
    let r = 1.0 / sqrt(ss + 1e-6);
    // Element pairs (dim is even), so packed storage writes whole words.
    for (var i = 0u; i < dim; i += 2u) {
        let a = load_elem(x_in[elem_word(base + i)], base + i) * r;
        let b = load_elem(x_in[elem_word(base + i + 1u)], base + i + 1u) * r;
        if (ELEMS_PER_WORD == 2u) {
            x_out[elem_word(base + i)] = pack_pair(a, b);
        } else {
            x_out[base + i] = pack_elem(a);
            x_out[base + i + 1u] = pack_elem(b);
        }
    }
}
