// segment_window: the gate-driven window of sequence parallelism (FlashQLA's
// get_warmup_chunks). A segment started from S ends at M S + E, and for unit keys and
// β ∈ [0, 2] ‖M‖ ≤ exp(Σ of its chunks' total log decays): the state at a segment boundary
// forgets everything older than its last n chunks up to a factor exp(Σ of their G_last).
//
// One invocation per (segment, v-head) walks back from the segment's end, adding each
// chunk's total log decay G_last (natural log, from prepare_gate), and stops at the first n
// where the sum falls below THRESHOLD, looking at most MAX_WARMUP chunks back. Then the
// boundary takes the end state of a scan from zero over the last n chunks, and the pair's
// transition is never scanned; otherwise (fallback) both scans run the whole segment, as
// without the window. The last segment of each sequence feeds no boundary: where its gates
// decay as well, both scans skip it (n = 0) and the final state comes from the final scan
// (segment_combine's final_copy); otherwise it stays exact.
//
// Writes per (segment, v-head): the end scan's row (start, length, slot), the transition
// scan's row (length 0: skipped), and `warmup` = n, or FALLBACK for the exact path.

@group(0) @binding(0) var<uniform> params: Params;                       // rows = S · HV
@group(0) @binding(1) var<storage, read> segments: array<u32>;           // start, length, slot
@group(0) @binding(2) var<storage, read> last_segment: array<u32>;       // [S]: 1 if last of its sequence
@group(0) @binding(3) var<storage, read> gate_beta: array<vec2<f32>>;    // [tokens, HV]: (G, β)
@group(0) @binding(4) var<storage, read_write> end_rows: array<u32>;     // [S, HV, 3]
@group(0) @binding(5) var<storage, read_write> trans_rows: array<u32>;   // [S, HV, 3]
@group(0) @binding(6) var<storage, read_write> warmup: array<u32>;       // [S, HV]

override THRESHOLD: f32;
override MAX_WARMUP: u32;
const FALLBACK: u32 = 0xffffffffu;

@compute @workgroup_size(64)
fn segment_window(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = flat_index(gid, nwg);
    if (e >= params.rows) {
        return;
    }
    let hvc = params.heads_v;
    let seg = e / hvc;
    let hv = e % hvc;
    let start = segments[3u * seg];
    let len = segments[3u * seg + 1u];
    let slot = segments[3u * seg + 2u];
    let n_chunks = (len + CHUNK - 1u) / CHUNK;

    var n = FALLBACK;
    var decay = 0.0;
    for (var i = 0u; i < min(n_chunks, MAX_WARMUP); i++) {
        // The last valid token of chunk n_chunks − 1 − i holds that chunk's G_last.
        let end = min(len, (n_chunks - i) * CHUNK);
        decay += gate_beta[(start + end - 1u) * hvc + hv].x;
        if (decay < THRESHOLD) {
            n = i + 1u;
            break;
        }
    }
    // A decaying last segment needs no warm-up; a non-decaying one stays exact, so a head
    // that never decays runs exactly what it runs without the window (bit for bit).
    if (last_segment[seg] != 0u && n != FALLBACK) {
        n = 0u;
    }

    var end_start = start;
    var end_len = len;
    var trans_len = len;
    if (n == 0u) {
        end_len = 0u;
        trans_len = 0u;
    } else if (n != FALLBACK) {
        // Non-last segments are whole chunks, so the skipped prefix is whole chunks too.
        let skip = (n_chunks - n) * CHUNK;
        end_start = start + skip;
        end_len = len - skip;
        trans_len = 0u;
    }
    end_rows[3u * e] = end_start;
    end_rows[3u * e + 1u] = end_len;
    end_rows[3u * e + 2u] = slot;
    trans_rows[3u * e] = start;
    trans_rows[3u * e + 1u] = trans_len;
    trans_rows[3u * e + 2u] = slot;
    warmup[e] = n;
}
