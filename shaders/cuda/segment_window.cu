// The gate-driven window of sequence parallelism (FlashQLA's get_warmup_chunks; the WGSL
// version is shaders/forward/segment_window.wgsl, docs/sequence-parallelism.md). A segment
// started from S ends at M·S + E, and for unit keys and β ∈ [0, 2] ‖M‖ ≤ exp(Σ of its chunks'
// total log decays): the state at a segment boundary forgets everything older than its last
// n chunks up to a factor exp(Σ of their G_last).
//
// One thread per (unit, v-head) walks back from the unit's end over the chunk totals G_last
// (log γ_C from the prep's decays: e^{G_last} underflowing to 0 reads as −∞, a decay past any
// threshold) and stops at the first n whose sum falls below the threshold, looking at most
// `max_warmup` chunks back (0: the whole unit). It writes n (the local pass then runs only the
// unit's last n chunks from zero for E and skips the transition; the combine takes
// start_{i+1} = E_i), or −1 (the exact path: no such n, e.g. every g = 0 head, which then runs
// bit for bit what it runs without the window). A sequence's last unit feeds no boundary
// (the local pass skips it either way): 0 where its gates decay, −1 otherwise, for the
// report (ChunkPlan::segment_paths).
namespace gdn {
namespace window {

constexpr int THREADS = 128;
constexpr int C = 64;              // chunk length (chunk.cuh's C; ws_f holds 2·C floats)
constexpr int UNIT_LAST = 2;       // chunked.cu's unit flag

// Mirrors WindowParams in src/cuda_backend/segment_window.rs (repr(C), 4-byte fields).
struct WindowParams {
    int heads_v;
    int num_units;
    int max_warmup;
    float threshold;
};

__device__ void segment_window(const WindowParams p, const int* __restrict__ units,
                               const float* __restrict__ ws_f, int* __restrict__ warmup) {
    const size_t e = (size_t)blockIdx.x * THREADS + threadIdx.x;
    if (e >= (size_t)p.num_units * p.heads_v) return;
    const int unit = (int)(e / p.heads_v), hv = (int)(e % p.heads_v);
    const int first = units[4 * unit], end = units[4 * unit + 1];
    const int lowest = p.max_warmup > 0 ? max(first, end - p.max_warmup) : first;
    int n = -1;
    float decay = 0.0f;
    for (int chunk = end - 1; chunk >= lowest; --chunk) {
        // γ_{C−1} = e^{G_last} (padding keeps the last valid G).
        decay += logf(ws_f[((size_t)chunk * p.heads_v + hv) * 2 * C + C - 1]);
        if (decay < p.threshold) {
            n = end - chunk;
            break;
        }
    }
    if ((units[4 * unit + 3] & UNIT_LAST) && n > 0) n = 0;
    warmup[e] = n;
}

}  // namespace window
}  // namespace gdn

extern "C" __global__ void __launch_bounds__(gdn::window::THREADS)
    gdn_segment_window(const gdn::window::WindowParams p, const int* units, const float* ws_f,
                       int* warmup) {
    gdn::window::segment_window(p, units, ws_f, warmup);
}
