// forward cells alone, one thread: ns per cell for the library's math and pieces of it
#include "../../native/src/scalar.h"
#include "../../native/src/lltm.h"
#include <chrono>
#include <cstdio>
#include <vector>
#include <random>
using namespace prl;
constexpr int B = 64, S = 128, STEPS = 2000;
__attribute__((noinline)) void cells(float *__restrict g, const float *__restrict rec, const float *__restrict oc,
                                     float *__restrict h, float *__restrict c) {
    for (int b = 0; b < B; ++b) {
        float *gi = g + b * 3 * S; const float *r = rec + b * 3 * S;
        for (int j = 0; j < S; ++j) {
            const float si = gi[j] + r[j], so = gi[S + j] + r[S + j], sc = gi[2 * S + j] + r[2 * S + j];
            gi[j] = si; gi[S + j] = so; gi[2 * S + j] = sc;
            float hj, cj;
            lltm_forward_math<float>(si, so, sc, oc[b * S + j], hj, cj);
            h[b * S + j] = hj; c[b * S + j] = cj;
        }
    }
}
__attribute__((noinline)) void exps(const float *__restrict x, float *__restrict y, int n) {
    for (int i = 0; i < n; ++i) y[i] = host::exp(x[i]);
}
__attribute__((noinline)) void sigm(const float *__restrict x, float *__restrict y, int n) {
    for (int i = 0; i < n; ++i) y[i] = sigmoid<float>(x[i]);
}
__attribute__((noinline)) void tanhs(const float *__restrict x, float *__restrict y, int n) {
    for (int i = 0; i < n; ++i) y[i] = host::tanh(x[i]);
}
__attribute__((noinline)) void elus(const float *__restrict x, float *__restrict y, int n) {
    for (int i = 0; i < n; ++i) y[i] = elu(x[i]);
}
template <class F> double ns(F f, double per) {
    double best = 1e30;
    for (int r = 0; r < 7; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        for (int s = 0; s < STEPS; ++s) f();
        double t = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
        best = std::min(best, t / STEPS / per);
    }
    return best;
}
int main() {
    std::mt19937 rng(1); std::normal_distribution<float> nd(0.f, 2.f);
    std::vector<float> g(B * 3 * S), rec(B * 3 * S), oc(B * S), h(B * S), c(B * S), x(B * S), y(B * S);
    for (auto *v : {&g, &rec, &oc, &x}) for (auto &e : *v) e = nd(rng);
    std::vector<float> g0 = g;
    printf("forward cells %.2f ns/cell\n", ns([&] { cells(g.data(), rec.data(), oc.data(), h.data(), c.data()); }, B * S));
    printf("exp %.3f ns/elem\n", ns([&] { exps(x.data(), y.data(), B * S); }, B * S));
    printf("sigmoid %.3f ns/elem\n", ns([&] { sigm(x.data(), y.data(), B * S); }, B * S));
    printf("tanh %.3f ns/elem\n", ns([&] { tanhs(x.data(), y.data(), B * S); }, B * S));
    printf("elu %.3f ns/elem\n", ns([&] { elus(x.data(), y.data(), B * S); }, B * S));
}
