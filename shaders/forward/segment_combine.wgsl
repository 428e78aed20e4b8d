// segment_combine: the sequential step of intra-device sequence parallelism. A sequence cut
// into segments i = 0..n−1 is scanned per segment, all segments at once, twice: from a zero
// state (end state E_i) and from the identity with v = 0 (the segment's transition M_i, K×K).
// A chunk's state update is affine in the state, so a segment started from S ends at
// M_i S + E_i exactly. This pass walks each sequence's segments in order,
//     start_0 = h0 (or 0),   start_{i+1} = M_i start_i + E_i,
// writes every start_i (the final scan's start states, K-first) and the sequence's final
// state M_{n−1} start_{n−1} + E_{n−1} in the problem's layout. One workgroup per (sequence,
// v-head, 16 state columns); invocation r owns state row r (K ≤ 256), in f32.
//
// With the gate-driven window (WINDOWED, segment_window.wgsl): a (segment, v-head) whose
// `warmup` is not FALLBACK takes start_{i+1} = E_i (the end state of its warm-up from zero;
// its transition was never scanned), and `final_copy` then writes the final state from the
// final scan's end state of each sequence's last segment (that segment's E is not scanned).
//
// The M slots start from identities the forward copies over them before the transition scan.

@group(0) @binding(0) var<uniform> params: Params;                        // the problem's
@group(0) @binding(1) var<storage, read> seq_segments: array<u32>;        // per sequence: first segment, count
@group(0) @binding(2) var<storage, read> h0: array<f32>;                  // [N, HV, K, V] (problem layout)
@group(0) @binding(3) var<storage, read> trans: array<f32>;               // [S, HV, K, K]
@group(0) @binding(4) var<storage, read> ends: array<f32>;                // [S, HV, K, V]
@group(0) @binding(5) var<storage, read_write> starts: array<f32>;        // [S, HV, K, V]
@group(0) @binding(6) var<storage, read_write> final_state: array<f32>;   // [N, HV, K, V] (problem layout)
@group(0) @binding(8) var<storage, read> warmup: array<u32>;              // [S, HV] (WINDOWED)

override HAS_H0: bool;
override WINDOWED: bool = false;
const FALLBACK: u32 = 0xffffffffu;     // segment_window's mark of an exact (segment, v-head)
const COLS: u32 = 16u;

var<workgroup> cur: array<f32, 4096>;   // the running state's 16 columns, [K][16]

// Index of state entry (row k, column v) of sequence n, v-head hv, in the problem's layout.
fn problem_index(n: u32, hv: u32, k: u32, v: u32) -> u32 {
    let base = (n * params.heads_v + hv) * params.key_dim * params.value_dim;
    if ((params.flags & FLAG_STATE_V_FIRST) != 0u) {
        return base + v * params.key_dim + k;
    }
    return base + k * params.value_dim + v;
}

// ends[base + c] (column c of this block), 0 past V (index clamped to the last column).
fn end_or_zero(base: u32, c: u32, width: u32) -> f32 {
    return select(0.0, ends[base + min(c, width - 1u)], c < width);
}

@compute @workgroup_size(256)
fn combine(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let n = wid.x;
    let hv = wid.y;
    let c0 = wid.z * COLS;
    let kd = params.key_dim;
    let vd = params.value_dim;
    let hvc = params.heads_v;
    let row = t < kd;
    for (var c = 0u; c < COLS; c++) {
        var x = 0.0;
        if (HAS_H0 && row && c0 + c < vd) {
            x = h0[problem_index(n, hv, t, c0 + c)];
        }
        cur[t * COLS + c] = x;
    }
    workgroupBarrier();
    let first = seq_segments[2u * n];
    let count = seq_segments[2u * n + 1u];
    for (var i = 0u; i < count; i++) {
        let slot = first + i;
        let sbase = ((slot * hvc + hv) * kd + t) * vd + c0;
        // Four vec4 accumulators (no indexed private array): start of the next segment.
        var a0 = vec4<f32>(0.0);
        var a1 = vec4<f32>(0.0);
        var a2 = vec4<f32>(0.0);
        var a3 = vec4<f32>(0.0);
        if (row) {
            for (var c = 0u; c < COLS; c++) {
                if (c0 + c < vd) {
                    starts[sbase + c] = cur[t * COLS + c];
                }
            }
            let w = vd - c0;   // columns of this block inside V
            a0 = vec4<f32>(end_or_zero(sbase, 0u, w), end_or_zero(sbase, 1u, w),
                           end_or_zero(sbase, 2u, w), end_or_zero(sbase, 3u, w));
            a1 = vec4<f32>(end_or_zero(sbase, 4u, w), end_or_zero(sbase, 5u, w),
                           end_or_zero(sbase, 6u, w), end_or_zero(sbase, 7u, w));
            a2 = vec4<f32>(end_or_zero(sbase, 8u, w), end_or_zero(sbase, 9u, w),
                           end_or_zero(sbase, 10u, w), end_or_zero(sbase, 11u, w));
            a3 = vec4<f32>(end_or_zero(sbase, 12u, w), end_or_zero(sbase, 13u, w),
                           end_or_zero(sbase, 14u, w), end_or_zero(sbase, 15u, w));
            let exact = !WINDOWED || warmup[slot * hvc + hv] == FALLBACK;
            let mrow = ((slot * hvc + hv) * kd + t) * kd;
            for (var j = 0u; j < select(0u, kd, exact); j++) {
                let m = trans[mrow + j];
                let s = j * COLS;
                a0 += m * vec4<f32>(cur[s], cur[s + 1u], cur[s + 2u], cur[s + 3u]);
                a1 += m * vec4<f32>(cur[s + 4u], cur[s + 5u], cur[s + 6u], cur[s + 7u]);
                a2 += m * vec4<f32>(cur[s + 8u], cur[s + 9u], cur[s + 10u], cur[s + 11u]);
                a3 += m * vec4<f32>(cur[s + 12u], cur[s + 13u], cur[s + 14u], cur[s + 15u]);
            }
        }
        workgroupBarrier();
        if (row) {
            let s = t * COLS;
            for (var q = 0u; q < 4u; q++) {
                cur[s + q] = a0[q];
                cur[s + 4u + q] = a1[q];
                cur[s + 8u + q] = a2[q];
                cur[s + 12u + q] = a3[q];
            }
        }
        workgroupBarrier();
    }
    if (row) {
        for (var c = 0u; c < COLS; c++) {
            if (c0 + c < vd) {
                final_state[problem_index(n, hv, t, c0 + c)] = cur[t * COLS + c];
            }
        }
    }
}

// After the final scan (windowed combines only): each sequence's final state is its last
// segment's end state, which the final scan left in `starts`, where that segment skipped its
// scans. Exact last segments and sequences without segments (empty) keep what `combine`
// wrote.
@compute @workgroup_size(256)
fn final_copy(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let n = wid.x;
    let hv = wid.y;
    let c0 = wid.z * COLS;
    let kd = params.key_dim;
    let vd = params.value_dim;
    let count = seq_segments[2u * n + 1u];
    if (count == 0u || t >= kd) {
        return;
    }
    let slot = seq_segments[2u * n] + count - 1u;
    if (warmup[slot * params.heads_v + hv] == FALLBACK) {
        return;
    }
    let sbase = ((slot * params.heads_v + hv) * kd + t) * vd;
    for (var c = 0u; c < COLS; c++) {
        if (c0 + c < vd) {
            final_state[problem_index(n, hv, t, c0 + c)] = starts[sbase + c0 + c];
        }
    }
}
