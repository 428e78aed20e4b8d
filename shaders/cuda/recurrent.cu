// The token-by-token GDN recurrence (FLA's order), serving forward and decode:
//   S <- exp(g) S;  u = beta (v - S^T k);  S <- S + k u^T;  o = scale S^T q.
// One thread block per (V-block, v-head, sequence): 4 warps x 32 lanes; lane = one v column of
// the block, warp = one quarter of the K rows. Each thread keeps its K/4 x 1 slice of the f32
// state in registers for the whole window of tokens, so h_in may alias h_out (decode pools).
// Correct first: three block barriers per token; the chunked tensor-core forward comes later.

namespace gdn {

constexpr int BV = 32;                // v columns per block: one per lane
constexpr int KSPLIT = 4;             // warps, each owning K / KSPLIT state rows
constexpr int MAX_K = 256;            // problem.rs MAX_HEAD_DIM
constexpr int MAX_ROWS = MAX_K / KSPLIT;

// Mirrors RecurrentParams in src/cuda_backend/recurrent.rs (repr(C), all 4-byte fields).
struct RecurrentParams {
    int heads_qk;
    int heads_v;
    int key_dim;
    int value_dim;
    int group;          // heads_v / heads_qk (GVA)
    int flags;          // option bits of common.cuh
    int window_begin;   // first token of each sequence this launch runs, relative to its start
    int window_len;     // tokens per sequence this launch runs (at most)
    float scale;
};

// Offset of state element (k, v) inside one (sequence, head) slice, in the problem's layout.
__device__ __forceinline__ size_t state_offset(int flags, int K, int V, int k, int v) {
    return (flags & STATE_V_FIRST) ? (size_t)v * K + k : (size_t)k * V + v;
}

template <typename T>
__device__ __forceinline__ void recurrent(const RecurrentParams p, const int* __restrict__ seq_bounds,
                                          const T* __restrict__ q, const T* __restrict__ k,
                                          const T* __restrict__ v, const float* __restrict__ g,
                                          const float* __restrict__ beta,
                                          const float* __restrict__ a_log,
                                          const float* __restrict__ dt_bias, const float* h_in,
                                          T* __restrict__ o, float* h_out) {
    __shared__ float sq[MAX_K];
    __shared__ float sk[MAX_K];
    __shared__ float red_p[KSPLIT][BV];
    __shared__ float red_o[KSPLIT][BV];
    __shared__ float inv_norm[2];

    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int hv = blockIdx.y;
    const int n = blockIdx.z;
    const int K = p.key_dim, V = p.value_dim, H = p.heads_qk, HV = p.heads_v;
    const int h = hv / p.group;
    const int col = blockIdx.x * BV + lane;
    const bool active = col < V;
    const int rows = K / KSPLIT;  // K is a multiple of 16
    const int row0 = warp * rows;
    const int flags = p.flags;

    const size_t slice = ((size_t)n * HV + hv) * (size_t)K * V;
    float s[MAX_ROWS];
#pragma unroll
    for (int j = 0; j < MAX_ROWS; ++j) {
        float x = 0.0f;
        if (j < rows && active && h_in != nullptr) x = h_in[slice + state_offset(flags, K, V, row0 + j, col)];
        s[j] = x;
    }

    const int seq_start = seq_bounds[n];
    const int seq_end = seq_bounds[n + 1];
    const int first = min(seq_start + p.window_begin, seq_end);
    const int last = min(first + p.window_len, seq_end);

    // Per-head constants of the gate activation.
    float neg_a = 0.0f, bias = 0.0f;
    if (flags & GATE_IN_KERNEL) {
        neg_a = -expf(a_log[hv]);
        bias = dt_bias[hv];
    }

    for (int t = first; t < last; ++t) {
        const size_t qk_row = ((size_t)t * H + h) * K;
        for (int i = threadIdx.x; i < K; i += blockDim.x) {
            sq[i] = to_f32(q[qk_row + i]);
            sk[i] = to_f32(k[qk_row + i]);
        }
        const size_t gate_idx = (size_t)t * HV + hv;
        const float vt = active ? to_f32(v[gate_idx * V + col]) : 0.0f;
        float gt = g[gate_idx];
        if (flags & GATE_IN_KERNEL) gt = neg_a * softplus(gt + bias);
        const float alpha = expf(gt);
        float bt = beta[gate_idx];
        if (flags & BETA_SIGMOID) bt = sigmoid(bt);
        if (flags & NEG_EIGVAL) bt *= 2.0f;
        __syncthreads();

        float rq = 1.0f, rk = 1.0f;
        if (flags & L2NORM_QK) {
            // Normalized q, k stay in f32 (no rounding to the storage dtype).
            if (warp < 2) {
                const float* x = warp == 0 ? sq : sk;
                float ss = 0.0f;
                for (int i = lane; i < K; i += 32) ss += x[i] * x[i];
                ss = warp_sum(ss);
                if (lane == 0) inv_norm[warp] = 1.0f / sqrtf(ss + L2NORM_EPS);
            }
            __syncthreads();
            rq = inv_norm[0];
            rk = inv_norm[1];
        }

        // Decay, then predict with the decayed state.
        float pred = 0.0f;
#pragma unroll
        for (int j = 0; j < MAX_ROWS; ++j) {
            if (j < rows) {
                s[j] *= alpha;
                pred = fmaf(s[j], sk[row0 + j], pred);
            }
        }
        red_p[warp][lane] = pred * rk;
        __syncthreads();
        float total = 0.0f;
#pragma unroll
        for (int w = 0; w < KSPLIT; ++w) total += red_p[w][lane];
        const float u = bt * (vt - total);

        // Rank-1 write, then read the output from the updated state.
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < MAX_ROWS; ++j) {
            if (j < rows) {
                s[j] = fmaf(sk[row0 + j] * rk, u, s[j]);
                acc = fmaf(s[j], sq[row0 + j], acc);
            }
        }
        red_o[warp][lane] = acc * rq;
        __syncthreads();
        if (warp == 0 && active) {
            float out = 0.0f;
#pragma unroll
            for (int w = 0; w < KSPLIT; ++w) out += red_o[w][lane];
            o[gate_idx * V + col] = from_f32<T>(p.scale * out);
        }
    }

    if (active) {
#pragma unroll
        for (int j = 0; j < MAX_ROWS; ++j) {
            if (j < rows) h_out[slice + state_offset(flags, K, V, row0 + j, col)] = s[j];
        }
    }
}

}  // namespace gdn

#define GDN_RECURRENT(NAME, T)                                                                      \
    extern "C" __global__ void __launch_bounds__(gdn::BV * gdn::KSPLIT) NAME(                       \
        const gdn::RecurrentParams p, const int* seq_bounds, const T* q, const T* k, const T* v,     \
        const float* g, const float* beta, const float* a_log, const float* dt_bias,                \
        const float* h_in, T* o, float* h_out) {                                                    \
        gdn::recurrent<T>(p, seq_bounds, q, k, v, g, beta, a_log, dt_bias, h_in, o, h_out);         \
    }

GDN_RECURRENT(gdn_recurrent_f32, float)
GDN_RECURRENT(gdn_recurrent_f16, __half)
GDN_RECURRENT(gdn_recurrent_bf16, __nv_bfloat16)
