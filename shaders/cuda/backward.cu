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
// Design (four kernels, all deterministic: no atomics):
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
// 2. gdn_bwd_qk_finish_*: per (token, q/k head) a warp, sums the partials over V-blocks and
//    over the GVA group's v-heads, then the l2norm chain rule (linear in dy, so summing first is
//    exact), stored in the storage dtype.
// 3. gdn_bwd_gate_finish: per (block of tokens, 32 v-heads), sums db / dg partials over
//    V-blocks, applies the sigmoid (x2) and gate-activation chain rules, and sums dA_log and
//    ddt_bias over the block's tokens; 4. gdn_bwd_gate_sums adds those per v-head (both sums in
//    a fixed order). The finishing kernels (2-4) are shared with the chunked backward.

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

// Per (token, q/k head) row, a warp each: sum dq / dk partials over V-blocks and the GVA
// group, then the l2norm chain rule dx = (dy - (dy.y) y) r with y = x r, r = 1/sqrt(sum x^2 +
// eps). Pure bandwidth: with K a multiple of 4 each lane moves 4 consecutive elements per
// access (16-byte f32 loads), else one.
constexpr int QK_ROWS = 8;  // rows (warps) per block (backward.rs QK_FINISH_ROWS)
constexpr int QK_PER_LANE = MAX_K / 32;

template <typename T> struct alignas(4 * sizeof(T)) Vec4 {
    T x[4];
};

template <typename T>
__device__ __forceinline__ void qk_finish(const BackwardParams p, const T* __restrict__ q,
                                          const T* __restrict__ k,
                                          const float* __restrict__ dq_part,
                                          const float* __restrict__ dk_part, T* __restrict__ dq,
                                          T* __restrict__ dk) {
    const int lane = threadIdx.x & 31;
    const size_t rows = (size_t)p.total_tokens * p.heads_qk;
    const size_t row_id = (size_t)blockIdx.x * QK_ROWS + (threadIdx.x >> 5);
    if (row_id >= rows) return;  // uniform across the warp
    const int t = (int)(row_id / p.heads_qk), h = (int)(row_id % p.heads_qk);
    const int K = p.key_dim, HV = p.heads_v, BT = p.total_tokens;
    const size_t row = row_id * K;
    const bool vec = K % 4 == 0;
    // Element j of this lane: 4 consecutive per 128 (vec), else one per 32.
    auto index = [&](int j) { return vec ? 128 * (j >> 2) + 4 * lane + (j & 3) : 32 * j + lane; };
    float aq[QK_PER_LANE], ak[QK_PER_LANE], xq[QK_PER_LANE], xk[QK_PER_LANE];
#pragma unroll
    for (int j = 0; j < QK_PER_LANE; ++j) aq[j] = ak[j] = xq[j] = xk[j] = 0.0f;
    for (int hv = h * p.group; hv < (h + 1) * p.group; ++hv) {
        for (int vb = 0; vb < p.v_blocks; ++vb) {
            const size_t base = (((size_t)vb * BT + t) * HV + hv) * K;
            if (vec) {
#pragma unroll
                for (int j = 0; j < QK_PER_LANE; j += 4) {
                    const int i = index(j);
                    if (i < K) {
                        const float4 fq = *reinterpret_cast<const float4*>(dq_part + base + i);
                        const float4 fk = *reinterpret_cast<const float4*>(dk_part + base + i);
                        aq[j] += fq.x, aq[j + 1] += fq.y, aq[j + 2] += fq.z, aq[j + 3] += fq.w;
                        ak[j] += fk.x, ak[j + 1] += fk.y, ak[j + 2] += fk.z, ak[j + 3] += fk.w;
                    }
                }
            } else {
#pragma unroll
                for (int j = 0; j < QK_PER_LANE; ++j) {
                    const int i = index(j);
                    if (i < K) {
                        aq[j] += dq_part[base + i];
                        ak[j] += dk_part[base + i];
                    }
                }
            }
        }
    }
    if (p.flags & L2NORM_QK) {
        if (vec) {
#pragma unroll
            for (int j = 0; j < QK_PER_LANE; j += 4) {
                const int i = index(j);
                if (i < K) {
                    const Vec4<T> vq = *reinterpret_cast<const Vec4<T>*>(q + row + i);
                    const Vec4<T> vk = *reinterpret_cast<const Vec4<T>*>(k + row + i);
#pragma unroll
                    for (int e = 0; e < 4; ++e) xq[j + e] = to_f32(vq.x[e]), xk[j + e] = to_f32(vk.x[e]);
                }
            }
        } else {
#pragma unroll
            for (int j = 0; j < QK_PER_LANE; ++j) {
                const int i = index(j);
                if (i < K) xq[j] = to_f32(q[row + i]), xk[j] = to_f32(k[row + i]);
            }
        }
        float sqq = 0.0f, skk = 0.0f, dqq = 0.0f, dkk = 0.0f;
#pragma unroll
        for (int j = 0; j < QK_PER_LANE; ++j) {  // elements past K are 0
            sqq += xq[j] * xq[j];
            skk += xk[j] * xk[j];
            dqq += aq[j] * xq[j];
            dkk += ak[j] * xk[j];
        }
        sqq = warp_sum(sqq);
        skk = warp_sum(skk);
        dqq = warp_sum(dqq);
        dkk = warp_sum(dkk);
        const float rq = 1.0f / sqrtf(sqq + L2NORM_EPS), rk = 1.0f / sqrtf(skk + L2NORM_EPS);
        // (dy.y) y r = (dy.x) r^3 x
        const float cq = dqq * rq * rq * rq, ck = dkk * rk * rk * rk;
#pragma unroll
        for (int j = 0; j < QK_PER_LANE; ++j) {
            aq[j] = aq[j] * rq - cq * xq[j];
            ak[j] = ak[j] * rk - ck * xk[j];
        }
    }
    if (vec) {
#pragma unroll
        for (int j = 0; j < QK_PER_LANE; j += 4) {
            const int i = index(j);
            if (i < K) {
                Vec4<T> oq, ok;
#pragma unroll
                for (int e = 0; e < 4; ++e) oq.x[e] = from_f32<T>(aq[j + e]), ok.x[e] = from_f32<T>(ak[j + e]);
                *reinterpret_cast<Vec4<T>*>(dq + row + i) = oq;
                *reinterpret_cast<Vec4<T>*>(dk + row + i) = ok;
            }
        }
    } else {
#pragma unroll
        for (int j = 0; j < QK_PER_LANE; ++j) {
            const int i = index(j);
            if (i < K) {
                dq[row + i] = from_f32<T>(aq[j]);
                dk[row + i] = from_f32<T>(ak[j]);
            }
        }
    }
}

// db, dg per token through the activations, and per (token block, v-head) the partial sums of
// dA_log and ddt_bias: a block per GATE_TOKENS tokens and 32 v-heads, lane = v-head (so each
// access reads 32 consecutive floats), warp w over tokens w, w + 8, …; fixed-order sums (per
// lane over its tokens, then over the warps) into gate_sums[2·(block·HV) + …].
constexpr int GATE_TOKENS = 256;  // tokens per block (backward.rs GATE_FINISH_TOKENS)
constexpr int GATE_WARPS = 8;

__device__ __forceinline__ void gate_finish(const BackwardParams p, const float* __restrict__ g,
                                            const float* __restrict__ beta,
                                            const float* __restrict__ a_log,
                                            const float* __restrict__ dt_bias,
                                            const float* __restrict__ dbeta_part,
                                            const float* __restrict__ dg_part,
                                            float* __restrict__ dg, float* __restrict__ dbeta,
                                            float* __restrict__ gate_sums) {
    __shared__ float red[2][GATE_WARPS][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int hv = blockIdx.y * 32 + lane, tb = blockIdx.x;
    const int HV = p.heads_v, BT = p.total_tokens;
    const bool gate = p.flags & GATE_IN_KERNEL;
    const bool active = hv < HV;
    const float neg_a = gate && active ? -expf(a_log[hv]) : 0.0f;
    const float bias = gate && active ? dt_bias[hv] : 0.0f;
    const size_t part_stride = (size_t)BT * HV;
    const int t_end = min(BT, (tb + 1) * GATE_TOKENS);
    float sum_a = 0.0f, sum_b = 0.0f;
    if (active) {
#pragma unroll 4
        for (int t = tb * GATE_TOKENS + warp; t < t_end; t += GATE_WARPS) {
            const size_t gi = (size_t)t * HV + hv;
            float db = 0.0f, dga = 0.0f;
            for (int vb = 0; vb < p.v_blocks; ++vb) {
                db += dbeta_part[vb * part_stride + gi];
                dga += dg_part[vb * part_stride + gi];
            }
            float d = 1.0f;
            if (p.flags & BETA_SIGMOID) {
                // σ' = σ(x)·σ(−x): 1 − σ(x) cancels for large logits (as in gate_finish.wgsl).
                const float b = beta[gi];
                d = sigmoid(b) * sigmoid(-b);
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
    }
    if (!gate) return;  // uniform across the grid
    red[0][warp][lane] = sum_a;
    red[1][warp][lane] = sum_b;
    __syncthreads();
    if (warp == 0 && active) {
        float a = 0.0f, b = 0.0f;
#pragma unroll
        for (int w = 0; w < GATE_WARPS; ++w) {
            a += red[0][w][lane];
            b += red[1][w][lane];
        }
        gate_sums[(2 * (size_t)tb) * HV + hv] = a;
        gate_sums[(2 * (size_t)tb + 1) * HV + hv] = b;
    }
}

// dA_log, ddt_bias per v-head (a warp each): the token blocks' partial sums, lanes strided
// over the blocks, then the warp's tree (a fixed order).
__device__ __forceinline__ void gate_sums_finish(const BackwardParams p, int blocks,
                                                 const float* __restrict__ gate_sums,
                                                 float* __restrict__ da_log,
                                                 float* __restrict__ ddt_bias) {
    const int hv = blockIdx.x, HV = p.heads_v;
    float a = 0.0f, b = 0.0f;
    for (int tb = threadIdx.x; tb < blocks; tb += 32) {
        a += gate_sums[(2 * (size_t)tb) * HV + hv];
        b += gate_sums[(2 * (size_t)tb + 1) * HV + hv];
    }
    a = warp_sum(a);
    b = warp_sum(b);
    if (threadIdx.x == 0) {
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
    extern "C" __global__ void __launch_bounds__(32 * gdn::QK_ROWS) gdn_bwd_qk_finish_##SUFFIX(                   \
        const gdn::BackwardParams p, const T* q, const T* k, const float* dq_part,                  \
        const float* dk_part, T* dq, T* dk) {                                                       \
        gdn::qk_finish<T>(p, q, k, dq_part, dk_part, dq, dk);                                       \
    }

GDN_BWD(f32, float)
GDN_BWD(f16, __half)
GDN_BWD(bf16, __nv_bfloat16)

extern "C" __global__ void __launch_bounds__(32 * gdn::GATE_WARPS) gdn_bwd_gate_finish(
    const gdn::BackwardParams p, const float* g, const float* beta, const float* a_log,
    const float* dt_bias, const float* dbeta_part, const float* dg_part, float* dg, float* dbeta,
    float* gate_sums) {
    gdn::gate_finish(p, g, beta, a_log, dt_bias, dbeta_part, dg_part, dg, dbeta, gate_sums);
}

extern "C" __global__ void __launch_bounds__(32) gdn_bwd_gate_sums(const gdn::BackwardParams p, int blocks,
                                                                   const float* gate_sums, float* da_log,
                                                                   float* ddt_bias) {
    gdn::gate_sums_finish(p, blocks, gate_sums, da_log, ddt_bias);
}
