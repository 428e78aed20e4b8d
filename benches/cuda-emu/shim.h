// Host emulation of the CUDA features the chunked backward kernels use.
#pragma once
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <cstdlib>

#define __device__
#define __global__
#define __host__
#define __constant__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __align__(n)

struct __half { uint16_t x; };
struct __nv_bfloat16 { uint16_t x; };
struct __half2 { __half a, b; };
struct __nv_bfloat162 { __nv_bfloat16 a, b; };
struct float2 { float x, y; };
struct int2 { int x, y; };
struct uint4 { unsigned x, y, z, w; };
struct alignas(16) float4 { float x, y, z, w; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline float2 make_float2(float a, float b) { return {a, b}; }
inline int2 make_int2(int a, int b) { return {a, b}; }
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
inline int min(int a, int b) { return a < b ? a : b; }
inline float __expf(float x) { return expf(x); }

inline float __half2float(__half h) { _Float16 f; memcpy(&f, &h, 2); return (float)f; }
inline __half __float2half_rn(float x) { _Float16 f = (_Float16)x; __half h; memcpy(&h, &f, 2); return h; }
inline float __bfloat162float(__nv_bfloat16 b) { uint32_t u = (uint32_t)b.x << 16; float f; memcpy(&f, &u, 4); return f; }
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return __nv_bfloat16{(uint16_t)(u >> 16)};
}
inline __half2 __floats2half2_rn(float a, float b) { return {__float2half_rn(a), __float2half_rn(b)}; }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__float2bfloat16_rn(a), __float2bfloat16_rn(b)}; }
inline float2 __half22float2(__half2 v) { return {__half2float(v.a), __half2float(v.b)}; }
inline float2 __bfloat1622float2(__nv_bfloat162 v) { return {__bfloat162float(v.a), __bfloat162float(v.b)}; }

struct Dim3 { unsigned x = 0, y = 0, z = 0; };

inline float __uint_as_float(unsigned u) { float x; memcpy(&x, &u, 4); return x; }
inline unsigned __float_as_uint(float x) { unsigned u; memcpy(&u, &x, 4); return u; }
namespace emu {
struct Warp {
    std::barrier<>* bar;
    uint64_t slot[32][8];
};
struct Block {
    std::barrier<>* bar;
    Warp* warps;
    unsigned char* smem;
    std::mutex named_lock{};
    std::map<int, std::unique_ptr<std::barrier<>>> named{};  // bar.sync id, count
};
inline thread_local Block* blk;
inline thread_local Dim3 tid, bid;
inline Dim3 bdim, gdim;
inline int lane() { return tid.x & 31; }
inline Warp& warp() { return blk->warps[tid.x >> 5]; }
inline void warp_sync() { warp().bar->arrive_and_wait(); }
// bar.sync id, count: the first thread to arrive makes the barrier of `count` threads.
inline void named_barrier(int id, int count) {
    std::barrier<>* b;
    {
        std::lock_guard<std::mutex> g(blk->named_lock);
        auto& slot = blk->named[id];
        if (!slot) slot = std::make_unique<std::barrier<>>(count);
        b = slot.get();
    }
    b->arrive_and_wait();
}
// bar.arrive id, count: arrive without waiting (a producer's half of the barrier).
inline void named_arrive(int id, int count) {
    std::barrier<>* b;
    {
        std::lock_guard<std::mutex> g(blk->named_lock);
        auto& slot = blk->named[id];
        if (!slot) slot = std::make_unique<std::barrier<>>(count);
        b = slot.get();
    }
    (void)b->arrive();
}
inline unsigned smem_addr(const void* p) { return (unsigned)((const unsigned char*)p - blk->smem); }
// cp.async: copied at once, or with EMU_DEFER=1 in the environment only when the issuing
// thread waits for its group (cp.async.wait_group / wait_all), as late as the hardware may
// land it, so that a read before the wait sees the room's old contents.
struct PendingCopy { unsigned dst; const void* src; int bytes; long group; };
inline thread_local std::vector<PendingCopy> pending;
inline thread_local long open_group = 0;
inline const bool defer_copies = [] { const char* e = getenv("EMU_DEFER"); return e && e[0] == '1'; }();
inline void copy_now(unsigned dst, const void* src, int bytes) {
    unsigned char* d = blk->smem + dst;
    if (bytes) memcpy(d, src, 16); else memset(d, 0, 16);
}
inline void cp_async(unsigned dst, const void* src, int bytes) {
    if (defer_copies) pending.push_back({dst, src, bytes, open_group});
    else copy_now(dst, src, bytes);
}
inline void cp_commit() { ++open_group; }
// Land every copy of the groups older than the newest `n` committed ones (n < 0: all copies).
inline void cp_wait(long n) {
    const long limit = n < 0 ? open_group + 1 : open_group - n;
    std::vector<PendingCopy> keep;
    for (const auto& c : pending) {
        if (c.group < limit) copy_now(c.dst, c.src, c.bytes);
        else keep.push_back(c);
    }
    pending.swap(keep);
}
// ldmatrix .x4 from the lanes' row addresses.
inline void ldsm(unsigned* x, unsigned addr, bool trans) {
    Warp& w = warp();
    const int l = lane();
    w.slot[l][0] = addr;
    warp_sync();
    for (int m = 0; m < 4; ++m) {
        if (!trans) {
            const unsigned a = (unsigned)w.slot[8 * m + (l >> 2)][0] + 4 * (l & 3);
            memcpy(&x[m], blk->smem + a, 4);
        } else {
            uint16_t lo, hi;
            memcpy(&lo, blk->smem + (unsigned)w.slot[8 * m + 2 * (l & 3)][0] + 2 * (l >> 2), 2);
            memcpy(&hi, blk->smem + (unsigned)w.slot[8 * m + 2 * (l & 3) + 1][0] + 2 * (l >> 2), 2);
            x[m] = lo | ((unsigned)hi << 16);
        }
    }
    warp_sync();
}
// stmatrix .x4 to the lanes' row addresses (x[m] laid out as ldsm's).
inline void stsm(unsigned addr, const unsigned* x, bool trans) {
    Warp& w = warp();
    const int l = lane();
    w.slot[l][0] = addr;
    warp_sync();
    for (int m = 0; m < 4; ++m) {
        if (!trans) {
            memcpy(blk->smem + (unsigned)w.slot[8 * m + (l >> 2)][0] + 4 * (l & 3), &x[m], 4);
        } else {
            const uint16_t lo = x[m] & 0xffff, hi = x[m] >> 16;
            memcpy(blk->smem + (unsigned)w.slot[8 * m + 2 * (l & 3)][0] + 2 * (l >> 2), &lo, 2);
            memcpy(blk->smem + (unsigned)w.slot[8 * m + 2 * (l & 3) + 1][0] + 2 * (l >> 2), &hi, 2);
        }
    }
    warp_sync();
}
template <typename T> float h2f(uint16_t v);
template <> inline float h2f<__half>(uint16_t v) { return __half2float(__half{v}); }
template <> inline float h2f<__nv_bfloat16>(uint16_t v) { return __bfloat162float(__nv_bfloat16{v}); }
template <typename T>
inline void mma(float* d, const unsigned* a, unsigned b0, unsigned b1) {
    Warp& w = warp();
    const int l = lane();
    w.slot[l][0] = a[0]; w.slot[l][1] = a[1]; w.slot[l][2] = a[2]; w.slot[l][3] = a[3];
    w.slot[l][4] = b0; w.slot[l][5] = b1;
    warp_sync();
    float A[16][16], B[16][8];
    for (int ln = 0; ln < 32; ++ln) {
        const int g = ln >> 2, t = ln & 3;
        auto lo = [&](uint64_t r) { return h2f<T>((uint16_t)(r & 0xffff)); };
        auto hi = [&](uint64_t r) { return h2f<T>((uint16_t)((r >> 16) & 0xffff)); };
        A[g][2 * t] = lo(w.slot[ln][0]); A[g][2 * t + 1] = hi(w.slot[ln][0]);
        A[g + 8][2 * t] = lo(w.slot[ln][1]); A[g + 8][2 * t + 1] = hi(w.slot[ln][1]);
        A[g][2 * t + 8] = lo(w.slot[ln][2]); A[g][2 * t + 9] = hi(w.slot[ln][2]);
        A[g + 8][2 * t + 8] = lo(w.slot[ln][3]); A[g + 8][2 * t + 9] = hi(w.slot[ln][3]);
        B[2 * t][g] = lo(w.slot[ln][4]); B[2 * t + 1][g] = hi(w.slot[ln][4]);
        B[2 * t + 8][g] = lo(w.slot[ln][5]); B[2 * t + 9][g] = hi(w.slot[ln][5]);
    }
    warp_sync();
    const int g = l >> 2, t = l & 3;
    const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
    for (int e = 0; e < 4; ++e) {
        double s = 0;
        for (int k = 0; k < 16; ++k) s += (double)A[rows[e]][k] * B[k][cols[e]];
        d[e] += (float)s;
    }
}

// cvt.rna.tf32.f32: round to 10 mantissa bits, ties away from zero (finite values).
inline unsigned to_tf32(float x) {
    uint32_t u; memcpy(&u, &x, 4);
    return (u + 0x1000u) & 0xffffe000u;
}
// mma.sync m16n8k8 .tf32 (f32 bit patterns; the low 13 bits are ignored).
inline void mma_tf32(float* d, const unsigned* a, unsigned b0, unsigned b1) {
    Warp& w = warp();
    const int l = lane();
    w.slot[l][0] = a[0]; w.slot[l][1] = a[1]; w.slot[l][2] = a[2]; w.slot[l][3] = a[3];
    w.slot[l][4] = b0; w.slot[l][5] = b1;
    warp_sync();
    float A[16][8], B[8][8];
    auto f = [](uint64_t r) { uint32_t u = (uint32_t)r & 0xffffe000u; float x; memcpy(&x, &u, 4); return x; };
    for (int ln = 0; ln < 32; ++ln) {
        const int g = ln >> 2, t = ln & 3;
        A[g][t] = f(w.slot[ln][0]); A[g + 8][t] = f(w.slot[ln][1]);
        A[g][t + 4] = f(w.slot[ln][2]); A[g + 8][t + 4] = f(w.slot[ln][3]);
        B[t][g] = f(w.slot[ln][4]); B[t + 4][g] = f(w.slot[ln][5]);
    }
    warp_sync();
    const int g = l >> 2, t = l & 3;
    const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
    for (int e = 0; e < 4; ++e) {
        double s = 0;
        for (int k = 0; k < 8; ++k) s += (double)A[rows[e]][k] * B[k][cols[e]];
        d[e] += (float)s;
    }
}
inline float shfl(float v, int src) {
    Warp& w = warp();
    const int l = lane();
    uint32_t u; memcpy(&u, &v, 4);
    w.slot[l][7] = u;
    warp_sync();
    uint32_t r = (uint32_t)w.slot[src][7];
    warp_sync();
    float f; memcpy(&f, &r, 4);
    return f;
}

// Run `kernel` over a grid, each block's threads as OS threads.
inline void launch(Dim3 grid, int threads, size_t smem_bytes, const std::function<void()>& kernel) {
    bdim = Dim3{(unsigned)threads, 1, 1};
    gdim = grid;
    std::vector<unsigned char> smem(smem_bytes + 16);
    for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
            for (unsigned x = 0; x < grid.x; ++x) {
                std::fill(smem.begin(), smem.end(), 0xAB);
                std::barrier<> bar(threads);
                int nw = threads / 32;
                std::vector<std::barrier<>*> wb;
                std::vector<Warp> warps(nw);
                for (int i = 0; i < nw; ++i) { warps[i].bar = new std::barrier<>(32); }
                Block b{&bar, warps.data(), smem.data()};
                std::vector<std::thread> ts;
                for (int t = 0; t < threads; ++t) {
                    ts.emplace_back([&, t] {
                        blk = &b; tid = Dim3{(unsigned)t, 0, 0}; bid = Dim3{x, y, z};
                        kernel();
                    });
                }
                for (auto& th : ts) th.join();
                for (auto& w : warps) delete w.bar;
            }
}
}  // namespace emu

#define threadIdx emu::tid
#define blockIdx emu::bid
#define blockDim emu::bdim
#define gridDim emu::gdim
inline void __syncthreads() { emu::blk->bar->arrive_and_wait(); }
inline void __syncwarp() { emu::warp_sync(); }
inline float __shfl_sync(unsigned, float v, int src) { return emu::shfl(v, src); }
inline float __shfl_xor_sync(unsigned, float v, int off) { return emu::shfl(v, emu::lane() ^ off); }
inline float __shfl_down_sync(unsigned, float v, int d) {
    const int l = emu::lane();
    return emu::shfl(v, l + d < 32 ? l + d : l);
}
inline float __shfl_up_sync(unsigned, float v, int d) {
    const int l = emu::lane();
    float r = emu::shfl(v, l >= d ? l - d : l);
    return r;
}
