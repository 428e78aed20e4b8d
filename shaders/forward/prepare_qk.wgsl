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
        let x = elem_to_f32(x_in[base + i]);
        ss += x * x;
    }
    let r = 1.0 / sqrt(ss + 1e-6);
    for (var i = 0u; i < dim; i++) {
        x_out[base + i] = f32_to_elem(elem_to_f32(x_in[base + i]) * r);
    }
}
