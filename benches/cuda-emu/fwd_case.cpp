// Runs one exported hard case (tests/common/cases.rs, see README.md) through the chunked
// forward on the emulator (l2norm on the host as chunked.cu does it, prep, the sequential
// pass; with a segment length also its local pass and the combine step) and prints the rel-L2
// of o and the final state against an f64 recurrence on the same rounded inputs.
//   ./fwd_case CASE BV [SEGMENT_CHUNKS]
#include "fwd_kernels.inc"
#include "tables.h"
#include <cstdio>
#include <string>

using namespace gdn::chunked;

static std::vector<unsigned char> bytes;
static size_t pos = 0;
template <typename X> std::vector<X> take(size_t n) {
    std::vector<X> v(n); memcpy(v.data(), bytes.data() + pos, n * sizeof(X)); pos += n * sizeof(X); return v;
}
static double rel(const std::vector<float>& a, const std::vector<double>& r, bool* nan) {
    double e = 0, n = 0;
    for (size_t i = 0; i < r.size(); ++i) {
        if (!std::isfinite(a[i])) *nan = true;
        e += (a[i] - r[i]) * (a[i] - r[i]); n += r[i] * r[i];
    }
    return n > 0 ? sqrt(e / n) : sqrt(e);
}

template <typename T>
int run(int ints[], const std::vector<int>& cu, float scale, int BV, int seg) {
    int N = ints[0], TT = ints[1], H = ints[2], HV = ints[3], K = ints[4], V = ints[5], flags = ints[6];
    bool has_h0 = ints[7];
    auto q = take<float>((size_t)TT * H * K), k = take<float>((size_t)TT * H * K), v = take<float>((size_t)TT * HV * V);
    auto g = take<float>((size_t)TT * HV), beta = take<float>((size_t)TT * HV);
    std::vector<float> h0, a_log, dt_bias;
    if (has_h0) h0 = take<float>((size_t)N * HV * K * V);
    bool gate = flags & 8;
    if (gate) { a_log = take<float>(HV); dt_bias = take<float>(HV); }
    const bool v_first = flags & 16;
    auto state_at = [&](int n, int hv, int r, int c) {
        return ((size_t)n * HV + hv) * K * V + (v_first ? (size_t)c * K + r : (size_t)r * V + c);
    };

    // The f64 recurrence (src/reference) on the rounded inputs.
    std::vector<double> e_o((size_t)TT * HV * V), e_h((size_t)N * HV * K * V);
    for (int n = 0; n < N; ++n) for (int hv = 0; hv < HV; ++hv) {
        std::vector<double> S((size_t)K * V, 0.0);
        if (has_h0) for (int r = 0; r < K; ++r) for (int c = 0; c < V; ++c) S[r * V + c] = h0[state_at(n, hv, r, c)];
        for (int t = cu[n]; t < cu[n + 1]; ++t) {
            const size_t qk = ((size_t)t * H + hv / (HV / H)) * K, th = (size_t)t * HV + hv;
            std::vector<double> qq(K), kk(K);
            double sq = 0, sk = 0;
            for (int i = 0; i < K; ++i) { qq[i] = q[qk + i]; kk[i] = k[qk + i]; sq += qq[i] * qq[i]; sk += kk[i] * kk[i]; }
            if (flags & 1) for (int i = 0; i < K; ++i) { qq[i] /= sqrt(sq + 1e-6); kk[i] /= sqrt(sk + 1e-6); }
            double b = beta[th], gg = g[th];
            if (flags & 2) b = 1 / (1 + exp(-b));
            if (flags & 4) b *= 2;
            if (gate) { double x = gg + dt_bias[hv]; gg = -exp((double)a_log[hv]) * (x > 20 ? x : log1p(exp(x))); }
            const double al = exp(gg);
            for (auto& x : S) x *= al;
            for (int c = 0; c < V; ++c) {
                double pred = 0;
                for (int r = 0; r < K; ++r) pred += S[r * V + c] * kk[r];
                const double u = b * (v[th * V + c] - pred);
                for (int r = 0; r < K; ++r) S[r * V + c] += kk[r] * u;
            }
            for (int c = 0; c < V; ++c) {
                double acc = 0;
                for (int r = 0; r < K; ++r) acc += S[r * V + c] * qq[r];
                e_o[th * V + c] = scale * acc;
            }
        }
        for (int r = 0; r < K; ++r) for (int c = 0; c < V; ++c) e_h[state_at(n, hv, r, c)] = S[r * V + c];
    }

    auto to16 = [](const std::vector<float>& x) { std::vector<T> y(x.size()); for (size_t i = 0; i < x.size(); ++i) y[i] = gdn::from_f32<T>(x[i]); return y; };
    auto Q = to16(q), Kt = to16(k), Vt = to16(v);
    if (flags & 1) {  // l2norm: q̂, k̂ rounded to the storage dtype (gdn_l2norm_*)
        for (auto* x : {&Q, &Kt}) for (size_t r = 0; r < x->size() / K; ++r) {
            float ss = 0; for (int i = 0; i < K; ++i) { float f = gdn::to_f32((*x)[r * K + i]); ss += f * f; }
            float rr = 1.0f / sqrtf(ss + 1e-6f);
            for (int i = 0; i < K; ++i) (*x)[r * K + i] = gdn::from_f32<T>(gdn::to_f32((*x)[r * K + i]) * rr);
        }
    }
    // Chunk and unit tables as ChunkPlan builds them.
    std::vector<int> chunks, units, seq_units;
    chunk_tables(cu, N, seg, chunks, units, seq_units);
    const int NC = chunks.size() / 2, NU = units.size() / 4;
    const bool segmented = NU > N;
    if (chunks.empty()) chunks.push_back(0);
    ChunkParams p{H, HV, K, V, HV / H, flags, NC, scale};
    size_t heads = (size_t)NC * HV + 1;
    std::vector<float> ws_f(heads * 2 * 64);
    std::vector<T> ws_a(heads * 4096), ws_p(heads * 4096), o((size_t)TT * HV * V, gdn::from_f32<T>(NAN));
    std::vector<float> ht((size_t)N * HV * K * V, NAN), seg_end((size_t)NU * HV * K * (V + K), NAN),
        seg_start((size_t)NU * HV * K * V, NAN);
    const float* H0 = has_h0 ? h0.data() : nullptr;
    if (NC > 0)
        emu::launch({(unsigned)NC, prep_grid_y(H, HV), 1}, 256, PREP_SMEM, [&] {
            prep<T>(p, chunks.data(), Q.data(), Kt.data(), g.data(), beta.data(), gate ? a_log.data() : nullptr,
                    gate ? dt_bias.data() : nullptr, ws_f.data(), ws_a.data(), ws_p.data()); });
    // Shared memory: the largest layout (2 main stages + three partials per pair or o tiles).
    const size_t smem = 2 * (2 * 64 * 136 + 2 * 64 * (BV + 8) + 2 * 64 * 72 + 512 + 2 * 64 * 136 + 2 * 64 * 72) + (BV / 16) * 3 * 4096;
    auto seq_pass = [&](bool local) {
        ChunkParams pp = p;
        if (local) pp.flags |= LOCAL_PASS;
        const unsigned cols = (V + BV - 1) / BV + (local ? (K + BV - 1) / BV : 0);
#define SEQ(BVV, KSS) emu::launch({cols, (unsigned)HV, (unsigned)NU}, 32 * KSS * BVV / 16, smem, [&] { \
        FWD_T(BVV, KSS)(pp, chunks.data(), units.data(), Q.data(), Kt.data(), Vt.data(), ws_f.data(), ws_a.data(), \
                         ws_p.data(), H0, seg_start.data(), o.data(), ht.data(), seg_end.data(), nullptr); });
#ifdef OLD
#define FWD_T(BVV, KSS) fwd<T, BVV>
#else
#define FWD_T(BVV, KSS) (K == 128 ? fwd<T, BVV, KSS, 128> : fwd<T, BVV, KSS>)
#endif
#ifdef OLD
        if (BV == 32) { SEQ(32, 1) } else if (BV == 64) { SEQ(64, 1) } else { SEQ(128, 1) }
#else
        if (getenv("EMU_KS1") && !local) { if (BV == 32) { SEQ(32, 1) } else if (BV == 64) { SEQ(64, 1) } else { SEQ(128, 1) } }
        else if (BV == 32) { SEQ(32, 2) } else if (BV == 64) { SEQ(64, 2) } else { SEQ(128, 1) }
#endif
    };
    // EMU_ROLES=1: the main pass by fwd_roles (a state and an output warp per 16 columns).
    const bool roles = getenv("EMU_ROLES") && atoi(getenv("EMU_ROLES")) == 1 && BV <= 64;
    auto roles_pass = [&] {
        const unsigned cols = (V + BV - 1) / BV;
#define ROLES(BVV) emu::launch({cols, (unsigned)HV, (unsigned)NU}, 4 * BVV, smem, [&] { \
        (K == 128 ? fwd_roles<T, BVV, 128> : fwd_roles<T, BVV>)(p, chunks.data(), units.data(), Q.data(), Kt.data(), \
            Vt.data(), ws_f.data(), ws_a.data(), ws_p.data(), H0, seg_start.data(), o.data(), ht.data()); });
        if (BV == 32) { ROLES(32) } else { ROLES(64) }
    };
    if (NU > 0) {
        if (segmented) {
            seq_pass(true);
            gdn::combine::CombineParams cp{HV, K, V, flags};
            emu::launch({(unsigned)((V + 7) / 8), (unsigned)HV, (unsigned)N}, 256, 4 * (2 * K * (K + 4) + 2 * K * 8 + 8 * (K + 4)), [&] {
                gdn::combine::combine(cp, seq_units.data(), nullptr, H0, seg_end.data(), seg_start.data()); });
        }
        if (roles) roles_pass(); else seq_pass(false);
    }
    std::vector<float> fo(o.size());
    for (size_t i = 0; i < o.size(); ++i) fo[i] = gdn::to_f32(o[i]);
    bool nan = false;
    const double ro = rel(fo, e_o, &nan), rh = rel(ht, e_h, &nan);
    printf("o %.2e state %.2e%s (units %d)\n", ro, rh, nan ? " NAN" : "", NU);
    // EMU_DUMP=path: o (as f32) and the final state, raw, for a bitwise A/B of two kernel versions.
    if (const char* dump = getenv("EMU_DUMP")) {
        FILE* d = fopen(dump, "wb");
        fwrite(fo.data(), sizeof(float), fo.size(), d);
        fwrite(ht.data(), sizeof(float), ht.size(), d);
        fclose(d);
    }
    return nan ? 1 : 0;
}
int main(int argc, char** argv) {
    FILE* f = fopen(argv[1], "rb"); fseek(f, 0, SEEK_END); bytes.resize(ftell(f)); fseek(f, 0, SEEK_SET);
    fread(bytes.data(), 1, bytes.size(), f); fclose(f);
    int BV = argc > 2 ? atoi(argv[2]) : 32, seg = argc > 3 ? atoi(argv[3]) : 0;
    auto ints = take<int>(10);
    auto cu = take<int>(ints[0] + 1);
    float scale = take<float>(1)[0];
    return ints[9] == 1 ? run<__half>(ints.data(), cu, scale, BV, seg) : run<__nv_bfloat16>(ints.data(), cu, scale, BV, seg);
}
