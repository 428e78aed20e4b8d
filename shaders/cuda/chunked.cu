// The chunked GDN forward (C = 64) on tensor cores, for f16/bf16 storage.
//
//   gdn_l2norm_*     (optional) q̂ = q / sqrt(Σq² + eps), k̂ likewise, rounded to the storage
//                    dtype (as FLA's separate l2norm kernel does); the passes below read q̂, k̂.
//   gdn_chunk_prep_* one block (8 warps) per (chunk, q/k head, part of its GVA group of at most
//                    4 v-heads), fully parallel: KKᵀ and QKᵀ once, then per v-head the gate
//                    activation and β transform, chunk-local cumsum G (f32, padded with the
//                    last valid value), L = strict_lower(diag(β)·(Γ⊙KKᵀ)), T = (I + L)⁻¹ (f32, 16×16
//                    blocks: forward substitution on the diagonal, block products below it),
//                    stored to a workspace in the storage dtype (MMA operands): T·diag(β) and
//                    P = scale·(Γ⊙QKᵀ) (i ≥ j); and the decays γ = e^G, γ_C/γ in f32.
//   gdn_chunk_fwd{32,64,128}_*
//                    one block per (V-block, v-head, unit), sequential over the unit's chunks,
//                    the f32 state in registers, a warp pair (V-blocks 32, 64) or a warp (128)
//                    per 16 state columns; per chunk
//                      X = V − diag(γ)·K·S,  v' = T·diag(β)·X   (= FLA's U − W·S),
//                      O = scale·diag(γ)·Q·S + P·v',
//                      S ← γ_C·S + Kᵀ·(diag(γ_C/γ)·v').
//                    A unit is a sequence, or with sequence parallelism a segment of one: then
//                    a local pass of the same kernel (LOCAL_PASS) gives each segment's end state
//                    from zero, E, and its transition M (S_end = M·S_start + E), chunk_combine.cu
//                    chains them into every segment's exact start state, and the main pass runs
//                    the segments from those (src/cuda_backend/chunked.rs decides). With the
//                    gate-driven window (segment_window.cu) a windowed (segment, v-head)'s
//                    local pass runs only its last n chunks and has no transition.
//   gdn_chunk_fwd{32,64}r_*
//                    the main pass with split roles (fwd_roles below): per 16 columns a state
//                    warp runs the chain, an output warp forms o and issues the copies.
//   gdn_chunk_fwd64w_*
//                    the same roles on Hopper warpgroup MMAs (sm_90a; fwd_wgmma below): a
//                    warpgroup runs the chain for 64 columns, a warpgroup forms o.
//
// Decisions and why:
// - FLA's gated T (not FlashQLA's gate-free A): no gate work on the T operand in the
//   sequential pass, and every exponent is a difference G_i − G_j (i ≥ j), G_last − G_i or G_i
//   of chunk-local cumsums: never positive (§7.2). Padded rows have β = 0, zero k and v rows
//   and the last valid G, so their T·diag(β) columns, v' rows and state contributions are
//   exactly zero.
// - W = T·diag(βγ)·K and U = T·diag(β)·V are never formed (FlashQLA's trick): v' comes from
//   X = V − diag(γ)·K·S, one more 64×64 product per chunk instead of writing and reading back
//   W and U (1.5 GiB at 16/64 × 32768); X is rounded to the storage dtype as an operand.
// - 16×16×16 tiles of mma.sync m16n8k16 (operands by ldmatrix) with f32 accumulators: the
//   same source runs on sm_80 and sm_90a (gdn_chunk_fwd64w is the wgmma variant). Operands (q, k, v, T·diag(β),
//   P, X, v', the state) are in the storage dtype, as in FLA; the inverse, the cumsum and every
//   accumulator are f32.
// - The output stays in the sequential pass (not FLA's separate output kernel): with the
//   state in registers it costs MMAs but no barrier, while a separate pass would write and
//   read back the per-chunk states and v' (1.5 GiB more traffic at 16/64 × 32768).
// - The sequential pass keeps each warp's state columns transposed in accumulator registers
//   (see fwd below): no shared-memory round trip of the state, one block barrier per chunk,
//   the next chunk's tiles copied by cp.async while this one computes. The chain is latency
//   bound (one warp per scheduler at 16/64 heads × one sequence, 19 % of cycles issuing on
//   the H200), so at V-blocks 32 and 64 two warps share 16 columns, each with half the
//   state's K rows: half of K·S, Q·S and the state update each, the partial K·S (both
//   warps) and Q·S (the warp that writes o) summed through shared memory after a barrier of
//   the pair; X, v' are computed by both (the same sums in the same order: the same bits). With SPLIT_STATE the
//   state enters K·S and Q·S as S_hi + S_lo (twice those MMAs, no rounding of the state;
//   measured on the H200 it did not change the error, so it is off by default).
// - Chunks never cross a sequence boundary: the host's chunk table gives each chunk's first
//   token and length, and the unit table each unit's chunks, sequence and first/last flags.
// - Shared-memory strides are fixed (MAX_K wide tiles whatever K is), so every tile offset is
//   a compile-time constant and each lane computes its ldmatrix addresses once.
// - Limits: K ≤ 128 (registers and shared memory); f32 storage and K = 256 use the recurrent
//   kernel (src/cuda_backend/chunked.rs decides per call).
// - The tile helpers, constants and the prep pass live in chunk.cuh (compiled before this
//   file), which the chunked backward shares.
namespace gdn {
namespace chunked {

// stmatrix (sm_90) for the o staging tile; sm_80 stores the elements one by one.
#if !defined(GDN_STMATRIX)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define GDN_STMATRIX 1
#else
#define GDN_STMATRIX 0
#endif
#endif

constexpr int THREADS = 128;  // l2norm: 4 warps, a row each
constexpr int LDO = STAGE_LD;  // a warp's o staging tile (pass 2)

// Option bit of the chunked passes only (src/cuda_backend/chunked.rs SPLIT_STATE).
constexpr int SPLIT_STATE = 1 << 8;

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
// Pass 2: per (V-block, v-head, unit), sequential over the unit's chunks. A unit is a whole
// sequence, or with sequence parallelism one segment of it (the host's unit table).
//
// Warp w (KS = 1) or warp pair w (KS = 2, each warp half the state's K rows) owns the 16
// state columns col0 + 16w.. of the block and everything computed from them, in the
// transposed orientation (columns as the MMA's M dimension), so that every
// accumulator is already the A operand of the next product (FlashAttention's P·V trick):
//   Sᵀ (16 × K, f32)   the state's accumulators; rounded to the storage dtype they are the
//                      A operand of (K·S)ᵀ = Sᵀ·Kᵀ and of (Q·S)ᵀ = Sᵀ·Qᵀ,
//   Xᵀ (16 × C)        Vᵀ − (K·S)ᵀ·diag(γ), rounded: the A operand of v'ᵀ = Xᵀ·(T·diag(β))ᵀ,
//   v'ᵀ (16 × C, f32)  rounded, the A operand of Oᵀ += v'ᵀ·Pᵀ; decayed by γ_C/γ and rounded,
//                      of Sᵀ ← γ_C·Sᵀ + vdᵀ·K.
// The state never leaves registers; K, V, T·diag(β), Q, P and the decays are shared B
// operands (or addends), copied in by cp.async one chunk ahead (two stages), so the chunk
// step has one block barrier. Each product loads its B fragments in a batch before its MMAs:
// with one warp per scheduler there is no other warp to hide a load's latency.

// The unit table's flags (src/cuda_backend/chunked.rs mirrors them).
constexpr int UNIT_FIRST = 1;  // the unit starts its sequence: its state is h0 (or 0)
constexpr int UNIT_LAST = 2;   // the unit ends its sequence: its end state is the final state

// Option bit of pass 2 only: the segments' local pass. Each unit starts from zero (the v
// columns: its end state E) and from the identity with V = 0 (the K extra columns past the
// v-blocks: its transition M, S_end = M·S_start + E); no output, and the unit that ends its
// sequence is skipped (nobody reads its E and M).
constexpr int LOCAL_PASS = 1 << 9;


// Pass 2's layout (byte offsets; mirrored by fwd_smem in chunked.rs): two stages (chunk.cuh's
// StageLayout; the local pass has no q and P). After the two stages (of either pass): with
// KS = 1 one C × 16 staging tile of o per warp; with KS = 2 (the state's K rows split over a
// pair of warps) per pair the two warps' f32 (K·S)ᵀ partial sums and one (Q·S)ᵀ partial, whose
// slot is then the o staging tile of the warp that writes o.
template <int BV, int KS> struct FwdLayout : StageLayout<BV> {
    static constexpr int LOCAL_STAGE = StageLayout<BV>::SHORT_STAGE;
    static constexpr int MAIN_STAGE = StageLayout<BV>::FULL_STAGE;
    static constexpr int COL_WARPS = BV / 16;  // warps across the block's columns
    static constexpr int WARPS = KS * COL_WARPS;
    static constexpr int THREADS = 32 * WARPS;
    static constexpr int PART = 4 * C * 16;  // bytes of one warp's f32 C × 16 partial sum
    static constexpr int PAIR = 3 * PART;    // KS = 2: two (K·S)ᵀ partials, one (Q·S)ᵀ
    static_assert(KS == 1 || KS == 2, "one warp or a pair per 16 state columns");
    static_assert(PART >= 2 * C * LDO, "the o staging tile fits a partial's slot");
};

// The chunk step's pieces that fwd and fwd_roles share (the same products on the same operands
// in the same order: either kernel gives the same bits).

// acc[0..7] += Sᵀ·Bᵀ over the state's 16-row blocks kb < nkw (B's K columns from block kb0 +
// kb), B = k or q (C × K, token rows; bt: the lane's ldmatrix address of the stage's tile);
// frag(kb, rest) is block kb of the state as an A operand, `parts` of them (2: SPLIT_STATE's
// S_hi + S_lo; a constant at every call, so the loop is straight-line code).
template <typename T, int KBW, typename Frag>
__device__ __forceinline__ void state_times_b(float (&acc)[C / 8][4], unsigned bt, int kb0, int nkw,
                                              int parts, Frag frag) {
#pragma unroll
    for (int kb = 0; kb < KBW; ++kb) {
        if (kb < nkw) {
            unsigned fb[C / 16][4];
#pragma unroll
            for (int jp = 0; jp < C / 16; ++jp) ldsm4(fb[jp], bt + 2 * (16 * jp * LDK + 16 * (kb0 + kb)));
#pragma unroll
            for (int part = 0; part < 2; ++part) {
                if (part == parts) break;
                const uint4 a4 = frag(kb, part == 1);
                const unsigned a[4] = {a4.x, a4.y, a4.z, a4.w};
#pragma unroll
                for (int jp = 0; jp < C / 16; ++jp) {
                    MmaOp<T>::run(acc[2 * jp], a, fb[jp][0], fb[jp][1]);
                    MmaOp<T>::run(acc[2 * jp + 1], a, fb[jp][2], fb[jp][3]);
                }
            }
        }
    }
}

// Xᵀ = Vᵀ − (K·S)ᵀ·diag(γ), rounded: the A operand of v'ᵀ = Xᵀ·(T·diag(β))ᵀ (FLA's
// v' = U − W·S with U = T·diag(β)·V and W = T·diag(βγ)·K, without forming W and U). vf: Vᵀ in
// the accumulators' layout (ldmatrix.trans); zero_v: V = 0 (the transition's columns).
template <typename T>
__device__ __forceinline__ void x_operand(unsigned (&xa)[C / 16][4], const unsigned (&vf)[C / 16][4],
                                          const float (&xacc)[C / 8][4], const float* gam, int t,
                                          bool zero_v) {
#pragma unroll
    for (int j = 0; j < C / 8; ++j) {
        const int i = 8 * j + 2 * t, kb = j >> 1, half = (j & 1) * 2;
        const float e0 = gam[i], e1 = gam[i + 1];
        const float2 v01 = zero_v ? make_float2(0.0f, 0.0f) : unpack2<T>(vf[kb][half]);
        const float2 v23 = zero_v ? make_float2(0.0f, 0.0f) : unpack2<T>(vf[kb][half + 1]);
        const float vi[4] = {v01.x, v01.y, v23.x, v23.y};
        float x[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) x[e] = vi[e] - ((e & 1) ? e1 : e0) * xacc[j][e];
        xa[kb][half] = pack2<T>(x[0], x[1]);
        xa[kb][half + 1] = pack2<T>(x[2], x[3]);
    }
}

// acc += Aᵀ·Bᵀ for a lower-triangular C × C tile B (T·diag(β) or P): token block ip reads
// blocks kb ≤ ip (bt: the lane's ldmatrix address of the stage's tile); a(kb): Aᵀ's token
// block kb as an A operand.
template <typename T, typename A>
__device__ __forceinline__ void times_lower(float (&acc)[C / 8][4], unsigned bt, A a_of) {
#pragma unroll
    for (int ip = 0; ip < C / 16; ++ip) {
        unsigned fb[C / 16][4];
#pragma unroll
        for (int kb = 0; kb <= ip; ++kb) ldsm4(fb[kb], bt + 2 * (16 * ip * LDC + 16 * kb));
#pragma unroll
        for (int kb = 0; kb <= ip; ++kb) {
            const uint4 a4 = a_of(kb);
            const unsigned a[4] = {a4.x, a4.y, a4.z, a4.w};
            MmaOp<T>::run(acc[2 * ip], a, fb[kb][0], fb[kb][1]);
            MmaOp<T>::run(acc[2 * ip + 1], a, fb[kb][2], fb[kb][3]);
        }
    }
}

// v'ᵀ = Xᵀ·(T·diag(β))ᵀ (at: the lane's ldmatrix address of the stage's T·diag(β) tile).
template <typename T>
__device__ __forceinline__ void v_prime(float (&vacc)[C / 8][4], const unsigned (&xa)[C / 16][4], unsigned at) {
#pragma unroll
    for (int j = 0; j < C / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) vacc[j][e] = 0.0f;
    }
    times_lower<T>(vacc, at, [&](int kb) { return make_uint4(xa[kb][0], xa[kb][1], xa[kb][2], xa[kb][3]); });
}

// Oᵀ = scale·(Q·S)ᵀ·diag(γ), in place.
__device__ __forceinline__ void scale_o(float (&oacc)[C / 8][4], const float* gam, float scale, int t) {
#pragma unroll
    for (int j = 0; j < C / 8; ++j) {
        const int i = 8 * j + 2 * t;
        const float o0 = scale * gam[i], o1 = scale * gam[i + 1];
        oacc[j][0] *= o0;
        oacc[j][1] *= o1;
        oacc[j][2] *= o0;
        oacc[j][3] *= o1;
    }
}

// KD > 0: the key dimension as a compile-time constant (the common K = 128: no guards on the
// K blocks, constant tile offsets); 0: p.key_dim.
template <typename T, int BV, int KS, int KD = 0>
__device__ void fwd(const ChunkParams p, const int* __restrict__ chunks,
                    const int* __restrict__ units, const T* __restrict__ q,
                    const T* __restrict__ k, const T* __restrict__ v,
                    const float* __restrict__ ws_f, const T* __restrict__ ws_a,
                    const T* __restrict__ ws_p, const float* h_in,
                    const float* __restrict__ seg_start, T* __restrict__ o, float* h_out,
                    float* __restrict__ seg_end, const int* __restrict__ warmup) {
    using L = FwdLayout<BV, KS>;
    extern __shared__ __align__(128) unsigned char smem[];
    const int K = KD > 0 ? KD : p.key_dim, V = p.value_dim, H = p.heads_qk, HV = p.heads_v;
    const int hv = blockIdx.y, unit = blockIdx.z, h = hv / p.group;
    const int end = units[4 * unit + 1];
    const int seq = units[4 * unit + 2], unit_flags = units[4 * unit + 3];
    const int flags = p.flags;
    const bool local = flags & LOCAL_PASS, split = flags & SPLIT_STATE;
    if (local && (unit_flags & UNIT_LAST)) return;
    const int v_blocks = (V + BV - 1) / BV;
    // Local pass: blocks past the v-blocks carry the transition's K columns (V = 0).
    const bool transition = local && (int)blockIdx.x >= v_blocks;
    // The gate-driven window (segment_window.cu): a windowed pair's local pass runs only its
    // last n chunks (E from zero over the warm-up) and needs no transition.
    const int n_warmup = local && warmup != nullptr ? warmup[(size_t)unit * HV + hv] : -1;
    if (transition && n_warmup >= 0) return;
    const int first = n_warmup >= 0 ? end - n_warmup : units[4 * unit];
    const int cols = transition ? K : V;
    const int col0 = (transition ? (int)blockIdx.x - v_blocks : (int)blockIdx.x) * BV;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    // Warp `warp` owns state columns cw·16.. of the block and (KS = 2) the K rows of half kh:
    // 16-row blocks kb0 .. kb0 + nkw of the nk = K/16.
    const int cw = warp / KS, kh = warp % KS;
    const int wc = cw * 16;    // the warp's first column in the block
    const int c0 = col0 + wc;  // ... in the state (cols and c0 are multiples of 16)
    const bool active = c0 < cols;
    constexpr int KBW = MAX_K / 16 / KS;  // the most 16-row blocks a warp holds
    const int nk = K / 16, nk_half = (nk + KS - 1) / KS;
    // At K = MAX_K every warp holds exactly KBW blocks: a constant, so that the block loops
    // below unroll without a branch per block (which kept each block's ldmatrix from being
    // issued ahead of the MMAs before it).
    const int kb0 = kh * nk_half, nkw = KD == MAX_K ? KBW : min(nk_half, nk - kb0);

    const int stage_bytes = local ? L::LOCAL_STAGE : L::MAIN_STAGE;
    const unsigned smem0 = smem_addr(smem);
    unsigned char* const after = smem + 2 * stage_bytes;
    float* const part_mine = reinterpret_cast<float*>(after + cw * L::PAIR + kh * L::PART);
    const float* const part_other = reinterpret_cast<const float*>(after + cw * L::PAIR + (1 - kh) * L::PART);
    float* const part_q = reinterpret_cast<float*>(after + cw * L::PAIR + 2 * L::PART);
    T* const o_stage = KS == 1 ? reinterpret_cast<T*>(after) + warp * C * LDO : reinterpret_cast<T*>(part_q);
#if GDN_STMATRIX
    const unsigned o_stage_lane = smem_addr(o_stage) + 2 * lane_b_nmajor<LDO>(lane);
#else
    const unsigned o_stage_lane = 0;
#endif
    // Which warp of a pair finishes and writes o (the other sends its (Q·S)ᵀ partial): the
    // first for column groups 0, 1, 4, 5, …, the second for 2, 3, 6, 7, … — so that the two
    // warps of each scheduler (warps w and w + 4) carry the same work.
    const bool writes_o = !local && kh == (KS == 2 ? (cw >> 1) & 1 : 0);
    // This lane's ldmatrix addresses within a stage.
    const unsigned lane_kt = 2 * (L::K_OFF / 2 + lane_b_nmajor<LDK>(lane));  // Kᵀ (B[k][n] = K[n][k])
    const unsigned lane_qt = 2 * (L::Q_OFF / 2 + lane_b_nmajor<LDK>(lane));  // Qᵀ
    const unsigned lane_at = 2 * (L::A_OFF / 2 + lane_b_nmajor<LDC>(lane));  // (T·diag(β))ᵀ
    const unsigned lane_pt = 2 * (L::P_OFF / 2 + lane_b_nmajor<LDC>(lane));  // Pᵀ
    const unsigned lane_k = 2 * (L::K_OFF / 2 + lane_b_kmajor<LDK>(lane));   // K
    const unsigned lane_vt = 2 * (L::V_OFF / 2 + lane_b_nmajor<L::LDV>(lane));  // Vᵀ (.trans)

    const size_t qk_stride = (size_t)H * K;
    const int v_vecs = (min(BV, V - col0) + 7) / 8;
    auto chunk_info = [&](int c) { return reinterpret_cast<const int2*>(chunks)[c]; };
    // This thread's share of each tile copy, its source offsets formed once (a step adds the
    // chunk's start): K and Q, V's block, the C × C tiles T·diag(β) and P, and the decays.
    const TileRows<L::THREADS, MAX_K / 8, LDK> kq_share(threadIdx.x);
    const TileRows<L::THREADS, BV / 8, L::LDV> v_share(threadIdx.x);
    const TileRows<L::THREADS, C / 8, LDC> cc_share(threadIdx.x);
    const size_t kq_off = (size_t)h * K + (size_t)kq_share.row * qk_stride + 8 * kq_share.vec;
    const size_t v_stride = (size_t)HV * V;
    const T* const v_thread = v + (size_t)hv * V + col0 + (size_t)v_share.row * v_stride + 8 * v_share.vec;
    const size_t cc_off = (size_t)hv * C * C + cc_share.row * C + 8 * cc_share.vec;
    const size_t cc_chunk = (size_t)HV * C * C;
    auto prefetch = [&](int chunk, int s, int2 info) {
        const unsigned base = smem0 + s * stage_bytes;
        const int start = info.x, len = info.y;
        const size_t kq_at = (size_t)start * qk_stride + kq_off, cc_at = (size_t)chunk * cc_chunk + cc_off;
        kq_share.copy(base + L::K_OFF, k + kq_at, k, qk_stride, len, K / 8);
        if (!transition) {
            v_share.copy(base + L::V_OFF, v_thread + (size_t)start * v_stride, v, v_stride, len, v_vecs);
        }
        cc_share.copy(base + L::A_OFF, ws_a + cc_at, ws_a, C, C, C / 8);
        if (threadIdx.x < 2 * C / 4) {
            cp_async16_zfill(base + L::F_OFF + 16 * threadIdx.x,
                             ws_f + ((size_t)chunk * HV + hv) * 2 * C + 4 * threadIdx.x, true);
        }
        if (!local) {
            kq_share.copy(base + L::Q_OFF, q + kq_at, q, qk_stride, len, K / 8);
            cc_share.copy(base + L::P_OFF, ws_p + cc_at, ws_p, C, C, C / 8);
        }
    };

    // The state: sacc[j] holds Sᵀ rows (columns c0 + g, c0 + g + 8) × K rows
    // 16·kb0 + 8j + 2t, + 1.
    const size_t user_slice = ((size_t)seq * HV + hv) * (size_t)K * V;
    auto user_state_at = [&](int r, int c) -> size_t {
        return user_slice + ((flags & STATE_V_FIRST) ? (size_t)c * K + r : (size_t)r * V + c);
    };
    const size_t unit_slice = ((size_t)unit * HV + hv) * (size_t)K;
    float sacc[2 * KBW][4];
#pragma unroll
    for (int j = 0; j < 2 * KBW; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = 16 * kb0 + 8 * j + 2 * t + (e & 1), c = c0 + g + 8 * (e >> 1);
            float x = 0.0f;
            if (active && j < 2 * nkw) {
                if (transition) x = r == c ? 1.0f : 0.0f;
                else if (local) x = 0.0f;
                else if (unit_flags & UNIT_FIRST) x = h_in != nullptr ? h_in[user_state_at(r, c)] : 0.0f;
                else x = seg_start[(unit_slice + r) * V + c];
            }
            sacc[j][e] = x;
        }
    }

    // A warp's C × 16 f32 partial to / from its slot: lane-major 16-byte vectors.
    auto put_part = [&](float* dst, const float (&acc)[C / 8][4]) {
#pragma unroll
        for (int j = 0; j < C / 8; ++j) {
            *reinterpret_cast<float4*>(dst + 4 * (32 * j + lane)) = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
        }
    };
    auto add_part = [&](float (&acc)[C / 8][4], const float* src) {
#pragma unroll
        for (int j = 0; j < C / 8; ++j) {
            const float4 x = *reinterpret_cast<const float4*>(src + 4 * (32 * j + lane));
            acc[j][0] += x.x;
            acc[j][1] += x.y;
            acc[j][2] += x.z;
            acc[j][3] += x.w;
        }
    };

    auto info_of = [&](int c) { return c < end ? chunk_info(c) : make_int2(0, 0); };
    int2 info = info_of(first), info1 = info_of(first + 1);
    if (first < end) {
        prefetch(first, 0, info);
        cp_async_commit();
    }
    for (int chunk = first, s = 0; chunk < end; ++chunk, s ^= 1) {
        // Read a step early, so that no prefetch waits for the table.
        const int2 info2 = info_of(chunk + 2);
        cp_async_wait_group<0>();
        __syncthreads();  // this chunk's tiles are in stage s; every warp is done with s ^ 1
        if (chunk + 1 < end) {
            prefetch(chunk + 1, s ^ 1, info1);
            cp_async_commit();
        }
        if (active) {
            const unsigned base = smem0 + s * stage_bytes;
            const unsigned char* stage = smem + s * stage_bytes;
            const float* gam = reinterpret_cast<const float*>(stage + L::F_OFF);  // γ_i
            const float* dec = gam + C;                                            // γ_C/γ_i

            // The state's 16-row block kb as an A operand: rounded, or the rest after rounding.
            auto state_frag = [&](int kb, bool rest) {
                const float* s0 = sacc[2 * kb];
                const float* s1 = sacc[2 * kb + 1];
                auto pk = [&](float lo, float hi) { return rest ? pack2_rest<T>(lo, hi) : pack2<T>(lo, hi); };
                return make_uint4(pk(s0[0], s0[1]), pk(s0[2], s0[3]), pk(s1[0], s1[1]), pk(s1[2], s1[3]));
            };
            // acc[0..7] += Sᵀ·Bᵀ over the warp's K blocks, B = k or q; the state as S_hi + S_lo
            // with SPLIT_STATE (tested once per product, not per block).
            auto state_times = [&](float (&acc)[C / 8][4], unsigned lane_bt) {
                if (split) state_times_b<T, KBW>(acc, base + lane_bt, kb0, nkw, 2, state_frag);
                else state_times_b<T, KBW>(acc, base + lane_bt, kb0, nkw, 1, state_frag);
            };

            // (K·S)ᵀ = Sᵀ·Kᵀ (this warp's K rows), and (Q·S)ᵀ likewise (main pass only).
            float xacc[C / 8][4], oacc[C / 8][4];
#pragma unroll
            for (int j = 0; j < C / 8; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    xacc[j][e] = 0.0f;
                    oacc[j][e] = 0.0f;
                }
            }
            state_times(xacc, lane_kt);
            if (KS == 2) put_part(part_mine, xacc);
            // Vᵀ in the accumulators' layout, by ldmatrix.trans of the token-major tile:
            // vf[jj][2q + h] holds (V[i][c], V[i + 1][c]) for i = 16jj + 8q + 2t, c = wc + 8h + g
            // (issued here, well before X needs them).
            unsigned vf[C / 16][4];
            if (!transition) {
#pragma unroll
                for (int jj = 0; jj < C / 16; ++jj) {
                    ldsm4_t(vf[jj], base + lane_vt + 2 * (16 * jj * L::LDV + wc));
                }
            }
            if (!local) {
                state_times(oacc, lane_qt);
                if (KS == 2 && !writes_o) put_part(part_q, oacc);
            }
            if (KS == 2) {
                // The pair's partial sums: both warps add the other's (K·S)ᵀ (the same sum in
                // either order: both get the same X), the one that writes o the other's (Q·S)ᵀ.
                named_barrier(1 + cw, 64);
                add_part(xacc, part_other);
                if (writes_o) add_part(oacc, part_q);
            }

            unsigned xa[C / 16][4];
            x_operand<T>(xa, vf, xacc, gam, t, transition);
            // Oᵀ = scale·(Q·S)ᵀ·diag(γ) so far (the warp that writes o).
            if (writes_o) scale_o(oacc, gam, p.scale, t);
            float vacc[C / 8][4];
            v_prime<T>(vacc, xa, base + lane_at);

            // v' rounded (for P·v') and decayed by γ_C/γ (for the state) as A operands over
            // the tokens.
            unsigned va[C / 16][4], vd[C / 16][4];
#pragma unroll
            for (int j = 0; j < C / 8; ++j) {
                const int i = 8 * j + 2 * t, kb = j >> 1, half = (j & 1) * 2;
                const float d0 = dec[i], d1 = dec[i + 1];
                va[kb][half] = pack2<T>(vacc[j][0], vacc[j][1]);
                va[kb][half + 1] = pack2<T>(vacc[j][2], vacc[j][3]);
                vd[kb][half] = pack2<T>(vacc[j][0] * d0, vacc[j][1] * d1);
                vd[kb][half + 1] = pack2<T>(vacc[j][2] * d0, vacc[j][3] * d1);
            }

            if (writes_o) {
                times_lower<T>(oacc, base + lane_pt,
                               [&](int kb) { return make_uint4(va[kb][0], va[kb][1], va[kb][2], va[kb][3]); });
                // With KS = 2 the staging tile is the (Q·S)ᵀ slot this warp has just read.
                if (KS == 2) __syncwarp();
                store_staged<T, GDN_STMATRIX != 0>(oacc, o_stage, o_stage_lane, o, info.x, info.y, HV, hv, V, c0, lane);
            }

            // The state's update (the warp's K rows).
            update_state<T, KBW>(sacc, vd, base + lane_k, kb0, nkw, gam[C - 1]);
        }
        info = info1;
        info1 = info2;
    }

    if (!active) return;
#pragma unroll
    for (int j = 0; j < 2 * KBW; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = 16 * kb0 + 8 * j + 2 * t + (e & 1), c = c0 + g + 8 * (e >> 1);
            if (j < 2 * nkw) {
                if (local) seg_end[(unit_slice + r) * (V + K) + (transition ? V : 0) + c] = sacc[j][e];
                else if (unit_flags & UNIT_LAST) h_out[user_state_at(r, c)] = sacc[j][e];
            }
        }
    }
}


// ---------------------------------------------------------------------------------------------
// Pass 2 with split roles (main pass only, no SPLIT_STATE): per 16 state columns a state
// warp (warp cw) and an output warp (warp COL_WARPS + cw). The state warp runs the chain
// alone, with the whole K: it publishes the rounded state Sᵀ (the A fragments of K·S and
// Q·S) into shared memory, then forms (K·S)ᵀ, Xᵀ, v'ᵀ, publishes v'ᵀ rounded, and updates
// the state. The output warp waits for each and forms Oᵀ = scale·(Q·S)ᵀ·diag(γ) + v'ᵀ·Pᵀ and
// stores o, off the chain's path. The products are the ones fwd<T, BV, 1> forms on the same
// rounded operands in the same order: the same bits.

// bar.arrive: a producer's half of a named barrier (does not wait); its earlier shared-memory
// writes are visible to the threads that complete the barrier with bar.sync.
__device__ __forceinline__ void named_arrive(int id, int count) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

template <int BV> struct RolesLayout {
    using S = FwdLayout<BV, 2>;  // the stage offsets (independent of KS)
    static constexpr int COL_WARPS = BV / 16;
    static constexpr int THREADS = 64 * COL_WARPS;
    static constexpr int STAGE = S::MAIN_STAGE;
    static constexpr int SFRAG = 16 * 32 * (MAX_K / 16);  // a warp's Sᵀ A fragments
    static constexpr int VFRAG = 16 * 32 * (C / 16);      // a warp's v'ᵀ A fragments
    static constexpr int OTILE = 2 * C * LDO;             // the output warp's o staging tile
    static constexpr int GROUP = SFRAG + VFRAG + OTILE;
    static constexpr int SMEM = 2 * STAGE + COL_WARPS * GROUP;
};

template <typename T, int BV, int KD = 0>
__device__ void fwd_roles(const ChunkParams p, const int* __restrict__ chunks,
                          const int* __restrict__ units, const T* __restrict__ q,
                          const T* __restrict__ k, const T* __restrict__ v,
                          const float* __restrict__ ws_f, const T* __restrict__ ws_a,
                          const T* __restrict__ ws_p, const float* h_in,
                          const float* __restrict__ seg_start, T* __restrict__ o, float* h_out) {
    using L = FwdLayout<BV, 2>;
    using R = RolesLayout<BV>;
    extern __shared__ __align__(128) unsigned char smem[];
    const int K = KD > 0 ? KD : p.key_dim, V = p.value_dim, H = p.heads_qk, HV = p.heads_v;
    const int hv = blockIdx.y, unit = blockIdx.z, h = hv / p.group;
    const int first = units[4 * unit], end = units[4 * unit + 1];
    const int seq = units[4 * unit + 2], unit_flags = units[4 * unit + 3];
    const int flags = p.flags;
    const int col0 = (int)blockIdx.x * BV;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const bool state_warp = warp < R::COL_WARPS;
    const int cw = state_warp ? warp : warp - R::COL_WARPS;
    const int wc = cw * 16, c0 = col0 + wc;
    const bool active = c0 < V;
    constexpr int KBW = MAX_K / 16;
    const int nkw = KD == MAX_K ? KBW : K / 16;
    const int bar_s = 1 + cw, bar_v = 1 + R::COL_WARPS + cw;  // S published, v' published

    const unsigned smem0 = smem_addr(smem);
    unsigned char* const group = smem + 2 * R::STAGE + cw * R::GROUP;
    uint4* const sfrag = reinterpret_cast<uint4*>(group);
    uint4* const vfrag = reinterpret_cast<uint4*>(group + R::SFRAG);
    T* const o_stage = reinterpret_cast<T*>(group + R::SFRAG + R::VFRAG);
#if GDN_STMATRIX
    const unsigned o_stage_lane = smem_addr(o_stage) + 2 * lane_b_nmajor<LDO>(lane);
#else
    const unsigned o_stage_lane = 0;
#endif
    const unsigned lane_kt = 2 * (L::K_OFF / 2 + lane_b_nmajor<LDK>(lane));
    const unsigned lane_qt = 2 * (L::Q_OFF / 2 + lane_b_nmajor<LDK>(lane));
    const unsigned lane_at = 2 * (L::A_OFF / 2 + lane_b_nmajor<LDC>(lane));
    const unsigned lane_pt = 2 * (L::P_OFF / 2 + lane_b_nmajor<LDC>(lane));
    const unsigned lane_k = 2 * (L::K_OFF / 2 + lane_b_kmajor<LDK>(lane));
    const unsigned lane_vt = 2 * (L::V_OFF / 2 + lane_b_nmajor<L::LDV>(lane));

    const size_t qk_stride = (size_t)H * K;
    const int v_vecs = (min(BV, V - col0) + 7) / 8;
    auto chunk_info = [&](int c) { return reinterpret_cast<const int2*>(chunks)[c]; };
    // The output warps copy the tiles (the state warps start each chunk's chain at once).
    constexpr int COPIERS = 32 * R::COL_WARPS;
    const int ct = state_warp ? 0 : (int)threadIdx.x - COPIERS;
    const TileRows<COPIERS, MAX_K / 8, LDK> kq_share(ct);
    const TileRows<COPIERS, BV / 8, L::LDV> v_share(ct);
    const TileRows<COPIERS, C / 8, LDC> cc_share(ct);
    const size_t kq_off = (size_t)h * K + (size_t)kq_share.row * qk_stride + 8 * kq_share.vec;
    const size_t v_stride = (size_t)HV * V;
    const T* const v_thread = v + (size_t)hv * V + col0 + (size_t)v_share.row * v_stride + 8 * v_share.vec;
    const size_t cc_off = (size_t)hv * C * C + cc_share.row * C + 8 * cc_share.vec;
    const size_t cc_chunk = (size_t)HV * C * C;
    auto prefetch = [&](int chunk, int s, int2 info) {
        if (state_warp) return;
        const unsigned base = smem0 + s * R::STAGE;
        const int start = info.x, len = info.y;
        const size_t kq_at = (size_t)start * qk_stride + kq_off, cc_at = (size_t)chunk * cc_chunk + cc_off;
        kq_share.copy(base + L::K_OFF, k + kq_at, k, qk_stride, len, K / 8);
        v_share.copy(base + L::V_OFF, v_thread + (size_t)start * v_stride, v, v_stride, len, v_vecs);
        cc_share.copy(base + L::A_OFF, ws_a + cc_at, ws_a, C, C, C / 8);
        if (ct < 2 * C / 4) {
            cp_async16_zfill(base + L::F_OFF + 16 * ct, ws_f + ((size_t)chunk * HV + hv) * 2 * C + 4 * ct, true);
        }
        kq_share.copy(base + L::Q_OFF, q + kq_at, q, qk_stride, len, K / 8);
        cc_share.copy(base + L::P_OFF, ws_p + cc_at, ws_p, C, C, C / 8);
    };

    // The state (state warps): sacc[j] holds Sᵀ rows (columns c0 + g, c0 + g + 8) × K rows
    // 8j + 2t, + 1.
    const size_t user_slice = ((size_t)seq * HV + hv) * (size_t)K * V;
    auto user_state_at = [&](int r, int c) -> size_t {
        return user_slice + ((flags & STATE_V_FIRST) ? (size_t)c * K + r : (size_t)r * V + c);
    };
    const size_t unit_slice = ((size_t)unit * HV + hv) * (size_t)K;
    float sacc[2 * KBW][4];
#pragma unroll
    for (int j = 0; j < 2 * KBW; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = 8 * j + 2 * t + (e & 1), c = c0 + g + 8 * (e >> 1);
            float x = 0.0f;
            if (state_warp && active && j < 2 * nkw) {
                if (unit_flags & UNIT_FIRST) x = h_in != nullptr ? h_in[user_state_at(r, c)] : 0.0f;
                else x = seg_start[(unit_slice + r) * V + c];
            }
            sacc[j][e] = x;
        }
    }

    auto info_of = [&](int c) { return c < end ? chunk_info(c) : make_int2(0, 0); };
    int2 info = info_of(first), info1 = info_of(first + 1);
    if (first < end) {
        prefetch(first, 0, info);
        cp_async_commit();
    }
    for (int chunk = first, s = 0; chunk < end; ++chunk, s ^= 1) {
        const int2 info2 = info_of(chunk + 2);
        cp_async_wait_group<0>();
        __syncthreads();  // this chunk's tiles are in stage s; every warp is done with s ^ 1
        if (chunk + 1 < end) {
            prefetch(chunk + 1, s ^ 1, info1);
            cp_async_commit();
        }
        if (active) {
            const unsigned base = smem0 + s * R::STAGE;
            const unsigned char* stage = smem + s * R::STAGE;
            const float* gam = reinterpret_cast<const float*>(stage + L::F_OFF);  // γ_i
            const float* dec = gam + C;                                            // γ_C/γ_i
            // acc[0..7] += Sᵀ·Bᵀ over the K blocks, the state's A fragments sa.
            auto state_times = [&](float (&acc)[C / 8][4], unsigned lane_bt, const uint4 (&sa)[KBW]) {
                state_times_b<T, KBW>(acc, base + lane_bt, 0, nkw, 1, [&](int kb, bool) { return sa[kb]; });
            };
            if (state_warp) {
                // Publish the rounded state for the output warp's Q·S.
                uint4 sa_reg[KBW];
#pragma unroll
                for (int kb = 0; kb < KBW; ++kb) {
                    if (kb < nkw) {
                        const float* s0 = sacc[2 * kb];
                        const float* s1 = sacc[2 * kb + 1];
                        sa_reg[kb] = make_uint4(pack2<T>(s0[0], s0[1]), pack2<T>(s0[2], s0[3]),
                                                pack2<T>(s1[0], s1[1]), pack2<T>(s1[2], s1[3]));
                        sfrag[32 * kb + lane] = sa_reg[kb];
                    }
                }
                named_arrive(bar_s, 64);
                float xacc[C / 8][4];
#pragma unroll
                for (int j = 0; j < C / 8; ++j) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) xacc[j][e] = 0.0f;
                }
                state_times(xacc, lane_kt, sa_reg);
                unsigned vf[C / 16][4];
#pragma unroll
                for (int jj = 0; jj < C / 16; ++jj) ldsm4_t(vf[jj], base + lane_vt + 2 * (16 * jj * L::LDV + wc));
                unsigned xa[C / 16][4];
                x_operand<T>(xa, vf, xacc, gam, t, false);
                float vacc[C / 8][4];
                v_prime<T>(vacc, xa, base + lane_at);
                // v' rounded, published for P·v'; decayed by γ_C/γ for the state.
                unsigned vd[C / 16][4];
#pragma unroll
                for (int kb = 0; kb < C / 16; ++kb) {
                    unsigned va[4];
#pragma unroll
                    for (int hh = 0; hh < 2; ++hh) {
                        const int j = 2 * kb + hh, i = 8 * j + 2 * t;
                        const float d0 = dec[i], d1 = dec[i + 1];
                        va[2 * hh] = pack2<T>(vacc[j][0], vacc[j][1]);
                        va[2 * hh + 1] = pack2<T>(vacc[j][2], vacc[j][3]);
                        vd[kb][2 * hh] = pack2<T>(vacc[j][0] * d0, vacc[j][1] * d1);
                        vd[kb][2 * hh + 1] = pack2<T>(vacc[j][2] * d0, vacc[j][3] * d1);
                    }
                    vfrag[32 * kb + lane] = make_uint4(va[0], va[1], va[2], va[3]);
                }
                named_arrive(bar_v, 64);
                update_state<T, KBW>(sacc, vd, base + lane_k, 0, nkw, gam[C - 1]);
            } else {
                // Oᵀ = scale·(Q·S)ᵀ·diag(γ) + v'ᵀ·Pᵀ, then o through the staging tile.
                float oacc[C / 8][4];
#pragma unroll
                for (int j = 0; j < C / 8; ++j) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) oacc[j][e] = 0.0f;
                }
                named_barrier(bar_s, 64);
                uint4 sa[KBW];
#pragma unroll
                for (int kb = 0; kb < KBW; ++kb) {
                    if (kb < nkw) sa[kb] = sfrag[32 * kb + lane];
                }
                state_times(oacc, lane_qt, sa);
                scale_o(oacc, gam, p.scale, t);
                named_barrier(bar_v, 64);
                times_lower<T>(oacc, base + lane_pt, [&](int kb) { return vfrag[32 * kb + lane]; });  // Oᵀ += v'ᵀ·Pᵀ
                store_staged<T, GDN_STMATRIX != 0>(oacc, o_stage, o_stage_lane, o, info.x, info.y, HV, hv, V, c0, lane);
            }
        }
        info = info1;
        info1 = info2;
    }

    if (!active || !state_warp || !(unit_flags & UNIT_LAST)) return;
#pragma unroll
    for (int j = 0; j < 2 * KBW; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = 8 * j + 2 * t + (e & 1), c = c0 + g + 8 * (e >> 1);
            if (j < 2 * nkw) h_out[user_state_at(r, c)] = sacc[j][e];
        }
    }
}


// ---------------------------------------------------------------------------------------------
// Pass 2's main pass with split roles on warpgroup MMAs (sm_90a, V-block 64, no SPLIT_STATE):
// fwd_roles's work with each per-warp product replaced by one wgmma of the warpgroup. Warps
// 0–3 (the state warpgroup) hold Sᵀ (64 state columns × 128 keys) as the accumulators of one
// m64n128 product, warp w its rows 16w‥ (fwd_roles's sacc of warp w, unchanged); every A
// operand (Sᵀ, Xᵀ, v'ᵀ rounded) stays in registers in the mma.sync A-fragment form, which is
// wgmma's register form. Per chunk the state warpgroup forms
//   (K·S)ᵀ = Sᵀ·Kᵀ (m64n64, 8 k16 steps, B = K K-major), Xᵀ as fwd_roles,
//   v'ᵀ = Xᵀ·(T·diag(β))ᵀ (m64n64, 4 steps), Sᵀ ← γ_C·Sᵀ + vdᵀ·K (m64n128, 4 steps, B = K MN-major),
// and warps 4–7 (the output warpgroup, also the copiers) Oᵀ = scale·(Q·S)ᵀ·diag(γ) + v'ᵀ·Pᵀ.
// Decisions and why:
// - K, Q, T·diag(β) and P are staged 128B-swizzled (64 elements per 128-byte row, 8-row atoms),
//   the layout wgmma reads without bank conflicts; one K tile is both the K-major B of Sᵀ·Kᵀ
//   (rows = tokens) and the MN-major B of the update (k-rows = tokens): the same bytes. V stays
//   padded: it is read by ldmatrix.trans into Xᵀ's accumulator layout, not by wgmma.
// - wgmma multiplies whole tiles: the blocks of T·diag(β) and P above the diagonal (never
//   written by the prep) and K's and Q's key columns from K on are zero-filled by the copies
//   (cp.async with no source bytes), so any K ≤ 128 runs the same 8 steps and Sᵀ's rows ≥ K
//   stay zero.
// - No `active` guard around the products: wgmma needs all four warps of the warpgroup; the
//   rows of a partial last V-block compute on unwritten V columns, and rows of an M = 64
//   product are independent, so only their stores are skipped.
// - Each product waits for its wgmma group before its results are used (the chain is
//   sequential); V's fragments are loaded while Sᵀ·Kᵀ runs. The update is waited for before
//   the chunk's end, so no wgmma still reads a stage when the next prefetch overwrites it.
// - cp.async writes through the generic proxy and wgmma reads through the async proxy: each
//   copier fences (fence.proxy.async) after its cp.async wait, before the block barrier.
// - The sums are wgmma's, not mma.sync's: not the bits of fwd_roles (both within the dtype's
//   tolerance of the oracle, tests/cuda.rs).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
struct WgmmaLayout {
    static constexpr int LDV = 64 + 8;
    static constexpr int HALF = C * 128;         // a 64-token × 64-column swizzled block (8 KiB)
    static constexpr int K_OFF = 0;              // k: two blocks (keys 0–63, 64–127)
    static constexpr int Q_OFF = K_OFF + 2 * HALF;
    static constexpr int A_OFF = Q_OFF + 2 * HALF;  // T·diag(β): one block
    static constexpr int P_OFF = A_OFF + HALF;
    static constexpr int V_OFF = P_OFF + HALF;   // padded C × 64 (ldmatrix.trans)
    static constexpr int F_OFF = V_OFF + 2 * C * LDV;
    static constexpr int STAGE = (F_OFF + 4 * 2 * C + 1023) / 1024 * 1024;
    static constexpr int SFRAG = 16 * 32 * (MAX_K / 16);
    static constexpr int VFRAG = 16 * 32 * (C / 16);
    static constexpr int OTILE = 2 * C * LDO;
    static constexpr int GROUP = SFRAG + VFRAG + OTILE;
    // Shared memory: the stages (2, or 3 with WGMMA_STAGES3), the four groups after the last,
    // and 1024 bytes of slack to start the stages on a 1024-byte boundary (wgmma_smem in
    // chunked.rs).
};

// Option bit of the wgmma main pass (src/cuda_backend/chunked.rs WGMMA_STAGES3): three stages.
constexpr int WGMMA_STAGES3 = 1 << 11;

// Which of a stage's tiles the state warpgroup copies (the output warpgroup copies the rest):
// 0 none, 1 k, 2 k and q, 3 k, q and P. The copies' issue was half of the output warpgroup's
// time with all of them there, while the state warpgroup waited at the block barrier; with
// the full-tile copies 3 and 2 were within noise (BENCHMARKS.md, 2026-12-06). A define for
// A/B runs (GDN_CUDA_DEFINES).
#if !defined(GDN_WGMMA_STATE_COPIES)
#define GDN_WGMMA_STATE_COPIES 3
#endif

// Full tiles (every row and vector valid, most chunks) copied without the per-copy bounds
// predicates and source selects: the copies' issue was a quarter of the pass's stall samples
// (BENCHMARKS.md, 2026-12-06); 0 for A/B runs (GDN_CUDA_DEFINES).
#if !defined(GDN_WGMMA_FULL_COPIES)
#define GDN_WGMMA_FULL_COPIES 1
#endif

__device__ __forceinline__ void cp_async16_at(unsigned dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}

// One copier's share of a 64-row tile of 16-bit elements, VECS 16-byte vectors per row, into
// the 128B-swizzled layout: vector x of row r at (x / 8)·HALF + r·128 + ((x % 8) ^ (r % 8))·16.
// Rows per pass are a multiple of 8, so r % 8 (and the swizzle) is the same on every pass.
template <int NTHREADS, int VECS> struct SwizzledRows {
    static constexpr int STEP = NTHREADS / VECS;
    static constexpr int PER = C / STEP;
    static_assert(NTHREADS % VECS == 0 && STEP % 8 == 0 && PER * STEP == C, "tile split");
    int row, vec;
    unsigned dst;
    __device__ explicit SwizzledRows(int tid)
        : row(tid / VECS), vec(tid % VECS),
          dst((vec / 8) * WgmmaLayout::HALF + row * 128 + (((vec % 8) ^ (row % 8)) * 16)) {}
    // Rows from `len` on, vectors from `valid_vecs` on and (LOWER: a lower-triangular C × C
    // tile) the 16 × 16 blocks above the diagonal are written as zeros without reading src.
    template <bool LOWER, typename E>
    __device__ __forceinline__ void copy(unsigned tile, const E* src, const E* any, size_t stride, int len,
                                         int valid_vecs) const {
        const size_t step = (size_t)STEP * stride;
        if (GDN_WGMMA_FULL_COPIES && len == C && valid_vecs == VECS) {
            const E* at = src;
#pragma unroll
            for (int u = 0; u < PER; ++u, at += step) {
                const unsigned d = tile + dst + 128 * STEP * u;
                if (!LOWER) {
                    cp_async16_at(d, at);
                } else {
                    const bool ok = vec / 2 <= (row + STEP * u) / 16;
                    cp_async16_zfill(d, ok ? at : any, ok);
                }
            }
            return;
        }
#pragma unroll
        for (int u = 0; u < PER; ++u) {
            const int r = row + STEP * u;
            const bool ok = r < len && vec < valid_vecs && (!LOWER || vec / 2 <= r / 16);
            cp_async16_zfill(tile + dst + 128 * STEP * u, ok ? src + u * step : any, ok);
        }
    }
};

template <typename T, int KD = 0>
__device__ void fwd_wgmma(const ChunkParams p, const int* __restrict__ chunks,
                          const int* __restrict__ units, const T* __restrict__ q,
                          const T* __restrict__ k, const T* __restrict__ v,
                          const float* __restrict__ ws_f, const T* __restrict__ ws_a,
                          const T* __restrict__ ws_p, const float* h_in,
                          const float* __restrict__ seg_start, T* __restrict__ o, float* h_out) {
    using L = WgmmaLayout;
    using Mma = wgmma::Rs<T>;
    constexpr int BV = 64, COL_WARPS = 4;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const int K = KD > 0 ? KD : p.key_dim, V = p.value_dim, H = p.heads_qk, HV = p.heads_v;
    const int hv = blockIdx.y, unit = blockIdx.z, h = hv / p.group;
    const int first = units[4 * unit], end = units[4 * unit + 1];
    const int seq = units[4 * unit + 2], unit_flags = units[4 * unit + 3];
    const int flags = p.flags;
    const int col0 = (int)blockIdx.x * BV;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const bool state_wg = warp < COL_WARPS;
    const int cw = state_wg ? warp : warp - COL_WARPS;
    const int wc = cw * 16, c0 = col0 + wc;
    const bool active = c0 < V;
    constexpr int KBW = MAX_K / 16;
    const int nkw = KD == MAX_K ? KBW : K / 16;
    const int bar_s = 1 + cw, bar_v = 1 + COL_WARPS + cw;  // S published, v' published

    // The stages start on a 1024-byte boundary of the shared window (the swizzle's atoms).
    const unsigned raw0 = smem_addr(smem_raw);
    const unsigned pad = (1024 - (raw0 & 1023)) & 1023;
    unsigned char* const smem = smem_raw + pad;
    const unsigned smem0 = raw0 + pad;
    unsigned char* const group = smem + ((flags & WGMMA_STAGES3) ? 3 : 2) * L::STAGE + cw * L::GROUP;
    uint4* const sfrag = reinterpret_cast<uint4*>(group);
    uint4* const vfrag = reinterpret_cast<uint4*>(group + L::SFRAG);
    T* const o_stage = reinterpret_cast<T*>(group + L::SFRAG + L::VFRAG);
    const unsigned o_stage_lane = smem_addr(o_stage) + 2 * lane_b_nmajor<LDO>(lane);
    const unsigned lane_vt = 2 * (L::V_OFF / 2 + lane_b_nmajor<L::LDV>(lane));

    const size_t qk_stride = (size_t)H * K;
    const int v_vecs = (min(BV, V - col0) + 7) / 8;
    auto chunk_info = [&](int c) { return reinterpret_cast<const int2*>(chunks)[c]; };
    // Both warpgroups copy tiles (GDN_WGMMA_STATE_COPIES says which), each thread by its index
    // in its warpgroup.
    constexpr int COPIERS = 32 * COL_WARPS;
    const int ct = (int)threadIdx.x % COPIERS;
    const SwizzledRows<COPIERS, MAX_K / 8> kq_share(ct);
    const SwizzledRows<COPIERS, C / 8> cc_share(ct);
    const TileRows<COPIERS, BV / 8, L::LDV> v_share(ct);
    const size_t kq_off = (size_t)h * K + (size_t)kq_share.row * qk_stride + 8 * kq_share.vec;
    const size_t v_stride = (size_t)HV * V;
    const T* const v_thread = v + (size_t)hv * V + col0 + (size_t)v_share.row * v_stride + 8 * v_share.vec;
    const size_t cc_off = (size_t)hv * C * C + cc_share.row * C + 8 * cc_share.vec;
    const size_t cc_chunk = (size_t)HV * C * C;
    // This warpgroup's copies of chunk `chunk` into stage s.
    constexpr int SC = GDN_WGMMA_STATE_COPIES;
    auto prefetch = [&](int chunk, int s, int2 info) {
        const unsigned base = smem0 + s * L::STAGE;
        const int start = info.x, len = info.y;
        const size_t kq_at = (size_t)start * qk_stride + kq_off, cc_at = (size_t)chunk * cc_chunk + cc_off;
        if ((SC >= 1) == state_wg) kq_share.copy<false>(base + L::K_OFF, k + kq_at, k, qk_stride, len, K / 8);
        if ((SC >= 2) == state_wg) kq_share.copy<false>(base + L::Q_OFF, q + kq_at, q, qk_stride, len, K / 8);
        if ((SC >= 3) == state_wg) cc_share.copy<true>(base + L::P_OFF, ws_p + cc_at, ws_p, C, C, C / 8);
        if (state_wg) return;
        const T* const v_at = v_thread + (size_t)start * v_stride;
        if (GDN_WGMMA_FULL_COPIES && len == C && v_vecs == BV / 8) {
            constexpr int V_STEP = decltype(v_share)::STEP;
#pragma unroll
            for (int u = 0; u < decltype(v_share)::PER; ++u) {
                cp_async16_at(base + L::V_OFF + v_share.dst + 2 * V_STEP * L::LDV * u, v_at + (size_t)u * V_STEP * v_stride);
            }
        } else {
            v_share.copy(base + L::V_OFF, v_at, v, v_stride, len, v_vecs);
        }
        cc_share.copy<true>(base + L::A_OFF, ws_a + cc_at, ws_a, C, C, C / 8);
        if (ct < 2 * C / 4) {
            cp_async16_zfill(base + L::F_OFF + 16 * ct, ws_f + ((size_t)chunk * HV + hv) * 2 * C + 4 * ct, true);
        }
    };

    // The state (state warpgroup): sacc[j] holds Sᵀ rows (columns c0 + g, c0 + g + 8) × K
    // rows 8j + 2t, + 1 (rows from K on zero).
    const size_t user_slice = ((size_t)seq * HV + hv) * (size_t)K * V;
    auto user_state_at = [&](int r, int c) -> size_t {
        return user_slice + ((flags & STATE_V_FIRST) ? (size_t)c * K + r : (size_t)r * V + c);
    };
    const size_t unit_slice = ((size_t)unit * HV + hv) * (size_t)K;
    float sacc[2 * KBW][4];
#pragma unroll
    for (int j = 0; j < 2 * KBW; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = 8 * j + 2 * t + (e & 1), c = c0 + g + 8 * (e >> 1);
            float x = 0.0f;
            if (state_wg && active && j < 2 * nkw) {
                if (unit_flags & UNIT_FIRST) x = h_in != nullptr ? h_in[user_state_at(r, c)] : 0.0f;
                else x = seg_start[(unit_slice + r) * V + c];
            }
            sacc[j][e] = x;
        }
    }

    // Two stages (the next chunk's copies run during this one), or three with WGMMA_STAGES3
    // (two chunks ahead). Every step commits one group, empty past the end, so that the wait
    // counts the same groups on every step.
    const bool three = flags & WGMMA_STAGES3;
    auto info_of = [&](int c) { return c < end ? chunk_info(c) : make_int2(0, 0); };
    int2 info = info_of(first), info1 = info_of(first + 1), info2 = info_of(first + 2);
    if (first < end) prefetch(first, 0, info);
    cp_async_commit();
    if (three) {
        if (first + 1 < end) prefetch(first + 1, 1, info1);
        cp_async_commit();
    }
    for (int chunk = first, s = 0; chunk < end; ++chunk) {
        const int2 info3 = info_of(chunk + 3);
        if (three) cp_async_wait_group<1>();
        else cp_async_wait_group<0>();
        // This thread's copies, landed through the generic proxy, before wgmma reads them.
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();  // this chunk's tiles are in stage s; every warp is done with the last chunk's
        // The next copies (one group per step, also where empty): the output warpgroup's now,
        // the state warpgroup's while its first product runs.
        auto prefetch_ahead = [&]() {
            if (three) {
                if (chunk + 2 < end) prefetch(chunk + 2, s == 0 ? 2 : s - 1, info2);
            } else if (chunk + 1 < end) {
                prefetch(chunk + 1, s ^ 1, info1);
            }
            cp_async_commit();
        };
        if (!state_wg) prefetch_ahead();
        const unsigned base = smem0 + s * L::STAGE;
        const unsigned char* stage = smem + s * L::STAGE;
        const float* gam = reinterpret_cast<const float*>(stage + L::F_OFF);  // γ_i
        const float* dec = gam + C;                                            // γ_C/γ_i
        // B descriptors of the stage's tiles: K-major k16 step s of a 128-column tile at
        // +(s / 4)·HALF + (s % 4)·32 bytes, of a 64-column one at +32·s; MN-major token step s
        // of K at +2048·s (16 k-rows of 128 bytes).
        const wgmma::u64 kt_desc = wgmma::desc(base + L::K_OFF, wgmma::KMAJOR);
        const wgmma::u64 qt_desc = wgmma::desc(base + L::Q_OFF, wgmma::KMAJOR);
        const wgmma::u64 at_desc = wgmma::desc(base + L::A_OFF, wgmma::KMAJOR);
        const wgmma::u64 pt_desc = wgmma::desc(base + L::P_OFF, wgmma::KMAJOR);
        const wgmma::u64 k_desc = wgmma::desc(base + L::K_OFF, wgmma::MNMAJOR);
        auto kmajor_step = [](int s) { return (wgmma::u64)(((s / 4) * L::HALF + (s % 4) * 32) >> 4); };
        if (state_wg) {
            // Publish the rounded state for the output warpgroup's Q·S.
            unsigned sa[KBW][4];
#pragma unroll
            for (int kb = 0; kb < KBW; ++kb) {
                const float* s0 = sacc[2 * kb];
                const float* s1 = sacc[2 * kb + 1];
                sa[kb][0] = pack2<T>(s0[0], s0[1]);
                sa[kb][1] = pack2<T>(s0[2], s0[3]);
                sa[kb][2] = pack2<T>(s1[0], s1[1]);
                sa[kb][3] = pack2<T>(s1[2], s1[3]);
                sfrag[32 * kb + lane] = make_uint4(sa[kb][0], sa[kb][1], sa[kb][2], sa[kb][3]);
            }
            named_arrive(bar_s, 64);
            float xacc[C / 8][4];
            wgmma::pin(sa);
            wgmma::fence();
#pragma unroll
            for (int kb = 0; kb < KBW; ++kb) {
                if (kb == 0) Mma::template m64n64<0, 0>(xacc, sa[kb], kt_desc + kmajor_step(kb));
                else Mma::template m64n64<0, 1>(xacc, sa[kb], kt_desc + kmajor_step(kb));
            }
            wgmma::commit();
            prefetch_ahead();
            // Vᵀ in the accumulators' layout while Sᵀ·Kᵀ runs.
            unsigned vf[C / 16][4];
#pragma unroll
            for (int jj = 0; jj < C / 16; ++jj) ldsm4_t(vf[jj], base + lane_vt + 2 * (16 * jj * L::LDV + wc));
            wgmma::wait<0>();
            wgmma::pin(xacc);
            unsigned xa[C / 16][4];
            x_operand<T>(xa, vf, xacc, gam, t, false);
            float vacc[C / 8][4];
            wgmma::pin(xa);
            wgmma::fence();
#pragma unroll
            for (int kb = 0; kb < C / 16; ++kb) {
                if (kb == 0) Mma::template m64n64<0, 0>(vacc, xa[kb], at_desc + 2 * kb);
                else Mma::template m64n64<0, 1>(vacc, xa[kb], at_desc + 2 * kb);
            }
            wgmma::commit();
            wgmma::wait<0>();
            wgmma::pin(vacc);
            // v' rounded, published for P·v'; decayed by γ_C/γ for the state.
            unsigned vd[C / 16][4];
#pragma unroll
            for (int kb = 0; kb < C / 16; ++kb) {
                unsigned va[4];
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) {
                    const int j = 2 * kb + hh, i = 8 * j + 2 * t;
                    const float d0 = dec[i], d1 = dec[i + 1];
                    va[2 * hh] = pack2<T>(vacc[j][0], vacc[j][1]);
                    va[2 * hh + 1] = pack2<T>(vacc[j][2], vacc[j][3]);
                    vd[kb][2 * hh] = pack2<T>(vacc[j][0] * d0, vacc[j][1] * d1);
                    vd[kb][2 * hh + 1] = pack2<T>(vacc[j][2] * d0, vacc[j][3] * d1);
                }
                vfrag[32 * kb + lane] = make_uint4(va[0], va[1], va[2], va[3]);
            }
            named_arrive(bar_v, 64);
            const float gamma_c = gam[C - 1];
#pragma unroll
            for (int j = 0; j < 2 * KBW; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) sacc[j][e] *= gamma_c;
            }
            wgmma::pin(sacc);
            wgmma::pin(vd);
            wgmma::fence();
#pragma unroll
            for (int kb = 0; kb < C / 16; ++kb) Mma::template m64n128<1, 1>(sacc, vd[kb], k_desc + 128 * kb);
            wgmma::commit();
            wgmma::wait<0>();
            wgmma::pin(sacc);
        } else {
            // Oᵀ = scale·(Q·S)ᵀ·diag(γ) + v'ᵀ·Pᵀ, then o through the staging tile.
            float oacc[C / 8][4];
            named_barrier(bar_s, 64);
            unsigned sa[KBW][4];
#pragma unroll
            for (int kb = 0; kb < KBW; ++kb) {
                const uint4 x = sfrag[32 * kb + lane];
                sa[kb][0] = x.x;
                sa[kb][1] = x.y;
                sa[kb][2] = x.z;
                sa[kb][3] = x.w;
            }
            wgmma::pin(sa);
            wgmma::fence();
#pragma unroll
            for (int kb = 0; kb < KBW; ++kb) {
                if (kb == 0) Mma::template m64n64<0, 0>(oacc, sa[kb], qt_desc + kmajor_step(kb));
                else Mma::template m64n64<0, 1>(oacc, sa[kb], qt_desc + kmajor_step(kb));
            }
            wgmma::commit();
            wgmma::wait<0>();
            wgmma::pin(oacc);
            scale_o(oacc, gam, p.scale, t);
            named_barrier(bar_v, 64);
            unsigned va[C / 16][4];
#pragma unroll
            for (int kb = 0; kb < C / 16; ++kb) {
                const uint4 x = vfrag[32 * kb + lane];
                va[kb][0] = x.x;
                va[kb][1] = x.y;
                va[kb][2] = x.z;
                va[kb][3] = x.w;
            }
            wgmma::pin(oacc);
            wgmma::pin(va);
            wgmma::fence();
#pragma unroll
            for (int kb = 0; kb < C / 16; ++kb) Mma::template m64n64<0, 1>(oacc, va[kb], pt_desc + 2 * kb);
            wgmma::commit();
            wgmma::wait<0>();
            wgmma::pin(oacc);
            if (active) {
                store_staged<T, true>(oacc, o_stage, o_stage_lane, o, info.x, info.y, HV, hv, V, c0, lane);
            }
        }
        info = info1;
        info1 = info2;
        info2 = info3;
        s = s + 1 == (three ? 3 : 2) ? 0 : s + 1;
    }

    if (!active || !state_wg || !(unit_flags & UNIT_LAST)) return;
#pragma unroll
    for (int j = 0; j < 2 * KBW; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = 8 * j + 2 * t + (e & 1), c = c0 + g + 8 * (e >> 1);
            if (j < 2 * nkw) h_out[user_state_at(r, c)] = sacc[j][e];
        }
    }
}
#endif

// The wgmma main pass's entry: K = 128 as a constant, any other K at run time; an empty body
// on targets without wgmma (src/cuda_backend/chunked.rs runs it only on sm_90a).
template <typename T>
__device__ void fwd_wgmma_entry(const ChunkParams p, const int* chunks, const int* units, const T* q,
                                const T* k, const T* v, const float* ws_f, const T* ws_a, const T* ws_p,
                                const float* h_in, const float* seg_start, T* o, float* h_out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if (p.key_dim == MAX_K) {
        fwd_wgmma<T, MAX_K>(p, chunks, units, q, k, v, ws_f, ws_a, ws_p, h_in, seg_start, o, h_out);
    } else {
        fwd_wgmma<T>(p, chunks, units, q, k, v, ws_f, ws_a, ws_p, h_in, seg_start, o, h_out);
    }
#endif
}

}  // namespace chunked
}  // namespace gdn

#define GDN_CHUNK_FWD(SUFFIX, T, BV, KS)                                                           \
    extern "C" __global__ void __launch_bounds__(BV * 2 * KS, 1) gdn_chunk_fwd##BV##_##SUFFIX(     \
        const gdn::chunked::ChunkParams p, const int* chunks, const int* units, const T* q,        \
        const T* k, const T* v, const float* ws_f, const T* ws_a, const T* ws_p,                   \
        const float* h_in, const float* seg_start, T* o, float* h_out, float* seg_end,             \
        const int* warmup) {                                                                       \
        if (p.key_dim == gdn::chunked::MAX_K) {                                                    \
            gdn::chunked::fwd<T, BV, KS, gdn::chunked::MAX_K>(p, chunks, units, q, k, v, ws_f, ws_a, \
                                                              ws_p, h_in, seg_start, o, h_out,       \
                                                              seg_end, warmup);                      \
        } else {                                                                                   \
            gdn::chunked::fwd<T, BV, KS>(p, chunks, units, q, k, v, ws_f, ws_a, ws_p, h_in,          \
                                         seg_start, o, h_out, seg_end, warmup);                    \
        }                                                                                          \
    }

#define GDN_CHUNK_FWD_ROLES(SUFFIX, T, BV)                                                         \
    extern "C" __global__ void __launch_bounds__(BV * 4, 1) gdn_chunk_fwd##BV##r_##SUFFIX(         \
        const gdn::chunked::ChunkParams p, const int* chunks, const int* units, const T* q,        \
        const T* k, const T* v, const float* ws_f, const T* ws_a, const T* ws_p,                   \
        const float* h_in, const float* seg_start, T* o, float* h_out) {                           \
        if (p.key_dim == gdn::chunked::MAX_K) {                                                    \
            gdn::chunked::fwd_roles<T, BV, gdn::chunked::MAX_K>(p, chunks, units, q, k, v, ws_f,   \
                                                                ws_a, ws_p, h_in, seg_start, o,    \
                                                                h_out);                            \
        } else {                                                                                   \
            gdn::chunked::fwd_roles<T, BV>(p, chunks, units, q, k, v, ws_f, ws_a, ws_p, h_in,      \
                                           seg_start, o, h_out);                                   \
        }                                                                                          \
    }

#define GDN_CHUNK_FWD_WGMMA(SUFFIX, T)                                                             \
    extern "C" __global__ void __launch_bounds__(256, 1) gdn_chunk_fwd64w_##SUFFIX(               \
        const gdn::chunked::ChunkParams p, const int* chunks, const int* units, const T* q,        \
        const T* k, const T* v, const float* ws_f, const T* ws_a, const T* ws_p,                   \
        const float* h_in, const float* seg_start, T* o, float* h_out) {                           \
        gdn::chunked::fwd_wgmma_entry<T>(p, chunks, units, q, k, v, ws_f, ws_a, ws_p, h_in,        \
                                         seg_start, o, h_out);                                     \
    }

#define GDN_CHUNKED(SUFFIX, T)                                                                     \
    extern "C" __global__ void __launch_bounds__(gdn::chunked::THREADS)                            \
        gdn_l2norm_##SUFFIX(int rows, int key_dim, const T* q, const T* k, T* qn, T* kn) {         \
        gdn::chunked::l2norm<T>(rows, key_dim, q, k, qn, kn);                                      \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(gdn::chunked::PREP_THREADS, gdn::chunked::PREP_BLOCKS) \
        gdn_chunk_prep_##SUFFIX(const gdn::chunked::ChunkParams p, const int* chunks, const T* q,  \
                                const T* k, const float* g, const float* beta, const float* a_log, \
                                const float* dt_bias, float* ws_f, T* ws_a, T* ws_p) {             \
        gdn::chunked::prep<T>(p, chunks, q, k, g, beta, a_log, dt_bias, ws_f, ws_a, ws_p);         \
    }                                                                                              \
    GDN_CHUNK_FWD(SUFFIX, T, 32, 2)                                                                \
    GDN_CHUNK_FWD(SUFFIX, T, 64, 2)                                                                \
    GDN_CHUNK_FWD(SUFFIX, T, 128, 1)                                                               \
    GDN_CHUNK_FWD_ROLES(SUFFIX, T, 32)                                                             \
    GDN_CHUNK_FWD_ROLES(SUFFIX, T, 64)                                                             \
    GDN_CHUNK_FWD_WGMMA(SUFFIX, T)

GDN_CHUNKED(f16, __half)
GDN_CHUNKED(bf16, __nv_bfloat16)
