// Sequence parallelism's combine step (docs/cuda.md): one block per (32 v columns, v-head,
// sequence) walks the sequence's segments in order,
//   start_0 = h0 (or 0),  start_{i+1} = M_i·start_i + E_i   (f32 FMAs, exact),
// where E_i (the segment's end state from zero) and M_i (its K × K transition) come from the
// local pass of gdn_chunk_fwd* (chunked.cu). Each later segment's start state goes to the
// workspace the main pass reads; the first segment's is h0, which the main pass reads itself.
// M_{i+1} is copied in by cp.async while M_i is applied.
namespace gdn {
namespace combine {

constexpr int THREADS = 256;  // 8 warps: lane = v column, warp w owns state rows w, w + 8, …
constexpr int COLS = 32;
constexpr int MAX_K = 128;

// Mirrors CombineParams in src/cuda_backend/chunk_combine.rs (repr(C), 4-byte fields).
struct CombineParams {
    int heads_v;
    int key_dim;
    int value_dim;
    int flags;
};

__device__ void combine(const CombineParams p, const int* __restrict__ seq_units,
                        const float* h_in, const float* __restrict__ seg_end,
                        float* __restrict__ seg_start) {
    extern __shared__ __align__(16) float smem[];
    const int K = p.key_dim, V = p.value_dim, HV = p.heads_v;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int c = blockIdx.x * COLS + lane, hv = blockIdx.y, n = blockIdx.z;
    const int u0 = seq_units[n], u1 = seq_units[n + 1];
    if (u1 - u0 < 2) return;
    const int ldm = K + 4;  // keeps rows 16-byte aligned
    const int rows = K / 8;
    const bool valid = c < V;
    const size_t unit_stride = (size_t)K * (V + K);  // seg_end: K rows of [E | M] per unit
    float* m_tiles = smem;                           // two stages of K × ldm
    float* s_tile = smem + 2 * K * ldm;              // the start state, K × COLS

    auto prefetch = [&](int u, int stage) {
        const float* m = seg_end + ((size_t)u * HV + hv) * unit_stride + V;
        float* dst = m_tiles + stage * K * ldm;
        for (int idx = threadIdx.x; idx < K * K / 4; idx += THREADS) {
            const int r = idx / (K / 4), c4 = (idx % (K / 4)) * 4;
            cp_async16(dst + r * ldm + c4, m + (size_t)r * (V + K) + c4);
        }
    };

    float s[MAX_K / 8];
    const size_t slice = ((size_t)n * HV + hv) * (size_t)K * V;
#pragma unroll
    for (int i = 0; i < MAX_K / 8; ++i) {
        const int r = warp + 8 * i;
        float x = 0.0f;
        if (i < rows && valid && h_in != nullptr) {
            x = h_in[slice + ((p.flags & STATE_V_FIRST) ? (size_t)c * K + r : (size_t)r * V + c)];
        }
        s[i] = x;
    }

    prefetch(u0, 0);
    for (int u = u0, stage = 0; u + 1 < u1; ++u, stage ^= 1) {
#pragma unroll
        for (int i = 0; i < MAX_K / 8; ++i) {
            if (i < rows) s_tile[(warp + 8 * i) * COLS + lane] = s[i];
        }
        cp_async_wait();
        __syncthreads();  // M_u and the start state are in place; the other stage is free
        if (u + 2 < u1) prefetch(u + 1, stage ^ 1);
        const float* e = seg_end + ((size_t)u * HV + hv) * unit_stride;
        const float* m = m_tiles + stage * K * ldm;
        float acc[MAX_K / 8];
#pragma unroll
        for (int i = 0; i < MAX_K / 8; ++i) {
            acc[i] = (i < rows && valid) ? e[(size_t)(warp + 8 * i) * (V + K) + c] : 0.0f;
        }
        for (int j = 0; j < K; j += 4) {
            const float x0 = s_tile[j * COLS + lane], x1 = s_tile[(j + 1) * COLS + lane];
            const float x2 = s_tile[(j + 2) * COLS + lane], x3 = s_tile[(j + 3) * COLS + lane];
#pragma unroll
            for (int i = 0; i < MAX_K / 8; ++i) {
                if (i < rows) {
                    // The whole warp reads one row of M: a broadcast.
                    const float4 mr = *reinterpret_cast<const float4*>(m + (warp + 8 * i) * ldm + j);
                    acc[i] = fmaf(mr.w, x3, fmaf(mr.z, x2, fmaf(mr.y, x1, fmaf(mr.x, x0, acc[i]))));
                }
            }
        }
        float* out = seg_start + ((size_t)(u + 1) * HV + hv) * (size_t)K * V;
#pragma unroll
        for (int i = 0; i < MAX_K / 8; ++i) {
            s[i] = acc[i];
            if (i < rows && valid) out[(size_t)(warp + 8 * i) * V + c] = acc[i];
        }
        __syncthreads();  // every thread is done reading s_tile
    }
}

}  // namespace combine
}  // namespace gdn

extern "C" __global__ void __launch_bounds__(gdn::combine::THREADS)
    gdn_chunk_combine(const gdn::combine::CombineParams p, const int* seq_units, const float* h_in,
                      const float* seg_end, float* seg_start) {
    gdn::combine::combine(p, seq_units, h_in, seg_end, seg_start);
}
