// Runs one exported hard case (tests/common/cases.rs, see README.md) through the chunked
// backward on the emulator, with the l2norm and finishing steps of chunked.cu / backward.cu
// written out on the host, and prints the rel-L2 of every gradient against the f64 oracle.
#include "kernels.inc"
#include "tables.h"
#include <cstdio>
#include <string>

using namespace gdn::chunked;

static std::vector<unsigned char> bytes;
static size_t pos = 0;
template <typename X> std::vector<X> take(size_t n) {
    std::vector<X> v(n); memcpy(v.data(), bytes.data() + pos, n * sizeof(X)); pos += n * sizeof(X); return v;
}
static double rel(const std::vector<float>& a, const std::vector<double>& r) {
    double e = 0, n = 0;
    for (size_t i = 0; i < r.size(); ++i) { e += (a[i] - r[i]) * (a[i] - r[i]); n += r[i] * r[i]; }
    return n > 0 ? sqrt(e / n) : sqrt(e);
}

template <typename T>
int run(int ints[], const std::vector<int>& cu, float scale, int BV, int seg, int KS, int together) {
    int N = ints[0], TT = ints[1], H = ints[2], HV = ints[3], K = ints[4], V = ints[5], flags = ints[6];
    bool has_h0 = ints[7], has_dht = ints[8];
    auto q = take<float>((size_t)TT * H * K), k = take<float>((size_t)TT * H * K), v = take<float>((size_t)TT * HV * V);
    auto g = take<float>((size_t)TT * HV), beta = take<float>((size_t)TT * HV);
    std::vector<float> h0, a_log, dt_bias, dht;
    if (has_h0) h0 = take<float>((size_t)N * HV * K * V);
    bool gate = flags & 8;
    if (gate) { a_log = take<float>(HV); dt_bias = take<float>(HV); }
    auto d_o = take<float>((size_t)TT * HV * V);
    if (has_dht) dht = take<float>((size_t)N * HV * K * V);
    auto e_dq = take<double>((size_t)TT * H * K), e_dk = take<double>((size_t)TT * H * K), e_dv = take<double>((size_t)TT * HV * V);
    auto e_dg = take<double>((size_t)TT * HV), e_db = take<double>((size_t)TT * HV);
    std::vector<double> e_dh0, e_da, e_ddt;
    if (has_h0) e_dh0 = take<double>((size_t)N * HV * K * V);
    if (gate) { e_da = take<double>(HV); e_ddt = take<double>(HV); }

    auto to16 = [](const std::vector<float>& x) { std::vector<T> y(x.size()); for (size_t i = 0; i < x.size(); ++i) y[i] = gdn::from_f32<T>(x[i]); return y; };
    auto Q = to16(q), Kt = to16(k), Vt = to16(v), DO = to16(d_o);
    if (flags & 1) {  // l2norm: q̂, k̂ rounded to the storage dtype
        for (auto* x : {&Q, &Kt}) for (size_t r = 0; r < x->size() / K; ++r) {
            float ss = 0; for (int i = 0; i < K; ++i) { float f = gdn::to_f32((*x)[r * K + i]); ss += f * f; }
            float rr = 1.0f / sqrtf(ss + 1e-6f);
            for (int i = 0; i < K; ++i) (*x)[r * K + i] = gdn::from_f32<T>(gdn::to_f32((*x)[r * K + i]) * rr);
        }
    }
    // Chunk and unit tables as ChunkedScratch builds them (segments of `seg` chunks; 0: whole).
    std::vector<int> chunks, units, seq_units;
    chunk_tables(cu, N, seg, chunks, units, seq_units);
    const int NU = units.size() / 4;
    const bool segmented = NU > N;
    int NC = chunks.size() / 2;
    if (chunks.empty()) chunks.push_back(0);
    ChunkParams p{H, HV, K, V, HV / H, flags, NC, scale};
    size_t heads = (size_t)NC * HV + 1;
    std::vector<float> ws_f(heads * 4 * 64);
    std::vector<T> ws_a(heads * 4096), ws_p(heads * 4096), ws_t(heads * 4096), ws_h(heads * V * K), ws_dh(heads * V * K),
        ws_x(heads * V * 64), ws_vp(heads * V * 64), ws_dvp(heads * V * 64), dv((size_t)TT * HV * V, gdn::from_f32<T>(NAN));
    // dq, dk per q/k head: f32 partials with l2norm, else the storage dtype (as on the device).
    const bool l2 = flags & 1;
    std::vector<float> dq((size_t)TT * H * K, NAN), dk((size_t)TT * H * K, NAN);
    std::vector<T> dq16((size_t)TT * H * K, gdn::from_f32<T>(NAN)), dk16((size_t)TT * H * K, gdn::from_f32<T>(NAN));
    std::vector<float> dbp(TT * HV, NAN), dgp(TT * HV, NAN), dh0((size_t)N * HV * K * V, NAN);
    const float* H0 = has_h0 ? h0.data() : nullptr; const float* DHT = has_dht ? dht.data() : nullptr;
    float* DH0 = has_h0 ? dh0.data() : nullptr;
    if (NC > 0)
        emu::launch({(unsigned)NC, prep_grid_y(H, HV), 1}, 256, PREP_SMEM, [&] {
            prep<T, true>(p, chunks.data(), Q.data(), Kt.data(), g.data(), beta.data(), gate ? a_log.data() : nullptr,
                          gate ? dt_bias.data() : nullptr, ws_f.data(), ws_a.data(), ws_p.data(), ws_t.data()); });
    // NaN-poisoned segment buffers: a read of a slot nobody wrote shows.
    std::vector<float> sg_start((size_t)NU * HV * K * V, NAN), sg_end((size_t)NU * HV * K * (V + K), NAN),
        dsg_start((size_t)NU * HV * K * V, NAN), dsg_end((size_t)NU * HV * K * (V + K), NAN);
    const SegmentIo sio = segmented ? SegmentIo{seq_units.data(), sg_start.data(), sg_end.data(), dsg_start.data(), dsg_end.data()}
                                    : SegmentIo{};
    size_t st = 2 * 64 * 136 + 2 * 64 * (BV + 8) + 2 * 64 * 72 + 4 * 2 * 64;
    size_t parts = KS == 2 ? 2 * (BV / 16) * 4 * 16 * 64 : 0;
    size_t st_smem = 2 * st + parts + (KS == 1 ? (BV / 16) * 2 * 16 * 72 : 0);  // + the single warps' S staging
    size_t dh_smem = 2 * (st + 2 * 64 * 136 + 2 * 64 * 72) + (BV / 16) * 64 * 24 * 2 + parts;
    auto chains = [&](bool local) {
        ChunkParams pp = p;
        if (local) pp.flags |= BWD_LOCAL;
        const unsigned vb = (V + BV - 1) / BV, kb = local ? (K + BV - 1) / BV : 0;
        Dim3 sg{vb + kb, (unsigned)HV, (unsigned)NU}, dg{together ? vb + kb : vb, (unsigned)HV, (unsigned)NU};
#define STATES(BVV, KSS) emu::launch(sg, BVV * 2 * KSS, st_smem, [&] { bwd_states<T, BVV, KSS>(pp, chunks.data(), units.data(), Kt.data(), Vt.data(), ws_f.data(), ws_a.data(), H0, ws_h.data(), ws_x.data(), ws_vp.data(), sio); });
#define DH(BVV, KSS) emu::launch(dg, BVV * 2 * KSS, dh_smem, [&] { bwd_dh<T, BVV, KSS>(pp, chunks.data(), units.data(), Q.data(), Kt.data(), DO.data(), ws_f.data(), ws_a.data(), ws_p.data(), DHT, dv.data(), DH0, ws_dh.data(), ws_dvp.data(), sio); });
#define BOTH(BVV, KSS) emu::launch(sg, BVV * 4 * KSS, st_smem + dh_smem, [&] { bwd_chains<T, BVV, KSS>(pp, chunks.data(), units.data(), Q.data(), Kt.data(), Vt.data(), DO.data(), ws_f.data(), ws_a.data(), ws_p.data(), H0, DHT, dv.data(), DH0, ws_h.data(), ws_x.data(), ws_vp.data(), ws_dh.data(), ws_dvp.data(), sio); });
#define SERIAL(BVV, KSS) { if (NC > 0) STATES(BVV, KSS) DH(BVV, KSS) }
        // Apart: the units twice in z (dh blocks, then states), one chain per block.
        const Dim3 ag{vb + kb, (unsigned)HV, 2 * (unsigned)NU};
#define APART(BVV, KSS) emu::launch(ag, BVV * 2 * KSS, std::max(st_smem, dh_smem), [&] { bwd_chains_apart<T, BVV, KSS>(pp, chunks.data(), units.data(), Q.data(), Kt.data(), Vt.data(), DO.data(), ws_f.data(), ws_a.data(), ws_p.data(), H0, DHT, dv.data(), DH0, ws_h.data(), ws_x.data(), ws_vp.data(), ws_dh.data(), ws_dvp.data(), sio); });
        if (together == 2) {
            if (BV == 32 && KS == 2) { APART(32, 2) } else { fprintf(stderr, "apart: V-block 32 with warp pairs only\n"); exit(2); }
        } else if (together) {
            if (BV == 32 && KS == 2) { BOTH(32, 2) } else if (BV == 32) { BOTH(32, 1) } else { BOTH(64, 1) }
        } else if (KS == 2) {
            if (BV == 32) SERIAL(32, 2) else SERIAL(64, 2)
        } else if (BV == 32) SERIAL(32, 1) else if (BV == 64) SERIAL(64, 1) else SERIAL(128, 1)
    };
    if (segmented) {
        chains(true);
        gdn::combine::CombineParams cp{HV, K, V, flags};
        const Dim3 cg{(unsigned)((V + 7) / 8), (unsigned)HV, (unsigned)N};
        const size_t cs = 4 * (2 * K * (K + 4) + 2 * K * 8 + 8 * (K + 4));
        emu::launch(cg, 256, cs, [&] { gdn::combine::combine(cp, seq_units.data(), nullptr, H0, sg_end.data(), sg_start.data()); });
        emu::launch(cg, 256, cs, [&] { gdn::combine::combine(cp, seq_units.data(), nullptr, DHT, dsg_end.data(), dsg_start.data()); });
    }
    chains(false);
    if (NC > 0) {
        emu::launch({(unsigned)NC, (unsigned)H, 1}, GRAD_THREADS, GradLayout::BYTES, [&] {
            bwd_grad<T>(p, chunks.data(), Q.data(), Kt.data(), DO.data(), dv.data(), ws_f.data(), ws_p.data(), ws_t.data(), ws_x.data(), ws_vp.data(), ws_dvp.data(), ws_h.data(), ws_dh.data(),
                        l2 ? dq.data() : nullptr, l2 ? dk.data() : nullptr, l2 ? nullptr : dq16.data(), l2 ? nullptr : dk16.data(), dgp.data(), dbp.data()); });
    }
    if (!l2) for (size_t i = 0; i < dq.size(); ++i) { dq[i] = gdn::to_f32(dq16[i]); dk[i] = gdn::to_f32(dk16[i]); }
    // Finishing (backward.cu qk_finish on per-q/k-head partials, gate_finish with one V-block).
    std::vector<float> fdq((size_t)TT * H * K), fdk((size_t)TT * H * K);
    for (int t = 0; t < TT; ++t) for (int h = 0; h < H; ++h) {
        std::vector<float> aq(K), ak(K); float sqq = 0, skk = 0, dqq = 0, dkk = 0;
        size_t row = ((size_t)t * H + h) * K;
        for (int i = 0; i < K; ++i) {
            aq[i] = dq[row + i]; ak[i] = dk[row + i];
            float xq = gdn::to_f32(gdn::from_f32<T>(q[row + i])), xk = gdn::to_f32(gdn::from_f32<T>(k[row + i]));
            sqq += xq * xq; skk += xk * xk; dqq += aq[i] * xq; dkk += ak[i] * xk;
        }
        float rq = 1, rk = 1, cq = 0, ck = 0;
        if (flags & 1) { rq = 1 / sqrtf(sqq + 1e-6f); rk = 1 / sqrtf(skk + 1e-6f); cq = dqq * rq * rq * rq; ck = dkk * rk * rk * rk; }
        for (int i = 0; i < K; ++i) {
            float yq = aq[i], yk = ak[i];
            if (flags & 1) { yq = yq * rq - cq * q[row + i]; yk = yk * rk - ck * k[row + i]; }
            fdq[row + i] = gdn::to_f32(gdn::from_f32<T>(yq)); fdk[row + i] = gdn::to_f32(gdn::from_f32<T>(yk));
        }
    }
    std::vector<float> fdg(TT * HV), fdb(TT * HV), fda(HV), fddt(HV), fdv(dv.size());
    for (size_t i = 0; i < dv.size(); ++i) fdv[i] = gdn::to_f32(dv[i]);
    for (int hv = 0; hv < HV; ++hv) {
        float na = gate ? -expf(a_log[hv]) : 0, bias = gate ? dt_bias[hv] : 0, sa = 0, sb = 0;
        for (int t = 0; t < TT; ++t) {
            size_t gi = (size_t)t * HV + hv; float d = 1;
            if (flags & 2) d = gdn::sigmoid(beta[gi]) * gdn::sigmoid(-beta[gi]);
            if (flags & 4) d *= 2;
            fdb[gi] = dbp[gi] * d;
            if (gate) { float x = g[gi] + bias, gv = na * gdn::softplus(x), dgr = dgp[gi] * na * (x > 20 ? 1 : gdn::sigmoid(x));
                fdg[gi] = dgr; sa += dgp[gi] * gv; sb += dgr; } else fdg[gi] = dgp[gi];
        }
        fda[hv] = sa; fddt[hv] = sb;
    }
    printf("dq %.2e dk %.2e dv %.2e dg %.2e db %.2e", rel(fdq, e_dq), rel(fdk, e_dk), rel(fdv, e_dv), rel(fdg, e_dg), rel(fdb, e_db));
    if (has_h0) printf(" dh0 %.2e", rel(dh0, e_dh0));
    if (gate) printf(" dA_log %.2e ddt_bias %.2e", rel(fda, e_da), rel(fddt, e_ddt));
    printf(" (units %d)\n", NU);
    return 0;
}
int main(int argc, char** argv) {
    FILE* f = fopen(argv[1], "rb"); fseek(f, 0, SEEK_END); bytes.resize(ftell(f)); fseek(f, 0, SEEK_SET);
    fread(bytes.data(), 1, bytes.size(), f); fclose(f);
    // file [V-block [segment chunks (0: whole) [warps per 16 columns [1: both chains together, 2: apart]]]]
    int BV = argc > 2 ? atoi(argv[2]) : 32, seg = argc > 3 ? atoi(argv[3]) : 0, KS = argc > 4 ? atoi(argv[4]) : 1;
    int together = argc > 5 ? atoi(argv[5]) : 0;  // 2: apart (both chains in one launch, a block each)
    auto ints = take<int>(10);
    auto cu = take<int>(ints[0] + 1);
    float scale = take<float>(1)[0];
    return ints[9] == 1 ? run<__half>(ints.data(), cu, scale, BV, seg, KS, together) : run<__nv_bfloat16>(ints.data(), cu, scale, BV, seg, KS, together);
}
