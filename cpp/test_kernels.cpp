// Standalone check that every kernel path this CPU runs agrees bit for bit
// with the scalar one. No Python: it is what the aarch64 job cross-compiles
// and runs under qemu (-cpu cortex-a72), and what x86 runs under
// qemu -cpu Nehalem to prove the dispatch falls back to scalar.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "verify.h"
#include "warp.h"

using namespace specgguf;

static int passed = 0, failed = 0;

static void check(bool ok, const char* what, const char* kern, std::size_t v) {
    if (ok) { ++passed; return; }
    ++failed;
    std::printf("FAIL %s [%s] V=%zu\n", what, kern, v);
}

int main() {
    const Kernels* ks[8];
    std::size_t nk = available_kernels(ks, 8);
    std::printf("kernels:");
    for (std::size_t i = 0; i < nk; ++i) std::printf(" %s", ks[i]->name);
    std::printf("\n");
    const Kernels& ref = scalar_kernels();
    std::mt19937_64 rng(42);
    std::uniform_real_distribution<float> unif(0.f, 1.f);
    const std::size_t sizes[] = {1, 7, 31, 32, 33, 255, 256, 257, 1000, 4099, 32000, 128256};
    for (std::size_t v : sizes) {
        const std::size_t k = 4;
        std::vector<float> t((k + 1) * v), d(k * v);
        for (auto& x : t) x = unif(rng) < 0.3f ? 0.f : unif(rng) * 1e3f;
        for (auto& x : d) x = unif(rng);
        for (std::size_t i = 0; i <= k; ++i) t[i * v + rng() % v] += 1.f;  // no zero row
        std::vector<double> s0(n_chunks(v)), s1(n_chunks(v));
        for (std::size_t ki = 0; ki < nk; ++ki) {
            const Kernels& kern = *ks[ki];
            bool b0 = false, b1 = false;
            check(kern.argmax(t.data(), v, &b1) == ref.argmax(t.data(), v, &b0) && b0 == b1,
                  "argmax", kern.name, v);
            float m0 = ref.chunk_sums(t.data(), v, s0.data());
            float m1 = kern.chunk_sums(t.data(), v, s1.data());
            check(m0 == m1 && std::memcmp(s0.data(), s1.data(), s0.size() * 8) == 0, "chunk_sums",
                  kern.name, v);
            ref.residual_chunk_sums(t.data(), d.data(), v, 3.5, 1.25, s0.data());
            kern.residual_chunk_sums(t.data(), d.data(), v, 3.5, 1.25, s1.data());
            check(std::memcmp(s0.data(), s1.data(), s0.size() * 8) == 0, "residual_chunk_sums",
                  kern.name, v);
            for (int trial = 0; trial < 50; ++trial) {
                std::int64_t tok[k];
                double u[k + 1];
                for (std::size_t i = 0; i < k; ++i) tok[i] = (std::int64_t)(rng() % v);
                for (auto& x : u) x = std::uniform_real_distribution<double>(0, 1)(rng);
                Result a = accept(ref, t.data(), d.data(), k, v, tok, u, s0.data());
                Result b = accept(kern, t.data(), d.data(), k, v, tok, u, s1.data());
                check(a.status == b.status && a.n_accepted == b.n_accepted && a.token == b.token,
                      "accept", kern.name, v);
                a = accept_onehot(ref, t.data(), k, v, tok, u, s0.data());
                b = accept_onehot(kern, t.data(), k, v, tok, u, s1.data());
                check(a.status == b.status && a.n_accepted == b.n_accepted && a.token == b.token,
                      "accept_onehot", kern.name, v);
            }
            // The warp's exp, and whole warps at every truncation setting.
            std::vector<float> lg(v), e0(v), e1(v), w0(v), w1(v);
            for (auto& x : lg) x = unif(rng) < 0.05f ? -INFINITY : (unif(rng) - 0.5f) * 60.f;
            lg[rng() % v] = 3.f;
            ref.exp_row(lg.data(), v, 3.f, 1.7f, e0.data());
            kern.exp_row(lg.data(), v, 3.f, 1.7f, e1.data());
            check(std::memcmp(e0.data(), e1.data(), v * 4) == 0, "exp_row", kern.name, v);
            // The compare passes the warp's cuts and top-k skip most of a row with.
            std::vector<std::uint32_t> i0(v), i1(v);
            for (float t : {-INFINITY, -20.f, 0.f, 2.9f, 3.f, 40.f}) {
                const std::size_t c0 = ref.indices_above(lg.data(), v, t, i0.data());
                const std::size_t c1 = kern.indices_above(lg.data(), v, t, i1.data());
                check(c0 == c1 && std::memcmp(i0.data(), i1.data(), c0 * 4) == 0, "indices_above", kern.name, v);
                for (std::size_t from : {(std::size_t)0, v / 3, v - 1}) {
                    const std::size_t f = kern.first_above(lg.data() + from, v - from, t);
                    std::size_t want = v - from;
                    for (std::size_t j = from; j < v; ++j)
                        if (lg[j] > t) { want = j - from; break; }
                    check(f == want && ref.first_above(lg.data() + from, v - from, t) == want, "first_above",
                          kern.name, v);
                }
            }
            const WarpParams settings[] = {{0.8, 0, 1.0, 0.0}, {0.8, 40, 0.95, 0.05}, {1.3, 0, 0.9, 0.0},
                                           {0.5, 0, 1.0, 0.05}, {1.0, 2000, 0.99, 0.0},
                                           {0.9, 300, 1.0, 0.0}};
            WarpScratch ws;
            for (const WarpParams& wp : settings) {
                const std::size_t n0 = warp_row(ref, lg.data(), v, wp, w0.data(), ws);
                const std::size_t n1 = warp_row(kern, lg.data(), v, wp, w1.data(), ws);
                check(n0 > 0 && n0 == n1 && std::memcmp(w0.data(), w1.data(), v * 4) == 0, "warp", kern.name, v);
            }
            // A NaN, +inf and a negative deep in the row are caught by every path.
            std::vector<float> bad(t.begin(), t.begin() + v);
            bad[v / 2] = NAN;
            b1 = false;
            kern.argmax(bad.data(), v, &b1);
            check(b1, "argmax NaN", kern.name, v);
            bad[v / 2] = INFINITY;
            b1 = false;
            kern.argmax(bad.data(), v, &b1);
            check(b1, "argmax +inf", kern.name, v);
            bad[v / 2] = -1.f;
            check(kern.chunk_sums(bad.data(), v, s1.data()) < 0.f, "chunk_sums negative", kern.name, v);
        }
    }
    std::printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
