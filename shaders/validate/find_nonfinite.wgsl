// find_nonfinite: the flat index of the first element of a tensor that is NaN or ±Inf (and,
// with REJECT_POSITIVE, the first that is > 0: log-decays g without gate_in_kernel), or
// 0xffffffff when there is none. It reads the tensor as u32 words and tests bit patterns:
// WGSL lets implementations assume floats are finite, so `x != x` may be compiled away.
// One invocation per word; 16-bit elements are packed two per word, element 2w in the low
// half (as little-endian memory lays out f16 and bf16 alike).

override ELEMENT_BITS: u32 = 32u;           // 32 (f32) or 16 (f16, bf16)
override EXPONENT_MASK: u32 = 0x7f800000u;  // f32; f16 0x7c00, bf16 0x7f80: all ones = NaN/Inf
override REJECT_POSITIVE: bool = false;

@group(0) @binding(0) var<uniform> params: Params;               // rows: elements
@group(0) @binding(1) var<storage, read> words: array<u32>;
@group(0) @binding(2) var<storage, read_write> first_bad: array<atomic<u32>>;  // [1]

fn is_bad(bits: u32) -> bool {
    let not_finite = (bits & EXPONENT_MASK) == EXPONENT_MASK;
    let positive = (bits >> (ELEMENT_BITS - 1u)) == 0u
        && (bits & ((1u << (ELEMENT_BITS - 1u)) - 1u)) != 0u;
    return not_finite || (REJECT_POSITIVE && positive);
}

@compute @workgroup_size(64)
fn find_nonfinite(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let per_word = 32u / ELEMENT_BITS;
    let w = flat_index(gid, nwg);
    if (w >= (params.rows + per_word - 1u) / per_word) {
        return;
    }
    let word = words[w];
    for (var i = 0u; i < per_word; i++) {
        let e = w * per_word + i;
        var bits = word;
        if (ELEMENT_BITS == 16u) {
            bits = (word >> (16u * i)) & 0xffffu;
        }
        if (e < params.rows && is_bad(bits)) {
            atomicMin(&first_bad[0], e);
        }
    }
}
