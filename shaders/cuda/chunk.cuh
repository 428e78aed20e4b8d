// What the chunked forward (chunked.cu) and the chunked backward (chunk_bwd_*.cu) share,
// compiled between common.cuh and the pass (src/cuda_backend/kernels.rs): the 16×16 tensor-core
// tile helpers (mma.sync m16n8k16, ldmatrix), the chunk constants and shared-memory strides,
// the cp.async tile copies, and the prep pass (per chunk and q/k head: KKᵀ, QKᵀ; per v-head
// of its GVA group: gate cumsum, decays, the inverse T = (I + L)⁻¹, T·diag(β), P), which the
// backward runs with extra outputs.
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
// The rounding is cvt.rna.tf32.f32's (to nearest, ties away from zero; the same bits for
// finite values) in two integer operations: ptxas expands the cvt to ~6 instructions on sm_90
// and sm_80, which were 29 % of the prep's SASS.
__device__ __forceinline__ unsigned to_tf32(float x) {
    return (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
}
// An MMA operand rounded to TF32 without clearing the low 13 bits, which mma.sync's .tf32
// operands ignore (CUTLASS's round_half_ulp_truncate relies on the same): the same product as
// to_tf32's, one operation less where the rounded value is not used otherwise.
__device__ __forceinline__ unsigned to_tf32_operand(float x) {
    return __float_as_uint(x) + 0x1000u;
}
__device__ __forceinline__ void mma_tf32(float* d, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The 3xTF32 operands of a 16 × 8 f32 A (row-major at a, stride lda) and an 8 × 8 f32 B
// (row-major at b, stride ldb) in this lane's fragment order: each value split into a TF32
// value (ab, bb) and its TF32 rest (as, bs).
__device__ __forceinline__ void tf32_split(const float* a, int lda, const float* b, int ldb, unsigned (&ab)[4],
                                           unsigned (&as)[4], unsigned (&bb)[2], unsigned (&bs)[2]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const float av[4] = {a[g * lda + t], a[(g + 8) * lda + t], a[g * lda + t + 4], a[(g + 8) * lda + t + 4]};
    const float bv[2] = {b[t * ldb + g], b[(t + 4) * ldb + g]};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        ab[e] = to_tf32(av[e]);
        as[e] = to_tf32_operand(av[e] - __uint_as_float(ab[e]));
    }
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        bb[e] = to_tf32(bv[e]);
        bs[e] = to_tf32_operand(bv[e] - __uint_as_float(bb[e]));
    }
}

// d += A·B for a 16 × 8 f32 A (row-major at a, stride lda) and an 8 × 8 f32 B (row-major at b,
// stride ldb) from shared memory, as three TF32 products (3xTF32: each operand split into a
// TF32 value and the TF32 rest; only the rest × rest term is dropped, ~2⁻²² relative).
__device__ __forceinline__ void mma_f32x3(float* d, const float* a, int lda, const float* b, int ldb) {
    unsigned ab[4], as[4], bb[2], bs[2];
    tf32_split(a, lda, b, ldb, ab, as, bb, bs);
    mma_tf32(d, as, bb[0], bb[1]);
    mma_tf32(d, ab, bs[0], bs[1]);
    mma_tf32(d, ab, bb[0], bb[1]);
}

// mma_f32x3's three products into three accumulators (d[0..3] the TF32 values' product,
// d[4..7] and d[8..11] the two rest terms), so that a sum over k is three independent MMA
// chains instead of one three times as long; the result is mma_f32x3_sum(d).
__device__ __forceinline__ void mma_f32x3_acc(float (&d)[12], const float* a, int lda, const float* b, int ldb) {
    unsigned ab[4], as[4], bb[2], bs[2];
    tf32_split(a, lda, b, ldb, ab, as, bb, bs);
    mma_tf32(d + 8, as, bb[0], bb[1]);
    mma_tf32(d + 4, ab, bs[0], bs[1]);
    mma_tf32(d, ab, bb[0], bb[1]);
}
__device__ __forceinline__ float mma_f32x3_sum(const float (&d)[12], int e) {
    return d[e] + (d[4 + e] + d[8 + e]);
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

// One stage of the sequential passes' two-stage pipeline (byte offsets), shared by chunked.cu's
// forward (FwdLayout) and chunk_bwd_chain.cuh's chains (ChainLayout); mirrored by fwd_smem in
// chunked.rs and chain_smem in chunk_bwd_chain.rs: k, a V-block of v (dO in the dh chain),
// T·diag(β), the decays (γ, then γ_C/γ), then q and P. SHORT_STAGE: the stage without q and P
// (the forward's local pass, the states chain); FULL_STAGE: all of it.
template <int BV> struct StageLayout {
    static constexpr int LDV = BV + 8;
    static constexpr int K_OFF = 0;
    static constexpr int V_OFF = K_OFF + 2 * C * LDK;
    static constexpr int A_OFF = V_OFF + 2 * C * LDV;
    static constexpr int F_OFF = A_OFF + 2 * C * LDC;
    static constexpr int Q_OFF = F_OFF + 4 * 2 * C;
    static constexpr int P_OFF = Q_OFF + 2 * C * LDK;
    static constexpr int SHORT_STAGE = Q_OFF;
    static constexpr int FULL_STAGE = P_OFF + 2 * C * LDC;
};

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

// One thread's fixed share of a ROWS-row (C unless told) tile copy of 16-bit elements,
// coalesced: thread i copies vector i % VECS of rows i / VECS + STEP·u, so that each cp.async
// instruction of a warp reads whole rows (32 threads × 16 bytes over 512 / (16·VECS) rows)
// instead of 16 bytes every 16·PER bytes; `dst` is the byte offset of its first vector in the
// tile.
template <int NTHREADS, int VECS, int LD, int ROWS = C> struct TileRows {
    static constexpr int STEP = NTHREADS / VECS;  // rows per pass
    static constexpr int PER = ROWS / STEP;       // passes
    static_assert(NTHREADS % VECS == 0 && PER >= 1 && ROWS == PER * STEP, "tile split");
    int row, vec;
    unsigned dst;
    __device__ explicit TileRows(int tid) : row(tid / VECS), vec(tid % VECS), dst(2 * (row * LD + 8 * vec)) {}
    // Start copying this thread's vectors (if vec < valid_vecs) from src (its first row and
    // vector already added; rows `stride` elements apart); zeros for rows from `len` on (then
    // from `any`, a valid address that is not read).
    template <typename E>
    __device__ __forceinline__ void copy(unsigned tile, const E* src, const E* any, size_t stride, int len,
                                         int valid_vecs) const {
        if (vec >= valid_vecs) return;
        const size_t step = (size_t)STEP * stride;
#pragma unroll
        for (int u = 0; u < PER; ++u) {
            const bool ok = row + STEP * u < len;
            cp_async16_zfill(tile + dst + 2 * STEP * LD * u, ok ? src + u * step : any, ok);
        }
    }
};

// Start copying a ROWS-row (C unless told) tile of 16-bit elements (VECS 16-byte vectors per
// row, shared rows LD elements apart, global rows `stride` elements apart) by the NTHREADS
// threads of which this is number `tid`, as TileRows shares it (a whole row per thread instead
// put each warp's copies 32 rows apart: 8-way shared-memory conflicts). Rows from `rows` on are
// zeros; vectors from `valid_vecs` on are left alone (never read). Complete after cp_async_wait
// and a barrier.
template <int NTHREADS, int VECS, int LD, int ROWS = C, typename E>
__device__ __forceinline__ void copy_tile(unsigned dst, const E* src, size_t stride, int rows,
                                          int valid_vecs, int tid = threadIdx.x) {
    static_assert(sizeof(E) == 2, "16-bit tiles");
    const TileRows<NTHREADS, VECS, LD, ROWS> share(tid);
    share.copy(dst, src + (size_t)share.row * stride + 8 * share.vec, src, stride, rows, valid_vecs);
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
// This lane's element offset in a 16×16 block of a tile with rows ld apart, for the ldmatrix
// .x4 of an MMA fragment (the registers in order: the 8×8 blocks (rows 0–7 | 8–15) × (columns
// 0–7 | 8–15), row block fastest, for A (m × k) and B (k × n)): lane l gives row l % 8 of
// matrix l / 8. k-major: A stored row-major (A[m][k] at tile[m·ld + k]: ldsm4) or B stored
// row-major (B[k][n] at tile[k·ld + n]: ldsm4_t); n-major: A stored column-major (ldsm4_t) or
// B stored column-major (B[k][n] at tile[n·ld + k]: ldsm4).
__device__ __forceinline__ int lane_frag_kmajor(int lane, int ld) {
    return (((lane >> 3) & 1) * 8 + (lane & 7)) * ld + (lane >> 4) * 8;
}
__device__ __forceinline__ int lane_frag_nmajor(int lane, int ld) {
    return ((lane >> 4) * 8 + (lane & 7)) * ld + ((lane >> 3) & 1) * 8;
}
// The same for B fragments, with the row stride a template constant.
template <int LD> __device__ __forceinline__ int lane_b_nmajor(int lane) { return lane_frag_nmajor(lane, LD); }
template <int LD> __device__ __forceinline__ int lane_b_kmajor(int lane) { return lane_frag_kmajor(lane, LD); }

// s (16 × the state's 16-row blocks lo.. lo + n − 1, at most NB) += aᵀ·B over the chunk's
// tokens: a (16 × C) as A operands, B a C × K token-major tile (k or q) through this lane's
// k-major ldmatrix address. The state update of the forward and of the backward's chains.
template <typename T, int NB>
__device__ __forceinline__ void add_tokens_times(float (&s)[2 * NB][4], const unsigned (&a)[C / 16][4],
                                                 unsigned lane_b, int lo, int n) {
#pragma unroll
    for (int kb = 0; kb < C / 16; ++kb) {
#pragma unroll
        for (int jb = 0; jb < NB; jb += 4) {
            unsigned fk[4][4];
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) {
                if (jb + jj < n) ldsm4_t(fk[jj], lane_b + 2 * (16 * kb * LDK + 16 * (lo + jb + jj)));
            }
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) {
                if (jb + jj < n) {
                    MmaOp<T>::run(s[2 * (jb + jj)], a[kb], fk[jj][0], fk[jj][1]);
                    MmaOp<T>::run(s[2 * (jb + jj) + 1], a[kb], fk[jj][2], fk[jj][3]);
                }
            }
        }
    }
}

// The state's update over the chunk, s ← γ_C·s + aᵀ·B (add_tokens_times: the same blocks, a, B):
// Sᵀ ← γ_C·Sᵀ + (diag(γ_C/γ)·v')ᵀ·K in the forward and the states chain, the dh chain's
// first term of dSᵀ.
template <typename T, int NB>
__device__ __forceinline__ void update_state(float (&s)[2 * NB][4], const unsigned (&a)[C / 16][4],
                                             unsigned lane_b, int lo, int n, float gamma_c) {
#pragma unroll
    for (int j = 0; j < 2 * NB; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] *= gamma_c;
    }
    add_tokens_times<T, NB>(s, a, lane_b, lo, n);
}

// A warp's C × 16 output (the transposed accumulators acc: o in the forward, dv in the dh
// chain) to the first len token rows from start of dst ([tokens, HV, V], v-head hv, columns
// c0..c0 + 15), through the warp's C × STAGE_LD staging tile `stage`: 16-byte stores of whole
// rows. STMATRIX (sm_90): stmatrix.trans from stage_lane, the lane's byte address in the tile
// (lane_b_nmajor); else element by element.
constexpr int STAGE_LD = 16 + 8;
template <typename T, bool STMATRIX>
__device__ __forceinline__ void store_staged(const float (&acc)[C / 8][4], T* stage, unsigned stage_lane,
                                             T* __restrict__ dst, int start, int len, int HV, int hv, int V,
                                             int c0, int lane) {
    if constexpr (STMATRIX) {
        // Four instructions for the tile (matrices (j, h), (j, h + 1), (j + 1, h), …).
#pragma unroll
        for (int j = 0; j < C / 8; j += 2) {
            const unsigned x[4] = {pack2<T>(acc[j][0], acc[j][1]), pack2<T>(acc[j][2], acc[j][3]),
                                   pack2<T>(acc[j + 1][0], acc[j + 1][1]),
                                   pack2<T>(acc[j + 1][2], acc[j + 1][3])};
            stsm4_t(stage_lane + 2 * (8 * j * STAGE_LD), x);
        }
    } else {
        (void)stage_lane;
        const int g = lane >> 2, t = lane & 3;
#pragma unroll
        for (int j = 0; j < C / 8; ++j) {
            const int i = 8 * j + 2 * t;
            stage[i * STAGE_LD + g] = from_f32<T>(acc[j][0]);
            stage[(i + 1) * STAGE_LD + g] = from_f32<T>(acc[j][1]);
            stage[i * STAGE_LD + g + 8] = from_f32<T>(acc[j][2]);
            stage[(i + 1) * STAGE_LD + g + 8] = from_f32<T>(acc[j][3]);
        }
    }
    __syncwarp();
    // Lane l stores half l % 2 of token row l / 2 + 16r.
    T* const row = dst + ((size_t)(start + (lane >> 1)) * HV + hv) * V + c0 + 8 * (lane & 1);
    const size_t rows16 = (size_t)16 * HV * V;
#pragma unroll
    for (int r = 0; r < C * 2 / 32; ++r) {
        const int i = (lane >> 1) + 16 * r;
        if (i < len) {
            *reinterpret_cast<uint4*>(row + r * rows16) = *reinterpret_cast<const uint4*>(stage + i * STAGE_LD + 8 * (lane & 1));
        }
    }
    __syncwarp();
}

// ---------------------------------------------------------------------------------------------
// Pass 1 (the prep): a block of 8 warps per (chunk, q/k head), or per part of its GVA group
// (the grid's y is heads_qk × the group's parts: each block walks group / parts v-heads). The
// Gram products KKᵀ and QKᵀ are formed once per block and kept in the warps' accumulators;
// each v-head's gates and β then give its Γ masks, L, the inverse T, T·diag(β) and P.
// Shared memory: k then the inverse's block sums and the raw products, q then T, L, the
// gates and β of up to PREP_GROUP v-heads (53 KB: four blocks per SM).

// Bytes of each of pass 1's three tiles (then the gates; prep_smem in chunked.rs mirrors it).
constexpr int PREP_TILE = 2 * C * LDK;  // = 4 · C · LDF
// The most v-heads one prep block walks (its gates' room: PREP_GROUP · 2C floats).
constexpr int PREP_GROUP = 4;
// The prep's blocks per SM (its launch bound: at most 64 registers, which its shared memory
// allows anyway; GDN_CUDA_DEFINES="GDN_PREP_BLOCKS=n" sets another for an experiment,
// docs/configuration.md).
#ifndef GDN_PREP_BLOCKS
#define GDN_PREP_BLOCKS 4
#endif
constexpr int PREP_BLOCKS = GDN_PREP_BLOCKS;

// The inverse's blocks below the diagonal (prep_group), by levels: T_A = (I + L_A)⁻¹ and T_B
// of the two 32 × 32 diagonal halves need T10 and T32; then T_BA = −T_B·(L_BA·T_A). Each
// product is a warp's 16 × 8 tile (8 columns of a block: half h) by 3xTF32 MMAs (near-f32), in
// two steps with a block barrier between them and the critical path 4 + 6 products of k = 16
// (column block 0's chain was 18):
//   step 1, warps 0–3: T10 = −T11·(L10·T00), T32 = −T33·(L32·T22) (the sums staged in the
//     warp's 16 × 8 slot of xs);
//   step 1, warps 4–7: X20' = L20·T00, X21 = L21·T11, X30' = L30·T00, X31 = L31·T11, two each,
//     into T's blocks above the diagonal (never read otherwise: the output masks them);
//   step 2, warps 2r + h: r = 0: X20 = X20' + L21·T10 (for role 1 too, behind a barrier of the
//     pair), T20 = −T22·X20; r = 1: X30 = X30' + L31·T10, T30 = −(T32·X20 + T33·X30); r = 2:
//     T21 = −T22·X21; r = 3: T31 = −(T32·X21 + T33·X31).
// Each product's fragments: A (16 rows) at a, stride lda; B (16 × 8) at b, stride ldb.
__device__ __forceinline__ void prep_k16(float (&acc)[12], const float* a, int lda, const float* b, int ldb) {
    mma_f32x3_acc(acc, a, lda, b, ldb);
    mma_f32x3_acc(acc, a + 8, lda, b + 8 * ldb, ldb);
}
// A 16 × 8 accumulator tile (mma_f32x3_sum, times sign) to out (stride ld).
__device__ __forceinline__ void prep_put(float* out, int ld, const float (&acc)[12], float sign) {
    const int lane = threadIdx.x & 31, g4 = lane >> 2, t4 = lane & 3;
    *reinterpret_cast<float2*>(out + g4 * ld + 2 * t4) = make_float2(sign * mma_f32x3_sum(acc, 0), sign * mma_f32x3_sum(acc, 1));
    *reinterpret_cast<float2*>(out + (g4 + 8) * ld + 2 * t4) = make_float2(sign * mma_f32x3_sum(acc, 2), sign * mma_f32x3_sum(acc, 3));
}
// An accumulator tile started from a stored 16 × 8 tile (the partial sums of step 1).
__device__ __forceinline__ void prep_start(float (&acc)[12], const float* in, int ld) {
    const int lane = threadIdx.x & 31, g4 = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int e = 0; e < 12; ++e) acc[e] = 0.0f;
    const float2 lo = *reinterpret_cast<const float2*>(in + g4 * ld + 2 * t4);
    const float2 hi = *reinterpret_cast<const float2*>(in + (g4 + 8) * ld + 2 * t4);
    acc[0] = lo.x, acc[1] = lo.y, acc[2] = hi.x, acc[3] = hi.y;
}
// The pair barriers of step 2 (ids 1, 2: one per half; 0 is __syncthreads').
constexpr int PREP_PAIR_BARRIER = 1;
__device__ __forceinline__ void prep_inverse_below(const float* a, float* t, float* xs, int warp) {
    const int h8 = 8 * (warp & 1);
    // Block (r, c) of L or T, this warp's 8 columns; T's blocks above the diagonal hold the
    // partial products: X20' in (0, 1), X21 in (0, 2), X30' in (0, 3), X31 in (1, 2), X20 in (1, 3).
    auto L = [&](int r, int c) { return a + 16 * r * LDF + 16 * c; };
    auto Tb = [&](int r, int c) { return t + 16 * r * LDF + 16 * c + h8; };
    float* xw = xs + warp * 128;
    float acc[12], y[12];
    auto zero = [](float (&d)[12]) {
#pragma unroll
        for (int e = 0; e < 12; ++e) d[e] = 0.0f;
    };
    if (warp < 4) {
        const int r = warp < 2 ? 1 : 3;  // T10 or T32
        zero(acc);
        prep_k16(acc, L(r, r - 1), LDF, Tb(r - 1, r - 1), LDF);
        prep_put(xw, 8, acc, 1.0f);
        __syncwarp();
        zero(y);
        prep_k16(y, t + 16 * r * LDF + 16 * r, LDF, xw, 8);
        prep_put(Tb(r, r - 1), LDF, y, -1.0f);
    } else {
        const int r = warp < 6 ? 2 : 3;  // X20', X21 or X30', X31
        zero(acc);
        prep_k16(acc, L(r, 0), LDF, Tb(0, 0), LDF);
        prep_put(r == 2 ? Tb(0, 1) : Tb(0, 3), LDF, acc, 1.0f);
        zero(y);
        prep_k16(y, L(r, 1), LDF, Tb(1, 1), LDF);
        prep_put(r == 2 ? Tb(0, 2) : Tb(1, 2), LDF, y, 1.0f);
    }
    __syncthreads();
    const int role = warp >> 1;
    if (role == 0) {
        prep_start(acc, Tb(0, 1), LDF);
        prep_k16(acc, L(2, 1), LDF, Tb(1, 0), LDF);
        prep_put(Tb(1, 3), LDF, acc, 1.0f);  // X20
        named_barrier(PREP_PAIR_BARRIER + (warp & 1), 64);
        zero(y);
        prep_k16(y, t + 32 * LDF + 32, LDF, Tb(1, 3), LDF);
        prep_put(Tb(2, 0), LDF, y, -1.0f);
    } else if (role == 1) {
        prep_start(acc, Tb(0, 3), LDF);
        prep_k16(acc, L(3, 1), LDF, Tb(1, 0), LDF);
        prep_put(xw, 8, acc, 1.0f);  // X30
        named_barrier(PREP_PAIR_BARRIER + (warp & 1), 64);
        zero(y);
        prep_k16(y, t + 48 * LDF + 32, LDF, Tb(1, 3), LDF);
        prep_k16(y, t + 48 * LDF + 48, LDF, xw, 8);
        prep_put(Tb(3, 0), LDF, y, -1.0f);
    } else if (role == 2) {
        zero(y);
        prep_k16(y, t + 32 * LDF + 32, LDF, Tb(0, 2), LDF);
        prep_put(Tb(2, 1), LDF, y, -1.0f);
    } else {
        zero(y);
        prep_k16(y, t + 48 * LDF + 32, LDF, Tb(0, 2), LDF);
        prep_k16(y, t + 48 * LDF + 48, LDF, Tb(1, 2), LDF);
        prep_put(Tb(3, 1), LDF, y, -1.0f);
    }
}

// The lower 16×16 tiles (i, j), j ≤ i, of a C × C product, numbered row by row:
// (0,0) (1,0) (1,1) (2,0) … (3,3); warp w owns tile w and, for w < 2, tile 8 + w.
constexpr int PREP_TILES = (C / 16) * (C / 16 + 1) / 2;
__host__ __device__ constexpr int prep_tile_row(int idx) { return idx < 1 ? 0 : idx < 3 ? 1 : idx < 6 ? 2 : 3; }
__device__ __forceinline__ int2 prep_tile(int idx) {
    const int ti = prep_tile_row(idx);
    return make_int2(ti, idx - ti * (ti + 1) / 2);
}

// Where the raw Gram products of tile idx wait (prep_group): slot (idx, e), e = 0 for KKᵀ and
// 1 for QKᵀ, as a float offset from the prep's shared memory, lane 0's. Tiles 0–6 in k's old
// tile after the inverse's block sums (a lane's 8 values at + 8·lane); tiles 7–9 in L's six
// blocks above the diagonal, (0, 1) (0, 2) (0, 3) (1, 2) (1, 3) (2, 3) for tiles 8, 9, then 7
// (a lane's values at + (lane / 2)·LDF + 8·(lane % 2)).
constexpr int PREP_SLOTS_IN_K = 7;
__host__ __device__ constexpr int prep_slot(int idx, int e) {
    if (idx < PREP_SLOTS_IN_K) return (3072 + 1024 * (2 * idx + e)) / 4;
    const int hh = idx == 7 ? 4 + e : 2 * (idx - 8) + e;
    const int r = hh < 3 ? 0 : hh < 5 ? 1 : 2, c = hh - (r == 0 ? 0 : r == 1 ? 3 : 5) + r + 1;
    return 2 * PREP_TILE / 4 + 16 * r * LDF + 16 * c;  // L: the third tile
}
// The P/L epilogue's 40 units of (tile, quarter: half × row half), a unit's lane-0 row and
// column and the byte offsets of its KKᵀ and QKᵀ values: a table, so that the epilogue's
// loop, run per v-head, does none of this index arithmetic (it was most of the loop's
// instructions). Units idx·4 + 2·half + rh; those of tiles 7–9 (unit ≥ 28) take the second
// lane offset.
struct PrepUnits { int v[4 * PREP_TILES][4]; };
__host__ __device__ constexpr PrepUnits prep_units() {
    PrepUnits u{};
    for (int unit = 0; unit < 4 * PREP_TILES; ++unit) {
        const int idx = unit >> 2, half = (unit >> 1) & 1, rh = unit & 1;
        const int ti = prep_tile_row(idx), tj = idx - ti * (ti + 1) / 2;
        u.v[unit][0] = ti * 16 + 8 * rh;
        u.v[unit][1] = tj * 16 + 8 * half;
        u.v[unit][2] = 4 * (prep_slot(idx, 0) + 4 * half + 2 * rh);
        u.v[unit][3] = 4 * (prep_slot(idx, 1) + 4 * half + 2 * rh);
    }
    return u;
}
__constant__ const PrepUnits PREP_UNITS = prep_units();

// KD > 0: the key dimension as a compile-time constant (K = 128: a straight-line Gram
// loop); 0: p.key_dim.
template <typename T, bool BWD, int KD>
__device__ void prep_group(const ChunkParams p, const int* __restrict__ chunks,
                           const T* __restrict__ q, const T* __restrict__ k,
                           const float* __restrict__ g, const float* __restrict__ beta,
                           const float* __restrict__ a_log, const float* __restrict__ dt_bias,
                           float* __restrict__ ws_f, T* __restrict__ ws_a, T* __restrict__ ws_p,
                           T* __restrict__ ws_t) {
    static_assert(PREP_TILE == 4 * C * LDF, "q's tile is reused for T");
    static_assert(PREP_THREADS >= 3 * 64, "a thread per row quarter of block row 3");
    static_assert(PREP_THREADS / 32 + 2 == PREP_TILES, "tiles w and 8 + w per warp");
    static_assert(LDF % 4 == 0, "16-byte rows of the f32 tiles");
    extern __shared__ __align__(128) unsigned char smem[];
    const int K = KD > 0 ? KD : p.key_dim, H = p.heads_qk, HV = p.heads_v;
    // Blocks are numbered (q/k head, part) fastest, so that the blocks of one chunk, which
    // read neighbouring rows of q and k, run together.
    const int parts = gridDim.y / H, per = p.group / parts;  // per ≤ PREP_GROUP
    const size_t lin = blockIdx.x + (size_t)blockIdx.y * gridDim.x;
    const int chunk = (int)(lin / ((size_t)H * parts)), hp = (int)(lin % ((size_t)H * parts));
    const int h = hp / parts, hv0 = hp * per;
    const int start = chunks[2 * chunk], len = chunks[2 * chunk + 1];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g4 = lane >> 2, t4 = lane & 3;

    T* ks = reinterpret_cast<T*>(smem);
    float* xs = reinterpret_cast<float*>(smem);  // after the Gram products: block sums
    T* qs = reinterpret_cast<T*>(smem + PREP_TILE);
    float* t = reinterpret_cast<float*>(smem + PREP_TILE);  // after the Gram products: T
    float* a = reinterpret_cast<float*>(smem + 2 * PREP_TILE);  // L
    // G and β of the block's v-head u at gates + u·2C (G) and + C (β).
    float* gates = reinterpret_cast<float*>(smem + 3 * PREP_TILE);

    // q and k first, so that their copies are in flight while the gates load.
    const size_t qk_stride = (size_t)H * K;
    copy_tile<PREP_THREADS, MAX_K / 8, LDK>(smem_addr(ks), k + ((size_t)start * H + h) * K, qk_stride, len, K / 8);
    copy_tile<PREP_THREADS, MAX_K / 8, LDK>(smem_addr(qs), q + ((size_t)start * H + h) * K, qk_stride, len, K / 8);

    // Warp w < per: v-head hv0 + w's gates and β (rows lane and 32 + lane): the activations,
    // the cumsum G (an inclusive scan per half, the second half plus the first's total) and
    // the decays. Padding: g = 0 (so G keeps its last value), β = 0.
    if (warp < per) {
        const int hv = hv0 + warp;
        const size_t ch = (size_t)chunk * HV + hv;
        float* sg = gates + warp * 2 * C;
        float* sb = sg + C;
        float gi[2], bi[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            gi[e] = 0.0f;
            bi[e] = 0.0f;
            if (lane + 32 * e < len) {
                const size_t idx = (size_t)(start + lane + 32 * e) * HV + hv;
                gi[e] = g[idx];
                if (p.flags & GATE_IN_KERNEL) gi[e] = -expf(a_log[hv]) * softplus(gi[e] + dt_bias[hv]);
                bi[e] = beta[idx];
                if (p.flags & BETA_SIGMOID) bi[e] = sigmoid(bi[e]);
                if (p.flags & NEG_EIGVAL) bi[e] *= 2.0f;
            }
#pragma unroll
            for (int d = 1; d < 32; d <<= 1) {
                const float up = __shfl_up_sync(0xffffffffu, gi[e], d);
                if (lane >= d) gi[e] += up;
            }
        }
        gi[1] += __shfl_sync(0xffffffffu, gi[0], 31);
        const float last = __shfl_sync(0xffffffffu, gi[1], 31);
        constexpr int FS = BWD ? 4 * C : 2 * C;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int i = lane + 32 * e;
            sg[i] = gi[e];
            sb[i] = bi[e];
            // The sequential pass's decays: γ_i = e^{G_i}, γ_C/γ_i = e^{G_last − G_i} (≤ 0).
            ws_f[ch * FS + i] = expf(gi[e]);
            ws_f[ch * FS + C + i] = expf(last - gi[e]);
            if (BWD) {
                ws_f[ch * FS + 2 * C + i] = gi[e];
                ws_f[ch * FS + 3 * C + i] = bi[e];
            }
        }
    }
    cp_async_wait();
    __syncthreads();

    // KKᵀ and QKᵀ of the warp's lower tiles (tile w, and 8 + w for w < 2), formed once. The
    // raw products wait in shared memory for every v-head: each lane's 8 + 8 accumulator
    // values of tile idx in its slots (idx, 0) (KKᵀ) and (idx, 1) (QKᵀ): tiles 0–6 in k's
    // old tile after the inverse's block sums (written once every warp is done with k),
    // tiles 7–9 in L's six blocks above the diagonal (never written nor read otherwise, so
    // written at once).
    const int ntiles = warp < PREP_TILES - PREP_THREADS / 32 ? 2 : 1;
    // A lane's float offset within a slot (prep_slot): in k's old tile, or in L's upper blocks.
    auto lane_in_slot = [&](bool in_k) { return in_k ? 8 * lane : (lane >> 1) * LDF + 8 * (lane & 1); };
    auto slot = [&](int idx, int e) -> float* {
        return reinterpret_cast<float*>(smem) + prep_slot(idx, e) + lane_in_slot(idx < PREP_SLOTS_IN_K);
    };
    static_assert(3072 + 1024 * 2 * PREP_SLOTS_IN_K <= PREP_TILE, "the raw products' slots fit k's tile");
    static_assert(PREP_TILES == 10, "seven tiles in k's tile, three in L's upper blocks");
    auto put = [&](int idx, const float (&ck)[8], const float (&cq)[8]) {
        float* sk = slot(idx, 0);
        float* sq = slot(idx, 1);
        *reinterpret_cast<float4*>(sk) = make_float4(ck[0], ck[1], ck[2], ck[3]);
        *reinterpret_cast<float4*>(sk + 4) = make_float4(ck[4], ck[5], ck[6], ck[7]);
        *reinterpret_cast<float4*>(sq) = make_float4(cq[0], cq[1], cq[2], cq[3]);
        *reinterpret_cast<float4*>(sq + 4) = make_float4(cq[4], cq[5], cq[6], cq[7]);
    };
    {
        // Each lane's ldmatrix addresses are formed once: A from the row-major tile (rows ti),
        // Kᵀ as B from k's rows tj (lane_frag_kmajor / _nmajor); q's tile is k's + dq.
        const int la = lane_frag_kmajor(lane, LDK);
        const int lb = lane_b_nmajor<LDK>(lane);
        const unsigned k0 = smem_addr(ks), dq = smem_addr(qs) - k0;
        auto gram = [&](int idx, float (&ck)[8], float (&cq)[8]) {
            const int2 tn = prep_tile(idx);
            const unsigned ak = k0 + 2 * (la + tn.x * 16 * LDK), bk = k0 + 2 * (lb + tn.y * 16 * LDK);
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                ck[e] = 0.0f;
                cq[e] = 0.0f;
            }
            auto step = [&](int kk) {
                unsigned fk[4], fq[4], fb[4];
                ldsm4(fk, ak + 2 * kk);
                ldsm4(fq, ak + dq + 2 * kk);
                ldsm4(fb, bk + 2 * kk);
                MmaOp<T>::run(ck, fk, fb[0], fb[1]);
                MmaOp<T>::run(ck + 4, fk, fb[2], fb[3]);
                MmaOp<T>::run(cq, fq, fb[0], fb[1]);
                MmaOp<T>::run(cq + 4, fq, fb[2], fb[3]);
            };
            if (KD > 0) {
#pragma unroll
                for (int kk = 0; kk < KD; kk += 16) step(kk);
            } else {
#pragma unroll 1
                for (int kk = 0; kk < K; kk += 16) step(kk);
            }
        };
        float ck[8], cq[8];
        if (ntiles == 2) {
            gram(warp + PREP_THREADS / 32, ck, cq);
            put(warp + PREP_THREADS / 32, ck, cq);  // tiles 8, 9: L's upper blocks
        }
        gram(warp, ck, cq);
        __syncthreads();  // every warp is done with q and k
        put(warp, ck, cq);
        __syncthreads();  // every slot is in (the epilogue reads other warps' slots)
    }

#pragma unroll 1
    for (int u = 0; u < per; ++u) {
        // The warp's index, formed again per v-head (opaque): the per-warp offsets and roles
        // are recomputed here rather than kept across the loop in spilled registers.
        const int w = opaque(warp);
        const int hv = hv0 + u;
        const size_t ch = (size_t)chunk * HV + hv;
        const float* sg = gates + u * 2 * C;
        const float* sb = sg + C;
        // (No barrier: v-head u − 1's last reads of L were before the barrier above its
        // output, and T is not written before the next barrier.)

        // L = strict_lower(diag(β)·(Γ⊙KKᵀ)) (to shared) and P = scale·Γ⊙QKᵀ (i ≥ j, to the
        // workspace), from the kept accumulators with one decay e^{G_i − G_j} each, lower
        // tiles only. The sequential pass never reads P's tiles above the diagonal. Only
        // i ≥ j is exponentiated, so G_i − G_j ≤ 0.
        T* p_out = ws_p + ch * C * C;
        // 40 units of (tile, quarter: half × row half) over the 8 warps, five each: lane l
        // of any warp takes lane l's values from the tile's slots. Unrolled, so that the
        // units' loads are in flight together (one unit at a time, their latency held a
        // quarter of the prep's stall samples; with the warp index opaque per v-head, ptxas
        // forms the units' offsets here instead of keeping them across the loop in 72 B of
        // local memory).
        static_assert(4 * PREP_TILES % (PREP_THREADS / 32) == 0, "the same units per warp");
#pragma unroll
        for (int n = 0; n < 4 * PREP_TILES / (PREP_THREADS / 32); ++n) {
            const int unit = w + n * (PREP_THREADS / 32);
            const int* row = PREP_UNITS.v[unit];
            const int i = row[0] + g4, j = row[1] + 2 * t4;
            const int lane_at = 4 * lane_in_slot(unit < 4 * PREP_SLOTS_IN_K);
            const float2 kk2 = *reinterpret_cast<const float2*>(smem + row[2] + lane_at);
            const float2 qk2 = *reinterpret_cast<const float2*>(smem + row[3] + lane_at);
            const float kv[2] = {kk2.x, kk2.y}, qv[2] = {qk2.x, qk2.y};
            float x[2], l[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                // (Formed for every lane, without a branch: the masked ones are not used.)
                const float e_ij = __expf(sg[i] - sg[j + e]), decay = j + e <= i ? e_ij : 0.0f;
                x[e] = j + e <= i ? p.scale * qv[e] * decay : 0.0f;
                l[e] = j + e < i ? sb[i] * kv[e] * decay : 0.0f;
            }
            *reinterpret_cast<unsigned*>(p_out + i * C + j) = pack2<T>(x[0], x[1]);
            *reinterpret_cast<float2*>(a + i * LDF + j) = make_float2(l[0], l[1]);
        }
        __syncthreads();

        // T = (I + L)⁻¹ in 16×16 blocks (§2.3). Diagonal blocks by forward substitution, one
        // column per thread in registers: T[i][c] = δ_ic − Σ_{c ≤ j < i} L[i][j]·T[j][c] within
        // the block (the column's entries above c are zero, so the sum may start at 0). Only
        // the blocks on and below the diagonal are written (and read); the output masks the
        // others. L's tiles above the diagonal are never written nor read.
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
        // Below the diagonal by levels on tensor cores (prep_inverse_below: eight warps, a
        // block barrier between its two steps), or with PREP_FFMA row block by row block in
        // f32 FMAs.
        static_assert(PREP_THREADS == 256, "prep_inverse_below's eight warps");
        if (!(p.flags & PREP_FFMA)) prep_inverse_below(a, t, xs, w);
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
        __syncthreads();
        // T·diag(β) to the workspace (the sequential pass's operand of v' = T·diag(β)·X), eight
        // elements per 16-byte store. Blocks above the diagonal are zeros (t holds q's old
        // bits there).
        T* a_out = ws_a + ch * C * C;
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
}

// The prep's entry (gdn_chunk_prep_*, gdn_chunk_bwd_prep_*): the K = 128 instance or the
// run-time K. The backward's prep (BWD) writes 4·C floats of gates per (chunk, v-head), γ,
// γ_C/γ, then G and β (the activated ones), and T itself (ws_t) besides T·diag(β) and P.
template <typename T, bool BWD = false>
__device__ void prep(const ChunkParams p, const int* __restrict__ chunks, const T* __restrict__ q,
                     const T* __restrict__ k, const float* __restrict__ g,
                     const float* __restrict__ beta, const float* __restrict__ a_log,
                     const float* __restrict__ dt_bias, float* __restrict__ ws_f,
                     T* __restrict__ ws_a, T* __restrict__ ws_p, T* __restrict__ ws_t = nullptr) {
    if (p.key_dim == MAX_K) {
        prep_group<T, BWD, MAX_K>(p, chunks, q, k, g, beta, a_log, dt_bias, ws_f, ws_a, ws_p, ws_t);
    } else {
        prep_group<T, BWD, 0>(p, chunks, q, k, g, beta, a_log, dt_bias, ws_f, ws_a, ws_p, ws_t);
    }
}

}  // namespace chunked
}  // namespace gdn
