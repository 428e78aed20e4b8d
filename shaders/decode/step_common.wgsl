// Shared by the decode kernels (recurrent_step.wgsl, subgroup_step.wgsl): the bindings other
// than q, k, v (2-4) and o (8), which each kernel declares in the width it reads, the uniform
// tables, slot codes and the gate activations. Needs `Elem` (shaders/common/dtype_*)
// and `State4` (shaders/decode/state_*) declared before it.
//
// Slot codes (one i32 per sequence, built by the host): c ≥ 0 resumes from pool slot c and
// writes it back; c = -1 is padding (zero state, the pool is not written); c ≤ -2 starts
// from a zero state and writes pool slot -2 - c. A pool larger than one storage binding is
// bound in windows of slots, one pass each; slot codes are relative to the window, and a
// sequence whose slot is in another window has code SLOT_ELSEWHERE: its workgroups walk no
// tokens and write nothing.

@group(0) @binding(0) var<uniform> params: Params;
// Words: token starts [N + 1], slot codes [N], A_log [HV], dt_bias [HV] (f32 bits).
@group(0) @binding(1) var<uniform> tables: array<vec4<u32>, 4096>;
@group(0) @binding(5) var<storage, read> g_buf: array<f32>;                        // [B·T, HV]
@group(0) @binding(6) var<storage, read> beta_buf: array<f32>;                     // [B·T, HV]
@group(0) @binding(7) var<storage, read_write> pool: array<State4>;                 // [P, HV, K, V] or V-first
@group(0) @binding(9) var<storage, read_write> token_states: array<State4>;         // [B·T, HV, K, V] or V-first

const SLOT_PADDING: i32 = -1;
const SLOT_ELSEWHERE: i32 = -2147483647 - 1;   // i32::MIN

fn table_word(i: u32) -> u32 {
    return tables[i / 4u][i % 4u];
}

fn softplus(x: f32) -> f32 {
    if (x > 20.0) {
        return x;
    }
    return log(1.0 + exp(x));
}

fn gate_of(tok: u32, hv: u32, a_log: f32, dt_bias: f32) -> vec2<f32> {
    let flags = params.flags;
    let gi = tok * params.heads_v + hv;
    var g = g_buf[gi];
    var beta = beta_buf[gi];
    if (has_flag(flags, FLAG_GATE_IN_KERNEL)) {
        g = -exp(a_log) * softplus(g + dt_bias);
    }
    if (has_flag(flags, FLAG_BETA_SIGMOID)) {
        beta = 1.0 / (1.0 + exp(-beta));
    }
    if (has_flag(flags, FLAG_NEG_EIGVAL)) {
        beta = 2.0 * beta;
    }
    return vec2<f32>(exp(g), beta);
}

// What a workgroup of sequence n does: its tokens start..end (none for a sequence of another
// pool window), the slot it reads (-1: a zero state) and the slot it writes (-1: none), and
// head hv's A_log, dt_bias.
struct Sequence {
    start: u32,
    end: u32,
    read_slot: i32,
    write_slot: i32,
    a_log: f32,
    dt_bias: f32,
}

fn sequence_of(n: u32, hv: u32) -> Sequence {
    let sequences = params.num_segments;
    let code = bitcast<i32>(table_word(sequences + 1u + n));
    // No early return for a sequence of another window: lavapipe runs workgroups with
    // barriers much slower when some return before them.
    let elsewhere = code == SLOT_ELSEWHERE;
    let start = table_word(n);
    let end = select(table_word(n + 1u), start, elsewhere);
    var write_slot = -1;
    if (code >= 0) {
        write_slot = code;
    } else if (code < SLOT_PADDING && !elsewhere) {
        write_slot = -2 - code;
    }
    // The host validated the codes; this only keeps a corrupted table inside the pool.
    if (write_slot >= i32(params.rows)) {
        write_slot = -1;
    }
    let read_slot = select(-1, code, code >= 0 && write_slot >= 0);
    return Sequence(start, end, read_slot, write_slot,
                    bitcast<f32>(table_word(2u * sequences + 1u + hv)),
                    bitcast<f32>(table_word(2u * sequences + 1u + params.heads_v + hv)));
}
