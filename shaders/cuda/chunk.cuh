// What the chunked forward (chunked.cu) and the chunked backward (chunk_bwd_*.cu) share,
// compiled between common.cuh and the pass (src/cuda_backend/kernels.rs): the 16×16 tensor-core
// tile helpers (mma.sync m16n8k16, ldmatrix), the chunk constants and shared-memory strides,
// the cp.async tile copies, and the per-(chunk, v-head) prep pass (gate cumsum, decays, the
// inverse T = (I + L)⁻¹, T·diag(β), P), which the backward runs with extra outputs.
namespace gdn {
namespace chunked {

// A 16×16×16 tile product (the subset of WMMA this file needs) from two mma.sync.m16n8k16
// per tile, operands loaded from shared memory by ldmatrix. Written out because NVRTC ships
// no <mma.h> implementation header (crt/mma.h) with the PyPI wheels, and the inline PTX is
// the same on sm_80 and sm_90a. Fragment layouts: PTX ISA, "Matrix Fragments for
// mma.m16n8k16 with floating point type": g = lane / 4, t = lane % 4.
struct FragA { unsigned x[4]; };   // 16×16 (m × k)
struct FragB { unsigned x[4]; };   // 16×16 (k × n): n 0..7 in x[0..1], n 8..15 in x[2..3]
struct FragC {                     // 16×16 f32: n 0..7 in x[0..3], n 8..15 in x[4..7]
    static constexpr int num_elements = 8;
    float x[8];
};


// Four 8×8 16-bit matrices from shared memory; lane l gives the address of row l % 8 of
// matrix l / 8. TRANS hands each thread the transposed elements.
template <bool TRANS>
__device__ __forceinline__ void ldsm_x4(unsigned* x, const void* p) {
    if (TRANS) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(x[0]), "=r"(x[1]), "=r"(x[2]), "=r"(x[3])
                     : "r"(smem_addr(p)));
    } else {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(x[0]), "=r"(x[1]), "=r"(x[2]), "=r"(x[3])
                     : "r"(smem_addr(p)));
    }
}

// Element (r, c) of a row-major tile is p[r·ld + c]; of a column-major one p[c·ld + r].
// The fragment registers are, in order, the 8×8 blocks (rows 0–7 | 8–15) × (cols 0–7 | 8–15)
// row block fastest for A (m × k) and for B (k × n); a tile stored with its fragment's
// rows along memory rows loads without transposition, the others with .trans.
template <typename T, bool COL>
__device__ __forceinline__ void load_a(FragA& f, const T* p, int ld) {
    const int lane = threadIdx.x & 31, j = lane >> 3, r8 = lane & 7;
    if (!COL) ldsm_x4<false>(f.x, p + ((j & 1) * 8 + r8) * ld + (j >> 1) * 8);
    else ldsm_x4<true>(f.x, p + ((j >> 1) * 8 + r8) * ld + (j & 1) * 8);
}

template <typename T, bool COL>
__device__ __forceinline__ void load_b(FragB& f, const T* p, int ld) {
    const int lane = threadIdx.x & 31, j = lane >> 3, r8 = lane & 7;
    if (!COL) ldsm_x4<true>(f.x, p + ((j & 1) * 8 + r8) * ld + (j >> 1) * 8);
    else ldsm_x4<false>(f.x, p + ((j >> 1) * 8 + r8) * ld + (j & 1) * 8);
}

__device__ __forceinline__ void fill_zero(FragC& f) {
#pragma unroll
    for (int e = 0; e < 8; ++e) f.x[e] = 0.0f;
}

// Row-major f32 tile p (stride ld) to / from an accumulator.
template <bool STORE>
__device__ __forceinline__ void move_c(FragC& f, float* p, int ld) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const int c = 8 * j + 2 * t;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float* q = p + (g + 8 * (e >> 1)) * ld + c + (e & 1);
            if (STORE) *q = f.x[4 * j + e];
            else f.x[4 * j + e] = *q;
        }
    }
}
__device__ __forceinline__ void store_c(float* p, FragC& f, int ld) { move_c<true>(f, p, ld); }

template <typename T> struct MmaOp;
template <> struct MmaOp<__half> {
    __device__ static void run(float* d, const unsigned* a, unsigned b0, unsigned b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};
template <> struct MmaOp<__nv_bfloat16> {
    __device__ static void run(float* d, const unsigned* a, unsigned b0, unsigned b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

// TF32 tensor-core products for the prep's f32 inverse: an f32 value rounded to TF32 (the
// f32 bits with 10 mantissa bits), and d += a·b for one m16n8k8 TF32 product (fragments:
// PTX ISA, "mma.m16n8k8 with .tf32": a = (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4);
// b = (t, g), (t + 4, g); d as m16n8k16's first half).
__device__ __forceinline__ unsigned to_tf32(float x) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}
__device__ __forceinline__ void mma_tf32(float* d, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d += A·B for a 16 × 8 f32 A (row-major at a, stride lda) and an 8 × 8 f32 B (row-major at b,
// stride ldb) from shared memory, as three TF32 products (3xTF32: each operand split into a
// TF32 value and the TF32 rest; only the rest × rest term is dropped, ~2⁻²² relative).
__device__ __forceinline__ void mma_f32x3(float* d, const float* a, int lda, const float* b, int ldb) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const float av[4] = {a[g * lda + t], a[(g + 8) * lda + t], a[g * lda + t + 4], a[(g + 8) * lda + t + 4]};
    const float bv[2] = {b[t * ldb + g], b[(t + 4) * ldb + g]};
    unsigned ab[4], as[4], bb[2], bs[2];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        ab[e] = to_tf32(av[e]);
        as[e] = to_tf32(av[e] - __uint_as_float(ab[e]));
    }
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        bb[e] = to_tf32(bv[e]);
        bs[e] = to_tf32(bv[e] - __uint_as_float(bb[e]));
    }
    mma_tf32(d, as, bb[0], bb[1]);
    mma_tf32(d, ab, bs[0], bs[1]);
    mma_tf32(d, ab, bb[0], bb[1]);
}

// d += a·b for one 16×16×16 tile.
template <typename T>
__device__ __forceinline__ void mma(FragC& d, const FragA& a, const FragB& b) {
    MmaOp<T>::run(d.x, a.x, b.x[0], b.x[1]);
    MmaOp<T>::run(d.x + 4, a.x, b.x[2], b.x[3]);
}

// Two 16-bit values in one register, `lo` in the low half (the lower MMA column).
template <typename T> __device__ __forceinline__ unsigned pack2(float lo, float hi);
template <> __device__ __forceinline__ unsigned pack2<__half>(float lo, float hi) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&v);
}
template <> __device__ __forceinline__ unsigned pack2<__nv_bfloat16>(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&v);
}
// The two 16-bit values of a register as floats (the low half first).
template <typename T> __device__ __forceinline__ float2 unpack2(unsigned x);
template <> __device__ __forceinline__ float2 unpack2<__half>(unsigned x) {
    return __half22float2(*reinterpret_cast<const __half2*>(&x));
}
template <> __device__ __forceinline__ float2 unpack2<__nv_bfloat16>(unsigned x) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&x));
}
// The rest of (lo, hi) after rounding to T: what SPLIT_STATE adds as a second operand.
template <typename T> __device__ __forceinline__ unsigned pack2_rest(float lo, float hi) {
    return pack2<T>(lo - to_f32(from_f32<T>(lo)), hi - to_f32(from_f32<T>(hi)));
}

constexpr int C = 64;          // chunk length
constexpr int PREP_THREADS = 256;  // pass 1: 8 warps (4 blocks of 8 warps per SM)
constexpr int MAX_K = 128;

// Option bit of the prep (src/cuda_backend/chunked.rs PREP_FFMA): the inverse's block
// products on the CUDA cores (f32 FMAs, two block barriers per block row) instead of 3xTF32
// MMAs, for an A/B.
constexpr int PREP_FFMA = 1 << 10;

// Mirrors ChunkParams in src/cuda_backend/chunked.rs (repr(C), all 4-byte fields).
struct ChunkParams {
    int heads_qk;
    int heads_v;
    int key_dim;
    int value_dim;
    int group;
    int flags;
    int num_chunks;
    float scale;
};

// Shared-memory row strides in elements, fixed whatever K is (so that every tile offset is a
// compile-time constant): 8 extra 16-bit elements (4 extra f32) keep rows 16-byte aligned
// while spreading them over banks.
constexpr int LDK = MAX_K + 8;  // 16-bit C × K tiles (k, q)
constexpr int LDC = C + 8;      // 16-bit C × C tiles (T·diag(β), P)
constexpr int LDF = C + 4;      // f32 C × C tiles (prep)

// A barrier of the `count` threads (whole warps) that use barrier `id` (0 is __syncthreads').
__device__ __forceinline__ void named_barrier(int id, int count) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// cp.async of 16 bytes to a shared-memory byte address; zeros when !valid (src-size 0: the
// source is not read).
__device__ __forceinline__ void cp_async16_zfill(unsigned dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}

// Start copying a C-row tile of 16-bit elements: VECS 16-byte vectors per row, shared rows
// LD elements apart, global rows `stride` elements apart; each thread copies PER consecutive
// vectors of one row (one row address per thread). Rows from `rows` on are zeros; vectors
// from `valid_vecs` on are left alone (never read). Complete after cp_async_wait and a
// barrier. `tid`: this thread's index among the NTHREADS copying.
template <int NTHREADS, int VECS, int LD, typename E>
__device__ __forceinline__ void copy_tile(unsigned dst, const E* src, size_t stride, int rows,
                                          int valid_vecs, int tid = threadIdx.x) {
    static_assert(sizeof(E) == 2, "16-bit tiles");
    constexpr int PER = C * VECS / NTHREADS;
    static_assert(PER >= 1 && VECS % PER == 0 && C * VECS == PER * NTHREADS, "tile split");
    const int r = tid / (VECS / PER), v0 = (tid % (VECS / PER)) * PER;
    const bool ok = r < rows;
    const E* row = src + (size_t)(ok ? r : 0) * stride + 8 * v0;
    const unsigned d = dst + 2 * (r * LD + 8 * v0);
#pragma unroll
    for (int u = 0; u < PER; ++u) {
        if (v0 + u < valid_vecs) cp_async16_zfill(d + 16 * u, row + 8 * u, ok);
    }
}

// ldmatrix .x4 from a shared-memory byte address.
__device__ __forceinline__ void ldsm4(unsigned (&x)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(x[0]), "=r"(x[1]), "=r"(x[2]), "=r"(x[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm4_t(unsigned (&x)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(x[0]), "=r"(x[1]), "=r"(x[2]), "=r"(x[3])
                 : "r"(addr));
}
// stmatrix .x4 .trans to a shared-memory byte address (sm_90): lane l gives the address of
// row l % 8 of matrix l / 8 and hands in x[m] as ldsm4's x[m], the matrix stored transposed.
__device__ __forceinline__ void stsm4_t(unsigned addr, const unsigned (&x)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(addr),
                 "r"(x[0]), "r"(x[1]), "r"(x[2]), "r"(x[3])
                 : "memory");
}
// This lane's element offset for a B fragment (k × n) of a tile stored n-major (B[k][n] at
// tile[n·LD + k]: ldsm4) or k-major (B[k][n] at tile[k·LD + n]: ldsm4_t), as load_b does.
template <int LD> __device__ __forceinline__ int lane_b_nmajor(int lane) {
    return ((lane >> 4) * 8 + (lane & 7)) * LD + ((lane >> 3) & 1) * 8;
}
template <int LD> __device__ __forceinline__ int lane_b_kmajor(int lane) {
    return (((lane >> 3) & 1) * 8 + (lane & 7)) * LD + (lane >> 4) * 8;
}

// ---------------------------------------------------------------------------------------------
// Pass 1: per (chunk, v-head), 8 warps. Shared memory: k then the inverse's block sums, q
// then T, L, the gates (52.7 KB: four blocks per SM).

// Bytes of each of pass 1's three tiles (then the gates; prep_smem in chunked.rs mirrors it).
constexpr int PREP_TILE = 2 * C * LDK;  // = 4 · C · LDF

// The backward's prep (BWD) writes 4·C floats of gates per (chunk, v-head), γ, γ_C/γ, then G
// and β (the activated ones), and T itself (ws_t) besides T·diag(β) and P.
template <typename T, bool BWD = false>
__device__ void prep(const ChunkParams p, const int* __restrict__ chunks, const T* __restrict__ q,
                     const T* __restrict__ k, const float* __restrict__ g,
                     const float* __restrict__ beta, const float* __restrict__ a_log,
                     const float* __restrict__ dt_bias, float* __restrict__ ws_f,
                     T* __restrict__ ws_a, T* __restrict__ ws_p, T* __restrict__ ws_t = nullptr) {
    static_assert(PREP_TILE == 4 * C * LDF, "q's tile is reused for T");
    static_assert(PREP_THREADS >= 3 * 64, "a thread per row quarter of block row 3");
    static_assert(LDF % 4 == 0, "16-byte rows of the f32 tiles");
    extern __shared__ __align__(128) unsigned char smem[];
    const int K = p.key_dim, H = p.heads_qk, HV = p.heads_v;
    // The grid is (chunks, v-heads); blocks are numbered v-head fastest, so that the v-heads
    // of a GVA group, which read the same q and k tiles, run together and share them in L2.
    const size_t lin = blockIdx.x + (size_t)blockIdx.y * gridDim.x;
    const int chunk = (int)(lin / HV), hv = (int)(lin % HV), h = hv / p.group;
    const int start = chunks[2 * chunk], len = chunks[2 * chunk + 1];
    const size_t ch = (size_t)chunk * HV + hv;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g4 = lane >> 2, t4 = lane & 3;

    T* ks = reinterpret_cast<T*>(smem);
    float* xs = reinterpret_cast<float*>(smem);  // after the Gram products: block sums
    T* qs = reinterpret_cast<T*>(smem + PREP_TILE);
    float* t = reinterpret_cast<float*>(smem + PREP_TILE);  // after the Gram products: T
    float* a = reinterpret_cast<float*>(smem + 2 * PREP_TILE);  // KKᵀ, then L
    float* sg = reinterpret_cast<float*>(smem + 3 * PREP_TILE);
    float* sb = sg + C;

    // q and k first, so that their copies are in flight while the gates load.
    const size_t qk_stride = (size_t)H * K;
    copy_tile<PREP_THREADS, MAX_K / 8, LDK>(smem_addr(ks), k + ((size_t)start * H + h) * K, qk_stride, len, K / 8);
    copy_tile<PREP_THREADS, MAX_K / 8, LDK>(smem_addr(qs), q + ((size_t)start * H + h) * K, qk_stride, len, K / 8);
    // Gates and β of the chunk's tokens; padding: g = 0 (so G keeps its last value), β = 0.
    if (threadIdx.x < C) {
        const int i = threadIdx.x;
        float gi = 0.0f, bi = 0.0f;
        if (i < len) {
            const size_t idx = (size_t)(start + i) * HV + hv;
            gi = g[idx];
            if (p.flags & GATE_IN_KERNEL) gi = -expf(a_log[hv]) * softplus(gi + dt_bias[hv]);
            bi = beta[idx];
            if (p.flags & BETA_SIGMOID) bi = sigmoid(bi);
            if (p.flags & NEG_EIGVAL) bi *= 2.0f;
        }
        // Inclusive scan within each warp, then warp 1 adds warp 0's total.
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const float up = __shfl_up_sync(0xffffffffu, gi, d);
            if (lane >= d) gi += up;
        }
        sg[i] = gi;
        sb[i] = bi;
    }
    cp_async_wait();
    __syncthreads();
    if (threadIdx.x >= 32 && threadIdx.x < C) sg[threadIdx.x] += sg[31];
    __syncthreads();
    // The sequential pass's decays: γ_i = e^{G_i} and γ_C/γ_i = e^{G_last − G_i} (exponents ≤ 0).
    if (threadIdx.x < C) {
        const int i = threadIdx.x;
        constexpr int FS = BWD ? 4 * C : 2 * C;
        ws_f[ch * FS + i] = expf(sg[i]);
        ws_f[ch * FS + C + i] = expf(sg[C - 1] - sg[i]);
        if (BWD) {
            ws_f[ch * FS + 2 * C + i] = sg[i];
            ws_f[ch * FS + 3 * C + i] = sb[i];
        }
    }

    // L = strict_lower(diag(β)·(Γ⊙KKᵀ)) (to shared) and P = scale·Γ⊙QKᵀ (i ≥ j, to the
    // workspace), both straight from the accumulators with one decay e^{G_i − G_j} each,
    // lower tiles only (tile (i, j) with j ≤ i); warp w owns row tile w % 4 and every other
    // of its tiles. The sequential pass never reads P's tiles above the diagonal. Only
    // i ≥ j is exponentiated, so G_i − G_j ≤ 0.
    T* p_out = ws_p + ch * C * C;
    {
        const int ti = warp & 3;
        for (int tj = warp >> 2; tj <= ti; tj += 2) {
            FragC ckk, cqk;
            fill_zero(ckk);
            fill_zero(cqk);
            for (int kk = 0; kk < K; kk += 16) {
                FragA fk, fq;
                FragB fkt;
                load_a<T, false>(fk, ks + ti * 16 * LDK + kk, LDK);
                load_a<T, false>(fq, qs + ti * 16 * LDK + kk, LDK);
                load_b<T, true>(fkt, ks + tj * 16 * LDK + kk, LDK);
                mma<T>(ckk, fk, fkt);
                mma<T>(cqk, fq, fkt);
            }
#pragma unroll
            for (int half = 0; half < 2; ++half) {
#pragma unroll
                for (int rh = 0; rh < 2; ++rh) {
                    const int i = ti * 16 + g4 + 8 * rh, j = tj * 16 + 8 * half + 2 * t4;
                    float x[2], l[2];
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const float qk = cqk.x[4 * half + 2 * rh + e];
                        const float kk = ckk.x[4 * half + 2 * rh + e];
                        const float decay = j + e <= i ? __expf(sg[i] - sg[j + e]) : 0.0f;
                        x[e] = j + e <= i ? p.scale * qk * decay : 0.0f;
                        l[e] = j + e < i ? sb[i] * kk * decay : 0.0f;
                    }
                    *reinterpret_cast<unsigned*>(p_out + i * C + j) = pack2<T>(x[0], x[1]);
                    *reinterpret_cast<float2*>(a + i * LDF + j) = make_float2(l[0], l[1]);
                }
            }
        }
    }
    __syncthreads();

    // T = (I + L)⁻¹ in 16×16 blocks (§2.3). Diagonal blocks by forward substitution, one
    // column per thread in registers: T[i][c] = δ_ic − Σ_{c ≤ j < i} L[i][j]·T[j][c] within
    // the block (the column's entries above c are zero, so the sum may start at 0). Only the
    // blocks on and below the diagonal are written (and read); the output masks the others.
    // L's tiles above the diagonal are never written nor read.
    if (threadIdx.x < C) {
        const int b = (threadIdx.x / 16) * 16, c = threadIdx.x % 16;
        float col[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            float acc = 0.0f;
#pragma unroll
            for (int j = 0; j < i; ++j) acc = fmaf(a[(b + i) * LDF + b + j], col[j], acc);
            col[i] = i == c ? 1.0f : (i > c ? -acc : 0.0f);
        }
#pragma unroll
        for (int i = 0; i < 16; ++i) t[(b + i) * LDF + b + c] = col[i];
    }
    __syncthreads();
    // Below the diagonal, column block by column block: T_rc = −T_rr · Σ_{c ≤ m < r} L_rm · T_mc
    // for r = c + 1 .. 3 in order. Warp 2c + h owns the 8 columns 16c + 8h.. of column block
    // c (c < 3), so each product reads only the diagonal blocks and the warp's own earlier
    // blocks: no block barrier between them. Products by 3xTF32 MMAs (near-f32; 16 × 8 tiles,
    // the sums staged through the warp's 16 × 8 slot of xs).
    if (!(p.flags & PREP_FFMA) && warp < 6) {
        const int c = warp >> 1, n0 = 16 * c + 8 * (warp & 1);
        float* xw = xs + warp * 128;
#pragma unroll 1
        for (int r = c + 1; r < C / 16; ++r) {
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 1
            for (int kk = 16 * c; kk < 16 * r; kk += 8) {
                mma_f32x3(acc, a + 16 * r * LDF + kk, LDF, t + kk * LDF + n0, LDF);
            }
            *reinterpret_cast<float2*>(xw + g4 * 8 + 2 * t4) = make_float2(acc[0], acc[1]);
            *reinterpret_cast<float2*>(xw + (g4 + 8) * 8 + 2 * t4) = make_float2(acc[2], acc[3]);
            __syncwarp();
            float y[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            mma_f32x3(y, t + 16 * r * LDF + 16 * r, LDF, xw, 8);
            mma_f32x3(y, t + 16 * r * LDF + 16 * r + 8, LDF, xw + 8 * 8, 8);
            float* out = t + (16 * r + g4) * LDF + n0 + 2 * t4;
            *reinterpret_cast<float2*>(out) = make_float2(-y[0], -y[1]);
            *reinterpret_cast<float2*>(out + 8 * LDF) = make_float2(-y[2], -y[3]);
            __syncwarp();  // T_rc is the next product's B operand; xw is rewritten
        }
    }
    __syncthreads();
    // Block row r, column blocks c < r: T_rc = −T_rr · Σ_{c ≤ m < r} L_rm · T_mc, with the
    // sums staged in xs (c·256 + row·16 + column). Each thread computes four consecutive
    // columns of one row (a broadcast of L or T_rr and a 16-byte load per four FMAs).
    if (p.flags & PREP_FFMA) for (int r = 1; r < C / 16; ++r) {
        const int e = threadIdx.x, c = e / 64, i = (e % 64) / 4, j4 = (e % 4) * 4;
        if (c < r) {
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            const float* arow = a + (16 * r + i) * LDF;
            for (int kk = 16 * c; kk < 16 * r; ++kk) {
                const float l = arow[kk];
                const float4 tv = *reinterpret_cast<const float4*>(t + kk * LDF + 16 * c + j4);
                acc[0] = fmaf(l, tv.x, acc[0]);
                acc[1] = fmaf(l, tv.y, acc[1]);
                acc[2] = fmaf(l, tv.z, acc[2]);
                acc[3] = fmaf(l, tv.w, acc[3]);
            }
            *reinterpret_cast<float4*>(xs + c * 256 + i * 16 + j4) = make_float4(acc[0], acc[1], acc[2], acc[3]);
        }
        __syncthreads();
        if (c < r) {
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            const float* trow = t + (16 * r + i) * LDF + 16 * r;
#pragma unroll
            for (int l = 0; l < 16; ++l) {
                const float tl = trow[l];  // zero above the diagonal
                const float4 xv = *reinterpret_cast<const float4*>(xs + c * 256 + l * 16 + j4);
                acc[0] = fmaf(tl, xv.x, acc[0]);
                acc[1] = fmaf(tl, xv.y, acc[1]);
                acc[2] = fmaf(tl, xv.z, acc[2]);
                acc[3] = fmaf(tl, xv.w, acc[3]);
            }
            *reinterpret_cast<float4*>(t + (16 * r + i) * LDF + 16 * c + j4) =
                make_float4(-acc[0], -acc[1], -acc[2], -acc[3]);
        }
        __syncthreads();
    }
    // T·diag(β) to the workspace (the sequential pass's operand of v' = T·diag(β)·X), eight
    // elements per 16-byte store.
    T* a_out = ws_a + ch * C * C;
    // Blocks above the diagonal are zeros (t holds q's old bits there).
    for (int idx = threadIdx.x; idx < C * C / 8; idx += PREP_THREADS) {
        const int i = idx / (C / 8), j = (idx % (C / 8)) * 8;
        const bool upper = (j >> 4) > (i >> 4);
        uint4 out = make_uint4(0u, 0u, 0u, 0u);
        unsigned* w = reinterpret_cast<unsigned*>(&out);
        if (!upper) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                w[e] = pack2<T>(t[i * LDF + j + 2 * e] * sb[j + 2 * e], t[i * LDF + j + 2 * e + 1] * sb[j + 2 * e + 1]);
            }
        }
        *reinterpret_cast<uint4*>(a_out + i * C + j) = out;
        if (BWD) {
            if (!upper) {
#pragma unroll
                for (int e = 0; e < 4; ++e) w[e] = pack2<T>(t[i * LDF + j + 2 * e], t[i * LDF + j + 2 * e + 1]);
            }
            *reinterpret_cast<uint4*>(ws_t + ch * C * C + i * C + j) = out;
        }
    }
}

}  // namespace chunked
}  // namespace gdn
