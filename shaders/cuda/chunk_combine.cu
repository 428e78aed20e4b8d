// Sequence parallelism's combine step (docs/cuda.md): one block per (8 v columns, v-head,
// sequence) walks the sequence's segments in order,
//   start_0 = h0 (or 0),  start_{i+1} = M_i·start_i + E_i   (f32 FMAs, exact),
// where E_i (the segment's end state from zero) and M_i (its K × K transition) come from the
// local pass of gdn_chunk_fwd* (chunked.cu). Each later segment's start state goes to the
// workspace the main pass reads; the first segment's is h0, which the main pass reads itself.
// With the gate-driven window (segment_window.cu), a windowed (segment, v-head) (warm-up
// n ≥ 0 chunks; −1: exact) has no M: start_{i+1} = E_i (the warm-up's end state from zero).
//
// The chain is sequential over segments, so the block count comes from the columns: 8 per
// block (a 2/8-head problem: 128 blocks, about one per SM; 32 columns per block took 0.23 ms
// for 7 steps at 2/8 × 8192 on the H200, 32 blocks). M_{i+1} and E_{i+1}'s columns arrive by
// cp.async while M_i is applied. Thread (row group rg, column c) computes rows rg + 32·i of
// column c: per four k a 16-byte load of its column of the start state (stored column-major)
// and of four rows of M (4 distinct rows per warp, conflict-free), sixteen FMAs.
namespace gdn {
namespace combine {

constexpr int THREADS = 256;
constexpr int COLS = 8;                  // v columns per block
constexpr int ROW_GROUPS = THREADS / COLS;  // 32
constexpr int MAX_K = 128;
constexpr int ROWS = MAX_K / ROW_GROUPS;    // rows per thread at K = 128

// Mirrors CombineParams in src/cuda_backend/chunk_combine.rs (repr(C), 4-byte fields).
struct CombineParams {
    int heads_v;
    int key_dim;
    int value_dim;
    int flags;
};

__device__ void combine(const CombineParams p, const int* __restrict__ seq_units,
                        const int* __restrict__ warmup, const float* h_in,
                        const float* __restrict__ seg_end, float* __restrict__ seg_start) {
    extern __shared__ __align__(16) float smem[];
    const int K = p.key_dim, V = p.value_dim, HV = p.heads_v;
    const int c = threadIdx.x % COLS, rg = threadIdx.x / COLS;
    const int col0 = blockIdx.x * COLS, hv = blockIdx.y, n = blockIdx.z;
    const int u0 = seq_units[n], u1 = seq_units[n + 1];
    if (u1 - u0 < 2) return;
    const int ldm = K + 4;  // keeps rows 16-byte aligned, spreads a warp's 4 rows over banks
    const size_t unit_stride = (size_t)K * (V + K);  // seg_end: K rows of [E | M] per unit
    float* const m_tiles = smem;                        // two stages of K × ldm
    float* const e_tiles = smem + 2 * K * ldm;          // two stages of K × COLS
    float* const s_cols = e_tiles + 2 * K * COLS;       // the start state, COLS × ldm
    // V is a multiple of 16 and COLS = 8: every block's columns are valid.

    auto windowed = [&](int u) { return warmup != nullptr && warmup[(size_t)u * HV + hv] >= 0; };
    auto prefetch = [&](int u, int stage) {
        const float* src = seg_end + ((size_t)u * HV + hv) * unit_stride;
        if (!windowed(u)) {
            float* dst = m_tiles + stage * K * ldm;
            for (int idx = threadIdx.x; idx < K * K / 4; idx += THREADS) {
                const int r = idx / (K / 4), c4 = (idx % (K / 4)) * 4;
                cp_async16(dst + r * ldm + c4, src + (size_t)r * (V + K) + V + c4);
            }
        }
        float* dst = e_tiles + stage * K * COLS;
        for (int idx = threadIdx.x; idx < K * COLS / 4; idx += THREADS) {
            const int r = idx / (COLS / 4), c4 = (idx % (COLS / 4)) * 4;
            cp_async16(dst + r * COLS + c4, src + (size_t)r * (V + K) + col0 + c4);
        }
    };

    prefetch(u0, 0);
    const size_t slice = ((size_t)n * HV + hv) * (size_t)K * V;
    for (int r = rg; r < K; r += ROW_GROUPS) {
        float x = 0.0f;
        if (h_in != nullptr) {
            const int col = col0 + c;
            x = h_in[slice + ((p.flags & STATE_V_FIRST) ? (size_t)col * K + r : (size_t)r * V + col)];
        }
        s_cols[c * ldm + r] = x;
    }

    for (int u = u0, stage = 0; u + 1 < u1; ++u, stage ^= 1) {
        cp_async_wait();
        __syncthreads();  // M_u, E_u and the start state are in place; the other stage is free
        if (u + 2 < u1) prefetch(u + 1, stage ^ 1);
        const float* e = e_tiles + stage * K * COLS;
        float acc[ROWS];
#pragma unroll
        for (int i = 0; i < ROWS; ++i) {
            const int r = rg + ROW_GROUPS * i;
            acc[i] = r < K ? e[r * COLS + c] : 0.0f;
        }
        if (!windowed(u)) {
            const float* m = m_tiles + stage * K * ldm;
            const float* s = s_cols + c * ldm;
            for (int j = 0; j < K; j += 4) {
                const float4 x = *reinterpret_cast<const float4*>(s + j);
#pragma unroll
                for (int i = 0; i < ROWS; ++i) {
                    const int r = rg + ROW_GROUPS * i;
                    if (r < K) {
                        const float4 mr = *reinterpret_cast<const float4*>(m + r * ldm + j);
                        acc[i] = fmaf(mr.w, x.w, fmaf(mr.z, x.z, fmaf(mr.y, x.y, fmaf(mr.x, x.x, acc[i]))));
                    }
                }
            }
        }
        __syncthreads();  // every thread is done reading s_cols
        float* out = seg_start + ((size_t)(u + 1) * HV + hv) * (size_t)K * V;
#pragma unroll
        for (int i = 0; i < ROWS; ++i) {
            const int r = rg + ROW_GROUPS * i;
            if (r < K) {
                s_cols[c * ldm + r] = acc[i];
                out[(size_t)r * V + col0 + c] = acc[i];
            }
        }
    }
}

}  // namespace combine
}  // namespace gdn

extern "C" __global__ void __launch_bounds__(gdn::combine::THREADS)
    gdn_chunk_combine(const gdn::combine::CombineParams p, const int* seq_units, const int* warmup,
                      const float* h_in, const float* seg_end, float* seg_start) {
    gdn::combine::combine(p, seq_units, warmup, h_in, seg_end, seg_start);
}
