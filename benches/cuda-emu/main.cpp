// Runs the chunked backward's kernels (prep, states, dh, grad) on the host through
// shim.h and dumps inputs and gradients (dq, dk per q/k head, f32) for check.py. Usage: see README.md.
#include "kernels.inc"
#include "tables.h"
#include <cstdio>
#include <random>
#include <string>

using namespace gdn::chunked;

template <typename T> uint16_t to16(float x) { T h = gdn::from_f32<T>(x); uint16_t u; memcpy(&u, &h, 2); return u; }
template <typename T> float from16(uint16_t u) { T h; memcpy(&h, &u, 2); return gdn::to_f32(h); }

template <typename T>
int run(int argc, char** argv) {
    // args: dtype H HV K V BV flags h0 dht seed cu0 cu1 ... cuN
    int H = atoi(argv[2]), HV = atoi(argv[3]), K = atoi(argv[4]), V = atoi(argv[5]), BV = atoi(argv[6]);
    int flags = atoi(argv[7]); bool has_h0 = atoi(argv[8]), has_dht = atoi(argv[9]); int seed = atoi(argv[10]);
    std::vector<int> cu; for (int i = 11; i < argc; ++i) cu.push_back(atoi(argv[i]));
    int N = cu.size() - 1, TT = cu.back();
    std::mt19937 rng(seed); std::normal_distribution<float> nd; std::uniform_real_distribution<float> ud;
    auto vec16 = [&](size_t n, bool unitrows, int rowlen) {
        std::vector<float> f(n); for (auto& x : f) x = nd(rng);
        if (unitrows) for (size_t r = 0; r < n / rowlen; ++r) { float s = 0; for (int i = 0; i < rowlen; ++i) s += f[r*rowlen+i]*f[r*rowlen+i]; s = 1/sqrtf(s); for (int i = 0; i < rowlen; ++i) f[r*rowlen+i] *= s; }
        std::vector<uint16_t> u(n); for (size_t i = 0; i < n; ++i) u[i] = to16<T>(f[i]); return u; };
    auto q = vec16((size_t)TT*H*K, false, K), k = vec16((size_t)TT*H*K, true, K);
    auto v = vec16((size_t)TT*HV*V, false, V), dO = vec16((size_t)TT*HV*V, false, V);
    std::vector<float> g(TT*HV), beta(TT*HV), h0((size_t)N*HV*K*V), dht((size_t)N*HV*K*V);
    for (int t = 0; t < TT; ++t) for (int h = 0; h < HV; ++h) {
        float gv = -0.3f * ud(rng); if (h == 0) gv = 0; if (h == HV - 1 && HV > 2) gv = -20.0f * ud(rng);
        float blo = getenv("BLO") ? atof(getenv("BLO")) : 0.0f, bhi = getenv("BHI") ? atof(getenv("BHI")) : 1.8f;
        g[t*HV+h] = gv; beta[t*HV+h] = blo + (bhi - blo) * ud(rng); }
    for (auto& x : h0) x = nd(rng); for (auto& x : dht) x = 0.5f * nd(rng);
    // tables
    std::vector<int> chunks, units;
    for (int n = 0; n < N; ++n) { int first = chunks.size()/2;
        for (int c = cu[n]; c < cu[n+1]; c += 64) { chunks.push_back(c); chunks.push_back(std::min(c+64, cu[n+1]) - c); }
        units.push_back(first); units.push_back(chunks.size()/2); units.push_back(n); units.push_back(3); }
    int NC = chunks.size()/2;
    ChunkParams p{H, HV, K, V, HV/H, flags, NC, 1.0f/sqrtf((float)K)};
    size_t heads = (size_t)NC*HV;
    std::vector<float> ws_f(heads*4*64);
    std::vector<uint16_t> ws_a(heads*64*64), ws_p(heads*64*64), ws_t(heads*64*64), ws_h(heads*V*K), ws_dh(heads*V*K),
        ws_x(heads*V*64), ws_vp(heads*V*64), ws_dvp(heads*V*64), dv((size_t)TT*HV*V, 0xFFFF);
    std::vector<float> dq((size_t)TT*H*K, NAN), dk((size_t)TT*H*K, NAN), dbeta(TT*HV, NAN), dg(TT*HV, NAN), dh0((size_t)N*HV*K*V, NAN);
    const T* Q = (const T*)q.data(); const T* Kp = (const T*)k.data(); const T* Vp = (const T*)v.data(); const T* DO = (const T*)dO.data();
    const float* H0 = has_h0 ? h0.data() : nullptr; const float* DHT = has_dht ? dht.data() : nullptr;
    float* DH0 = has_h0 ? dh0.data() : nullptr;
    emu::launch({(unsigned)NC, prep_grid_y(H, HV), 1}, 256, PREP_SMEM, [&] {
        prep<T, true>(p, chunks.data(), Q, Kp, g.data(), beta.data(), nullptr, nullptr, ws_f.data(), (T*)ws_a.data(), (T*)ws_p.data(), (T*)ws_t.data()); });
    int ldk = 136, ldc = 72;
    size_t st = 2*64*ldk + 2*64*(BV+8) + 2*64*ldc + 4*2*64;
    size_t dh_smem = 2*(st + 2*64*ldk + 2*64*ldc) + (BV/16)*64*24*2;
    Dim3 cg{(unsigned)((V + BV - 1)/BV), (unsigned)HV, (unsigned)N};
#ifndef KS_EMU
#define KS_EMU 1  // -DKS_EMU=2: the chains with warp pairs (V-blocks 32 and 64)
#endif
#if KS_EMU == 1
    auto states = [&] { if (BV == 32) bwd_states<T,32>(p, chunks.data(), units.data(), Kp, Vp, ws_f.data(), (T*)ws_a.data(), H0, (T*)ws_h.data(), (T*)ws_x.data(), (T*)ws_vp.data(), SegmentIo{});
                        else if (BV == 64) bwd_states<T,64>(p, chunks.data(), units.data(), Kp, Vp, ws_f.data(), (T*)ws_a.data(), H0, (T*)ws_h.data(), (T*)ws_x.data(), (T*)ws_vp.data(), SegmentIo{});
                        else bwd_states<T,128>(p, chunks.data(), units.data(), Kp, Vp, ws_f.data(), (T*)ws_a.data(), H0, (T*)ws_h.data(), (T*)ws_x.data(), (T*)ws_vp.data(), SegmentIo{}); };
    auto dhk = [&] { if (BV == 32) bwd_dh<T,32>(p, chunks.data(), units.data(), Q, Kp, DO, ws_f.data(), (T*)ws_a.data(), (T*)ws_p.data(), DHT, (T*)dv.data(), DH0, (T*)ws_dh.data(), (T*)ws_dvp.data(), SegmentIo{});
                     else if (BV == 64) bwd_dh<T,64>(p, chunks.data(), units.data(), Q, Kp, DO, ws_f.data(), (T*)ws_a.data(), (T*)ws_p.data(), DHT, (T*)dv.data(), DH0, (T*)ws_dh.data(), (T*)ws_dvp.data(), SegmentIo{});
                     else bwd_dh<T,128>(p, chunks.data(), units.data(), Q, Kp, DO, ws_f.data(), (T*)ws_a.data(), (T*)ws_p.data(), DHT, (T*)dv.data(), DH0, (T*)ws_dh.data(), (T*)ws_dvp.data(), SegmentIo{}); };
#else
    (void)st; (void)dh_smem;
    if (BV != 32 && BV != 64) { fprintf(stderr, "warp pairs: BV 32 or 64\n"); return 2; }
    auto states = [&] { if (BV == 32) bwd_states<T,32,2>(p, chunks.data(), units.data(), Kp, Vp, ws_f.data(), (T*)ws_a.data(), H0, (T*)ws_h.data(), (T*)ws_x.data(), (T*)ws_vp.data(), SegmentIo{});
                        else bwd_states<T,64,2>(p, chunks.data(), units.data(), Kp, Vp, ws_f.data(), (T*)ws_a.data(), H0, (T*)ws_h.data(), (T*)ws_x.data(), (T*)ws_vp.data(), SegmentIo{}); };
    auto dhk = [&] { if (BV == 32) bwd_dh<T,32,2>(p, chunks.data(), units.data(), Q, Kp, DO, ws_f.data(), (T*)ws_a.data(), (T*)ws_p.data(), DHT, (T*)dv.data(), DH0, (T*)ws_dh.data(), (T*)ws_dvp.data(), SegmentIo{});
                     else bwd_dh<T,64,2>(p, chunks.data(), units.data(), Q, Kp, DO, ws_f.data(), (T*)ws_a.data(), (T*)ws_p.data(), DHT, (T*)dv.data(), DH0, (T*)ws_dh.data(), (T*)ws_dvp.data(), SegmentIo{}); };
    st = BV == 32 ? ChainLayout<32, 2>::STATES_BYTES / 2 : ChainLayout<64, 2>::STATES_BYTES / 2;
    dh_smem = BV == 32 ? ChainLayout<32, 2>::DH_BYTES : ChainLayout<64, 2>::DH_BYTES;
#endif
#ifdef TOGETHER  // both chains in one launch (bwd_chains), V-block 32
    auto both = [&] { bwd_chains<T, 32, KS_EMU>(p, chunks.data(), units.data(), Q, Kp, Vp, DO, ws_f.data(), (T*)ws_a.data(), (T*)ws_p.data(), H0, DHT, (T*)dv.data(), DH0, (T*)ws_h.data(), (T*)ws_x.data(), (T*)ws_vp.data(), (T*)ws_dh.data(), (T*)ws_dvp.data(), SegmentIo{}); };
    (void)states; (void)dhk;
    emu::launch(cg, 32*4*KS_EMU, ChainLayout<32, KS_EMU>::STATES_BYTES + ChainLayout<32, KS_EMU>::DH_BYTES, both);
#elif defined(APART)  // both chains in one launch, a block each (bwd_chains_apart: dh blocks, then states), V-block 32
    auto apart = [&] { bwd_chains_apart<T, 32, KS_EMU>(p, chunks.data(), units.data(), Q, Kp, Vp, DO, ws_f.data(), (T*)ws_a.data(), (T*)ws_p.data(), H0, DHT, (T*)dv.data(), DH0, (T*)ws_h.data(), (T*)ws_x.data(), (T*)ws_vp.data(), (T*)ws_dh.data(), (T*)ws_dvp.data(), SegmentIo{}); };
    (void)states; (void)dhk;
    emu::launch({cg.x, cg.y, 2 * cg.z}, 32*2*KS_EMU, std::max(ChainLayout<32, KS_EMU>::STATES_BYTES, ChainLayout<32, KS_EMU>::DH_BYTES), apart);
#else
    emu::launch(cg, BV*2*KS_EMU, 2*st + (KS_EMU == 1 ? (BV/16)*2*16*72 : 0), states);  // + the single warps' S staging
    emu::launch(cg, BV*2*KS_EMU, dh_smem, dhk);
#endif
    if (NC > 0) {
        emu::launch({(unsigned)NC, (unsigned)H, 1}, GRAD_THREADS, GradLayout::BYTES, [&] {
            bwd_grad<T>(p, chunks.data(), Q, Kp, DO, (T*)dv.data(), ws_f.data(), (T*)ws_p.data(), (T*)ws_t.data(), (T*)ws_x.data(), (T*)ws_vp.data(), (T*)ws_dvp.data(), (T*)ws_h.data(), (T*)ws_dh.data(), dq.data(), dk.data(), nullptr, nullptr, dg.data(), dbeta.data()); });
    }
    FILE* f = fopen(getenv("EMU_DUMP") ? getenv("EMU_DUMP") : "dump.bin", "wb");
    int hdr[8] = {H, HV, K, V, N, TT, flags, (int)(has_h0 | (has_dht << 1))};
    fwrite(hdr, 4, 8, f); fwrite(cu.data(), 4, cu.size(), f);
    auto wf = [&](const std::vector<float>& x) { fwrite(x.data(), 4, x.size(), f); };
    auto w16 = [&](const std::vector<uint16_t>& x) { std::vector<float> y(x.size()); for (size_t i = 0; i < x.size(); ++i) y[i] = from16<T>(x[i]); wf(y); };
    w16(q); w16(k); w16(v); wf(g); wf(beta); wf(h0); w16(dO); wf(dht);
    wf(dq); wf(dk); w16(dv); wf(dg); wf(dbeta); wf(dh0);
    fclose(f);
    printf("ran %d chunks\n", NC);
    return 0;
}
int main(int argc, char** argv) {
    if (std::string(argv[1]) == "bf16") return run<__nv_bfloat16>(argc, argv);
    return run<__half>(argc, argv);
}
