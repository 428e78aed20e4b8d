// The exact GDN backward (BPTT through the token recurrence), f32 arithmetic; correct first,
// the chunked tensor-core backward comes later. Same semantics as src/reference/backward.rs:
//
//   forward (one token)             reverse (dS = dL/dS_t on entry, dL/dS_{t-1} on exit)
//   S_a = a S_{t-1}, a = exp(g)     dq = scale S_t do;            dS += scale q do^T
//   p   = S_a^T k                   dk = dS u;  du = dS^T k
//   u   = b (v - p)                 db = du.(v - p);  dv = b du;  dp = -b du
//   S_t = S_a + k u^T               dk += S_a dp;  dS += k dp^T
//   o   = scale S_t^T q             dg = a sum(dS * S_{t-1});  dS <- a dS
//
// Design (three kernels, all deterministic: no atomics):
// 1. gdn_bwd_recurrent_*: one block per (V-block of 32 columns, v-head, sequence), the thread
//    mapping of recurrent.cu (lane = v column, warp = a quarter of the K rows), so the K x 32
//    slices of S and dS live in registers. A forward pass over the sequence stores the state
//    before every CK-th token (checkpoints); then, segment by segment from the newest, the
//    segment's states are replayed from its checkpoint into a per-block buffer and walked
//    backward carrying dS. Memory: checkpoints T/CK states per head plus CK states per block,
//    instead of T states per head. Reductions over K (p, du) go through shared memory; the
//    per-row sums over the block's columns (dq, dk) through a K x 33 shared tile. Everything
//    owned by one v column (dv) is final; what sums over V (dq, dk, db, dg) is written as one
//    partial per V-block, because the V-blocks run in different thread blocks.
// 2. gdn_bwd_qk_finish_*: per (token, q/k head), sums the partials over V-blocks and over the
//    GVA group's v-heads, then the l2norm chain rule (linear in dy, so summing first is exact),
//    stored in the storage dtype.
// 3. gdn_bwd_gate_finish: per v-head, sums db / dg partials over V-blocks, applies the sigmoid
//    (x2) and gate-activation chain rules, and reduces dA_log and ddt_bias over all tokens of
//    the head in a fixed order (one block per head).

namespace gdn {

constexpr int BV = 32;        // v columns per block: one per lane
constexpr int KSPLIT = 4;     // warps, each owning K / KSPLIT state rows
constexpr int MAX_K = 256;    // problem.rs MAX_HEAD_DIM
constexpr int MAX_ROWS = MAX_K / KSPLIT;
constexpr int CK = 64;        // tokens per checkpoint segment (backward.rs CHECKPOINT)

// Mirrors BackwardParams in src/cuda_backend/backward.rs (repr(C), all 4-byte fields).
struct BackwardParams {
    int heads_qk;
    int heads_v;
    int key_dim;
    int value_dim;
    int group;          // heads_v / heads_qk (GVA)
    int flags;          // option bits of common.cuh
    int v_blocks;       // ceil(V / BV)
    int total_tokens;   // B*T (packed)
    float scale;
};

__device__ __forceinline__ size_t bwd_state_offset(int flags, int K, int V, int k, int v) {
    return (flags & STATE_V_FIRST) ? (size_t)v * K + k : (size_t)k * V + v;
}

// One token's activated scalars; q, k (raw) are in shared memory with their inverse norms.
struct TokenScalars {
    float alpha;
    float beta;
};

// Loads token t's q, k rows into shared memory and their inverse norms (1 without l2norm);
// returns the activated decay and beta. Starts with a barrier so the previous token's readers
// of sq / sk are done. Every thread of the block must call it.
template <typename T>
__device__ __forceinline__ TokenScalars load_token(const BackwardParams& p, int t, int hv,
                                                   const T* __restrict__ q,
                                                   const T* __restrict__ k,
                                                   const float* __restrict__ g,
                                                   const float* __restrict__ beta, float neg_a,
                                                   float bias, float* sq, float* sk,
                                                   float* inv_norm) {
    const int K = p.key_dim;
    const size_t qk_row = ((size_t)t * p.heads_qk + hv / p.group) * K;
    __syncthreads();
    for (int i = threadIdx.x; i < K; i += blockDim.x) {
        sq[i] = to_f32(q[qk_row + i]);
        sk[i] = to_f32(k[qk_row + i]);
    }
    if (threadIdx.x == 0) {
        inv_norm[0] = 1.0f;
        inv_norm[1] = 1.0f;
    }
    __syncthreads();
    if (p.flags & L2NORM_QK) {
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        if (warp < 2) {
            const float* x = warp == 0 ? sq : sk;
            float ss = 0.0f;
            for (int i = lane; i < K; i += 32) ss += x[i] * x[i];
            ss = warp_sum(ss);
            if (lane == 0) inv_norm[warp] = 1.0f / sqrtf(ss + L2NORM_EPS);
        }
        __syncthreads();
    }
    const size_t gi = (size_t)t * p.heads_v + hv;
    float gt = g[gi];
    if (p.flags & GATE_IN_KERNEL) gt = neg_a * softplus(gt + bias);
    float bt = beta[gi];
    if (p.flags & BETA_SIGMOID) bt = sigmoid(bt);
    if (p.flags & NEG_EIGVAL) bt *= 2.0f;
    return TokenScalars{expf(gt), bt};
}

template <typename T>
__device__ __forceinline__ void recurrent_bwd(
    const BackwardParams p, const int* __restrict__ seq_bounds, const int* __restrict__ ckpt_base,
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
    const float* __restrict__ g, const float* __restrict__ beta, const float* __restrict__ a_log,
    const float* __restrict__ dt_bias, const float* __restrict__ h0, const T* __restrict__ d_o,
    const float* __restrict__ dht, T* __restrict__ dv, float* __restrict__ dh0,
    float* __restrict__ ckpt, float* __restrict__ seg, float* __restrict__ dq_part,
    float* __restrict__ dk_part, float* __restrict__ dbeta_part, float* __restrict__ dg_part) {
    __shared__ float sq[MAX_K];
    __shared__ float sk[MAX_K];
    __shared__ float tile[MAX_K][BV + 1];  // +1: rows read across lanes without bank conflicts
    __shared__ float red_p[KSPLIT][BV];
    __shared__ float red_du[KSPLIT][BV];
    __shared__ float red_a[KSPLIT];
    __shared__ float inv_norm[2];

    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int vb = blockIdx.x;
    const int hv = blockIdx.y;
    const int n = blockIdx.z;
    const int K = p.key_dim, V = p.value_dim, HV = p.heads_v, BT = p.total_tokens;
    const int col = vb * BV + lane;
    const bool active = col < V;
    const int rows = K / KSPLIT;  // K is a multiple of 16
    const int row0 = warp * rows;
    const int flags = p.flags;
    const size_t kb = (size_t)K * BV;  // one block's state slice

    const size_t slice = ((size_t)n * HV + hv) * (size_t)K * V;
    const int first = seq_bounds[n];
    const int last = seq_bounds[n + 1];
    const int segments = (last - first + CK - 1) / CK;
    float* my_ckpt = ckpt + (((size_t)ckpt_base[n] * HV + hv) * p.v_blocks + vb) * kb;
    const size_t ckpt_stride = (size_t)HV * p.v_blocks * kb;  // between checkpoints of a block
    float* my_seg = seg + (((size_t)n * HV + hv) * p.v_blocks + vb) * CK * kb;

    float neg_a = 0.0f, bias = 0.0f;
    if (flags & GATE_IN_KERNEL) {
        neg_a = -expf(a_log[hv]);
        bias = dt_bias[hv];
    }

    float s[MAX_ROWS];
#pragma unroll
    for (int j = 0; j < MAX_ROWS; ++j) {
        float x = 0.0f;
        if (j < rows && active && h0 != nullptr) x = h0[slice + bwd_state_offset(flags, K, V, row0 + j, col)];
        s[j] = x;
    }

    // One forward token on the register state (the forward kernel's operation order).
    auto step = [&](int t) {
        const TokenScalars tk = load_token<T>(p, t, hv, q, k, g, beta, neg_a, bias, sq, sk, inv_norm);
        const float rk = inv_norm[1];
        const float vt = active ? to_f32(v[((size_t)t * HV + hv) * V + col]) : 0.0f;
        float pred = 0.0f;
#pragma unroll
        for (int j = 0; j < MAX_ROWS; ++j) {
            if (j < rows) {
                s[j] *= tk.alpha;
                pred = fmaf(s[j], sk[row0 + j], pred);
            }
        }
        red_p[warp][lane] = pred * rk;
        __syncthreads();
        float total = 0.0f;
#pragma unroll
        for (int w = 0; w < KSPLIT; ++w) total += red_p[w][lane];
        const float u = tk.beta * (vt - total);
#pragma unroll
        for (int j = 0; j < MAX_ROWS; ++j) {
            if (j < rows) s[j] = fmaf(sk[row0 + j] * rk, u, s[j]);
        }
    };

    // Pass 1: checkpoints (the state before tokens first, first + CK, ...).
    for (int t = first; t < last; ++t) {
        const int i = t - first;
        if (i % CK == 0) {
            float* dst = my_ckpt + (size_t)(i / CK) * ckpt_stride;
#pragma unroll
            for (int j = 0; j < MAX_ROWS; ++j) {
                if (j < rows) dst[(row0 + j) * BV + lane] = s[j];
            }
        }
        step(t);
    }

    float ds[MAX_ROWS];
#pragma unroll
    for (int j = 0; j < MAX_ROWS; ++j) {
        float x = 0.0f;
        if (j < rows && active && dht != nullptr) x = dht[slice + bwd_state_offset(flags, K, V, row0 + j, col)];
        ds[j] = x;
    }

    // Pass 2: segments newest first; replay each from its checkpoint, then walk it backward.
    for (int c = segments - 1; c >= 0; --c) {
        const int seg_start = first + c * CK;
        const int seg_end = min(seg_start + CK, last);
        const float* src = my_ckpt + (size_t)c * ckpt_stride;
#pragma unroll
        for (int j = 0; j < MAX_ROWS; ++j) {
            if (j < rows) s[j] = src[(row0 + j) * BV + lane];
        }
        for (int t = seg_start; t < seg_end; ++t) {
            float* dst = my_seg + (size_t)(t - seg_start) * kb;
#pragma unroll
            for (int j = 0; j < MAX_ROWS; ++j) {
                if (j < rows) dst[(row0 + j) * BV + lane] = s[j];
            }
            step(t);
        }

        for (int t = seg_end - 1; t >= seg_start; --t) {
            const TokenScalars tk = load_token<T>(p, t, hv, q, k, g, beta, neg_a, bias, sq, sk, inv_norm);
            const float rq = inv_norm[0], rk = inv_norm[1];
            const size_t tv = ((size_t)t * HV + hv) * V + col;
            const float vt = active ? to_f32(v[tv]) : 0.0f;
            const float dov = active ? to_f32(d_o[tv]) : 0.0f;
            const float* prev = my_seg + (size_t)(t - seg_start) * kb;  // S_{t-1}

            // Replay: S_a = a S_{t-1}, p = S_a^T k, u = b (v - p).
            float sa[MAX_ROWS];
            float pred = 0.0f;
#pragma unroll
            for (int j = 0; j < MAX_ROWS; ++j) {
                sa[j] = 0.0f;
                if (j < rows) {
                    sa[j] = tk.alpha * prev[(row0 + j) * BV + lane];
                    pred = fmaf(sa[j], sk[row0 + j], pred);
                }
            }
            red_p[warp][lane] = pred * rk;
            __syncthreads();
            float ptot = 0.0f;
#pragma unroll
            for (int w = 0; w < KSPLIT; ++w) ptot += red_p[w][lane];
            const float err = vt - ptot;
            const float u = tk.beta * err;

            // dq = scale S_t do (summed over this block's columns), and dS += scale q do^T.
            float du_part = 0.0f;
#pragma unroll
            for (int j = 0; j < MAX_ROWS; ++j) {
                if (j < rows) {
                    const float kr = sk[row0 + j] * rk;
                    tile[row0 + j][lane] = p.scale * fmaf(kr, u, sa[j]) * dov;
                    ds[j] = fmaf(p.scale * sq[row0 + j] * rq, dov, ds[j]);
                    du_part = fmaf(ds[j], kr, du_part);
                }
            }
            red_du[warp][lane] = du_part;
            __syncthreads();
            const size_t part = ((size_t)vb * BT + t) * HV + hv;
            for (int r = threadIdx.x; r < K; r += blockDim.x) {
                float acc = 0.0f;
#pragma unroll 8
                for (int l = 0; l < BV; ++l) acc += tile[r][l];
                dq_part[part * K + r] = acc;
            }
            float du = 0.0f;
#pragma unroll
            for (int w = 0; w < KSPLIT; ++w) du += red_du[w][lane];
            if (active && warp == 0) dv[tv] = from_f32<T>(tk.beta * du);
            const float dp = -tk.beta * du;
            if (warp == 0) {
                const float db = warp_sum(active ? du * err : 0.0f);
                if (lane == 0) dbeta_part[part] = db;
            }
            __syncthreads();  // the dq rows are read before the tile is reused

            // dk = dS u + S_a dp (dS before the k dp^T term); dS += k dp^T; da = sum(dS S_{t-1}).
            float dal = 0.0f;
#pragma unroll
            for (int j = 0; j < MAX_ROWS; ++j) {
                if (j < rows) {
                    tile[row0 + j][lane] = fmaf(ds[j], u, sa[j] * dp);
                    ds[j] = fmaf(sk[row0 + j] * rk, dp, ds[j]);
                    dal = fmaf(ds[j], prev[(row0 + j) * BV + lane], dal);
                    ds[j] *= tk.alpha;
                }
            }
            dal = warp_sum(dal);
            if (lane == 0) red_a[warp] = dal;
            __syncthreads();
            for (int r = threadIdx.x; r < K; r += blockDim.x) {
                float acc = 0.0f;
#pragma unroll 8
                for (int l = 0; l < BV; ++l) acc += tile[r][l];
                dk_part[part * K + r] = acc;
            }
            if (threadIdx.x == 0) {
                float a = 0.0f;
                for (int w = 0; w < KSPLIT; ++w) a += red_a[w];
                dg_part[part] = tk.alpha * a;
            }
            // The next load_token's barrier orders these reads before the tile is rewritten.
        }
    }

    if (dh0 != nullptr && active) {
#pragma unroll
        for (int j = 0; j < MAX_ROWS; ++j) {
            if (j < rows) dh0[slice + bwd_state_offset(flags, K, V, row0 + j, col)] = ds[j];
        }
    }
}

__device__ __forceinline__ float block_sum_128(float x, float* red4) {
    // Sum over a block of 128 threads; red4 holds 4 floats; ends with every thread holding it.
    x = warp_sum(x);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red4[threadIdx.x >> 5] = x;
    __syncthreads();
    return red4[0] + red4[1] + red4[2] + red4[3];
}

// Per (token, q/k head): sum dq / dk partials over V-blocks and the GVA group, then the l2norm
// chain rule dx = (dy - (dy.y) y) r with y = x r, r = 1/sqrt(sum x^2 + eps).
template <typename T>
__device__ __forceinline__ void qk_finish(const BackwardParams p, const T* __restrict__ q,
                                          const T* __restrict__ k,
                                          const float* __restrict__ dq_part,
                                          const float* __restrict__ dk_part, T* __restrict__ dq,
                                          T* __restrict__ dk) {
    __shared__ float dqs[MAX_K];
    __shared__ float dks[MAX_K];
    __shared__ float red4[4];
    const int t = blockIdx.x, h = blockIdx.y;
    const int K = p.key_dim, HV = p.heads_v, BT = p.total_tokens;
    const size_t row = ((size_t)t * p.heads_qk + h) * K;
    float sqq = 0.0f, skk = 0.0f, dqq = 0.0f, dkk = 0.0f;
    for (int i = threadIdx.x; i < K; i += blockDim.x) {
        float aq = 0.0f, ak = 0.0f;
        for (int hv = h * p.group; hv < (h + 1) * p.group; ++hv) {
            for (int vb = 0; vb < p.v_blocks; ++vb) {
                const size_t at = (((size_t)vb * BT + t) * HV + hv) * K + i;
                aq += dq_part[at];
                ak += dk_part[at];
            }
        }
        dqs[i] = aq;
        dks[i] = ak;
        const float xq = to_f32(q[row + i]), xk = to_f32(k[row + i]);
        sqq += xq * xq;
        skk += xk * xk;
        dqq += aq * xq;
        dkk += ak * xk;
    }
    float rq = 1.0f, rk = 1.0f, cq = 0.0f, ck = 0.0f;
    if (p.flags & L2NORM_QK) {
        sqq = block_sum_128(sqq, red4);
        skk = block_sum_128(skk, red4);
        dqq = block_sum_128(dqq, red4);
        dkk = block_sum_128(dkk, red4);
        rq = 1.0f / sqrtf(sqq + L2NORM_EPS);
        rk = 1.0f / sqrtf(skk + L2NORM_EPS);
        // (dy.y) y r = (dy.x) r^3 x
        cq = dqq * rq * rq * rq;
        ck = dkk * rk * rk * rk;
    }
    for (int i = threadIdx.x; i < K; i += blockDim.x) {
        float yq = dqs[i], yk = dks[i];
        if (p.flags & L2NORM_QK) {
            yq = yq * rq - cq * to_f32(q[row + i]);
            yk = yk * rk - ck * to_f32(k[row + i]);
        }
        dq[row + i] = from_f32<T>(yq);
        dk[row + i] = from_f32<T>(yk);
    }
}

// Per v-head (256 threads): db, dg over the head's tokens through the activations, and the
// dA_log / ddt_bias sums (fixed order: per-thread strided sums, then a tree).
__device__ __forceinline__ void gate_finish(const BackwardParams p, const float* __restrict__ g,
                                            const float* __restrict__ beta,
                                            const float* __restrict__ a_log,
                                            const float* __restrict__ dt_bias,
                                            const float* __restrict__ dbeta_part,
                                            const float* __restrict__ dg_part,
                                            float* __restrict__ dg, float* __restrict__ dbeta,
                                            float* __restrict__ da_log,
                                            float* __restrict__ ddt_bias) {
    __shared__ float red[2][8];
    const int hv = blockIdx.x;
    const int HV = p.heads_v, BT = p.total_tokens;
    const bool gate = p.flags & GATE_IN_KERNEL;
    const float neg_a = gate ? -expf(a_log[hv]) : 0.0f;
    const float bias = gate ? dt_bias[hv] : 0.0f;
    float sum_a = 0.0f, sum_b = 0.0f;
    for (int t = threadIdx.x; t < BT; t += blockDim.x) {
        const size_t gi = (size_t)t * HV + hv;
        float db = 0.0f, dga = 0.0f;
        for (int vb = 0; vb < p.v_blocks; ++vb) {
            db += dbeta_part[(size_t)vb * BT * HV + gi];
            dga += dg_part[(size_t)vb * BT * HV + gi];
        }
        float d = 1.0f;
        if (p.flags & BETA_SIGMOID) {
            // σ' = σ(x)·σ(−x): 1 − σ(x) cancels for large logits (as in gate_finish.wgsl).
            d = sigmoid(beta[gi]) * sigmoid(-beta[gi]);
        }
        if (p.flags & NEG_EIGVAL) d *= 2.0f;
        dbeta[gi] = db * d;
        if (gate) {
            const float x = g[gi] + bias;
            const float gv = neg_a * softplus(x);
            const float dgr = dga * neg_a * (x > 20.0f ? 1.0f : sigmoid(x));
            dg[gi] = dgr;
            sum_a = fmaf(dga, gv, sum_a);  // dg/dA_log = g
            sum_b += dgr;                  // dg/ddt_bias = dg/dg_raw
        } else {
            dg[gi] = dga;
        }
    }
    if (!gate) return;  // uniform across the block
    sum_a = warp_sum(sum_a);
    sum_b = warp_sum(sum_b);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) {
        red[0][warp] = sum_a;
        red[1][warp] = sum_b;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float a = 0.0f, b = 0.0f;
        for (int w = 0; w < (int)(blockDim.x >> 5); ++w) {
            a += red[0][w];
            b += red[1][w];
        }
        da_log[hv] = a;
        ddt_bias[hv] = b;
    }
}

}  // namespace gdn

#define GDN_BWD(SUFFIX, T)                                                                          \
    extern "C" __global__ void __launch_bounds__(gdn::BV * gdn::KSPLIT)                             \
        gdn_bwd_recurrent_##SUFFIX(const gdn::BackwardParams p, const int* seq_bounds,              \
                                   const int* ckpt_base, const T* q, const T* k, const T* v,        \
                                   const float* g, const float* beta, const float* a_log,           \
                                   const float* dt_bias, const float* h0, const T* d_o,             \
                                   const float* dht, T* dv, float* dh0, float* ckpt, float* seg,    \
                                   float* dq_part, float* dk_part, float* dbeta_part,               \
                                   float* dg_part) {                                                \
        gdn::recurrent_bwd<T>(p, seq_bounds, ckpt_base, q, k, v, g, beta, a_log, dt_bias, h0, d_o,  \
                              dht, dv, dh0, ckpt, seg, dq_part, dk_part, dbeta_part, dg_part);      \
    }                                                                                               \
    extern "C" __global__ void __launch_bounds__(128) gdn_bwd_qk_finish_##SUFFIX(                   \
        const gdn::BackwardParams p, const T* q, const T* k, const float* dq_part,                  \
        const float* dk_part, T* dq, T* dk) {                                                       \
        gdn::qk_finish<T>(p, q, k, dq_part, dk_part, dq, dk);                                       \
    }

GDN_BWD(f32, float)
GDN_BWD(f16, __half)
GDN_BWD(bf16, __nv_bfloat16)

extern "C" __global__ void __launch_bounds__(256) gdn_bwd_gate_finish(
    const gdn::BackwardParams p, const float* g, const float* beta, const float* a_log,
    const float* dt_bias, const float* dbeta_part, const float* dg_part, float* dg, float* dbeta,
    float* da_log, float* ddt_bias) {
    gdn::gate_finish(p, g, beta, a_log, dt_bias, dbeta_part, dg_part, dg, dbeta, da_log, ddt_bias);
}
