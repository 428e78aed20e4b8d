// Decode: the GDN recurrence (FLA's order) for a short window of tokens per sequence (one token
// per step in serving, a few for speculative verification) over an f32 state pool updated in
// place:  S <- exp(g) S;  u = beta (v - S^T k);  S <- S + k u^T;  o = scale S^T q.
//
// Why a kernel of its own: decode is a pure stream of the state (read + write 2*K*V*4 bytes per
// head, ~0.9 FLOP/B). The recurrent kernel's 4-warp K-split needs three block barriers per token
// and reads the K-first state in 128 B rows but the V-first state with a 4 B stride per lane.
//
// Design (no shared memory, no block barriers):
// - One warp owns COLS = 16 v columns and the whole K of one (sequence, v-head). Lane =
//   kl * 4 + vl: 8 lanes along k, 4 along v. Each lane keeps a (K/8) x 4 f32 tile of the state
//   in registers (64 floats at K = 128), so S^T k and S^T q are in-lane sums followed by three
//   xor-shuffles across the 8 k-lanes.
// - Lane k indices are groups of 4 contiguous k: k = 32*gi + 4*kl + e, so q/k come in one vector
//   load per group (8 B for 16-bit, 16 B for f32) and the V-first state ([V,K]) in float4 along
//   k (8 lanes cover 128 contiguous bytes per v row). K-first ([K,V]): the lane's 4 columns are
//   contiguous (col0 + 4*vl + c), so each state row is one float4 per lane and a warp reads
//   64 contiguous bytes per row. Both layouts move the state with 128-bit loads and stores.
// - 2 warps per block (64 threads) for small grids: at B = 1 with HV = 32, V = 128 that is 256
//   warps in 128 blocks, each lane with 16 independent 16 B state loads in flight, so one
//   memory round trip fetches the whole state; 4 warps per block for large grids (fewer block
//   launches; measured below). A warp past V returns at once (nothing to wait for).
// - The state load is issued first, before the window bounds are known (the slot exists for
//   every sequence), so it overlaps the dependent loads of the bounds and then q, k, v. A
//   sequence with no token in the window is not written: the pool is updated in place, so
//   skipping is exact (finished sequences cost a read, no write).
// - Instantiations per dtype: KMAX = 128 (K <= 128, capped at 128 registers so 16 warps fit
//   per SM) and 256 (K <= 256), each with 2- and 4-warp blocks.
// Requires: K, V multiples of 16 (Problem validates), base pointers 16 B aligned (cudarc
// allocations are 256 B aligned); every per-row offset is then a multiple of the vector width.
//
// Measured (H200, 2026-12-01; state f32, K = V = 128, bf16 q/k/v/o, one token per step):
//   `gdn bench --no-progress --backend cuda --ops decode --heads 16/32,2/8 --decode-batch 1,64,256
//    --dtype bf16 --reps 50` (median GPU ms, CUDA events around each step):
//     16/32 B=1 0.0135 (host-bound, see below), B=64 0.0832, B=256 0.2878 ms = 3753 GB/s;
//     2/8 B=1 0.0135, B=64 0.0241, B=256 0.0825 ms.
//   Before (recurrent.cu): 16/32 B=1 0.0161, B=64 0.1290, B=256 0.4727 ms (2285 GB/s);
//     FLA fused_recurrent: 16/32 B=1 0.0043, B=256 0.3638 ms.
//   The bench's B=1 figure is the host enqueue time (host ms ~ GPU ms: the events bracket an
//   idle GPU waiting for the launch). Kernel time from Nsight Compute (`ncu --clock-control
//   none --cache-control all|none -k regex:gdn_decode`, same bench): 16/32 B=1 5.15 us with a
//   cold L2 / 4.03 us warm; 2/8 B=1 4.80 / 3.78 us; 16/32 B=256 274 us = 3.92 TB/s (80 % of
//   DRAM peak). Variants measured and dropped: 1 warp per block (B=256 0.346 ms), 8 warps
//   (0.297), __ldcs/__stcs streaming hints (0.302-0.354: worse at every block size); 4 warps vs
//   2 at B=256: 0.2857 vs 0.2910 ms (kept for large grids); reading the state before the
//   window bounds: B=1 5.50 us before, 5.15 after, cold L2 (but ncu ran at base clocks before and
//   unlocked after, so the effect is not isolated).

namespace gdn {

constexpr int DECODE_COLS = 16;   // v columns per warp

// Mirrors DecodeParams in src/cuda_backend/decode.rs (repr(C), all 4-byte fields).
struct DecodeParams {
    int heads_qk;
    int heads_v;
    int key_dim;
    int value_dim;
    int group;         // heads_v / heads_qk (GVA)
    int flags;         // option bits of common.cuh
    int window_begin;  // first token of each sequence this launch runs, relative to its start
    int window_len;    // tokens per sequence this launch runs (at most)
    float scale;
};

__device__ __forceinline__ void load4(const float* p, float x[4]) {
    const float4 r = *reinterpret_cast<const float4*>(p);
    x[0] = r.x; x[1] = r.y; x[2] = r.z; x[3] = r.w;
}
__device__ __forceinline__ void load4(const __half* p, float x[4]) {
    const uint2 r = *reinterpret_cast<const uint2*>(p);
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&r.x));
    const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&r.y));
    x[0] = a.x; x[1] = a.y; x[2] = b.x; x[3] = b.y;
}
__device__ __forceinline__ void load4(const __nv_bfloat16* p, float x[4]) {
    const uint2 r = *reinterpret_cast<const uint2*>(p);
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&r.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&r.y));
    x[0] = a.x; x[1] = a.y; x[2] = b.x; x[3] = b.y;
}

// Sum over the 8 k-lanes (lane bits 2..4); every lane ends with the total of its v-lane.
__device__ __forceinline__ float klane_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 4);
    x += __shfl_xor_sync(0xffffffffu, x, 8);
    x += __shfl_xor_sync(0xffffffffu, x, 16);
    return x;
}

template <typename T, int KMAX, int WARPS>
__device__ __forceinline__ void decode(const DecodeParams p, const int* __restrict__ seq_bounds,
                                       const T* __restrict__ q, const T* __restrict__ k,
                                       const T* __restrict__ v, const float* __restrict__ g,
                                       const float* __restrict__ beta,
                                       const float* __restrict__ a_log,
                                       const float* __restrict__ dt_bias, T* __restrict__ o,
                                       float* __restrict__ state) {
    constexpr int G = KMAX / 32;  // groups of 4 contiguous k per lane
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int vl = lane & 3;
    const int kl = lane >> 2;
    const int K = p.key_dim, V = p.value_dim, H = p.heads_qk, HV = p.heads_v;
    const int col0 = (blockIdx.x * WARPS + warp) * DECODE_COLS;
    if (col0 >= V) return;  // V is a multiple of 16: a warp is either all in or all out
    const int hv = blockIdx.y;
    const int n = blockIdx.z;
    const int h = hv / p.group;
    const int flags = p.flags;
    const bool v_first = (flags & STATE_V_FIRST) != 0;

    float* slice = state + ((size_t)n * HV + hv) * (size_t)K * V;
    // This lane's 4 columns: contiguous for K-first (one float4 per state row), strided by 4
    // for V-first (so that the 8 k-lanes of one column read 128 contiguous bytes).
    const int cbase = v_first ? col0 + vl : col0 + 4 * vl;
    const int cstep = v_first ? 4 : 1;

    float s[G][4][4];  // [k group][k within group][column]
#pragma unroll
    for (int gi = 0; gi < G; ++gi) {
        const int kb = gi * 32 + kl * 4;
        if (kb < K) {
            if (v_first) {
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    float x[4];
                    load4(slice + (size_t)(cbase + c * cstep) * K + kb, x);
#pragma unroll
                    for (int e = 0; e < 4; ++e) s[gi][e][c] = x[e];
                }
            } else {
#pragma unroll
                for (int e = 0; e < 4; ++e) load4(slice + (size_t)(kb + e) * V + cbase, s[gi][e]);
            }
        } else {
#pragma unroll
            for (int e = 0; e < 4; ++e)
#pragma unroll
                for (int c = 0; c < 4; ++c) s[gi][e][c] = 0.0f;
        }
    }

    // The state is read before the window is known (it exists for every sequence), so its
    // load overlaps the dependent loads of the bounds and then q, k, v: one DRAM round trip
    // fewer on the latency-bound B = 1 path.
    const int seq_start = seq_bounds[n];
    const int seq_end = seq_bounds[n + 1];
    const int first = min(seq_start + p.window_begin, seq_end);
    const int last = min(first + p.window_len, seq_end);
    if (first >= last) return;  // nothing to run: the pooled state is not written

    // Per-head constants of the gate activation.
    float neg_a = 0.0f, bias = 0.0f;
    if (flags & GATE_IN_KERNEL) {
        neg_a = -expf(a_log[hv]);
        bias = dt_bias[hv];
    }

    for (int t = first; t < last; ++t) {
        const size_t qk_row = ((size_t)t * H + h) * K;
        float qv[G][4], kv[G][4];
#pragma unroll
        for (int gi = 0; gi < G; ++gi) {
            const int kb = gi * 32 + kl * 4;
            if (kb < K) {
                load4(q + qk_row + kb, qv[gi]);
                load4(k + qk_row + kb, kv[gi]);
            } else {
#pragma unroll
                for (int e = 0; e < 4; ++e) qv[gi][e] = kv[gi][e] = 0.0f;
            }
        }
        const size_t gate_idx = (size_t)t * HV + hv;
        float vt[4];
        if (v_first) {
#pragma unroll
            for (int c = 0; c < 4; ++c) vt[c] = to_f32(v[gate_idx * V + cbase + c * cstep]);
        } else {
            load4(v + gate_idx * V + cbase, vt);
        }
        float gt = g[gate_idx];
        if (flags & GATE_IN_KERNEL) gt = neg_a * softplus(gt + bias);
        const float alpha = expf(gt);
        float bt = beta[gate_idx];
        if (flags & BETA_SIGMOID) bt = sigmoid(bt);
        if (flags & NEG_EIGVAL) bt *= 2.0f;

        if (flags & L2NORM_QK) {
            // Normalized q, k stay in f32 (no rounding to the storage dtype), as the oracle.
            float sq = 0.0f, sk = 0.0f;
#pragma unroll
            for (int gi = 0; gi < G; ++gi)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    sq = fmaf(qv[gi][e], qv[gi][e], sq);
                    sk = fmaf(kv[gi][e], kv[gi][e], sk);
                }
            const float rq = 1.0f / sqrtf(klane_sum(sq) + L2NORM_EPS);
            const float rk = 1.0f / sqrtf(klane_sum(sk) + L2NORM_EPS);
#pragma unroll
            for (int gi = 0; gi < G; ++gi)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    qv[gi][e] *= rq;
                    kv[gi][e] *= rk;
                }
        }

        // Decay, then predict with the decayed state.
        float pred[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int gi = 0; gi < G; ++gi)
#pragma unroll
            for (int e = 0; e < 4; ++e)
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    s[gi][e][c] *= alpha;
                    pred[c] = fmaf(s[gi][e][c], kv[gi][e], pred[c]);
                }
        float u[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) u[c] = bt * (vt[c] - klane_sum(pred[c]));

        // Rank-1 write, then read the output from the updated state.
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int gi = 0; gi < G; ++gi)
#pragma unroll
            for (int e = 0; e < 4; ++e)
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    s[gi][e][c] = fmaf(kv[gi][e], u[c], s[gi][e][c]);
                    acc[c] = fmaf(s[gi][e][c], qv[gi][e], acc[c]);
                }
        float out = 0.0f;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const float total = klane_sum(acc[c]);
            if (kl == c) out = total;
        }
        // Every k-lane holds the totals: k-lanes 0..3 each store one of the 4 columns, so the
        // 16 stores of a warp cover its 16 columns.
        if (kl < 4) o[gate_idx * V + cbase + kl * cstep] = from_f32<T>(p.scale * out);
    }

#pragma unroll
    for (int gi = 0; gi < G; ++gi) {
        const int kb = gi * 32 + kl * 4;
        if (kb < K) {
            if (v_first) {
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    const float4 x = make_float4(s[gi][0][c], s[gi][1][c], s[gi][2][c], s[gi][3][c]);
                    *reinterpret_cast<float4*>(slice + (size_t)(cbase + c * cstep) * K + kb) = x;
                }
            } else {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float4 x = make_float4(s[gi][e][0], s[gi][e][1], s[gi][e][2], s[gi][e][3]);
                    *reinterpret_cast<float4*>(slice + (size_t)(kb + e) * V + cbase) = x;
                }
            }
        }
    }
}

}  // namespace gdn

#define GDN_DECODE(NAME, T, KMAX, WARPS)                                                            \
    extern "C" __global__ void __launch_bounds__(WARPS * 32, KMAX == 128 ? 16 / WARPS : 1) NAME( \
        const gdn::DecodeParams p, const int* seq_bounds, const T* q, const T* k, const T* v,       \
        const float* g, const float* beta, const float* a_log, const float* dt_bias, T* o,          \
        float* state) {                                                                             \
        gdn::decode<T, KMAX, WARPS>(p, seq_bounds, q, k, v, g, beta, a_log, dt_bias, o, state);            \
    }

GDN_DECODE(gdn_decode_f32_k128_w2, float, 128, 2)
GDN_DECODE(gdn_decode_f16_k128_w2, __half, 128, 2)
GDN_DECODE(gdn_decode_bf16_k128_w2, __nv_bfloat16, 128, 2)
GDN_DECODE(gdn_decode_f32_k256_w2, float, 256, 2)
GDN_DECODE(gdn_decode_f16_k256_w2, __half, 256, 2)
GDN_DECODE(gdn_decode_bf16_k256_w2, __nv_bfloat16, 256, 2)
GDN_DECODE(gdn_decode_f32_k128_w4, float, 128, 4)
GDN_DECODE(gdn_decode_f16_k128_w4, __half, 128, 4)
GDN_DECODE(gdn_decode_bf16_k128_w4, __nv_bfloat16, 128, 4)
GDN_DECODE(gdn_decode_f32_k256_w4, float, 256, 4)
GDN_DECODE(gdn_decode_f16_k256_w4, __half, 256, 4)
GDN_DECODE(gdn_decode_bf16_k256_w4, __nv_bfloat16, 256, 4)
