// Host emulation of backward.cu's finishing kernels against their semantics (the old kernels').
#include "finish_kernels.inc"
#include <cstdio>
#include <random>
using namespace gdn;
static std::mt19937 rng(7);
static float rnd() { return std::normal_distribution<float>(0.f, 1.f)(rng); }
template <typename T> float rt(float x) { return to_f32(from_f32<T>(x)); }
static double worst = 0;
static void cmp(const char* what, float got, double want) {
    double e = std::fabs(got - want) / (1e-3 + std::fabs(want));
    if (e > worst) worst = e;
    if (e > 2e-2 || std::isnan(got)) { printf("MISMATCH %s got %g want %g\n", what, got, want); exit(1); }
}
template <typename T> void qk_case(int BT, int H, int group, int K, int vbs, int flags) {
    BackwardParams p{H, H * group, K, 64, group, flags, vbs, BT, 1.0f};
    const int HV = H * group;
    std::vector<float> dqp((size_t)vbs * BT * HV * K), dkp(dqp.size());
    for (auto& x : dqp) x = rnd();
    for (auto& x : dkp) x = rnd();
    std::vector<T> q((size_t)BT * H * K), k(q.size()), dq(q.size()), dk(q.size());
    for (auto& x : q) x = from_f32<T>(rnd());
    for (auto& x : k) x = from_f32<T>(rnd());
    for (auto& x : dq) x = from_f32<T>(NAN);
    for (auto& x : dk) x = from_f32<T>(NAN);
    const int rows = BT * H;
    emu::launch(Dim3{(unsigned)((rows + QK_ROWS - 1) / QK_ROWS), 1, 1}, 32 * QK_ROWS, 0,
                [&] { qk_finish<T>(p, q.data(), k.data(), dqp.data(), dkp.data(), dq.data(), dk.data()); });
    for (int t = 0; t < BT; ++t)
        for (int h = 0; h < H; ++h) {
            const size_t row = ((size_t)t * H + h) * K;
            for (int which = 0; which < 2; ++which) {
                const auto& part = which ? dkp : dqp;
                const auto& x = which ? k : q;
                const auto& got = which ? dk : dq;
                std::vector<double> a(K);
                double sxx = 0, dxx = 0;
                for (int i = 0; i < K; ++i) {
                    for (int hv = h * group; hv < (h + 1) * group; ++hv)
                        for (int vb = 0; vb < vbs; ++vb) a[i] += part[(((size_t)vb * BT + t) * HV + hv) * K + i];
                    const double xi = to_f32(x[row + i]);
                    sxx += xi * xi;
                    dxx += a[i] * xi;
                }
                for (int i = 0; i < K; ++i) {
                    double y = a[i];
                    if (flags & L2NORM_QK) {
                        const double r = 1.0 / std::sqrt(sxx + L2NORM_EPS);
                        y = y * r - dxx * r * r * r * to_f32(x[row + i]);
                    }
                    cmp(which ? "dk" : "dq", to_f32(got[row + i]), rt<T>((float)y));
                }
            }
        }
    printf("qk_finish %s BT=%d H=%d group=%d K=%d v_blocks=%d flags=%d ok\n", sizeof(T) == 4 ? "f32" : "16-bit", BT, H, group, K, vbs, flags);
}
void gate_case(int BT, int HV, int vbs, int flags) {
    BackwardParams p{1, HV, 64, 64, HV, flags, vbs, BT, 1.0f};
    const size_t n = (size_t)BT * HV;
    std::vector<float> g(n), beta(n), dbp(vbs * n), dgp(vbs * n), a_log(HV), dt_bias(HV), dg(n, NAN), dbeta(n, NAN);
    for (auto& x : g) x = rnd() * 3;
    for (auto& x : beta) x = rnd() * 3;
    for (auto& x : dbp) x = rnd();
    for (auto& x : dgp) x = rnd();
    for (auto& x : a_log) x = rnd() * 0.5f;
    for (auto& x : dt_bias) x = rnd();
    const int blocks = (BT + GATE_TOKENS - 1) / GATE_TOKENS;
    std::vector<float> sums(2 * blocks * HV, NAN), da(HV, NAN), ddt(HV, NAN);
    const bool gate = flags & GATE_IN_KERNEL;
    emu::launch(Dim3{(unsigned)blocks, (unsigned)((HV + 31) / 32), 1}, 32 * GATE_WARPS, 0, [&] {
        gate_finish(p, g.data(), beta.data(), gate ? a_log.data() : nullptr, gate ? dt_bias.data() : nullptr,
                    dbp.data(), dgp.data(), dg.data(), dbeta.data(), sums.data());
    });
    if (gate) emu::launch(Dim3{(unsigned)HV, 1, 1}, 32, 0, [&] { gate_sums_finish(p, blocks, sums.data(), da.data(), ddt.data()); });
    for (int hv = 0; hv < HV; ++hv) {
        double sa = 0, sb = 0;
        for (int t = 0; t < BT; ++t) {
            const size_t gi = (size_t)t * HV + hv;
            double db = 0, dga = 0;
            for (int vb = 0; vb < vbs; ++vb) db += dbp[vb * n + gi], dga += dgp[vb * n + gi];
            double d = 1;
            if (flags & BETA_SIGMOID) { const double s = 1 / (1 + std::exp(-(double)beta[gi])); d = s * (1 - s); }
            if (flags & NEG_EIGVAL) d *= 2;
            cmp("dbeta", dbeta[gi], db * d);
            if (gate) {
                const double na = -std::exp((double)a_log[hv]), x = g[gi] + dt_bias[hv];
                const double sp = x > 20 ? x : std::log1p(std::exp(x));
                const double dgr = dga * na * (x > 20 ? 1 : 1 / (1 + std::exp(-x)));
                cmp("dg", dg[gi], dgr);
                sa += dga * na * sp;
                sb += dgr;
            } else {
                cmp("dg", dg[gi], dga);
            }
        }
        if (gate) { cmp("dA_log", da[hv], sa); cmp("ddt_bias", ddt[hv], sb); }
    }
    printf("gate_finish BT=%d HV=%d v_blocks=%d flags=%d ok\n", BT, HV, vbs, flags);
}
int main() {
    qk_case<float>(5, 3, 2, 128, 2, 0);
    qk_case<float>(5, 3, 2, 128, 1, L2NORM_QK);
    qk_case<float>(4, 2, 1, 50, 2, L2NORM_QK);   // K % 4 != 0: one element per access
    qk_case<__nv_bfloat16>(7, 2, 2, 128, 1, L2NORM_QK);
    qk_case<__half>(3, 3, 1, 64, 3, 0);
    qk_case<__nv_bfloat16>(3, 1, 4, 256, 1, L2NORM_QK);  // K = MAX_K
    qk_case<float>(2, 1, 1, 1, 1, L2NORM_QK);
    gate_case(600, 40, 2, GATE_IN_KERNEL | BETA_SIGMOID | NEG_EIGVAL);
    gate_case(300, 8, 1, BETA_SIGMOID);
    gate_case(1, 3, 1, GATE_IN_KERNEL);
    gate_case(256, 32, 1, GATE_IN_KERNEL | NEG_EIGVAL);
    printf("worst rel err %g\n", worst);
}
