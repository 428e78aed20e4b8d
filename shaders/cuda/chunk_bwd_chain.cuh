// The chunked backward's two sequential passes (C = 64, f16/bf16 storage, K ≤ 128, V ≤ 128),
// one block per (V-block, v-head, sequence) (or one for both passes: bwd_chains), a warp (with
// warp pairs two) per 16 columns, the f32 state or state gradient in registers in the
// transposed orientation, as the forward's sequential pass (chunked.cu) keeps its state. Both
// read the backward prep's workspace (chunk.cuh prep with BWD: the decays, T·diag(β), P); they
// do not depend on each other.
//
//   gdn_chunk_bwd_states{32,64,128}_*   forward over the chunks, the forward's recurrence
//       X = V − diag(γ)·K·S,  v' = T·diag(β)·X,  S ← γ_C·S + Kᵀ·(diag(γ_C/γ)·v'),
//       storing per chunk its start state S (rounded), X and v' (rounded, the operands the
//       forward multiplied with), all transposed: Sᵀ as V × K, Xᵀ and v'ᵀ as V × C.
//   gdn_chunk_bwd_dh{32,64,128}_*       backward over the chunks from dht (or 0), per chunk with
//       dS' the gradient of its end state:
//         dv' = Pᵀ·dO + diag(γ_C/γ)·K·dS'        (v' feeds o through P and the next state)
//         dX  = (T·diag(β))ᵀ·dv'                 (= dv: X = V − …)
//         dS  = γ_C·dS' + scale·Qᵀ·diag(γ)·dO − Kᵀ·diag(γ)·dX
//       storing dS' (rounded, transposed V × K) and dv' (rounded, V × C) per chunk, writing dv
//       and, at the sequence start, dh0 (f32).
// The per-chunk gradient passes (chunk_bwd_grad.cu) then run over all chunks at once.
//
// Sequence parallelism (exact; chunk_bwd.rs decides, docs/sequence-parallelism.md): a unit
// (blockIdx.z) is a sequence or a segment of one. Both chains are linear in their carry, and
// chunk c's dh step is the adjoint of its states step: S_end = M_c·S + (terms of v) with
// M_c = γ_C·I − Kᵀ·diag(γ_C/γ)·T·diag(β)·diag(γ)·K, and dS = M_cᵀ·dS' + (terms of dO). So a
// local pass (BWD_LOCAL) runs each segment from zero: the states chain's end state E (units
// but the last of their sequence) and, in K extra column blocks from the identity with v = 0,
// the segment's transition M (every unit of a cut sequence); the dh chain's start gradient E'
// from a zero end gradient (units but the first). chunk_combine.cu then chains
// start_{i+1} = M_i·start_i + E_i from h0, and, over the units in reverse order (slot
// first + last − unit) with [E' | Mᵀ], the gradients entering each segment's end from dht;
// the main pass runs every unit from those.
//
// Why: the dh recurrence needs no forward state (only P, T·diag(β), the decays, q, k, dO), so
// the two chains are independent; everything else of the backward is parallel over chunks.
// The stores are what the parallel passes cannot cheaply recompute (S, dS') or what the
// chains already hold as MMA operands (X, v', dv'), rounded exactly as multiplied.

namespace gdn {
namespace chunked {

constexpr int LDO = STAGE_LD;  // a column group's C × 16 staging tile of dv

// The unit table's flags (chunk_bwd.rs mirrors them, as chunked.cu's): the unit starts / ends
// its sequence. BWD_LOCAL (a ChunkParams flag): the segments' local pass.
constexpr int BWD_UNIT_FIRST = 1;
constexpr int BWD_UNIT_LAST = 2;
constexpr int BWD_LOCAL = 1 << 9;

// The segments' buffers (null without segments), f32, per (slot, v-head): `start` K × V
// (combined start states, slot = unit), `end` K × (V + K) ([E | M] of the states local pass,
// slot = unit), `dh_start` K × V (the gradients entering each unit's end, slot = reversed),
// `dh_end` K × (V + K) ([E' | Mᵀ], slot = reversed); `seq_units` per sequence its first unit,
// then the end.
struct SegmentIo {
    const int* seq_units;
    const float* start;
    float* end;
    const float* dh_start;
    float* dh_end;
};

// A unit's slot in the dh direction: its sequence's units in reverse order.
__device__ __forceinline__ int reversed_slot(const int* seq_units, int seq, int unit) {
    return seq_units[seq] + seq_units[seq + 1] - 1 - unit;
}

// Pass-wide layout (byte offsets): two stages of chunk.cuh's StageLayout, as the forward's
// (V-block of v in the states chain, of dO in the dh chain; q and P in the dh chain only).
// After both stages, the dh pass's dv staging tiles (one per 16 columns), then with KS = 2 (a
// pair of warps per 16 columns, each holding half the state's K rows) one f32 16 × C partial
// sum per warp. Mirrored by chain_smem in chunk_bwd_chain.rs.
// Row stride of a warp's staging tile for its state stores (store_state_staged): half of the
// largest K (64 rows of the state at a time) plus 8 elements of padding.
constexpr int STATE_STAGE_LD = MAX_K / 2 + 8;

template <int BV, int KS = 1> struct ChainLayout : StageLayout<BV> {
    static constexpr int STATES_STAGE = StageLayout<BV>::SHORT_STAGE;
    static constexpr int DH_STAGE = StageLayout<BV>::FULL_STAGE;
    static constexpr int GROUPS = BV / 16;
    static constexpr int WARPS = GROUPS * KS;
    static constexpr int THREADS = 32 * WARPS;
    static constexpr int PARTIAL_BYTES = KS == 2 ? WARPS * 4 * 16 * C : 0;
    static constexpr int STATES_PARTIAL_OFF = 2 * STATES_STAGE;
    static constexpr int DH_PARTIAL_OFF = 2 * DH_STAGE + GROUPS * C * LDO * 2;
    // Single warps' staging tiles for the S stores (pairs stage through their partial slots):
    // 16 × (64 + 8) 16-bit elements per warp, half the K rows at a time.
    static constexpr int STAGING_OFF = STATES_PARTIAL_OFF + PARTIAL_BYTES;
    static constexpr int STAGING_BYTES = KS == 1 ? WARPS * 2 * 16 * STATE_STAGE_LD : 0;
    static constexpr int STATES_BYTES = STAGING_OFF + STAGING_BYTES;
    static_assert(4 * 16 * C >= 2 * 16 * STATE_STAGE_LD, "a pair's partial slot holds half a state block");
    static constexpr int DH_BYTES = DH_PARTIAL_OFF + PARTIAL_BYTES;
};

// Which K rows of the state a warp holds: 16-row blocks [lo, lo + n) of nk (its pair's first
// warp takes the odd block when nk is odd).
struct KRows {
    int lo, n;
};
template <int KS> __device__ __forceinline__ KRows k_rows(int nk, int half) {
    if (KS == 1) return {0, nk};
    const int first = (nk + 1) / 2;
    return half == 0 ? KRows{0, first} : KRows{first, nk - first};
}

// A pair's partial sums acc (16 columns × C) summed: each warp writes its own to its slot,
// then both add the two slots in the same order (slot 0 first), so both hold the same sum.
// `slots` is the pair's two 16 × C f32 slots, `bar` its named barrier.
__device__ __forceinline__ void pair_sum(float (&acc)[C / 8][4], float* slots, int half, int bar) {
    const int lane = threadIdx.x & 31;
    float* mine = slots + half * 16 * C;
#pragma unroll
    for (int j = 0; j < C / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) mine[(4 * j + e) * 32 + lane] = acc[j][e];
    }
    named_barrier(bar, 64);
#pragma unroll
    for (int j = 0; j < C / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int at = (4 * j + e) * 32 + lane;
            acc[j][e] = slots[at] + slots[16 * C + at];
        }
    }
}

// Transposed accumulators (16 columns × 16·n rows, row 8j + 2t + (e & 1) of column g + 8(e >> 1))
// to a row-major 16-bit matrix whose rows are the columns: pairs of rows are adjacent.
template <typename T, int N8>
__device__ __forceinline__ void store_transposed(T* dst, size_t ld, const float (&acc)[N8][4]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < N8; ++j) {
        const int r = 8 * j + 2 * t;
        *reinterpret_cast<unsigned*>(dst + (size_t)g * ld + r) = pack2<T>(acc[j][0], acc[j][1]);
        *reinterpret_cast<unsigned*>(dst + (size_t)(g + 8) * ld + r) = pack2<T>(acc[j][2], acc[j][3]);
    }
}

// A warp's state block (the accumulators acc: Sᵀ or dS'ᵀ rows c0 + g, c0 + g + 8, K rows
// 16·kr.lo + 8j + 2t (+ 1)), rounded, to dst (row c0 of a row-major V × K matrix, rows ld
// apart), staged through `stage`, 16 × (64 + 8) 16-bit elements of this warp's alone, 64 K
// rows at a time, so that each lane stores whole 16-byte vectors (4 rows of 8 lanes per
// instruction, each row's vectors contiguous). Stored directly, 4 bytes a lane, the stores
// held the chain: ncu showed its next instructions waiting on the store registers (long_sb on
// the packs, 2026-12-03).
template <typename T, int NB>
__device__ __forceinline__ void store_state_staged(T* dst, size_t ld, const float (&acc)[2 * NB][4], T* stage,
                                                   KRows kr) {
    constexpr int SLD = STATE_STAGE_LD;
    constexpr int PARTS = (2 * NB + 7) / 8;  // 64 K rows (8 accumulator blocks) each
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int part = 0; part < PARTS; ++part) {
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
            const int j = 8 * part + jj;
            if (j < 2 * NB && j < 2 * kr.n) {
                *reinterpret_cast<unsigned*>(stage + g * SLD + 8 * jj + 2 * t) = pack2<T>(acc[j][0], acc[j][1]);
                *reinterpret_cast<unsigned*>(stage + (g + 8) * SLD + 8 * jj + 2 * t) = pack2<T>(acc[j][2], acc[j][3]);
            }
        }
        __syncwarp();
        const int vec = lane & 7;
        if (8 * part + vec < 2 * kr.n) {
#pragma unroll
            for (int r4 = 0; r4 < 16; r4 += 4) {
                const int row = r4 + (lane >> 3);
                *reinterpret_cast<uint4*>(dst + (size_t)row * ld + 16 * kr.lo + 64 * part + 8 * vec) =
                    *reinterpret_cast<const uint4*>(stage + row * SLD + 8 * vec);
            }
        }
        __syncwarp();
    }
}

// Accumulators acc (16 columns × C tokens) as A operands over the tokens, each token's value
// scaled by f[token] (f = nullptr: unscaled) and by `sign`.
template <typename T>
__device__ __forceinline__ void pack_tokens(unsigned (&a)[C / 16][4], const float (&acc)[C / 8][4],
                                            const float* f, float sign) {
    const int t = threadIdx.x & 3;
#pragma unroll
    for (int j = 0; j < C / 8; ++j) {
        const int i = 8 * j + 2 * t, kb = j >> 1, half = (j & 1) * 2;
        const float f0 = f != nullptr ? sign * f[i] : sign, f1 = f != nullptr ? sign * f[i + 1] : sign;
        a[kb][half] = pack2<T>(acc[j][0] * f0, acc[j][1] * f1);
        a[kb][half + 1] = pack2<T>(acc[j][2] * f0, acc[j][3] * f1);
    }
}

__device__ __forceinline__ void zero_acc(float (&acc)[C / 8][4]) {
#pragma unroll
    for (int j = 0; j < C / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
    }
}

// acc (16 × C) += Sᵀ·Bᵀ over this warp's K rows (blocks kr.lo + kb, kb < kr.n): the state
// accumulators rounded as A operands, B = a C × K token-major tile (k or q) through this
// lane's n-major ldmatrix address.
template <typename T, int NB>
__device__ __forceinline__ void state_times(float (&acc)[C / 8][4], const float (&s)[2 * NB][4],
                                            unsigned lane_bt, KRows kr) {
#pragma unroll
    for (int kb = 0; kb < NB; ++kb) {
        if (kb < kr.n) {
            unsigned fb[C / 16][4];
#pragma unroll
            for (int jp = 0; jp < C / 16; ++jp) {
                ldsm4(fb[jp], lane_bt + 2 * (16 * jp * LDK + 16 * (kr.lo + kb)));
            }
            const float* s0 = s[2 * kb];
            const float* s1 = s[2 * kb + 1];
            const unsigned a[4] = {pack2<T>(s0[0], s0[1]), pack2<T>(s0[2], s0[3]), pack2<T>(s1[0], s1[1]),
                                   pack2<T>(s1[2], s1[3])};
#pragma unroll
            for (int jp = 0; jp < C / 16; ++jp) {
                MmaOp<T>::run(acc[2 * jp], a, fb[jp][0], fb[jp][1]);
                MmaOp<T>::run(acc[2 * jp + 1], a, fb[jp][2], fb[jp][3]);
            }
        }
    }
}

// acc (16 × C) += a·B for a lower-triangular C × C tile B stored row-major (B[j][i], nonzero
// for j ≥ i): output token block ib reads blocks jb ≥ ib.
template <typename T>
__device__ __forceinline__ void times_lower(float (&acc)[C / 8][4], const unsigned (&a)[C / 16][4],
                                            unsigned lane_b) {
#pragma unroll
    for (int ib = 0; ib < C / 16; ++ib) {
        unsigned fb[C / 16][4];
#pragma unroll
        for (int jb = ib; jb < C / 16; ++jb) ldsm4_t(fb[jb], lane_b + 2 * (16 * jb * LDC + 16 * ib));
#pragma unroll
        for (int jb = ib; jb < C / 16; ++jb) {
            MmaOp<T>::run(acc[2 * ib], a[jb], fb[jb][0], fb[jb][1]);
            MmaOp<T>::run(acc[2 * ib + 1], a[jb], fb[jb][2], fb[jb][3]);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The states pass.

template <typename T, int BV, int KS = 1>
__device__ void bwd_states(const ChunkParams p, const int* __restrict__ chunks,
                           const int* __restrict__ units, const T* __restrict__ k,
                           const T* __restrict__ v, const float* __restrict__ ws_f,
                           const T* __restrict__ ws_a, const float* __restrict__ h0,
                           T* __restrict__ ws_h, T* __restrict__ ws_x, T* __restrict__ ws_vp,
                           const SegmentIo seg, const int first_thread = 0,
                           const int smem_offset = 0, const int barrier = 0, const int unit_z = -1) {
    using L = ChainLayout<BV, KS>;
    constexpr int NB = MAX_K / 16 / KS;  // 16-row blocks of the state a warp holds at most
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char* const role_smem = smem + smem_offset;
    const int tid = threadIdx.x - first_thread;
    const int K = p.key_dim, V = p.value_dim, H = p.heads_qk, HV = p.heads_v;
    const int hv = blockIdx.y, unit = unit_z < 0 ? (int)blockIdx.z : unit_z, h = hv / p.group;
    const int first = units[4 * unit], end = units[4 * unit + 1];
    const int seq = units[4 * unit + 2], unit_flags = units[4 * unit + 3];
    const int flags = p.flags;
    const bool local = flags & BWD_LOCAL;
    // Local pass: blocks past the v-blocks carry the transition's K columns (v = 0), wanted by
    // every unit of a cut sequence; E by every unit but the last.
    const int v_blocks = (V + BV - 1) / BV;
    const bool transition = local && (int)blockIdx.x >= v_blocks;
    const bool whole = (unit_flags & BWD_UNIT_FIRST) && (unit_flags & BWD_UNIT_LAST);
    if (local && (transition ? whole : (unit_flags & BWD_UNIT_LAST) != 0)) return;
    const int cols = transition ? K : V;
    const int col0 = (transition ? (int)blockIdx.x - v_blocks : (int)blockIdx.x) * BV;
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int cw = warp / KS, half = warp % KS;  // column group, its half of the K rows
    const int wc = cw * 16, c0 = col0 + wc;
    const bool active = c0 < cols;
    const int nk = K / 16;
    const KRows kr = k_rows<KS>(nk, half);
    const int pair_bar = barrier + 1 + cw;

    const unsigned smem0 = smem_addr(role_smem);
    const unsigned lane_kt = 2 * (L::K_OFF / 2 + lane_b_nmajor<LDK>(lane));  // Kᵀ
    const unsigned lane_at = 2 * (L::A_OFF / 2 + lane_b_nmajor<LDC>(lane));  // (T·diag(β))ᵀ
    const unsigned lane_k = 2 * (L::K_OFF / 2 + lane_b_kmajor<LDK>(lane));   // K
    float* const partials = reinterpret_cast<float*>(role_smem + L::STATES_PARTIAL_OFF) + cw * 2 * 16 * C;
    T* const state_stage = KS == 2 ? reinterpret_cast<T*>(partials + half * 16 * C)
                                   : reinterpret_cast<T*>(role_smem + L::STAGING_OFF) + warp * 16 * STATE_STAGE_LD;

    const size_t qk_stride = (size_t)H * K;
    const int v_vecs = (min(BV, V - col0) + 7) / 8;
    auto chunk_info = [&](int c) { return reinterpret_cast<const int2*>(chunks)[c]; };
    auto prefetch = [&](int chunk, int s, int2 info) {
        const unsigned base = smem0 + s * L::STATES_STAGE;
        const int start = info.x, len = info.y;
        const size_t ch = (size_t)chunk * HV + hv;
        copy_tile<L::THREADS, MAX_K / 8, LDK>(base + L::K_OFF, k + ((size_t)start * H + h) * K, qk_stride,
                                              len, K / 8, tid);
        if (!transition) {
            copy_tile<L::THREADS, BV / 8, L::LDV>(base + L::V_OFF, v + ((size_t)start * HV + hv) * V + col0,
                                                  (size_t)HV * V, len, v_vecs, tid);
        }
        copy_tile<L::THREADS, C / 8, LDC>(base + L::A_OFF, ws_a + ch * C * C, (size_t)C, C, C / 8, tid);
        if (tid < 2 * C / 4) {
            cp_async16_zfill(base + L::F_OFF + 16 * tid, ws_f + ch * 4 * C + 4 * tid, true);
        }
    };

    // sacc[j] holds Sᵀ rows (columns c0 + g, c0 + g + 8) × K rows 16·kr.lo + 8j + 2t (+ 1).
    const size_t user_slice = ((size_t)seq * HV + hv) * (size_t)K * V;
    const size_t unit_slice = ((size_t)unit * HV + hv) * (size_t)K;
    float sacc[2 * NB][4];
#pragma unroll
    for (int j = 0; j < 2 * NB; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = 16 * kr.lo + 8 * j + 2 * t + (e & 1), c = c0 + g + 8 * (e >> 1);
            float x = 0.0f;
            if (active && j < 2 * kr.n) {
                if (transition) x = r == c ? 1.0f : 0.0f;
                else if (local) x = 0.0f;
                else if (!(unit_flags & BWD_UNIT_FIRST)) x = seg.start[(unit_slice + r) * V + c];
                else if (h0 != nullptr) {
                    x = h0[user_slice + ((flags & STATE_V_FIRST) ? (size_t)c * K + r : (size_t)r * V + c)];
                }
            }
            sacc[j][e] = x;
        }
    }

    auto info_of = [&](int c) { return c < end ? chunk_info(c) : make_int2(0, 0); };
    int2 info1 = info_of(first + 1);
    if (first < end) {
        prefetch(first, 0, info_of(first));
        cp_async_commit();
    }
    for (int chunk = first, s = 0; chunk < end; ++chunk, s ^= 1) {
        const int2 info2 = info_of(chunk + 2);
        cp_async_wait_group<0>();
        named_barrier(barrier, L::THREADS);  // this chunk's tiles are in stage s; every warp is done with s ^ 1
        if (chunk + 1 < end) {
            prefetch(chunk + 1, s ^ 1, info1);
            cp_async_commit();
        }
        if (active) {
            const unsigned base = smem0 + s * L::STATES_STAGE;
            const unsigned char* stage = role_smem + s * L::STATES_STAGE;
            const T* vs = reinterpret_cast<const T*>(stage + L::V_OFF);
            const float* gam = reinterpret_cast<const float*>(stage + L::F_OFF);  // γ_i
            const float* dec = gam + C;                                            // γ_C/γ_i
            const size_t ch = (size_t)chunk * HV + hv;

            // The chunk's start state, rounded as the MMAs take it, as Sᵀ (V × K), staged: pairs
            // through the warp's partial-sum slot (free until this chunk's pair sum: the partner
            // read it before the chunk's barrier), single warps through their staging tile.
            if (!local) store_state_staged<T, NB>(ws_h + (ch * V + c0) * K, (size_t)K, sacc, state_stage, kr);

            // Xᵀ = Vᵀ − (K·S)ᵀ·diag(γ), rounded (the forward's operand), stored as V × C. A
            // pair sums its halves of K·S first; both warps then go on with the whole X.
            float xacc[C / 8][4];
            zero_acc(xacc);
            state_times<T, NB>(xacc, sacc, base + lane_kt, kr);
            if (KS == 2) pair_sum(xacc, partials, half, pair_bar);
#pragma unroll
            for (int j = 0; j < C / 8; ++j) {
                const int i = 8 * j + 2 * t;
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float vi = transition ? 0.0f : to_f32(vs[(i + (e & 1)) * L::LDV + wc + g + 8 * (e >> 1)]);
                    xacc[j][e] = vi - gam[i + (e & 1)] * xacc[j][e];
                }
            }
            unsigned xa[C / 16][4];
            pack_tokens<T>(xa, xacc, nullptr, 1.0f);
            if (!local && half == 0) store_transposed<T>(ws_x + (ch * V + c0) * C, C, xacc);

            // v'ᵀ = Xᵀ·(T·diag(β))ᵀ; T is lower triangular: token block ip reads blocks kb ≤ ip.
            float vacc[C / 8][4];
            zero_acc(vacc);
#pragma unroll
            for (int ip = 0; ip < C / 16; ++ip) {
                unsigned fa[C / 16][4];
#pragma unroll
                for (int kb = 0; kb <= ip; ++kb) ldsm4(fa[kb], base + lane_at + 2 * (16 * ip * LDC + 16 * kb));
#pragma unroll
                for (int kb = 0; kb <= ip; ++kb) {
                    MmaOp<T>::run(vacc[2 * ip], xa[kb], fa[kb][0], fa[kb][1]);
                    MmaOp<T>::run(vacc[2 * ip + 1], xa[kb], fa[kb][2], fa[kb][3]);
                }
            }
            if (!local && half == 0) store_transposed<T>(ws_vp + (ch * V + c0) * C, C, vacc);

            // Sᵀ ← γ_C·Sᵀ + (diag(γ_C/γ)·v')ᵀ·K, this warp's K rows.
            unsigned vd[C / 16][4];
            pack_tokens<T>(vd, vacc, dec, 1.0f);
            update_state<T, NB>(sacc, vd, base + lane_k, kr.lo, kr.n, gam[C - 1]);
        }
        info1 = info2;
    }

    // Local pass: E (v columns), M (transition columns) for the combine from h0, Mᵀ (the dh
    // chain's transition) for the one from dht.
    if (!local || !active) return;
    const int slot = transition && !(unit_flags & BWD_UNIT_FIRST) ? reversed_slot(seg.seq_units, seq, unit) : 0;
    const size_t slot_slice = ((size_t)slot * HV + hv) * (size_t)K;
#pragma unroll
    for (int j = 0; j < 2 * NB; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = 16 * kr.lo + 8 * j + 2 * t + (e & 1), c = c0 + g + 8 * (e >> 1);
            if (j < 2 * kr.n) {
                if (!(unit_flags & BWD_UNIT_LAST)) seg.end[(unit_slice + r) * (V + K) + (transition ? V : 0) + c] = sacc[j][e];
                if (transition && !(unit_flags & BWD_UNIT_FIRST)) seg.dh_end[(slot_slice + c) * (V + K) + V + r] = sacc[j][e];
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The state-gradient (dh) pass.

template <typename T, int BV, int KS = 1>
__device__ void bwd_dh(const ChunkParams p, const int* __restrict__ chunks,
                       const int* __restrict__ units, const T* __restrict__ q,
                       const T* __restrict__ k, const T* __restrict__ d_o,
                       const float* __restrict__ ws_f, const T* __restrict__ ws_a,
                       const T* __restrict__ ws_p, const float* __restrict__ dht,
                       T* __restrict__ dv, float* __restrict__ dh0, T* __restrict__ ws_dh,
                       T* __restrict__ ws_dvp, const SegmentIo seg, const int first_thread = 0,
                       const int smem_offset = 0, const int barrier = 0, const int unit_z = -1) {
    using L = ChainLayout<BV, KS>;
    constexpr int NB = MAX_K / 16 / KS;  // 16-row blocks of the state a warp holds at most
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char* const role_smem = smem + smem_offset;
    const int tid = threadIdx.x - first_thread;
    const int K = p.key_dim, V = p.value_dim, H = p.heads_qk, HV = p.heads_v;
    const int hv = blockIdx.y, unit = unit_z < 0 ? (int)blockIdx.z : unit_z, h = hv / p.group;
    const int first = units[4 * unit], end = units[4 * unit + 1];
    const int seq = units[4 * unit + 2], unit_flags = units[4 * unit + 3];
    const int flags = p.flags;
    const bool local = flags & BWD_LOCAL;
    // Local pass: E' for every unit but the first, v columns only (the transition, Mᵀ, comes
    // from the states chain's local pass).
    if (local && ((int)blockIdx.x >= (V + BV - 1) / BV || (unit_flags & BWD_UNIT_FIRST))) return;
    const bool whole = (unit_flags & BWD_UNIT_FIRST) && (unit_flags & BWD_UNIT_LAST);
    const int slot = whole ? unit : reversed_slot(seg.seq_units, seq, unit);
    const size_t slot_slice = ((size_t)slot * HV + hv) * (size_t)K;
    const int col0 = blockIdx.x * BV;
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int cw = warp / KS, half = warp % KS;  // column group, its half of the K rows
    const int wc = cw * 16, c0 = col0 + wc;
    const bool active = c0 < V;
    const int nk = K / 16;
    const KRows kr = k_rows<KS>(nk, half);
    const int pair_bar = barrier + 1 + cw;

    const unsigned smem0 = smem_addr(role_smem);
    T* const dv_stage = reinterpret_cast<T*>(role_smem + 2 * L::DH_STAGE) + cw * C * LDO;
    float* const partials = reinterpret_cast<float*>(role_smem + L::DH_PARTIAL_OFF) + cw * 2 * 16 * C;
    static_assert(C * LDO >= 16 * STATE_STAGE_LD, "a dv staging tile holds half a state block");
    T* const state_stage = KS == 2 ? reinterpret_cast<T*>(partials + half * 16 * C) : dv_stage;
    const unsigned lane_kt = 2 * (L::K_OFF / 2 + lane_b_nmajor<LDK>(lane));  // Kᵀ
    const unsigned lane_k = 2 * (L::K_OFF / 2 + lane_b_kmajor<LDK>(lane));   // K
    const unsigned lane_q = 2 * (L::Q_OFF / 2 + lane_b_kmajor<LDK>(lane));   // Q
    // dOᵀ as an A operand (columns × tokens) from the token-major dO tile: the same lane
    // pattern as an n-major B operand, transposed.
    const unsigned lane_dot = 2 * (L::V_OFF / 2 + lane_b_nmajor<L::LDV>(lane) + wc);
    const unsigned lane_p = 2 * (L::P_OFF / 2 + lane_b_kmajor<LDC>(lane));  // P (B[j][i] = P[j][i])
    const unsigned lane_a = 2 * (L::A_OFF / 2 + lane_b_kmajor<LDC>(lane));  // T·diag(β)

    const size_t qk_stride = (size_t)H * K;
    const int v_vecs = (min(BV, V - col0) + 7) / 8;
    auto chunk_info = [&](int c) { return reinterpret_cast<const int2*>(chunks)[c]; };
    auto prefetch = [&](int chunk, int s, int2 info) {
        const unsigned base = smem0 + s * L::DH_STAGE;
        const int start = info.x, len = info.y;
        const size_t ch = (size_t)chunk * HV + hv;
        copy_tile<L::THREADS, MAX_K / 8, LDK>(base + L::K_OFF, k + ((size_t)start * H + h) * K, qk_stride,
                                              len, K / 8, tid);
        copy_tile<L::THREADS, BV / 8, L::LDV>(base + L::V_OFF, d_o + ((size_t)start * HV + hv) * V + col0,
                                              (size_t)HV * V, len, v_vecs, tid);
        copy_tile<L::THREADS, C / 8, LDC>(base + L::A_OFF, ws_a + ch * C * C, (size_t)C, C, C / 8, tid);
        if (tid < 2 * C / 4) {
            cp_async16_zfill(base + L::F_OFF + 16 * tid, ws_f + ch * 4 * C + 4 * tid, true);
        }
        copy_tile<L::THREADS, MAX_K / 8, LDK>(base + L::Q_OFF, q + ((size_t)start * H + h) * K, qk_stride,
                                              len, K / 8, tid);
        copy_tile<L::THREADS, C / 8, LDC>(base + L::P_OFF, ws_p + ch * C * C, (size_t)C, C, C / 8, tid);
    };

    // dsacc[j] holds dSᵀ rows (columns c0 + g, c0 + g + 8) × K rows 16·kr.lo + 8j + 2t (+ 1).
    const size_t user_slice = ((size_t)seq * HV + hv) * (size_t)K * V;
    auto user_state_at = [&](int r, int c) -> size_t {
        return user_slice + ((flags & STATE_V_FIRST) ? (size_t)c * K + r : (size_t)r * V + c);
    };
    float dsacc[2 * NB][4];
#pragma unroll
    for (int j = 0; j < 2 * NB; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = 16 * kr.lo + 8 * j + 2 * t + (e & 1), c = c0 + g + 8 * (e >> 1);
            float x = 0.0f;
            if (active && j < 2 * kr.n && !local) {
                if (!(unit_flags & BWD_UNIT_LAST)) x = seg.dh_start[(slot_slice + r) * V + c];
                else if (dht != nullptr) x = dht[user_state_at(r, c)];
            }
            dsacc[j][e] = x;
        }
    }

    auto info_of = [&](int c) { return c >= first ? chunk_info(c) : make_int2(0, 0); };
    int2 info = info_of(end - 1), info1 = info_of(end - 2);
    if (first < end) {
        prefetch(end - 1, 0, info);
        cp_async_commit();
    }
    for (int chunk = end - 1, s = 0; chunk >= first; --chunk, s ^= 1) {
        const int2 info2 = info_of(chunk - 2);
        cp_async_wait_group<0>();
        named_barrier(barrier, L::THREADS);  // this chunk's tiles are in stage s; every warp is done with s ^ 1
        if (chunk - 1 >= first) {
            prefetch(chunk - 1, s ^ 1, info1);
            cp_async_commit();
        }
        if (active) {
            const unsigned base = smem0 + s * L::DH_STAGE;
            const unsigned char* stage = role_smem + s * L::DH_STAGE;
            const float* gam = reinterpret_cast<const float*>(stage + L::F_OFF);  // γ_i
            const float* dec = gam + C;                                            // γ_C/γ_i
            const size_t ch = (size_t)chunk * HV + hv;

            // dS' (the gradient of the chunk's end state), rounded, as dS'ᵀ (V × K), staged as the
            // states chain's S: pairs through the partial-sum slot, single warps through their dv
            // staging tile (free: its dv store ended the previous chunk).
            if (!local) store_state_staged<T, NB>(ws_dh + (ch * V + c0) * K, (size_t)K, dsacc, state_stage, kr);

            // The terms that do not depend on dS' are issued around the products that do, so
            // that they fill those products' latency (and the pair's barrier): dOᵀ·P (of dv')
            // first, then (after dS'ᵀ·Kᵀ) γ_C·dS'ᵀ + scale·dOᵀ·diag(γ)·Q (of dS).
            unsigned fo[C / 16][4];  // dOᵀ (16 columns × C tokens)
#pragma unroll
            for (int kb = 0; kb < C / 16; ++kb) ldsm4_t(fo[kb], base + lane_dot + 2 * (16 * kb * L::LDV));
            float pacc[C / 8][4];
            zero_acc(pacc);
            times_lower<T>(pacc, fo, base + lane_p);
            unsigned a1[C / 16][4];  // scale·dOᵀ·diag(γ)
#pragma unroll
            for (int kb = 0; kb < C / 16; ++kb) {
                const int i0 = 16 * kb + 2 * t, i1 = i0 + 8;
                const float s00 = p.scale * gam[i0], s01 = p.scale * gam[i0 + 1];
                const float s10 = p.scale * gam[i1], s11 = p.scale * gam[i1 + 1];
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const float2 x = unpack2<T>(fo[kb][r]);
                    const float f0 = r < 2 ? s00 : s10, f1 = r < 2 ? s01 : s11;
                    a1[kb][r] = pack2<T>(x.x * f0, x.y * f1);
                }
            }

            // dv'ᵀ = dS'ᵀ·Kᵀ·diag(γ_C/γ) + dOᵀ·P (a pair sums its halves of dS'ᵀ·Kᵀ first; both
            // warps then go on with the whole dv').
            float dvacc[C / 8][4];
            zero_acc(dvacc);
            state_times<T, NB>(dvacc, dsacc, base + lane_kt, kr);
            update_state<T, NB>(dsacc, a1, base + lane_q, kr.lo, kr.n, gam[C - 1]);
            if (KS == 2) pair_sum(dvacc, partials, half, pair_bar);
#pragma unroll
            for (int j = 0; j < C / 8; ++j) {
                const int i = 8 * j + 2 * t;
                dvacc[j][0] = fmaf(dvacc[j][0], dec[i], pacc[j][0]);
                dvacc[j][1] = fmaf(dvacc[j][1], dec[i + 1], pacc[j][1]);
                dvacc[j][2] = fmaf(dvacc[j][2], dec[i], pacc[j][2]);
                dvacc[j][3] = fmaf(dvacc[j][3], dec[i + 1], pacc[j][3]);
            }
            if (!local && half == 0) store_transposed<T>(ws_dvp + (ch * V + c0) * C, C, dvacc);

            // dXᵀ = dv'ᵀ·(T·diag(β)) (= dv), stored through the warp's staging tile.
            unsigned dva[C / 16][4];
            pack_tokens<T>(dva, dvacc, nullptr, 1.0f);
            float dxacc[C / 8][4];
            zero_acc(dxacc);
            times_lower<T>(dxacc, dva, base + lane_a);
            if (!local && half == 0) {
                const int2 ci = chunk_info(chunk);
                store_staged<T, false>(dxacc, dv_stage, 0, dv, ci.x, ci.y, HV, hv, V, c0, lane);
            }

            // dSᵀ ← γ_C·dS'ᵀ + (scale·dOᵀ·diag(γ))·Q (above) − (dXᵀ·diag(γ))·K.
            unsigned a2[C / 16][4];
            pack_tokens<T>(a2, dxacc, gam, -1.0f);
            add_tokens_times<T, NB>(dsacc, a2, base + lane_k, kr.lo, kr.n);
        }
        info1 = info2;
    }

    // Local pass: E' for the combine from dht; main pass: dh0 at the sequence's start.
    if (!active || (!local && (dh0 == nullptr || !(unit_flags & BWD_UNIT_FIRST)))) return;
#pragma unroll
    for (int j = 0; j < 2 * NB; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = 16 * kr.lo + 8 * j + 2 * t + (e & 1), c = c0 + g + 8 * (e >> 1);
            if (j < 2 * kr.n) {
                if (local) seg.dh_end[(slot_slice + r) * (V + K) + c] = dsacc[j][e];
                else dh0[user_state_at(r, c)] = dsacc[j][e];
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Both chains in one block (V-blocks 32 and 64, and 32 with warp pairs): the first L::THREADS
// threads run the states pass, the next L::THREADS the dh pass of the same (V-block, v-head,
// sequence), each in its own shared memory (the states layout, then the dh layout) behind its
// own named barriers (states: 1 and its pairs' 2 …, dh: 2 + GROUPS and its pairs'). The chains
// are latency-bound at a few warps per SM: run one after the other, each leaves the SMs mostly
// idle; side by side, the slower one's time is the pair's.
template <typename T, int BV, int KS = 1>
__device__ void bwd_chains(const ChunkParams p, const int* __restrict__ chunks,
                           const int* __restrict__ units, const T* __restrict__ q,
                           const T* __restrict__ k, const T* __restrict__ v,
                           const T* __restrict__ d_o, const float* __restrict__ ws_f,
                           const T* __restrict__ ws_a, const T* __restrict__ ws_p,
                           const float* __restrict__ h0, const float* __restrict__ dht,
                           T* __restrict__ dv, float* __restrict__ dh0, T* __restrict__ ws_h,
                           T* __restrict__ ws_x, T* __restrict__ ws_vp, T* __restrict__ ws_dh,
                           T* __restrict__ ws_dvp, const SegmentIo seg) {
    using L = ChainLayout<BV, KS>;
    if (threadIdx.x < L::THREADS) {
        bwd_states<T, BV, KS>(p, chunks, units, k, v, ws_f, ws_a, h0, ws_h, ws_x, ws_vp, seg, 0, 0, 1);
    } else {
        bwd_dh<T, BV, KS>(p, chunks, units, q, k, d_o, ws_f, ws_a, ws_p, dht, dv, dh0, ws_dh, ws_dvp, seg,
                          L::THREADS, L::STATES_BYTES, 2 + L::GROUPS);
    }
}


// Both chains in one launch, a block each (V-block 32 with warp pairs): the grid's z holds the
// units twice, the dh pass's blocks first (the longer chain, dispatched first), then the
// states pass's. Where the two grids together are resident at one block per SM (few heads
// and sequences), each chain has an SM of its own instead of sharing one (bwd_chains).
template <typename T, int BV, int KS = 1>
__device__ void bwd_chains_apart(const ChunkParams p, const int* __restrict__ chunks,
                                 const int* __restrict__ units, const T* __restrict__ q,
                                 const T* __restrict__ k, const T* __restrict__ v,
                                 const T* __restrict__ d_o, const float* __restrict__ ws_f,
                                 const T* __restrict__ ws_a, const T* __restrict__ ws_p,
                                 const float* __restrict__ h0, const float* __restrict__ dht,
                                 T* __restrict__ dv, float* __restrict__ dh0, T* __restrict__ ws_h,
                                 T* __restrict__ ws_x, T* __restrict__ ws_vp, T* __restrict__ ws_dh,
                                 T* __restrict__ ws_dvp, const SegmentIo seg) {
    const int num_units = (int)gridDim.z / 2, z = blockIdx.z;
    if (z < num_units) {
        bwd_dh<T, BV, KS>(p, chunks, units, q, k, d_o, ws_f, ws_a, ws_p, dht, dv, dh0, ws_dh, ws_dvp, seg,
                          0, 0, 0, z);
    } else {
        bwd_states<T, BV, KS>(p, chunks, units, k, v, ws_f, ws_a, h0, ws_h, ws_x, ws_vp, seg, 0, 0, 0,
                              z - num_units);
    }
}

}  // namespace chunked
}  // namespace gdn

// NAME: the kernels' V-block suffix (BV, or BV##p with warp pairs); THREADS per role. Every
// kernel takes the segments' buffers (SegmentIo, in its order; null without segments).
#define GDN_CHUNK_BWD_SEG_ARGS                                                                    \
    const int *seq_units, const float *seg_start, float *seg_end, const float *dh_seg_start,      \
        float *dh_seg_end
#define GDN_CHUNK_BWD_SEG gdn::chunked::SegmentIo{seq_units, seg_start, seg_end, dh_seg_start, dh_seg_end}
#define GDN_CHUNK_BWD_CHAIN(SUFFIX, T, BV, KS, NAME)                                              \
    extern "C" __global__ void __launch_bounds__(BV * 2 * KS, 1) gdn_chunk_bwd_states##NAME##_##SUFFIX( \
        const gdn::chunked::ChunkParams p, const int* chunks, const int* units, const T* k,       \
        const T* v, const float* ws_f, const T* ws_a, const float* h0, T* ws_h, T* ws_x,          \
        T* ws_vp, GDN_CHUNK_BWD_SEG_ARGS) {                                                       \
        gdn::chunked::bwd_states<T, BV, KS>(p, chunks, units, k, v, ws_f, ws_a, h0, ws_h, ws_x, ws_vp, \
                                            GDN_CHUNK_BWD_SEG);                                   \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(BV * 2 * KS, 1) gdn_chunk_bwd_dh##NAME##_##SUFFIX(  \
        const gdn::chunked::ChunkParams p, const int* chunks, const int* units, const T* q,       \
        const T* k, const T* d_o, const float* ws_f, const T* ws_a, const T* ws_p,                \
        const float* dht, T* dv, float* dh0, T* ws_dh, T* ws_dvp, GDN_CHUNK_BWD_SEG_ARGS) {       \
        gdn::chunked::bwd_dh<T, BV, KS>(p, chunks, units, q, k, d_o, ws_f, ws_a, ws_p, dht, dv, dh0, \
                                        ws_dh, ws_dvp, GDN_CHUNK_BWD_SEG);                        \
    }

// Both chains in one launch, as FN (bwd_chains: ROLES = 2 thread sets per block; bwd_chains_apart:
// 1, a block per chain), named gdn_chunk_bwd_KIND##NAME##_##SUFFIX.
#define GDN_CHUNK_BWD_JOINT(SUFFIX, T, BV, KS, NAME, KIND, FN, ROLES)                              \
    extern "C" __global__ void __launch_bounds__(BV * 2 * KS * ROLES, 1) gdn_chunk_bwd_##KIND##NAME##_##SUFFIX( \
        const gdn::chunked::ChunkParams p, const int* chunks, const int* units, const T* q,         \
        const T* k, const T* v, const T* d_o, const float* ws_f, const T* ws_a, const T* ws_p,      \
        const float* h0, const float* dht, T* dv, float* dh0, T* ws_h, T* ws_x, T* ws_vp, T* ws_dh, \
        T* ws_dvp, GDN_CHUNK_BWD_SEG_ARGS) {                                                        \
        gdn::chunked::FN<T, BV, KS>(p, chunks, units, q, k, v, d_o, ws_f, ws_a, ws_p, h0, dht, dv,  \
                                    dh0, ws_h, ws_x, ws_vp, ws_dh, ws_dvp, GDN_CHUNK_BWD_SEG);      \
    }
#define GDN_CHUNK_BWD_BOTH(SUFFIX, T, BV, KS, NAME) GDN_CHUNK_BWD_JOINT(SUFFIX, T, BV, KS, NAME, chains, bwd_chains, 2)
#define GDN_CHUNK_BWD_APART(SUFFIX, T, BV, KS, NAME) \
    GDN_CHUNK_BWD_JOINT(SUFFIX, T, BV, KS, NAME, apart, bwd_chains_apart, 1)

// Every kernel of one dtype: chunk_bwd_chain_f16.cu and chunk_bwd_chain_bf16.cu are one each, so
// the two compile on parallel threads (one source of both took 53 s cold on the H200's host).
#define GDN_CHUNK_BWD_CHAINS(SUFFIX, T)           \
    GDN_CHUNK_BWD_CHAIN(SUFFIX, T, 32, 1, 32)     \
    GDN_CHUNK_BWD_CHAIN(SUFFIX, T, 64, 1, 64)     \
    GDN_CHUNK_BWD_CHAIN(SUFFIX, T, 128, 1, 128)   \
    GDN_CHUNK_BWD_CHAIN(SUFFIX, T, 32, 2, 32p)    \
    GDN_CHUNK_BWD_CHAIN(SUFFIX, T, 64, 2, 64p)    \
    GDN_CHUNK_BWD_BOTH(SUFFIX, T, 32, 1, 32)      \
    GDN_CHUNK_BWD_BOTH(SUFFIX, T, 64, 1, 64)      \
    GDN_CHUNK_BWD_BOTH(SUFFIX, T, 32, 2, 32p)     \
    GDN_CHUNK_BWD_APART(SUFFIX, T, 32, 2, 32p)

