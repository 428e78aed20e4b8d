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
// (chunk.cuh's load_a / load_b); each warp takes whole output tiles.

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

// acc += A(mb, kb)·B(kb, nb) for kb in [kb0, kb1).
template <typename T, bool ACOL, bool BCOL>
__device__ __forceinline__ void tile_product(FragC& acc, const T* a, int lda, const T* b, int ldb, int mb,
                                             int nb, int kb0, int kb1) {
    for (int kb = kb0; kb < kb1; ++kb) {
        FragA fa;
        FragB fb;
        load_a<T, ACOL>(fa, a_block<ACOL>(a, lda, mb, kb), lda);
        load_b<T, BCOL>(fb, b_block<BCOL>(b, ldb, kb, nb), ldb);
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

// Start copying `rows` rows of `vecs` 16-byte vectors (global rows `stride` elements apart)
// to a shared tile at byte address dst with rows `ld` elements apart, by the whole block; rows
// from `valid` on are zeros (their source is not read).
template <typename E>
__device__ __forceinline__ void copy_rows(unsigned dst, const E* src, size_t stride, int rows, int valid,
                                          int vecs, int ld) {
    for (int idx = threadIdx.x; idx < rows * vecs; idx += GRAD_THREADS) {
        const int r = idx / vecs, c = idx % vecs;
        const bool ok = r < valid;
        cp_async16_zfill(dst + 2 * (r * ld + 8 * c), src + (size_t)(ok ? r : 0) * stride + 8 * c, ok);
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
// q, k, dO (C × K / V, token rows), v'ᵀ, Xᵀ, dv'ᵀ (V × C), T, P (C × C, 16-bit), three f32
// C × C tiles (dP, dA then dL, KKᵀ), the gates, the sums. Reused as the products free them:
// Xᵀ's room holds dT and Y = dT·Tᵀ, then dX (C × V, token rows); dv'ᵀ's holds dPs and M + Mᵀ
// (16-bit); T, P and the f32 tiles hold Sᵀ and dS'ᵀ (V × K), whose copies overlap the
// intra-chunk products of dq and dk.
struct GradLayout {
    static constexpr int Q_OFF = 0;
    static constexpr int K_OFF = Q_OFF + 2 * C * LDK;
    static constexpr int DO_OFF = K_OFF + 2 * C * LDK;
    static constexpr int VP_OFF = DO_OFF + 2 * C * LDK;
    static constexpr int X_OFF = VP_OFF + 2 * MAX_V * LDC;
    static constexpr int DVP_OFF = X_OFF + 2 * MAX_V * LDC;
    static constexpr int T_OFF = DVP_OFF + 2 * MAX_V * LDC;
    static constexpr int P_OFF = T_OFF + 2 * C * LDC;
    static constexpr int DP_OFF = P_OFF + 2 * C * LDC;
    static constexpr int DA_OFF = DP_OFF + 4 * C * LDF;
    static constexpr int KK_OFF = DA_OFF + 4 * C * LDF;
    static constexpr int G_OFF = KK_OFF + 4 * C * LDF;  // γ, γ_C/γ, G, β (activated): ws_f's order
    static constexpr int SUM_OFF = G_OFF + 4 * 4 * C;   // 5 × C sums, dG, 2 × GRAD_COLS × C row partials, warp sums
    static constexpr int BYTES = SUM_OFF + 4 * ((6 + 2 * GRAD_COLS) * C + GRAD_WARPS);
    // Reused after the first products.
    static constexpr int DT_OFF = X_OFF;
    static constexpr int Y_OFF = X_OFF + 2 * C * LDC;
    static constexpr int DX_OFF = X_OFF;
    static constexpr int DPS_OFF = DVP_OFF;
    static constexpr int MS_OFF = DVP_OFF + 2 * C * LDC;
    static constexpr int H_OFF = T_OFF;
    static constexpr int DH_OFF = H_OFF + 2 * MAX_V * LDK;
    static_assert(2 * 2 * C * LDC <= 2 * MAX_V * LDC, "two C × C tiles fit a V × C tile");
    static_assert(2 * C * LDK <= 2 * MAX_V * LDC, "dX fits Xᵀ's room");
    static_assert(DH_OFF + 2 * MAX_V * LDK <= G_OFF, "Sᵀ and dS'ᵀ fit T, P and the f32 tiles");
};

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
    float* dp = reinterpret_cast<float*>(smem + L::DP_OFF);
    float* da = reinterpret_cast<float*>(smem + L::DA_OFF);  // later dL
    float* kk = reinterpret_cast<float*>(smem + L::KK_OFF);
    float* gam = reinterpret_cast<float*>(smem + L::G_OFF);
    float* dec = gam + C;
    float* sg = gam + 2 * C;
    float* sb = gam + 3 * C;
    float* sums = reinterpret_cast<float*>(smem + L::SUM_OFF);
    float* row_e1 = sums;          // Σ_j P_ij dP_ij
    float* col_e1 = sums + C;      // Σ_i P_ij dP_ij
    float* col_da = sums + 2 * C;  // Σ_i dA_ij T_ij
    float* row_dl = sums + 3 * C;  // Σ_j Γ_ij dL_ij KK_ij
    float* col_e2 = sums + 4 * C;  // Σ_i β_i Γ_ij dL_ij KK_ij
    float* dg_s = sums + 5 * C;    // dG
    float* row_g = sums + 6 * C;   // [GRAD_COLS][C]: q·dq_S + k·dk_X − k·dk_S by column group
    float* row_s = row_g + GRAD_COLS * C;      // [GRAD_COLS][C]: k·dk_S
    float* warp_s = row_s + GRAD_COLS * C;     // [GRAD_WARPS]: Σ S⊙dS' per warp
    T* dts = reinterpret_cast<T*>(smem + L::DT_OFF);
    T* ys = reinterpret_cast<T*>(smem + L::Y_OFF);
    T* dxs = reinterpret_cast<T*>(smem + L::DX_OFF);
    T* dps = reinterpret_cast<T*>(smem + L::DPS_OFF);
    T* ms = reinterpret_cast<T*>(smem + L::MS_OFF);
    T* hs = reinterpret_cast<T*>(smem + L::H_OFF);
    T* dhs = reinterpret_cast<T*>(smem + L::DH_OFF);

    const unsigned s0 = smem_addr(smem);
    const size_t qk_stride = (size_t)H * K;

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

    for (int hv = h * p.group; hv < (h + 1) * p.group; ++hv) {
        const size_t ch = (size_t)chunk * HV + hv;
        const bool first_head = hv == h * p.group;
        // The previous v-head's last readers of the tiles refilled below are done.
        if (!first_head) __syncthreads();
        // Two groups of copies: the first products' operands, then q, T and P (read from the
        // step after), which arrive while the first products run. q and k stay for the group.
        if (first_head) copy_rows(s0 + L::K_OFF, k + ((size_t)start * H + h) * K, qk_stride, C, len, K / 8, LDK);
        copy_rows(s0 + L::DO_OFF, d_o + ((size_t)start * HV + hv) * V, (size_t)HV * V, C, len, V / 8, LDK);
        copy_rows(s0 + L::VP_OFF, ws_vp + ch * V * C, (size_t)C, V, V, C / 8, LDC);
        copy_rows(s0 + L::X_OFF, ws_x + ch * V * C, (size_t)C, V, V, C / 8, LDC);
        copy_rows(s0 + L::DVP_OFF, ws_dvp + ch * V * C, (size_t)C, V, V, C / 8, LDC);
        if (tid < 4 * C / 4) cp_async16_zfill(s0 + L::G_OFF + 16 * tid, ws_f + ch * 4 * C + 4 * tid, true);
        cp_async_commit();
        if (first_head) copy_rows(s0 + L::Q_OFF, q + ((size_t)start * H + h) * K, qk_stride, C, len, K / 8, LDK);
        copy_rows(s0 + L::T_OFF, ws_t + ch * C * C, (size_t)C, C, C, C / 8, LDC);
        copy_rows(s0 + L::P_OFF, ws_p + ch * C * C, (size_t)C, C, C, C / 8, LDC);
        cp_async_commit();
        cp_async_wait_group<1>();
        __syncthreads();

        // dP = dO·v'ᵀ, dA = dv'·Xᵀ, KKᵀ: their lower 16×16 blocks (i ≥ j), f32.
        for (int job = warp; job < 30; job += GRAD_WARPS) {
            const int2 b = lower_block(job % 10);
            FragC acc;
            fill_zero(acc);
            float* out;
            if (job < 10) {
                tile_product<T, false, false>(acc, dos, LDK, vps, LDC, b.x, b.y, 0, nv);
                out = dp;
            } else if (job < 20) {
                tile_product<T, true, false>(acc, dvps, LDC, xs, LDC, b.x, b.y, 0, nv);
                out = da;
            } else {
                tile_product<T, false, true>(acc, ks, LDK, ks, LDK, b.x, b.y, 0, nk);
                out = kk;
            }
            store_c(out + 16 * b.x * LDF + 16 * b.y, acc, LDF);
        }
        cp_async_wait();
        __syncthreads();

        // dPs = scale·Γ⊙dP and dT = dA·diag(β) (lower, with the diagonal; zero above); the sums of
        // P⊙dP by rows and columns and of dA⊙T by columns.
        for (int idx = tid; idx < C * C; idx += GRAD_THREADS) {
            const int i = idx / C, j = idx % C;
            const bool lower = j <= i;
            const float gm = lower ? __expf(sg[i] - sg[j]) : 0.0f;
            dps[i * LDC + j] = from_f32<T>(lower ? p.scale * gm * dp[i * LDF + j] : 0.0f);
            dts[i * LDC + j] = from_f32<T>(lower ? da[i * LDF + j] * sb[j] : 0.0f);
        }
        // Two lanes per sum (every other term each, then added by a shuffle).
        static_assert(GRAD_THREADS >= 2 * 3 * C, "two lanes for each of the 3·C sums");
        if (tid < 2 * 3 * C) {
            const int which = tid / (2 * C), o = (tid % (2 * C)) >> 1, part = tid & 1;
            float acc = 0.0f;
            if (which == 0) {
                for (int j = part; j <= o; j += 2) acc = fmaf(to_f32(ps[o * LDC + j]), dp[o * LDF + j], acc);
            } else if (which == 1) {
                for (int i = o + part; i < C; i += 2) acc = fmaf(to_f32(ps[i * LDC + o]), dp[i * LDF + o], acc);
            } else {
                for (int i = o + part; i < C; i += 2) acc = fmaf(da[i * LDF + o], to_f32(ts[i * LDC + o]), acc);
            }
            acc += __shfl_xor_sync(0xffffffffu, acc, 1);
            if (part == 0) sums[which * C + o] = acc;  // row_e1, col_e1, col_da
        }
        __syncthreads();

        // Y = dT·Tᵀ, lower blocks (the only ones Tᵀ·Y reads below the diagonal): Tᵀ's block (kb, tj)
        // is zero past kb = tj.
        for (int job = warp; job < 10; job += GRAD_WARPS) {
            const int2 b = lower_block(job);
            FragC acc;
            fill_zero(acc);
            tile_product<T, false, true>(acc, dts, LDC, ts, LDC, b.x, b.y, 0, b.y + 1);
            store_c16<T>(ys + 16 * b.x * LDC + 16 * b.y, acc, LDC, 1.0f);
        }
        __syncthreads();

        // dL = −Tᵀ·Y, lower blocks: Tᵀ's block (ti, kb) is zero before kb = ti.
        for (int job = warp; job < 10; job += GRAD_WARPS) {
            const int2 b = lower_block(job);
            FragC acc;
            fill_zero(acc);
            tile_product<T, true, false>(acc, ts, LDC, ys, LDC, b.x, b.y, b.x, C / 16);
#pragma unroll
            for (int e = 0; e < 8; ++e) acc.x[e] = -acc.x[e];
            store_c(da + 16 * b.x * LDF + 16 * b.y, acc, LDF);
        }
        __syncthreads();

        // dX (dv as the dh pass wrote it) to Xᵀ's room, free now that Y is read: its copy runs
        // under the next step.
        copy_rows(s0 + L::DX_OFF, dv + ((size_t)start * HV + hv) * V, (size_t)HV * V, C, len, V / 8, LDK);

        // M = diag(β)·(Γ⊙dL) strictly below the diagonal, as M + Mᵀ (16-bit); the row sums of
        // Γ⊙dL⊙KKᵀ (dβ) and the column sums of L⊙dL = M⊙KKᵀ (dG).
        for (int idx = tid; idx < C * C; idx += GRAD_THREADS) {
            const int i = idx / C, j = idx % C;
            float m = 0.0f;
            if (i > j) m = sb[i] * da[i * LDF + j] * __expf(sg[i] - sg[j]);
            if (i < j) m = sb[j] * da[j * LDF + i] * __expf(sg[j] - sg[i]);
            ms[i * LDC + j] = from_f32<T>(m);
        }
        // Four lanes per sum (every fourth term each, then added by shuffles).
        static_assert(GRAD_THREADS >= 4 * 2 * C, "four lanes for each of the 2·C sums");
        if (tid < 4 * 2 * C) {
            const int which = tid / (4 * C), o = (tid % (4 * C)) >> 2, part = tid & 3;
            float acc = 0.0f;
            if (which == 0) {
                for (int j = part; j < o; j += 4) acc = fmaf(da[o * LDF + j] * __expf(sg[o] - sg[j]), kk[o * LDF + j], acc);
            } else {
                for (int i = o + 1 + part; i < C; i += 4) acc = fmaf(sb[i] * da[i * LDF + o] * __expf(sg[i] - sg[o]), kk[i * LDF + o], acc);
            }
            acc += __shfl_xor_sync(0xffffffffu, acc, 1);
            acc += __shfl_xor_sync(0xffffffffu, acc, 2);
            if (part == 0) (which == 0 ? row_dl : col_e2)[o] = acc;
        }
        __syncthreads();

        // Sᵀ and dS'ᵀ to the room of T, P and the f32 tiles (all read now); their copies run under
        // the intra-chunk products below.
        copy_rows(s0 + L::H_OFF, ws_h + ch * V * K, (size_t)K, V, V, K / 8, LDK);
        copy_rows(s0 + L::DH_OFF, ws_dh + ch * V * K, (size_t)K, V, V, K / 8, LDK);

        // dβ (final for the activated β: T·diag(β) and L are its only uses) and dG so far.
        if (tid < C) {
            const int i = tid;
            float dgi = 0.0f;
            if (i < len) {
                dbeta_part[(size_t)(start + i) * HV + hv] = col_da[i] + row_dl[i];
                dgi = row_e1[i] - col_e1[i] + sb[i] * row_dl[i] - col_e2[i];
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
        cp_async_wait();
        __syncthreads();

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
        for (int kb = 0; kb < nv; ++kb) {
            FragA fo, fx, fv;
            load_a<T, false>(fo, a_block<false>(dos, LDK, mb, kb), LDK);
            load_a<T, false>(fx, a_block<false>(dxs, LDK, mb, kb), LDK);
            load_a<T, true>(fv, a_block<true>(vps, LDC, mb, kb), LDC);
#pragma unroll
            for (int n = 0; n < NB; ++n) {
                const int nb = col + GRAD_COLS * n;
                if (nb >= nk) break;
                FragB fs, fd;
                load_b<T, false>(fs, b_block<false>(hs, LDK, kb, nb), LDK);
                load_b<T, false>(fd, b_block<false>(dhs, LDK, kb, nb), LDK);
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
#pragma unroll
                for (int x = 0; x < 2; ++x) {
                    const float dqs = p.scale * gi * u1[n].x[e + x];  // dq through S
                    const float dkx = -gi * u2[n].x[e + x];           // dk through X
                    const float dks = di * u3[n].x[e + x];            // dk through the state update
                    const float qv = to_f32(qs[i * LDK + c + x]), kv = to_f32(ks[i * LDK + c + x]);
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
        // Σ S⊙dS' over the V × K state.
        float sd = 0.0f;
        for (int idx = tid; idx < V * K / 2; idx += GRAD_THREADS) {
            const int r = (2 * idx) / K, c = (2 * idx) % K;
            const float2 a = unpack2<T>(*reinterpret_cast<const unsigned*>(hs + r * LDK + c));
            const float2 b = unpack2<T>(*reinterpret_cast<const unsigned*>(dhs + r * LDK + c));
            sd = fmaf(a.x, b.x, fmaf(a.y, b.y, sd));
        }
        sd = warp_sum(sd);
        if (lane == 0) warp_s[warp] = sd;
        __syncthreads();

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
