// Per-dispatch parameters shared by every pass (mirrors `gpu::params::Params`).
struct Params {
    total_tokens: u32,   // B·T, the packed token axis
    heads_qk: u32,       // H
    heads_v: u32,        // HV
    key_dim: u32,        // K
    value_dim: u32,      // V
    num_chunks: u32,     // rows of the chunk table
    num_segments: u32,   // rows of the segment table
    flags: u32,          // FLAG_* bits
    scale: f32,          // output scale
    rows: u32,           // work items of 1-D passes
    _pad0: u32,
    _pad1: u32,
}

const FLAG_L2NORM: u32 = 1u;
const FLAG_BETA_SIGMOID: u32 = 2u;
const FLAG_NEG_EIGVAL: u32 = 4u;
const FLAG_GATE_IN_KERNEL: u32 = 8u;
const FLAG_STATE_V_FIRST: u32 = 16u;

// Tokens per chunk.
const CHUNK: u32 = 64u;

fn has_flag(flags: u32, f: u32) -> bool {
    return (flags & f) != 0u;
}

// Flattened index of a 1-D pass dispatched on a 2-D grid of 64-wide workgroups (the grid is
// split when a dimension would exceed 65535 workgroups).
fn flat_index(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * 64u;
}
