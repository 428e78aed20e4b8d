// The chunked backward's parallel passes (C = 64, f16/bf16 storage, K ≤ 128, V ≤ 128), all
// chunks at once:
//
//   gdn_chunk_bwd_prep_*   (8 warps, a block per (chunk, q/k head, up to 4 v-heads of its group))
//       the forward's prep (chunk.cuh) with the backward's extras:
//       per chunk the decays γ, γ_C/γ, the cumsum G and the activated β (f32), T·diag(β), P, T.
//   gdn_chunk_bwd_grad_*   (16 warps, a block per (chunk, q/k head) walking the v-heads of its
//       GVA group) every per-chunk gradient. Inside the chunk, from dO, v',
//       X, dv' (the chains, chunk_bwd_chain.cuh) and T, P:
//         dP  = dO·v'ᵀ,  dPs = scale·Γ⊙dP (i ≥ j)           dq = dPs·K,  dk = dPsᵀ·Q
//         dA  = dv'·Xᵀ  (A = T·diag(β)):  dβ_j += Σ_i dA_ij T_ij,  dT = dA·diag(β)
//         dL  = −Tᵀ·dT·Tᵀ  (T = (I + L)⁻¹, L = strict_lower(diag(β)·(Γ⊙KKᵀ)))
//         M   = diag(β)·(Γ⊙dL) (i > j):  dβ_i += Σ_j Γ_ij dL_ij (k_i·k_j),  dk += (M + Mᵀ)·K
//         dG  = rowsum(E) − colsum(E) for E = P⊙dP and E = L⊙dL (the Γ masks' gate terms),
//       dβ final (w.r.t. the activated β); then through the chunk's start state S and end-state
//       gradient dS' (both from the chains):
//         dq += scale·diag(γ)·dO·Sᵀ,  dk += −diag(γ)·dX·Sᵀ + diag(γ_C/γ)·v'·dS'ᵀ   (dX = dv)
//         dG_i += q_i·dq_S,i + k_i·dk_X,i − k_i·dk_S,i,
//         dG_last += γ_C·Σ S⊙dS' + Σ_i k_i·dk_S,i,
//       and dg = the reverse cumsum of dG within the chunk (G is a chunk-local cumsum), f32;
//       dq, dk, summed over the group in registers, are written once per q/k head: in the
//       storage dtype, or (l2norm) in f32 for backward.cu's chain rule.
// backward.cu's finishing kernels then take dq, dk through the l2norm (with l2norm_qk only)
// and dβ, dg through the sigmoid and the gate activation (dA_log, ddt_bias).
//
// Every sum has a fixed order (per-thread loops, shuffles, per-warp partials summed in warp
// order), so results are bitwise the same from run to run. Operands of the MMAs are in the
// storage dtype (as the chains stored them), accumulators and every elementwise step f32.
// Tiles are 16×16×16 products on mma.sync with ldmatrix operands from shared memory
// (chunk.cuh's lane_frag_kmajor / _nmajor layouts); each warp takes whole output tiles.

namespace gdn {
namespace chunked {

constexpr int GRAD_THREADS = 512;
constexpr int GRAD_WARPS = GRAD_THREADS / 32;
// The gradient pass's last step: warp w takes row block w % 4 and every GRAD_COLS-th column
// block of C × K from w / 4 on.
constexpr int GRAD_COLS = GRAD_WARPS / 4;
constexpr int MAX_V = 128;

// Operand tiles of a product: the 16×16 block (mb, kb) of A and (kb, nb) of B, row-major
// (element (r, c) at p[r·ld + c]) or column-major (COL: at p[c·ld + r]).
template <bool COL, typename T>
__device__ __forceinline__ const T* a_block(const T* a, int ld, int mb, int kb) {
    return COL ? a + 16 * kb * ld + 16 * mb : a + 16 * mb * ld + 16 * kb;
}
template <bool COL, typename T>
__device__ __forceinline__ const T* b_block(const T* b, int ld, int kb, int nb) {
    return COL ? b + 16 * nb * ld + 16 * kb : b + 16 * kb * ld + 16 * nb;
}

// acc += A(mb, kb)·B(kb, nb) for kb in [kb0, kb1), the fragments' ldmatrix addresses formed
// once per product as 32-bit shared addresses (each step moves them one block along k).
template <typename T, bool ACOL, bool BCOL>
__device__ __forceinline__ void tile_product(FragC& acc, const T* a, int lda, const T* b, int ldb, int mb,
                                             int nb, int kb0, int kb1) {
    static_assert(sizeof(T) == 2, "16-bit operands");
    const int lane = threadIdx.x & 31;
    unsigned pa = smem_addr(a_block<ACOL>(a, lda, mb, kb0) + (ACOL ? lane_frag_nmajor(lane, lda) : lane_frag_kmajor(lane, lda)));
    unsigned pb = smem_addr(b_block<BCOL>(b, ldb, kb0, nb) + (BCOL ? lane_frag_nmajor(lane, ldb) : lane_frag_kmajor(lane, ldb)));
    const unsigned da = 2 * 16 * (ACOL ? lda : 1), db = 2 * 16 * (BCOL ? 1 : ldb);
    for (int kb = kb0; kb < kb1; ++kb, pa += da, pb += db) {
        FragA fa;
        FragB fb;
        if (ACOL) ldsm4_t(fa.x, pa);
        else ldsm4(fa.x, pa);
        if (BCOL) ldsm4(fb.x, pb);
        else ldsm4_t(fb.x, pb);
        mma<T>(acc, fa, fb);
    }
}

// An accumulator's element e: row g + 8·((e & 3) >> 1), column 8·(e >> 2) + 2t + (e & 1).
__device__ __forceinline__ int frag_row(int e) { return ((threadIdx.x & 31) >> 2) + 8 * ((e & 3) >> 1); }
__device__ __forceinline__ int frag_col(int e) { return 8 * (e >> 2) + 2 * (threadIdx.x & 3) + (e & 1); }

// An accumulator, times `factor`, to a row-major 16-bit tile.
template <typename T>
__device__ __forceinline__ void store_c16(T* p, const FragC& f, int ld, float factor) {
#pragma unroll
    for (int e = 0; e < 8; e += 2) {
        *reinterpret_cast<unsigned*>(p + frag_row(e) * ld + frag_col(e)) =
            pack2<T>(factor * f.x[e], factor * f.x[e + 1]);
    }
}

// Lower-triangular 16×16 block number `idx` (0..9) of a C × C matrix: (ti, tj), tj ≤ ti.
__device__ __forceinline__ int2 lower_block(int idx) {
    int ti = 0;
    while ((ti + 1) * (ti + 2) / 2 <= idx) ++ti;
    return make_int2(ti, idx - ti * (ti + 1) / 2);
}

// ---------------------------------------------------------------------------------------------
// The per-chunk gradient pass: inside the chunk, then through its states, in one block so that
// dq, dk and dG are written once (no f32 read-modify-write between two launches) and q, k, dO
// and v' are read once. Shared memory (bytes; mirrored by grad_smem in chunk_bwd_grad.rs):
// q, k, dO (C × K / V, token rows), v'ᵀ (V × C); the intra-chunk room: Xᵀ, dv'ᵀ (V × C), T, P
// and dT (C × C, 16-bit); the state room: Sᵀ, dS'ᵀ (V × K) and dX (C × V, token rows); the
// gates twice (this v-head's and the next one's); the 16×16 blocks' partial sums, the sums. The
// two rooms are apart so that each fills while the other is read: the state room's copies run
// under the intra-chunk products, the next v-head's intra-chunk tiles (and then its dO and v'ᵀ)
// under the state products. dP, dA, dL and KKᵀ stay in the accumulators of the warps that form
// them. Reused as the products free them: Xᵀ's room holds Y = dT·Tᵀ; dv'ᵀ's holds dPs and M + Mᵀ
// (16-bit).
struct GradLayout {
    static constexpr int Q_OFF = 0;
    static constexpr int K_OFF = Q_OFF + 2 * C * LDK;
    static constexpr int DO_OFF = K_OFF + 2 * C * LDK;
    static constexpr int VP_OFF = DO_OFF + 2 * C * LDK;
    static constexpr int X_OFF = VP_OFF + 2 * MAX_V * LDC;  // the intra-chunk room
    static constexpr int DVP_OFF = X_OFF + 2 * MAX_V * LDC;
    static constexpr int T_OFF = DVP_OFF + 2 * MAX_V * LDC;
    static constexpr int P_OFF = T_OFF + 2 * C * LDC;
    static constexpr int DT_OFF = P_OFF + 2 * C * LDC;
    static constexpr int H_OFF = DT_OFF + 2 * C * LDC;  // the state room
    static constexpr int DH_OFF = H_OFF + 2 * MAX_V * LDK;
    static constexpr int DX_OFF = DH_OFF + 2 * MAX_V * LDK;
    static constexpr int G_OFF = DX_OFF + 2 * C * LDK;   // 2 × (γ, γ_C/γ, G, β (activated)): ws_f's order
    static constexpr int G_BYTES = 4 * 4 * C;
    static constexpr int PART_OFF = G_OFF + 2 * G_BYTES;  // 5 × [C / 16][C] block partial sums
    static constexpr int SUM_OFF = PART_OFF + 4 * 5 * (C / 16) * C;  // dG, 2 × GRAD_COLS × C row partials, warp sums
    static constexpr int BYTES = SUM_OFF + 4 * ((1 + 2 * GRAD_COLS) * C + GRAD_WARPS);
    static constexpr int Y_OFF = X_OFF;
    static constexpr int DPS_OFF = DVP_OFF;
    static constexpr int MS_OFF = DVP_OFF + 2 * C * LDC;
    static_assert(2 * 2 * C * LDC <= 2 * MAX_V * LDC, "two C × C tiles fit a V × C tile");
    static_assert(BYTES <= 227 * 1024, "Hopper's shared memory per block");
};

// A 16×16 block's (b = (bi, bj)) partial sums of the accumulator-layout values e: by rows
// (part[bj][16·bi + r]) and by columns (part[bi][16·bj + c]), each in a fixed shuffle order.
__device__ __forceinline__ void block_row_sums(const float (&e)[8], float* part, int2 b) {
    float r0 = (e[0] + e[1]) + (e[4] + e[5]), r1 = (e[2] + e[3]) + (e[6] + e[7]);
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
        r0 += __shfl_xor_sync(0xffffffffu, r0, off);
        r1 += __shfl_xor_sync(0xffffffffu, r1, off);
    }
    const int lane = threadIdx.x & 31, g = lane >> 2;
    if ((lane & 3) == 0) {
        part[b.y * C + 16 * b.x + g] = r0;
        part[b.y * C + 16 * b.x + g + 8] = r1;
    }
}
__device__ __forceinline__ void block_col_sums(const float (&e)[8], float* part, int2 b) {
    float c[4] = {e[0] + e[2], e[1] + e[3], e[4] + e[6], e[5] + e[7]};
#pragma unroll
    for (int off = 4; off < 32; off <<= 1) {
#pragma unroll
        for (int x = 0; x < 4; ++x) c[x] += __shfl_xor_sync(0xffffffffu, c[x], off);
    }
    const int lane = threadIdx.x & 31, t = lane & 3;
    if (lane < 4) {
        float* col = part + b.x * C + 16 * b.y + 2 * t;
        col[0] = c[0];
        col[1] = c[1];
        col[8] = c[2];
        col[9] = c[3];
    }
}

// Two adjacent 16-bit elements (p 4-byte aligned) as f32, and two f32s from an 8-byte aligned p.
template <typename T> __device__ __forceinline__ float2 load2(const T* p) {
    return unpack2<T>(*reinterpret_cast<const unsigned*>(p));
}
__device__ __forceinline__ float2 load2f(const float* p) { return *reinterpret_cast<const float2*>(p); }

template <typename T>
__device__ void bwd_grad(const ChunkParams p, const int* __restrict__ chunks, const T* __restrict__ q,
                         const T* __restrict__ k, const T* __restrict__ d_o, const T* __restrict__ dv,
                         const float* __restrict__ ws_f, const T* __restrict__ ws_p,
                         const T* __restrict__ ws_t, const T* __restrict__ ws_x,
                         const T* __restrict__ ws_vp, const T* __restrict__ ws_dvp,
                         const T* __restrict__ ws_h, const T* __restrict__ ws_dh,
                         float* __restrict__ dq_part, float* __restrict__ dk_part,
                         T* __restrict__ dq_out, T* __restrict__ dk_out,
                         float* __restrict__ dg_part, float* __restrict__ dbeta_part) {
    using L = GradLayout;
    extern __shared__ __align__(128) unsigned char smem[];
    const int K = p.key_dim, V = p.value_dim, H = p.heads_qk, HV = p.heads_v;
    // Blocks numbered q/k head fastest, as the prep's v-heads: neighbouring heads' blocks share
    // their chunk's rows in L2. Each block walks the v-heads of its GVA group, q and k loaded
    // once, dq and dk summed over the group in registers.
    const size_t lin = blockIdx.x + (size_t)blockIdx.y * gridDim.x;
    const int chunk = (int)(lin / H), h = (int)(lin % H);
    const int start = chunks[2 * chunk], len = chunks[2 * chunk + 1];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tid = threadIdx.x;
    const int nk = K / 16, nv = V / 16;

    T* qs = reinterpret_cast<T*>(smem + L::Q_OFF);
    T* ks = reinterpret_cast<T*>(smem + L::K_OFF);
    T* dos = reinterpret_cast<T*>(smem + L::DO_OFF);
    T* vps = reinterpret_cast<T*>(smem + L::VP_OFF);
    T* xs = reinterpret_cast<T*>(smem + L::X_OFF);
    T* dvps = reinterpret_cast<T*>(smem + L::DVP_OFF);
    T* ts = reinterpret_cast<T*>(smem + L::T_OFF);
    T* ps = reinterpret_cast<T*>(smem + L::P_OFF);
    float* part = reinterpret_cast<float*>(smem + L::PART_OFF);  // [C / 16][C] each
    float* part_row_e1 = part;           // Σ_j P_ij dP_ij
    float* part_col_e1 = part + 4 * C;   // Σ_i P_ij dP_ij
    float* part_col_da = part + 8 * C;   // Σ_i dA_ij T_ij
    float* part_row_dl = part + 12 * C;  // Σ_j Γ_ij dL_ij KK_ij
    float* part_col_e2 = part + 16 * C;  // Σ_i β_i Γ_ij dL_ij KK_ij
    float* sums = reinterpret_cast<float*>(smem + L::SUM_OFF);
    float* dg_s = sums;                  // dG
    float* row_g = sums + C;             // [GRAD_COLS][C]: q·dq_S + k·dk_X − k·dk_S by column group
    float* row_s = row_g + GRAD_COLS * C;  // [GRAD_COLS][C]: k·dk_S
    float* warp_s = row_s + GRAD_COLS * C; // [GRAD_WARPS]: Σ S⊙dS' per warp
    T* dts = reinterpret_cast<T*>(smem + L::DT_OFF);
    T* ys = reinterpret_cast<T*>(smem + L::Y_OFF);
    T* dxs = reinterpret_cast<T*>(smem + L::DX_OFF);
    T* dps = reinterpret_cast<T*>(smem + L::DPS_OFF);
    T* ms = reinterpret_cast<T*>(smem + L::MS_OFF);
    T* hs = reinterpret_cast<T*>(smem + L::H_OFF);
    T* dhs = reinterpret_cast<T*>(smem + L::DH_OFF);

    const unsigned s0 = smem_addr(smem);
    const size_t qk_stride = (size_t)H * K;
    const int group = p.group, hv0 = h * group;

    // Start copying v-head hv's tiles of the intra-chunk room and its gates (into buffer `buf`),
    // its dO and v'ᵀ, and its state room (each thread's share fixed by TileRows: whole rows per
    // warp instruction, no division per vector).
    auto copy_intra = [&](int hv, int buf) {
        const size_t ch = (size_t)chunk * HV + hv;
        copy_tile<GRAD_THREADS, C / 8, LDC, MAX_V>(s0 + L::X_OFF, ws_x + ch * V * C, (size_t)C, V, C / 8);
        copy_tile<GRAD_THREADS, C / 8, LDC, MAX_V>(s0 + L::DVP_OFF, ws_dvp + ch * V * C, (size_t)C, V, C / 8);
        if (tid < L::G_BYTES / 16) cp_async16_zfill(s0 + L::G_OFF + buf * L::G_BYTES + 16 * tid, ws_f + ch * 4 * C + 4 * tid, true);
        copy_tile<GRAD_THREADS, C / 8, LDC>(s0 + L::T_OFF, ws_t + ch * C * C, (size_t)C, C, C / 8);
        copy_tile<GRAD_THREADS, C / 8, LDC>(s0 + L::P_OFF, ws_p + ch * C * C, (size_t)C, C, C / 8);
    };
    auto copy_outputs = [&](int hv) {
        const size_t ch = (size_t)chunk * HV + hv;
        copy_tile<GRAD_THREADS, MAX_V / 8, LDK>(s0 + L::DO_OFF, d_o + ((size_t)start * HV + hv) * V, (size_t)HV * V, len, V / 8);
        copy_tile<GRAD_THREADS, C / 8, LDC, MAX_V>(s0 + L::VP_OFF, ws_vp + ch * V * C, (size_t)C, V, C / 8);
    };
    auto copy_states = [&](int hv) {
        const size_t ch = (size_t)chunk * HV + hv;
        copy_tile<GRAD_THREADS, MAX_V / 8, LDK>(s0 + L::DX_OFF, dv + ((size_t)start * HV + hv) * V, (size_t)HV * V, len, V / 8);
        copy_tile<GRAD_THREADS, MAX_K / 8, LDK, MAX_V>(s0 + L::H_OFF, ws_h + ch * V * K, (size_t)K, V, K / 8);
        copy_tile<GRAD_THREADS, MAX_K / 8, LDK, MAX_V>(s0 + L::DH_OFF, ws_dh + ch * V * K, (size_t)K, V, K / 8);
    };

    // Warp w's share of dq, dk (f32, summed over the group's v-heads): row block mb = w % 4,
    // column blocks nb = w / 4 + GRAD_COLS·n of C × K.
    const int mb = warp & 3, col = warp >> 2;
    constexpr int NB = MAX_K / 16 / GRAD_COLS;
    FragC aq[NB], ak[NB];
#pragma unroll
    for (int n = 0; n < NB; ++n) {
        fill_zero(aq[n]);
        fill_zero(ak[n]);
    }

    // The first v-head's tiles, in three groups of copies: what the first products and their
    // epilogues read; q (read from the intra-chunk products on); the state room. Later v-heads'
    // arrive during the one before (below). q and k stay for the group.
    copy_tile<GRAD_THREADS, MAX_K / 8, LDK>(s0 + L::K_OFF, k + ((size_t)start * H + h) * K, qk_stride, len, K / 8);
    copy_intra(hv0, 0);
    copy_outputs(hv0);
    cp_async_commit();
    copy_tile<GRAD_THREADS, MAX_K / 8, LDK>(s0 + L::Q_OFF, q + ((size_t)start * H + h) * K, qk_stride, len, K / 8);
    cp_async_commit();
    copy_states(hv0);
    cp_async_commit();

    for (int hv = hv0; hv < hv0 + group; ++hv) {
        const int i_head = hv - hv0;
        const size_t ch = (size_t)chunk * HV + hv;
        float* gam = reinterpret_cast<float*>(smem + L::G_OFF + (i_head & 1) * L::G_BYTES);
        float* dec = gam + C;
        float* sg = gam + 2 * C;
        float* sb = gam + 3 * C;
        // In flight: this v-head's intra-chunk tiles, dO and v'ᵀ (with k and then q for the first),
        // and its state room.
        if (i_head == 0) cp_async_wait_group<2>();
        else cp_async_wait_group<1>();
        __syncthreads();

        // dA = dv'·Xᵀ, dP = dO·v'ᵀ: their lower 16×16 blocks (i ≥ j; jobs w and w + 16 of warp w,
        // so that a warp forms at most one dP block). From the accumulators: dT = dA·diag(β) and
        // dPs = scale·Γ⊙dP (16-bit, lower with the diagonal; above it zero in the diagonal
        // blocks, the only upper elements read), and the block's partial sums of dA⊙T by columns
        // and of P⊙dP by rows and columns. dPs is held until every warp has read dv'ᵀ, whose room
        // it takes.
        float dps_held[8];
        int2 dps_block = make_int2(-1, -1);
        for (int job = warp; job < 20; job += GRAD_WARPS) {
            const int2 b = lower_block(job % 10);
            const bool is_dp = job >= 10;
            FragC acc;
            fill_zero(acc);
            if (is_dp) tile_product<T, false, false>(acc, dos, LDK, vps, LDC, b.x, b.y, 0, nv);
            else tile_product<T, true, false>(acc, dvps, LDC, xs, LDC, b.x, b.y, 0, nv);
            float e[8];
#pragma unroll
            for (int x = 0; x < 8; x += 2) {
                // Elements x and x + 1: row i, columns j and j + 1.
                const int i = 16 * b.x + frag_row(x), j = 16 * b.y + frag_col(x);
                const bool lo0 = j <= i, lo1 = j + 1 <= i;
                if (is_dp) {
                    const float2 sj = load2f(sg + j), pv = load2<T>(ps + i * LDC + j);
                    dps_held[x] = lo0 ? p.scale * __expf(sg[i] - sj.x) * acc.x[x] : 0.0f;
                    dps_held[x + 1] = lo1 ? p.scale * __expf(sg[i] - sj.y) * acc.x[x + 1] : 0.0f;
                    e[x] = lo0 ? pv.x * acc.x[x] : 0.0f;
                    e[x + 1] = lo1 ? pv.y * acc.x[x + 1] : 0.0f;
                } else {
                    const float2 bj = load2f(sb + j), tv = load2<T>(ts + i * LDC + j);
                    *reinterpret_cast<unsigned*>(dts + i * LDC + j) =
                        pack2<T>(lo0 ? acc.x[x] * bj.x : 0.0f, lo1 ? acc.x[x + 1] * bj.y : 0.0f);
                    e[x] = lo0 ? acc.x[x] * tv.x : 0.0f;
                    e[x + 1] = lo1 ? acc.x[x + 1] * tv.y : 0.0f;
                }
            }
            if (is_dp) {
                dps_block = b;
                block_row_sums(e, part_row_e1, b);
            }
            block_col_sums(e, is_dp ? part_col_e1 : part_col_da, b);
        }
        // (q for the first v-head.)
        cp_async_wait_group<1>();
        __syncthreads();
        if (dps_block.x >= 0) {
#pragma unroll
            for (int x = 0; x < 8; x += 2) {
                const int i = 16 * dps_block.x + frag_row(x), j = 16 * dps_block.y + frag_col(x);
                *reinterpret_cast<unsigned*>(dps + i * LDC + j) = pack2<T>(dps_held[x], dps_held[x + 1]);
            }
        }

        // Y = dT·Tᵀ, lower blocks (the only ones Tᵀ·Y reads below the diagonal): Tᵀ's block (kb, tj)
        // is zero past kb = tj.
        for (int job = warp; job < 10; job += GRAD_WARPS) {
            const int2 b = lower_block(job);
            FragC y;
            fill_zero(y);
            tile_product<T, false, true>(y, dts, LDC, ts, LDC, b.x, b.y, 0, b.y + 1);
            store_c16<T>(ys + 16 * b.x * LDC + 16 * b.y, y, LDC, 1.0f);
        }
        __syncthreads();

        // dL = −Tᵀ·Y, lower blocks (Tᵀ's block (ti, kb) is zero before kb = ti), and beside it the
        // same block of KKᵀ (formed here, where it is read, rather than kept in shared memory).
        // From the accumulators: M = diag(β)·(Γ⊙dL) strictly below the diagonal, stored as M + Mᵀ
        // (16-bit: each element and its transpose; zero on the diagonal), and the block's partial
        // sums of Γ⊙dL⊙KKᵀ by rows (dβ) and of L⊙dL = M⊙KKᵀ by columns (dG).
        for (int job = warp; job < 10; job += GRAD_WARPS) {
            const int2 b = lower_block(job);
            FragC dl, kk;
            fill_zero(dl);
            fill_zero(kk);
            tile_product<T, true, false>(dl, ts, LDC, ys, LDC, b.x, b.y, b.x, C / 16);
            tile_product<T, false, true>(kk, ks, LDK, ks, LDK, b.x, b.y, 0, nk);
            float er[8], ec[8];
#pragma unroll
            for (int x = 0; x < 8; x += 2) {
                // Row i, columns j and j + 1. Below the diagonal (j + 1 ≤ i) both are stored as a
                // pair; at j = i only (i, i), j + 1 being Mᵀ's element (stored by its transpose).
                const int i = 16 * b.x + frag_row(x), j = 16 * b.y + frag_col(x);
                float m[2];
#pragma unroll
                for (int u = 0; u < 2; ++u) {
                    const bool strict = i > j + u;
                    const float gdl = strict ? -dl.x[x + u] * __expf(sg[i] - sg[j + u]) : 0.0f;  // Γ⊙dL
                    m[u] = sb[i] * gdl;
                    er[x + u] = gdl * kk.x[x + u];
                    ec[x + u] = m[u] * kk.x[x + u];
                    if (strict) ms[(j + u) * LDC + i] = from_f32<T>(m[u]);
                }
                if (j + 1 <= i) *reinterpret_cast<unsigned*>(ms + i * LDC + j) = pack2<T>(m[0], m[1]);
                else if (j <= i) ms[i * LDC + j] = from_f32<T>(m[0]);
            }
            block_row_sums(er, part_row_dl, b);
            block_col_sums(ec, part_col_e2, b);
        }
        __syncthreads();

        // dβ (final for the activated β: T·diag(β) and L are its only uses) and dG so far, from
        // the blocks' partial sums in block order: row i's blocks are (i / 16, bj ≤ i / 16),
        // column j's (bi ≥ j / 16, j / 16).
        if (tid < C) {
            const int i = tid, bi = i / 16;
            float row_e1 = 0.0f, row_dl = 0.0f, col_e1 = 0.0f, col_da = 0.0f, col_e2 = 0.0f;
            for (int bj = 0; bj <= bi; ++bj) {
                row_e1 += part_row_e1[bj * C + i];
                row_dl += part_row_dl[bj * C + i];
            }
            for (int bk = bi; bk < C / 16; ++bk) {
                col_e1 += part_col_e1[bk * C + i];
                col_da += part_col_da[bk * C + i];
                col_e2 += part_col_e2[bk * C + i];
            }
            float dgi = 0.0f;
            if (i < len) {
                dbeta_part[(size_t)(start + i) * HV + hv] = col_da + row_dl;
                dgi = row_e1 - col_e1 + sb[i] * row_dl - col_e2;
            }
            dg_s[i] = dgi;
        }

        // First the intra-chunk terms, added in registers: dq += dPs·K, dk += dPsᵀ·Q + (M + Mᵀ)·K.
#pragma unroll
        for (int n = 0; n < NB; ++n) {
            const int nb = col + GRAD_COLS * n;
            if (nb >= nk) continue;
            tile_product<T, false, false>(aq[n], dps, LDC, ks, LDK, mb, nb, 0, mb + 1);
            tile_product<T, true, false>(ak[n], dps, LDC, qs, LDK, mb, nb, mb, C / 16);
            tile_product<T, false, false>(ak[n], ms, LDC, ks, LDK, mb, nb, 0, C / 16);
        }
        // The state room has arrived; the intra-chunk room is read: the next v-head's tiles go
        // there while the state products run.
        cp_async_wait_group<0>();
        __syncthreads();
        const bool more = hv + 1 < hv0 + group;
        if (more) {
            copy_intra(hv + 1, (i_head + 1) & 1);
            cp_async_commit();
        }

        // Then the terms through the states, added to them (dq, dk are written after the group):
        //   dq += scale·diag(γ)·dO·Sᵀ,  dk += −diag(γ)·dX·Sᵀ + diag(γ_C/γ)·v'·dS'ᵀ.
        // The A operands (rows mb of dO, dX, v') are loaded once per kb for the warp's column
        // blocks, Sᵀ's B operand once for dO·Sᵀ and dX·Sᵀ.
        FragC u1[NB], u2[NB], u3[NB];  // dO·Sᵀ, dX·Sᵀ, v'·dS'ᵀ
#pragma unroll
        for (int n = 0; n < NB; ++n) {
            fill_zero(u1[n]);
            fill_zero(u2[n]);
            fill_zero(u3[n]);
        }
        // This lane's shared addresses of block (mb, 0) of dO, dX, v' (column-major) and of
        // block (0, col) of Sᵀ and dS'ᵀ; block kb of A is 16·kb columns (v': rows) on, of B
        // 16·kb rows on, column block nb 16·(nb − col) columns on.
        const unsigned lane_k = 2 * lane_frag_kmajor(lane, LDK);  // the row-major tiles' (ld LDK)
        const unsigned fo0 = smem_addr(dos + 16 * mb * LDK) + lane_k, fx0 = smem_addr(dxs + 16 * mb * LDK) + lane_k;
        const unsigned fv0 = smem_addr(vps + 16 * mb) + 2 * lane_frag_nmajor(lane, LDC);
        const unsigned fs0 = smem_addr(hs + 16 * col) + lane_k, fd0 = smem_addr(dhs + 16 * col) + lane_k;
        for (int kb = 0; kb < nv; ++kb) {
            FragA fo, fx, fv;
            ldsm4(fo.x, fo0 + 2 * 16 * kb);
            ldsm4(fx.x, fx0 + 2 * 16 * kb);
            ldsm4_t(fv.x, fv0 + 2 * 16 * LDC * kb);
#pragma unroll
            for (int n = 0; n < NB; ++n) {
                const int nb = col + GRAD_COLS * n;
                if (nb >= nk) break;
                FragB fs, fd;
                ldsm4_t(fs.x, fs0 + 2 * (16 * LDK * kb + 16 * GRAD_COLS * n));
                ldsm4_t(fd.x, fd0 + 2 * (16 * LDK * kb + 16 * GRAD_COLS * n));
                mma<T>(u1[n], fo, fs);
                mma<T>(u2[n], fx, fs);
                mma<T>(u3[n], fv, fd);
            }
        }
        float rg[2] = {0.0f, 0.0f}, rs[2] = {0.0f, 0.0f};
#pragma unroll
        for (int n = 0; n < NB; ++n) {
            const int nb = col + GRAD_COLS * n;
            if (nb >= nk) break;
#pragma unroll
            for (int e = 0; e < 8; e += 2) {
                const int i = 16 * mb + frag_row(e), c = 16 * nb + frag_col(e);
                const float gi = gam[i], di = dec[i];
                const float2 q2 = load2<T>(qs + i * LDK + c), k2 = load2<T>(ks + i * LDK + c);
#pragma unroll
                for (int x = 0; x < 2; ++x) {
                    const float dqs = p.scale * gi * u1[n].x[e + x];  // dq through S
                    const float dkx = -gi * u2[n].x[e + x];           // dk through X
                    const float dks = di * u3[n].x[e + x];            // dk through the state update
                    const float qv = x ? q2.y : q2.x, kv = x ? k2.y : k2.x;
                    rg[(e & 3) >> 1] += qv * dqs + kv * dkx - kv * dks;
                    rs[(e & 3) >> 1] += kv * dks;
                    aq[n].x[e + x] += dqs;
                    ak[n].x[e + x] += dkx + dks;
                }
            }
        }
        // Row partials over the four lanes of a row, then per column group.
#pragma unroll
        for (int r = 0; r < 2; ++r) {
#pragma unroll
            for (int off = 1; off < 4; off <<= 1) {
                rg[r] += __shfl_xor_sync(0xffffffffu, rg[r], off);
                rs[r] += __shfl_xor_sync(0xffffffffu, rs[r], off);
            }
        }
        if ((lane & 3) == 0) {
            const int i = 16 * mb + (lane >> 2);
            row_g[col * C + i] = rg[0];
            row_g[col * C + i + 8] = rg[1];
            row_s[col * C + i] = rs[0];
            row_s[col * C + i + 8] = rs[1];
        }
        // Σ S⊙dS' over the V × K state: thread t takes the element pairs t + GRAD_THREADS·u (row r,
        // column c), stepped without a division per pair.
        float sd = 0.0f;
        {
            const int step_r = 2 * GRAD_THREADS / K, step_c = 2 * GRAD_THREADS % K;
            int r = 2 * tid / K, c = 2 * tid % K;
            while (r < V) {
                const float2 a = load2<T>(hs + r * LDK + c), b = load2<T>(dhs + r * LDK + c);
                sd = fmaf(a.x, b.x, fmaf(a.y, b.y, sd));
                r += step_r;
                c += step_c;
                if (c >= K) {
                    c -= K;
                    ++r;
                }
            }
        }
        sd = warp_sum(sd);
        if (lane == 0) warp_s[warp] = sd;
        __syncthreads();
        // dO, v'ᵀ and the state room are read: the next v-head's go there while warp 0 finishes dG.
        if (more) {
            copy_outputs(hv + 1);
            cp_async_commit();
            copy_states(hv + 1);
            cp_async_commit();
        }

        // dG, its last-token terms, and the reverse cumsum within the chunk, by warp 0 (lane l
        // holds tokens 2l and 2l + 1; sums by fixed shuffle trees):
        //   dG_i += q_i·dq_S,i + k_i·dk_X,i − k_i·dk_S,i,  dG_last += γ_C·Σ S⊙dS' + Σ_i k_i·dk_S,i;
        // dg = the reverse cumsum of dG (G is a chunk-local cumsum), f32.
        static_assert(C == 64 && GRAD_WARPS <= 32, "two tokens per lane, a warp sum per lane");
        if (warp == 0 && len > 0) {
            const float total = warp_sum(lane < GRAD_WARPS ? warp_s[lane] : 0.0f);
            float x[2], ls = 0.0f;
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int i = 2 * lane + r;
                float xi = dg_s[i];
#pragma unroll
                for (int c = 0; c < GRAD_COLS; ++c) {
                    xi += row_g[c * C + i];
                    ls += row_s[c * C + i];
                }
                x[r] = i < len ? xi : 0.0f;
            }
            const float last = gam[C - 1] * total + warp_sum(ls);
            // Suffix sums over the lanes of the pairs' sums: the lanes after this one.
            float suffix = x[0] + x[1];
#pragma unroll
            for (int off = 1; off < 32; off <<= 1) {
                const float o = __shfl_down_sync(0xffffffffu, suffix, off);
                if (lane + off < 32) suffix += o;
            }
            float after = __shfl_down_sync(0xffffffffu, suffix, 1);
            if (lane == 31) after = 0.0f;
            const float d1 = last + (after + x[1]), d0 = last + ((after + x[1]) + x[0]);
            const size_t at = (size_t)(start + 2 * lane) * HV + hv;
            if (2 * lane < len) dg_part[at] = d0;
            if (2 * lane + 1 < len) dg_part[at + HV] = d1;
        }
    }  // v-heads of the group

    // dq, dk of this q/k head's rows of the chunk: in the storage dtype (dq_out, dk_out: no
    // chain rule follows) or f32 for backward.cu's l2norm finish.
#pragma unroll
    for (int n = 0; n < NB; ++n) {
        const int nb = col + GRAD_COLS * n;
        if (nb >= nk) break;
#pragma unroll
        for (int e = 0; e < 8; e += 2) {
            const int i = 16 * mb + frag_row(e), c = 16 * nb + frag_col(e);
            if (i >= len) continue;
            const size_t at = ((size_t)(start + i) * H + h) * K + c;
            if (dq_out != nullptr) {
                *reinterpret_cast<unsigned*>(dq_out + at) = pack2<T>(aq[n].x[e], aq[n].x[e + 1]);
                *reinterpret_cast<unsigned*>(dk_out + at) = pack2<T>(ak[n].x[e], ak[n].x[e + 1]);
            } else {
                *reinterpret_cast<float2*>(dq_part + at) = make_float2(aq[n].x[e], aq[n].x[e + 1]);
                *reinterpret_cast<float2*>(dk_part + at) = make_float2(ak[n].x[e], ak[n].x[e + 1]);
            }
        }
    }
}

}  // namespace chunked
}  // namespace gdn

#define GDN_CHUNK_BWD_GRAD(SUFFIX, T)                                                               \
    extern "C" __global__ void __launch_bounds__(gdn::chunked::PREP_THREADS, gdn::chunked::PREP_BLOCKS) gdn_chunk_bwd_prep_##SUFFIX( \
        const gdn::chunked::ChunkParams p, const int* chunks, const T* q, const T* k,              \
        const float* g, const float* beta, const float* a_log, const float* dt_bias, float* ws_f,  \
        T* ws_a, T* ws_p, T* ws_t) {                                                               \
        gdn::chunked::prep<T, true>(p, chunks, q, k, g, beta, a_log, dt_bias, ws_f, ws_a, ws_p, ws_t); \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(gdn::chunked::GRAD_THREADS, 1)                    \
        gdn_chunk_bwd_grad_##SUFFIX(const gdn::chunked::ChunkParams p, const int* chunks, const T* q, \
                                    const T* k, const T* d_o, const T* dv, const float* ws_f,      \
                                    const T* ws_p, const T* ws_t, const T* ws_x, const T* ws_vp,   \
                                    const T* ws_dvp, const T* ws_h, const T* ws_dh, float* dq_part, \
                                    float* dk_part, T* dq_out, T* dk_out, float* dg_part,          \
                                    float* dbeta_part) {                                           \
        gdn::chunked::bwd_grad<T>(p, chunks, q, k, d_o, dv, ws_f, ws_p, ws_t, ws_x, ws_vp, ws_dvp,  \
                                  ws_h, ws_dh, dq_part, dk_part, dq_out, dk_out, dg_part,          \
                                  dbeta_part);                                                     \
    }

GDN_CHUNK_BWD_GRAD(f16, __half)
GDN_CHUNK_BWD_GRAD(bf16, __nv_bfloat16)
