// Hardware check of Hopper wgmma as docs/wgmma-notes.md describes it: each variant multiplies
// exact inputs (multiples of 1/8 in [-1, 1], exact in bf16 and in f32 sums) with one warpgroup
// and compares every output element with the host's product. It also prints clock64 cycles
// around 64 repeats of the product; on an H100 (2026-12-05) those were below the SM's peak
// rate, so they are not a latency (BENCHMARKS.md).
// Build and run on the device: nvcc -gencode arch=compute_90a,code=sm_90a -O2 -o /tmp/wgmma-check check.cu && /tmp/wgmma-check
#ifndef __CUDACC_RTC__  // under NVRTC the kernels alone compile (a compile check here, without a GPU)
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>
#endif
typedef unsigned short bf16_t; typedef unsigned long long u64; typedef unsigned int u32;

__device__ __forceinline__ u64 make_desc(const void* smem, u32 lbo, u32 sbo, u32 swizzle) {
  u32 a = (u32)__cvta_generic_to_shared(smem);
  return (u64)((a & 0x3FFFF) >> 4) | ((u64)((lbo & 0x3FFFF) >> 4) << 16) |
         ((u64)((sbo & 0x3FFFF) >> 4) << 32) | ((u64)swizzle << 62);
}
// D(64x64) (+)= A(64x16, shared, descriptor) * B(16x64, shared, descriptor).
template <int TRANS_B>
__device__ __forceinline__ void wgmma_ss_m64n64(float* d, u64 da, u64 db, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
    "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, %35;\n}\n"
    : "+f"(d[0]),"+f"(d[1]),"+f"(d[2]),"+f"(d[3]),"+f"(d[4]),"+f"(d[5]),"+f"(d[6]),"+f"(d[7]),"+f"(d[8]),"+f"(d[9]),"+f"(d[10]),"+f"(d[11]),"+f"(d[12]),"+f"(d[13]),"+f"(d[14]),"+f"(d[15]),"+f"(d[16]),"+f"(d[17]),"+f"(d[18]),"+f"(d[19]),"+f"(d[20]),"+f"(d[21]),"+f"(d[22]),"+f"(d[23]),"+f"(d[24]),"+f"(d[25]),"+f"(d[26]),"+f"(d[27]),"+f"(d[28]),"+f"(d[29]),"+f"(d[30]),"+f"(d[31])
    : "l"(da), "l"(db), "r"(scale_d), "n"(TRANS_B));
}
// D(64x64) (+)= A(64x16, registers: the mma.m16n8k16 A fragment of warp w's rows) * B(shared).
template <int TRANS_B>
__device__ __forceinline__ void wgmma_rs_m64n64(float* d, const u32* a, u64 db, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
    "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, %38;\n}\n"
    : "+f"(d[0]),"+f"(d[1]),"+f"(d[2]),"+f"(d[3]),"+f"(d[4]),"+f"(d[5]),"+f"(d[6]),"+f"(d[7]),"+f"(d[8]),"+f"(d[9]),"+f"(d[10]),"+f"(d[11]),"+f"(d[12]),"+f"(d[13]),"+f"(d[14]),"+f"(d[15]),"+f"(d[16]),"+f"(d[17]),"+f"(d[18]),"+f"(d[19]),"+f"(d[20]),"+f"(d[21]),"+f"(d[22]),"+f"(d[23]),"+f"(d[24]),"+f"(d[25]),"+f"(d[26]),"+f"(d[27]),"+f"(d[28]),"+f"(d[29]),"+f"(d[30]),"+f"(d[31])
    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d), "n"(TRANS_B));
}

// D(64x128) (+)= A(64x16, shared, descriptor) * B(16x128, shared, descriptor).
template <int TRANS_B>
__device__ __forceinline__ void wgmma_ss_m64n128(float* d, u64 da, u64 db, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
    "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, %67;\n}\n"
    : "+f"(d[0]),"+f"(d[1]),"+f"(d[2]),"+f"(d[3]),"+f"(d[4]),"+f"(d[5]),"+f"(d[6]),"+f"(d[7]),"+f"(d[8]),"+f"(d[9]),"+f"(d[10]),"+f"(d[11]),"+f"(d[12]),"+f"(d[13]),"+f"(d[14]),"+f"(d[15]),"+f"(d[16]),"+f"(d[17]),"+f"(d[18]),"+f"(d[19]),"+f"(d[20]),"+f"(d[21]),"+f"(d[22]),"+f"(d[23]),"+f"(d[24]),"+f"(d[25]),"+f"(d[26]),"+f"(d[27]),"+f"(d[28]),"+f"(d[29]),"+f"(d[30]),"+f"(d[31]),"+f"(d[32]),"+f"(d[33]),"+f"(d[34]),"+f"(d[35]),"+f"(d[36]),"+f"(d[37]),"+f"(d[38]),"+f"(d[39]),"+f"(d[40]),"+f"(d[41]),"+f"(d[42]),"+f"(d[43]),"+f"(d[44]),"+f"(d[45]),"+f"(d[46]),"+f"(d[47]),"+f"(d[48]),"+f"(d[49]),"+f"(d[50]),"+f"(d[51]),"+f"(d[52]),"+f"(d[53]),"+f"(d[54]),"+f"(d[55]),"+f"(d[56]),"+f"(d[57]),"+f"(d[58]),"+f"(d[59]),"+f"(d[60]),"+f"(d[61]),"+f"(d[62]),"+f"(d[63])
    : "l"(da), "l"(db), "r"(scale_d), "n"(TRANS_B));
}
// D(64x128) (+)= A(64x16, registers: the mma.m16n8k16 A fragment of warp w's rows) * B(shared).
template <int TRANS_B>
__device__ __forceinline__ void wgmma_rs_m64n128(float* d, const u32* a, u64 db, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
    "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, %70;\n}\n"
    : "+f"(d[0]),"+f"(d[1]),"+f"(d[2]),"+f"(d[3]),"+f"(d[4]),"+f"(d[5]),"+f"(d[6]),"+f"(d[7]),"+f"(d[8]),"+f"(d[9]),"+f"(d[10]),"+f"(d[11]),"+f"(d[12]),"+f"(d[13]),"+f"(d[14]),"+f"(d[15]),"+f"(d[16]),"+f"(d[17]),"+f"(d[18]),"+f"(d[19]),"+f"(d[20]),"+f"(d[21]),"+f"(d[22]),"+f"(d[23]),"+f"(d[24]),"+f"(d[25]),"+f"(d[26]),"+f"(d[27]),"+f"(d[28]),"+f"(d[29]),"+f"(d[30]),"+f"(d[31]),"+f"(d[32]),"+f"(d[33]),"+f"(d[34]),"+f"(d[35]),"+f"(d[36]),"+f"(d[37]),"+f"(d[38]),"+f"(d[39]),"+f"(d[40]),"+f"(d[41]),"+f"(d[42]),"+f"(d[43]),"+f"(d[44]),"+f"(d[45]),"+f"(d[46]),"+f"(d[47]),"+f"(d[48]),"+f"(d[49]),"+f"(d[50]),"+f"(d[51]),"+f"(d[52]),"+f"(d[53]),"+f"(d[54]),"+f"(d[55]),"+f"(d[56]),"+f"(d[57]),"+f"(d[58]),"+f"(d[59]),"+f"(d[60]),"+f"(d[61]),"+f"(d[62]),"+f"(d[63])
    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d), "n"(TRANS_B));
}

// Layouts (byte offsets). rows: M for A, N for B stored N x K ("K-major"); cols: K.
enum Layout { KMAJ_NONE, MN_NONE, KMAJ_128, MN_128 };
// K-major, no swizzle: 8x16B core matrices, K neighbours adjacent (LBO 128), next 8 rows SBO = K*16.
__host__ __device__ inline u32 off_kmaj_none(u32 r, u32 k, u32 K) { return (r / 8) * (K * 16) + (k / 8) * 128 + (r % 8) * 16 + (k % 8) * 2; }
// MN-major (B as K x N, N contiguous), no swizzle: core = 8 k-rows x 8 n; SBO (next 8 n) 128, LBO (next 8 k) N*16.
__host__ __device__ inline u32 off_mn_none(u32 k, u32 n, u32 N) { return (n / 8) * 128 + (k / 8) * (N * 16) + (k % 8) * 16 + (n % 8) * 2; }
// K-major, 128B swizzle: 64 k per 128-B row, 8-row atoms of 1024 B (SBO), 64-wide k blocks one after the other.
__host__ __device__ inline u32 off_kmaj_128(u32 r, u32 k, u32 R) { return (k / 64) * (R * 128) + r * 128 + ((((k % 64) / 8) ^ (r % 8)) * 16) + (k % 8) * 2; }
// MN-major, 128B swizzle: 64 n per 128-B k-row, 8 k-rows an atom (SBO 1024), 64-wide n blocks K*128 apart (LBO).
__host__ __device__ inline u32 off_mn_128(u32 k, u32 n, u32 K) { return (n / 64) * (K * 128) + (k / 8) * 1024 + (k % 8) * 128 + ((((n % 64) / 8) ^ (k % 8)) * 16) + (n % 8) * 2; }

__device__ inline bf16_t to_bf16(float x) { return (bf16_t)(__float_as_uint(x) >> 16); }  // exact for the test values

// A: M=64 x K, row-major floats; B: K x N row-major floats; C: 64 x N.
template <int N, int K, int RS, Layout LA, Layout LB>
__global__ void __launch_bounds__(128) product(const float* A, const float* B, float* C, long long* cycles, int* misaligned) {
  extern __shared__ __align__(1024) char smem[];
  char* sA = smem; char* sB = smem + 64 * K * 2;
  const int tid = threadIdx.x;
  if (tid == 0) *misaligned = ((u32)__cvta_generic_to_shared(smem) & 1023) != 0;
  for (int i = tid; i < 64 * K; i += 128) {
    const u32 m = i / K, k = i % K;
    const u32 o = LA == KMAJ_NONE ? off_kmaj_none(m, k, K) : off_kmaj_128(m, k, 64);
    *(bf16_t*)(sA + o) = to_bf16(A[i]);
  }
  for (int i = tid; i < K * N; i += 128) {
    const u32 k = i / N, n = i % N;
    const u32 o = LB == KMAJ_NONE ? off_kmaj_none(n, k, K) : LB == MN_NONE ? off_mn_none(k, n, N)
                : LB == KMAJ_128 ? off_kmaj_128(n, k, N) : off_mn_128(k, n, K);
    *(bf16_t*)(sB + o) = to_bf16(B[i]);
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  // A fragments for RS: reg r of k16 slab s: row 16w + g + 8(r&1), k = 16s + 2t + 8(r>>1) + {0,1}.
  const int w = tid / 32, g = (tid % 32) / 4, t = tid % 4;
  u32 afrag[K / 16][4];
  #pragma unroll
  for (int s = 0; s < K / 16; ++s)
    #pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int row = 16 * w + g + 8 * (r & 1), k = 16 * s + 2 * t + 8 * (r >> 1);
      afrag[s][r] = (u32)to_bf16(A[row * K + k]) | ((u32)to_bf16(A[row * K + k + 1]) << 16);
    }
  float d[N / 2];
  #pragma unroll
  for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
  constexpr int TB = (LB == MN_NONE || LB == MN_128) ? 1 : 0;
  auto run = [&]() {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    #pragma unroll
    for (int s = 0; s < K / 16; ++s) {
      const u32 a_off = LA == KMAJ_NONE ? s * 256 : (s / 4) * (64 * 128) + (s % 4) * 32;
      const u64 da = LA == KMAJ_NONE ? make_desc(sA + a_off, 128, K * 16, 0) : make_desc(sA + a_off, 16, 1024, 1);
      u64 db;
      if (LB == KMAJ_NONE) db = make_desc(sB + s * 256, 128, K * 16, 0);
      else if (LB == MN_NONE) db = make_desc(sB + s * 32 * N, N * 16, 128, 0);
      else if (LB == KMAJ_128) db = make_desc(sB + (s / 4) * (N * 128) + (s % 4) * 32, 16, 1024, 1);
      else db = make_desc(sB + s * 2048, K * 128, 1024, 1);
      if (RS) { if (N == 64) wgmma_rs_m64n64<TB>(d, afrag[s], db, s > 0); else wgmma_rs_m64n128<TB>(d, afrag[s], db, s > 0); }
      else { if (N == 64) wgmma_ss_m64n64<TB>(d, da, db, s > 0); else wgmma_ss_m64n128<TB>(d, da, db, s > 0); }
    }
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  };
  run();
  #pragma unroll
  for (int i = 0; i < N / 2; ++i)
    C[(16 * w + g + 8 * ((i >> 1) & 1)) * N + 8 * (i >> 2) + 2 * t + (i & 1)] = d[i];
  // Latency of the whole 64 x N x K product (K/16 dependent wgmmas, commit, wait), 64 times.
  __syncwarp();
  const long long c0 = clock64();
  for (int rep = 0; rep < 64; ++rep) {
    run();
    #pragma unroll
    for (int i = 0; i < N / 2; ++i) asm volatile("" : "+f"(d[i]) :: "memory");
  }
  const long long c1 = clock64();
  if (tid == 0) *cycles = (c1 - c0) / 64;
  if (d[0] == 12345.f) C[0] = 0.f;  // keep the timed chain
}

#ifdef __CUDACC_RTC__
#define GDN_INSTANTIATE(N, K, RS, LA, LB) \
  template __global__ void product<N, K, RS, LA, LB>(const float*, const float*, float*, long long*, int*);
GDN_INSTANTIATE(64, 64, 0, KMAJ_NONE, KMAJ_NONE)
GDN_INSTANTIATE(64, 64, 0, KMAJ_NONE, MN_NONE)
GDN_INSTANTIATE(64, 64, 1, KMAJ_NONE, KMAJ_NONE)
GDN_INSTANTIATE(128, 128, 0, KMAJ_128, MN_128)
GDN_INSTANTIATE(128, 128, 0, KMAJ_128, KMAJ_128)
GDN_INSTANTIATE(128, 128, 1, KMAJ_128, MN_128)
GDN_INSTANTIATE(128, 128, 1, KMAJ_128, KMAJ_128)
GDN_INSTANTIATE(128, 64, 0, KMAJ_NONE, MN_NONE)
#else
template <int N, int K, int RS, Layout LA, Layout LB>
static int check(const char* name) {
  std::vector<float> A(64 * K), B(K * N), C(64 * N), ref(64 * N, 0.f);
  srand(7 + N + K + RS * 3 + LA * 5 + LB * 11);
  for (auto& x : A) x = (rand() % 17 - 8) / 8.f;
  for (auto& x : B) x = (rand() % 17 - 8) / 8.f;
  for (int m = 0; m < 64; ++m) for (int n = 0; n < N; ++n) { double s = 0; for (int k = 0; k < K; ++k) s += (double)A[m * K + k] * B[k * N + n]; ref[m * N + n] = (float)s; }
  float *dA, *dB, *dC; long long* dcy; int* dmis;
  cudaMalloc(&dA, A.size() * 4); cudaMalloc(&dB, B.size() * 4); cudaMalloc(&dC, C.size() * 4); cudaMalloc(&dcy, 8); cudaMalloc(&dmis, 4);
  cudaMemcpy(dA, A.data(), A.size() * 4, cudaMemcpyHostToDevice); cudaMemcpy(dB, B.data(), B.size() * 4, cudaMemcpyHostToDevice);
  cudaMemset(dC, 0xff, C.size() * 4);
  const int smem = (64 * K + K * N) * 2;
  cudaFuncSetAttribute(product<N, K, RS, LA, LB>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  product<N, K, RS, LA, LB><<<1, 128, smem>>>(dA, dB, dC, dcy, dmis);
  cudaError_t e = cudaDeviceSynchronize();
  long long cy = 0; int mis = 0;
  cudaMemcpy(C.data(), dC, C.size() * 4, cudaMemcpyDeviceToHost); cudaMemcpy(&cy, dcy, 8, cudaMemcpyDeviceToHost); cudaMemcpy(&mis, dmis, 4, cudaMemcpyDeviceToHost);
  int bad = 0, first = -1;
  for (int i = 0; i < 64 * N; ++i) if (C[i] != ref[i]) { if (first < 0) first = i; ++bad; }
  printf("%-44s %s: %5d / %5d wrong", name, e == cudaSuccess ? "ran" : cudaGetErrorString(e), bad, 64 * N);
  if (first >= 0) printf(" (first [%d][%d]: %g, expected %g)", first / N, first % N, C[first], ref[first]);
  printf("; %lld cycles per 64x%dx%d product%s\n", cy, N, K, mis ? "; smem base NOT 1024-aligned" : "");
  cudaFree(dA); cudaFree(dB); cudaFree(dC); cudaFree(dcy); cudaFree(dmis);
  return bad != 0 || e != cudaSuccess;
}

int main() {
  int fails = 0;
  fails += check<64, 64, 0, KMAJ_NONE, KMAJ_NONE>("SS n64 k64: A K-major none, B K-major none");
  fails += check<64, 64, 0, KMAJ_NONE, MN_NONE>("SS n64 k64: A K-major none, B MN-major none");
  fails += check<64, 64, 1, KMAJ_NONE, KMAJ_NONE>("RS n64 k64: B K-major none");
  fails += check<128, 128, 0, KMAJ_128, MN_128>("SS n128 k128: A K-major 128B, B MN-major 128B");
  fails += check<128, 128, 0, KMAJ_128, KMAJ_128>("SS n128 k128: A K-major 128B, B K-major 128B");
  fails += check<128, 128, 1, KMAJ_128, MN_128>("RS n128 k128: B MN-major 128B");
  fails += check<128, 128, 1, KMAJ_128, KMAJ_128>("RS n128 k128: B K-major 128B");
  fails += check<128, 64, 0, KMAJ_NONE, MN_NONE>("SS n128 k64: A K-major none, B MN-major none");
  printf("%s\n", fails ? "FAILED" : "all variants exact");
  return fails != 0;
}
#endif
