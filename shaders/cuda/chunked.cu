// The chunked GDN forward (C = 64) on tensor cores, for f16/bf16 storage: FLA's split.
//
//   gdn_l2norm_*     (optional) q̂ = q / sqrt(Σq² + eps), k̂ likewise, rounded to the storage
//                    dtype (as FLA's separate l2norm kernel does); the passes below read q̂, k̂.
//   gdn_chunk_prep_* one block per (chunk, v-head), fully parallel: gate activation and
//                    β transform, chunk-local cumsum G (f32, padded with the last valid value),
//                    L = strict_lower(diag(β)·(Γ⊙KKᵀ)), T = (I + L)⁻¹ (f32, 16×16 blocks:
//                    forward substitution on the diagonal, block products below it),
//                    W = T·diag(βγ)·K, U = T·diag(β)·V and P = scale·(Γ⊙QKᵀ) (i ≥ j), stored
//                    to a workspace: −W and P in the storage dtype (MMA operands; −W so the
//                    sequential pass starts its accumulator at U and adds (−W)·S), U in f32
//                    (only ever an addend: no rounding needed).
//   gdn_chunk_fwd_*  one block per (V-block, v-head, sequence), sequential over the sequence's
//                    chunks: the f32 state lives in shared memory (as MMA operand it is
//                    rounded to the storage dtype, or split hi + lo with SPLIT_STATE), per chunk
//                      v' = U − W·S,  O = scale·diag(γ)·Q·S + P·v',
//                      S ← γ_C·S + Kᵀ·(diag(γ_C/γ)·v').
//
// Decisions and why:
// - FLA's gated T (not FlashQLA's gate-free A): W and U then need no gate work in the
//   sequential pass, and every exponent is a difference G_i − G_j (i ≥ j), G_last − G_i or G_i
//   of chunk-local cumsums: never positive (§7.2). Padded rows have β = 0 and the last valid
//   G, so their L rows, W, U, v' rows and state contributions are exactly zero.
// - 16×16×16 tiles of mma.sync m16n8k16 (operands by ldmatrix) with f32 accumulators: the
//   same source runs on sm_80 and sm_90a (wgmma is a later step). Operands (q, k, v, W, P,
//   v', the state parts) are in the storage dtype, as in FLA; the inverse, the cumsum, U and
//   every accumulator are f32. Global → shared copies are cp.async, all of a chunk in flight
//   at once (no double buffering yet: the sequential pass's shared memory is near the limit).
// - The state accumulates in f32 shared memory (accumulator fragments are loaded, scaled by
//   γ_C, multiplied into and stored back). Where it is an operand (W·S, Q·S) it is rounded to
//   the storage dtype as in FLA, or with SPLIT_STATE enters as S_hi + S_lo (twice those
//   MMAs, no rounding of the state; measured on the H200 it did not change the error, so it
//   is off by default).
// - Chunks never cross a sequence boundary: the host's chunk table gives each chunk's first
//   token and length, and each sequence's first chunk.
// - Limits: K ≤ 128 (the sequential pass's shared memory); f32 storage and K = 256 use the
//   recurrent kernel (src/cuda_backend/chunked.rs decides per call).
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

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

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
__device__ __forceinline__ void load_c(FragC& f, float* p, int ld) { move_c<false>(f, p, ld); }

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

// d += a·b for one 16×16×16 tile.
template <typename T>
__device__ __forceinline__ void mma(FragC& d, const FragA& a, const FragB& b) {
    MmaOp<T>::run(d.x, a.x, b.x[0], b.x[1]);
    MmaOp<T>::run(d.x + 4, a.x, b.x[2], b.x[3]);
}

constexpr int C = 64;          // chunk length
constexpr int THREADS = 128;   // l2norm and prep: 4 warps; warp w owns row tile w
constexpr int FWD_THREADS = 256;  // the sequential pass: 8 warps, two per 16-row tile
constexpr int MAX_K = 128;

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

// Shared-memory row strides: 8 extra 16-bit elements (4 extra f32) keep rows 16-byte aligned
// (vector copies) while spreading them over banks.
__host__ __device__ constexpr int ld16(int n) { return n + 8; }
__host__ __device__ constexpr int ld32(int n) { return n + 4; }
__device__ __forceinline__ size_t align128(size_t x) { return (x + 127) & ~(size_t)127; }

// x as hi + lo, both in T: hi = round(x), lo = round(x − hi).
template <typename T>
__device__ __forceinline__ void split_store(T* hi, T* lo, float x) {
    const T h = from_f32<T>(x);
    *hi = h;
    *lo = from_f32<T>(x - to_f32(h));
}

// Option bit of the chunked passes only (src/cuda_backend/chunked.rs SPLIT_STATE).
constexpr int SPLIT_STATE = 1 << 8;

// 16 bytes global → shared without passing through registers (sm_80+): every copy of a
// chunk is in flight at once, and cp_async_wait waits for all of this thread's.
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src)
                 : "memory");
}
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// Start copying `rows` rows of `n` elements (n·sizeof(E) a multiple of 16) from global rows
// `stride` elements apart into shared rows `ld` apart; rows rows..C-1 and columns from
// `valid` on are zeroed. Complete after cp_async_wait and a barrier.
template <typename E>
__device__ __forceinline__ void load_rows(E* dst, int ld, const E* src, size_t stride, int rows, int n,
                                          int valid) {
    constexpr int PER = 16 / sizeof(E);
    const int vecs = n / PER;
    for (int idx = threadIdx.x; idx < C * vecs; idx += blockDim.x) {
        const int r = idx / vecs, c = (idx % vecs) * PER;
        if (r < rows && c < valid) cp_async16(dst + r * ld + c, src + r * stride + c);
        else *reinterpret_cast<uint4*>(dst + r * ld + c) = make_uint4(0, 0, 0, 0);
    }
}

// ---------------------------------------------------------------------------------------------
// In-kernel l2norm: one warp per row of q (blockIdx.y = 0) or k (1).

template <typename T>
__device__ void l2norm(int rows, int K, const T* __restrict__ q, const T* __restrict__ k,
                       T* __restrict__ qn, T* __restrict__ kn) {
    const int row = blockIdx.x * (THREADS / 32) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const T* x = (blockIdx.y == 0 ? q : k) + (size_t)row * K;
    T* y = (blockIdx.y == 0 ? qn : kn) + (size_t)row * K;
    float ss = 0.0f;
    for (int i = lane; i < K; i += 32) {
        const float v = to_f32(x[i]);
        ss += v * v;
    }
    const float r = 1.0f / sqrtf(warp_sum(ss) + L2NORM_EPS);
    for (int i = lane; i < K; i += 32) y[i] = from_f32<T>(to_f32(x[i]) * r);
}

// ---------------------------------------------------------------------------------------------
// Pass 1: per (chunk, v-head).

template <typename T>
__device__ void prep(const ChunkParams p, const int* __restrict__ chunks, const T* __restrict__ q,
                     const T* __restrict__ k, const T* __restrict__ v, const float* __restrict__ g,
                     const float* __restrict__ beta, const float* __restrict__ a_log,
                     const float* __restrict__ dt_bias, float* __restrict__ ws_g, T* __restrict__ ws_w,
                     float* __restrict__ ws_u, T* __restrict__ ws_p) {
    extern __shared__ __align__(128) unsigned char smem[];
    const int K = p.key_dim, V = p.value_dim, H = p.heads_qk, HV = p.heads_v;
    const int chunk = blockIdx.x, hv = blockIdx.y, h = hv / p.group;
    const int start = chunks[2 * chunk], len = chunks[2 * chunk + 1];
    const int ldk = ld16(K), ldv = ld16(V), lda = ld32(C), ldt = ld16(C);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

    size_t off = 0;
    T* ks = reinterpret_cast<T*>(smem + off);
    off = align128(off + sizeof(T) * C * ldk);
    T* qs = reinterpret_cast<T*>(smem + off);
    off = align128(off + sizeof(T) * C * ldk);
    T* vs = reinterpret_cast<T*>(smem + off);
    off = align128(off + sizeof(T) * C * ldv);
    float* a = reinterpret_cast<float*>(smem + off);  // KKᵀ, then L
    off = align128(off + sizeof(float) * C * lda);
    float* t = reinterpret_cast<float*>(smem + off);  // QKᵀ, then T = (I + L)⁻¹
    off = align128(off + sizeof(float) * C * lda);
    T* a1 = reinterpret_cast<T*>(smem + off);  // T·diag(βγ)
    off = align128(off + sizeof(T) * C * ldt);
    T* a2 = reinterpret_cast<T*>(smem + off);  // T·diag(β)
    off = align128(off + sizeof(T) * C * ldt);
    const size_t stage_off = off;
    float* stage = reinterpret_cast<float*>(smem + off) + warp * 16 * 16;  // one tile per warp
    off = align128(off + sizeof(float) * 4 * 16 * 16);
    float* sg = reinterpret_cast<float*>(smem + off);
    float* sb = sg + C;

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
    const size_t qk_stride = (size_t)H * K;
    load_rows(ks, ldk, k + ((size_t)start * H + h) * K, qk_stride, len, K, K);
    load_rows(qs, ldk, q + ((size_t)start * H + h) * K, qk_stride, len, K, K);
    load_rows(vs, ldv, v + ((size_t)start * HV + hv) * V, (size_t)HV * V, len, V, V);
    cp_async_wait();
    __syncthreads();
    if (threadIdx.x >= 32 && threadIdx.x < C) sg[threadIdx.x] += sg[31];
    __syncthreads();
    if (threadIdx.x < C) ws_g[((size_t)chunk * HV + hv) * C + threadIdx.x] = sg[threadIdx.x];

    // KKᵀ and QKᵀ, lower tiles only (tile (i, j) with j ≤ i); warp w owns row tile w.
    {
        const int ti = warp;
        for (int tj = 0; tj <= ti; ++tj) {
            FragC ckk, cqk;
            fill_zero(ckk);
            fill_zero(cqk);
            for (int kk = 0; kk < K; kk += 16) {
                FragA fk, fq;
                FragB fkt;
                load_a<T, false>(fk, ks + ti * 16 * ldk + kk, ldk);
                load_a<T, false>(fq, qs + ti * 16 * ldk + kk, ldk);
                load_b<T, true>(fkt, ks + tj * 16 * ldk + kk, ldk);
                mma<T>(ckk, fk, fkt);
                mma<T>(cqk, fq, fkt);
            }
            store_c(a + ti * 16 * lda + tj * 16, ckk, lda);
            store_c(t + ti * 16 * lda + tj * 16, cqk, lda);
        }
    }
    __syncthreads();

    // L (strictly lower, gated, β rows) in place; P = scale·Γ⊙QKᵀ (i ≥ j) straight to the
    // workspace. Only i ≥ j is exponentiated, so G_i − G_j ≤ 0.
    T* p_out = ws_p + ((size_t)chunk * HV + hv) * C * C;
    for (int idx = threadIdx.x; idx < C * C; idx += THREADS) {
        const int i = idx / C, j = idx % C;
        float l = 0.0f, pij = 0.0f;
        if (j <= i) {
            const float decay = expf(sg[i] - sg[j]);
            if (j < i) l = sb[i] * a[i * lda + j] * decay;
            pij = p.scale * t[i * lda + j] * decay;
        }
        a[i * lda + j] = l;
        p_out[idx] = from_f32<T>(pij);
    }
    __syncthreads();

    // T = (I + L)⁻¹ in 16×16 blocks (§2.3). Diagonal blocks by forward substitution, one
    // column per thread: T[i][c] = δ_ic − Σ_{c ≤ j < i} L[i][j]·T[j][c] within the block.
    for (int idx = threadIdx.x; idx < C * C; idx += THREADS) t[(idx / C) * lda + idx % C] = 0.0f;
    __syncthreads();
    if (threadIdx.x < C) {
        const int b = (threadIdx.x / 16) * 16, c = threadIdx.x % 16;
        t[(b + c) * lda + b + c] = 1.0f;
        for (int i = c + 1; i < 16; ++i) {
            float acc = 0.0f;
            for (int j = c; j < i; ++j) acc = fmaf(a[(b + i) * lda + b + j], t[(b + j) * lda + b + c], acc);
            t[(b + i) * lda + b + c] = -acc;
        }
    }
    __syncthreads();
    // Block row r, column blocks c < r: T_rc = −T_rr · Σ_{c ≤ m < r} L_rm · T_mc, with the
    // sums staged in the (not yet used) W/U staging tiles.
    float* xs = reinterpret_cast<float*>(smem + stage_off);
    for (int r = 1; r < C / 16; ++r) {
        for (int e = threadIdx.x; e < r * 256; e += THREADS) {
            const int c = e / 256, i = (e % 256) / 16, j = e % 16;
            float acc = 0.0f;
            for (int m = c; m < r; ++m) {
#pragma unroll
                for (int l = 0; l < 16; ++l) {
                    acc = fmaf(a[(16 * r + i) * lda + 16 * m + l], t[(16 * m + l) * lda + 16 * c + j], acc);
                }
            }
            xs[e] = acc;
        }
        __syncthreads();
        for (int e = threadIdx.x; e < r * 256; e += THREADS) {
            const int c = e / 256, i = (e % 256) / 16, j = e % 16;
            float acc = 0.0f;
            for (int l = 0; l <= i; ++l) acc = fmaf(t[(16 * r + i) * lda + 16 * r + l], xs[c * 256 + l * 16 + j], acc);
            t[(16 * r + i) * lda + 16 * c + j] = -acc;
        }
        __syncthreads();
    }
    for (int idx = threadIdx.x; idx < C * C; idx += THREADS) {
        const int i = idx / C, j = idx % C;
        const float tij = t[i * lda + j];
        a1[i * ldt + j] = from_f32<T>(tij * sb[j] * expf(sg[j]));
        a2[i * ldt + j] = from_f32<T>(tij * sb[j]);
    }
    __syncthreads();

    // W = a1·K (C×K) and U = a2·V (C×V); warp w owns row tile w, staged through f32 shared.
    const int row0 = warp * 16;
    for (int pass = 0; pass < 2; ++pass) {
        const int n = pass == 0 ? K : V;
        const T* lhs = pass == 0 ? a1 : a2;
        const T* rhs = pass == 0 ? ks : vs;
        const int ldr = pass == 0 ? ldk : ldv;
        const size_t base = ((size_t)chunk * HV + hv) * C * n;
        FragA fa[C / 16];
#pragma unroll
        for (int s = 0; s < C / 16; ++s) load_a<T, false>(fa[s], lhs + row0 * ldt + s * 16, ldt);
        for (int c0 = 0; c0 < n; c0 += 16) {
            FragC acc;
            fill_zero(acc);
#pragma unroll
            for (int s = 0; s < C / 16; ++s) {
                FragB fb;
                load_b<T, false>(fb, rhs + s * 16 * ldr + c0, ldr);
                mma<T>(acc, fa[s], fb);
            }
            store_c(stage, acc, 16);
            __syncwarp();
            for (int e = lane; e < 256; e += 32) {
                const size_t at = base + (size_t)(row0 + e / 16) * n + c0 + e % 16;
                if (pass == 0) ws_w[at] = from_f32<T>(-stage[e]);  // −W: see the fwd pass
                else ws_u[at] = stage[e];
            }
            __syncwarp();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Pass 2: per (V-block, v-head, sequence), sequential over the sequence's chunks.

template <typename T, int BV>
__device__ void fwd(const ChunkParams p, const int* __restrict__ chunks,
                    const int* __restrict__ seq_chunks, const T* __restrict__ q,
                    const T* __restrict__ k, const float* __restrict__ ws_g,
                    const T* __restrict__ ws_w, const float* __restrict__ ws_u,
                    const T* __restrict__ ws_p, const float* h_in, T* __restrict__ o, float* h_out) {
    extern __shared__ __align__(128) unsigned char smem[];
    const int K = p.key_dim, V = p.value_dim, H = p.heads_qk, HV = p.heads_v;
    const int v0 = blockIdx.x * BV, hv = blockIdx.y, n = blockIdx.z, h = hv / p.group;
    const int ldk = ld16(K), lds = ld32(BV), ldd = ld16(BV), ldp = ld16(C);
    // Warp w owns row tile w % 4 and the column half w / 4 of every 64 × BV product, and the
    // state row tiles w % 4, w % 4 + 4, … in the same column half.
    const int warp = threadIdx.x >> 5;
    const int cb = (warp >> 2) * (BV / 2), ce = cb + BV / 2;
    const int flags = p.flags;
    const bool split = flags & SPLIT_STATE;

    size_t off = 0;
    float* sf = reinterpret_cast<float*>(smem + off);  // the f32 state, K × BV
    off = align128(off + sizeof(float) * K * lds);
    T* sd = reinterpret_cast<T*>(smem + off);  // its 16-bit part hi (MMA operand)
    off = align128(off + sizeof(T) * K * ldd);
    T* sdl = reinterpret_cast<T*>(smem + off);  // the rest, lo = S − hi (SPLIT_STATE)
    off = align128(off + sizeof(T) * K * ldd);
    T* qs = reinterpret_cast<T*>(smem + off);
    off = align128(off + sizeof(T) * C * ldk);
    T* ks = reinterpret_cast<T*>(smem + off);
    off = align128(off + sizeof(T) * C * ldk);
    T* ws = reinterpret_cast<T*>(smem + off);
    off = align128(off + sizeof(T) * C * ldk);
    T* ps = reinterpret_cast<T*>(smem + off);
    off = align128(off + sizeof(T) * C * ldp);
    float* x1 = reinterpret_cast<float*>(smem + off);  // U, then v' = U − W·S
    off = align128(off + sizeof(float) * C * lds);
    float* x2 = reinterpret_cast<float*>(smem + off);  // Q·S, then O
    off = align128(off + sizeof(float) * C * lds);
    T* vn = reinterpret_cast<T*>(smem + off);  // v'
    off = align128(off + sizeof(T) * C * ldd);
    T* vd = reinterpret_cast<T*>(smem + off);  // diag(γ_C/γ)·v'
    off = align128(off + sizeof(T) * C * ldd);
    float* sg = reinterpret_cast<float*>(smem + off);

    const size_t slice = ((size_t)n * HV + hv) * (size_t)K * V;
    auto state_at = [&](int r, int c) -> size_t {
        return slice + ((flags & STATE_V_FIRST) ? (size_t)(v0 + c) * K + r : (size_t)r * V + v0 + c);
    };
    for (int idx = threadIdx.x; idx < K * BV; idx += FWD_THREADS) {
        const int r = idx / BV, c = idx % BV;
        float x = 0.0f;
        if (h_in != nullptr && v0 + c < V) x = h_in[state_at(r, c)];
        sf[r * lds + c] = x;
        split_store(sd + r * ldd + c, sdl + r * ldd + c, x);
    }

    const int first = seq_chunks[n], last = seq_chunks[n + 1];
    const int row0 = (warp & 3) * 16;
    for (int chunk = first; chunk < last; ++chunk) {
        const int start = chunks[2 * chunk], len = chunks[2 * chunk + 1];
        const size_t ch = (size_t)chunk * HV + hv;
        const size_t qk_stride = (size_t)H * K;
        load_rows(qs, ldk, q + ((size_t)start * H + h) * K, qk_stride, len, K, K);
        load_rows(ks, ldk, k + ((size_t)start * H + h) * K, qk_stride, len, K, K);
        load_rows(ws, ldk, ws_w + ch * C * K, (size_t)K, C, K, K);
        load_rows(ps, ldp, ws_p + ch * C * C, (size_t)C, C, C, C);
        // x1 ← U's V-block (columns past V zeroed): the accumulator of v' = U + (−W)·S.
        load_rows(x1, lds, ws_u + ch * C * V + v0, (size_t)V, C, BV, V - v0);
        if (threadIdx.x < C) sg[threadIdx.x] = ws_g[ch * C + threadIdx.x];
        cp_async_wait();
        __syncthreads();  // also: the previous chunk's sd is complete

        // x1 = v' = U + (−W)·S, x2 = Q·S (the chunk-start state).
        for (int c0 = cb; c0 < ce; c0 += 16) {
            FragC acc1, acc2;
            load_c(acc1, x1 + row0 * lds + c0, lds);
            fill_zero(acc2);
            for (int kk = 0; kk < K; kk += 16) {
                FragA fw, fq;
                FragB fs;
                load_a<T, false>(fw, ws + row0 * ldk + kk, ldk);
                load_a<T, false>(fq, qs + row0 * ldk + kk, ldk);
                load_b<T, false>(fs, sd + kk * ldd + c0, ldd);
                mma<T>(acc1, fw, fs);
                mma<T>(acc2, fq, fs);
                if (split) {
                    load_b<T, false>(fs, sdl + kk * ldd + c0, ldd);
                    mma<T>(acc1, fw, fs);
                    mma<T>(acc2, fq, fs);
                }
            }
            store_c(x1 + row0 * lds + c0, acc1, lds);
            store_c(x2 + row0 * lds + c0, acc2, lds);
        }
        __syncthreads();

        // v' in the storage dtype; its decayed copy for the state; x2 ← scale·γ⊙(Q·S).
        const float g_last = sg[C - 1];
        for (int idx = threadIdx.x; idx < C * BV; idx += FWD_THREADS) {
            const int i = idx / BV, c = idx % BV;
            const float vi = x1[i * lds + c];
            vn[i * ldd + c] = from_f32<T>(vi);
            vd[i * ldd + c] = from_f32<T>(vi * expf(g_last - sg[i]));
            x2[i * lds + c] *= p.scale * expf(sg[i]);
        }
        __syncthreads();

        // O = x2 + P·v'; S ← γ_C·S + Kᵀ·vd.
        for (int c0 = cb; c0 < ce; c0 += 16) {
            FragC acc;
            load_c(acc, x2 + row0 * lds + c0, lds);
#pragma unroll
            for (int s = 0; s < C / 16; ++s) {
                FragA fp;
                FragB fv;
                load_a<T, false>(fp, ps + row0 * ldp + s * 16, ldp);
                load_b<T, false>(fv, vn + s * 16 * ldd + c0, ldd);
                mma<T>(acc, fp, fv);
            }
            store_c(x2 + row0 * lds + c0, acc, lds);
        }
        const float gamma_c = expf(g_last);
        for (int r0 = row0; r0 < K; r0 += C) {
            for (int c0 = cb; c0 < ce; c0 += 16) {
                FragC acc;
                load_c(acc, sf + r0 * lds + c0, lds);
#pragma unroll
                for (int e = 0; e < FragC::num_elements; ++e) acc.x[e] *= gamma_c;
#pragma unroll
                for (int s = 0; s < C / 16; ++s) {
                    FragA fkt;  // Kᵀ: element (r, t) at ks[t·ldk + r]
                    FragB fv;
                    load_a<T, true>(fkt, ks + s * 16 * ldk + r0, ldk);
                    load_b<T, false>(fv, vd + s * 16 * ldd + c0, ldd);
                    mma<T>(acc, fkt, fv);
                }
                store_c(sf + r0 * lds + c0, acc, lds);
            }
        }
        __syncthreads();

        for (int idx = threadIdx.x; idx < C * BV; idx += FWD_THREADS) {
            const int i = idx / BV, c = idx % BV;
            if (i < len && v0 + c < V) {
                o[((size_t)(start + i) * HV + hv) * V + v0 + c] = from_f32<T>(x2[i * lds + c]);
            }
        }
        for (int idx = threadIdx.x; idx < K * BV; idx += FWD_THREADS) {
            const int r = idx / BV, c = idx % BV;
            split_store(sd + r * ldd + c, sdl + r * ldd + c, sf[r * lds + c]);
        }
        __syncthreads();  // before the next chunk overwrites qs, ks, x2
    }

    for (int idx = threadIdx.x; idx < K * BV; idx += FWD_THREADS) {
        const int r = idx / BV, c = idx % BV;
        if (v0 + c < V) h_out[state_at(r, c)] = sf[r * lds + c];
    }
}

}  // namespace chunked
}  // namespace gdn

#define GDN_CHUNK_FWD(SUFFIX, T, BV)                                                               \
    extern "C" __global__ void __launch_bounds__(gdn::chunked::FWD_THREADS)                        \
        gdn_chunk_fwd##BV##_##SUFFIX(const gdn::chunked::ChunkParams p, const int* chunks,          \
                                     const int* seq_chunks, const T* q, const T* k,                 \
                                     const float* ws_g, const T* ws_w, const float* ws_u,               \
                                     const T* ws_p, const float* h_in, T* o, float* h_out) {        \
        gdn::chunked::fwd<T, BV>(p, chunks, seq_chunks, q, k, ws_g, ws_w, ws_u, ws_p, h_in, o,     \
                                 h_out);                                                           \
    }

#define GDN_CHUNKED(SUFFIX, T)                                                                     \
    extern "C" __global__ void __launch_bounds__(gdn::chunked::THREADS)                            \
        gdn_l2norm_##SUFFIX(int rows, int key_dim, const T* q, const T* k, T* qn, T* kn) {         \
        gdn::chunked::l2norm<T>(rows, key_dim, q, k, qn, kn);                                      \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(gdn::chunked::THREADS) gdn_chunk_prep_##SUFFIX(   \
        const gdn::chunked::ChunkParams p, const int* chunks, const T* q, const T* k, const T* v,  \
        const float* g, const float* beta, const float* a_log, const float* dt_bias,               \
        float* ws_g, T* ws_w, float* ws_u, T* ws_p) {                                                  \
        gdn::chunked::prep<T>(p, chunks, q, k, v, g, beta, a_log, dt_bias, ws_g, ws_w, ws_u,       \
                              ws_p);                                                               \
    }                                                                                              \
    GDN_CHUNK_FWD(SUFFIX, T, 32)                                                                   \
    GDN_CHUNK_FWD(SUFFIX, T, 64)

GDN_CHUNKED(f16, __half)
GDN_CHUNKED(bf16, __nv_bfloat16)
