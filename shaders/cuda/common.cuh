// Shared by every CUDA pass: NVRTC compiles this prelude followed by one pass file (see
// src/cuda_backend/kernels.rs), so a pass needs no include of its own for these helpers.
// Storage dtypes are loaded to f32 and stored with round-to-nearest-even, as the oracle rounds.
#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace gdn {

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

// FLA's softplus: x above 20, else ln(1 + e^x).
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
// x, opaque to the compiler: what a loop forms from it is formed again in every iteration
// instead of being hoisted out into registers (which, at a launch bound's register count,
// spill to local memory).
__device__ __forceinline__ int opaque(int x) {
    asm volatile("" : "+r"(x));
    return x;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

// Option bits; the same constants live in src/cuda_backend/recurrent.rs.
constexpr int L2NORM_QK = 1;
constexpr int BETA_SIGMOID = 2;
constexpr int NEG_EIGVAL = 4;
constexpr int GATE_IN_KERNEL = 8;
constexpr int STATE_V_FIRST = 16;

// The in-kernel l2norm's epsilon, inside the square root (problem.rs L2NORM_EPS).
constexpr float L2NORM_EPS = 1e-6f;

// Shared-memory address of a generic pointer, for inline PTX.
__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// 16 bytes global → shared without passing through registers (sm_80+): copies stay in flight
// while the thread computes, and cp_async_wait waits for all of this thread's.
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src)
                 : "memory");
}
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
// Close the thread's current group of copies; wait until at most N groups are in flight.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait_group() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace gdn
