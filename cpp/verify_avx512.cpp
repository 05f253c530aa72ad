// AVX-512 path of the row-sum kernels (argmax reuses AVX2: greedy is already
// at its memory floor). The double accumulation is conversion-bound, and
// AVX-512 converts 8 floats per instruction instead of 4. Built with a target
// attribute and picked at run time; must agree bit for bit with the scalar
// kernels (same 32 lanes, same fold; see verify.h).
#include "verify.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#include <limits>

#define AVX512 __attribute__((target("avx512f")))

namespace specgguf {

const Kernels* avx2_kernels();

namespace {

// 32 double lanes = 4 registers; register r holds lanes 8r..8r+7.
struct Acc {
    __m512d r[4];
};

AVX512 inline void acc_zero(Acc& a) {
    for (auto& r : a.r) r = _mm512_setzero_pd();
}

// Canonical fold (verify.h): lanes j += j+16, +8, +4, +2, +1.
AVX512 inline double acc_fold(Acc& a) {
    __m512d s = _mm512_add_pd(_mm512_add_pd(a.r[0], a.r[2]), _mm512_add_pd(a.r[1], a.r[3]));
    __m256d h = _mm256_add_pd(_mm512_castpd512_pd256(s), _mm512_extractf64x4_pd(s, 1));
    __m128d q = _mm_add_pd(_mm256_castpd256_pd128(h), _mm256_extractf128_pd(h, 1));
    return _mm_cvtsd_f64(_mm_add_sd(q, _mm_unpackhi_pd(q, q)));
}

template <class Elem>
AVX512 double acc_fold_tail(Acc& a, std::size_t j, std::size_t end, Elem elem) {
    alignas(64) double lanes[kLanes];
    for (int m = 0; m < 4; ++m) _mm512_store_pd(lanes + 8 * m, a.r[m]);
    for (; j < end; ++j) lanes[j % kLanes] += elem(j);
    return fold_lanes(lanes);
}

AVX512 float chunk_sums_avx512(const float* x, std::size_t n, double* out) {
    __m512 mn = _mm512_set1_ps(std::numeric_limits<float>::infinity());
    float mn_tail = std::numeric_limits<float>::infinity();
    Acc a;
    for (std::size_t c = 0, start = 0; start < n; ++c, start += kChunk) {
        std::size_t end = start + kChunk < n ? start + kChunk : n;
        acc_zero(a);
        std::size_t j = start;
        for (; j + kLanes <= end; j += kLanes) {
            for (int m = 0; m < 4; m += 2) {
                __m512 v = _mm512_loadu_ps(x + j + 8 * m);
                mn = _mm512_min_ps(mn, v);
                a.r[m] = _mm512_add_pd(a.r[m], _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
                a.r[m + 1] = _mm512_add_pd(
                    a.r[m + 1], _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
            }
        }
        if (j == end) {
            out[c] = acc_fold(a);
        } else {
            for (std::size_t t = j; t < end; ++t) mn_tail = x[t] < mn_tail ? x[t] : mn_tail;
            out[c] = acc_fold_tail(a, j, end, [x](std::size_t t) { return (double)x[t]; });
        }
    }
    float m = _mm512_reduce_min_ps(mn);
    return m < mn_tail ? m : mn_tail;
}

AVX512 void residual_chunk_sums_avx512(const float* p, const float* q, std::size_t n, double P,
                                       double Q, double* out) {
    const __m512d vP = _mm512_set1_pd(P), vQ = _mm512_set1_pd(Q), z = _mm512_setzero_pd();
    Acc a;
    for (std::size_t c = 0, start = 0; start < n; ++c, start += kChunk) {
        std::size_t end = start + kChunk < n ? start + kChunk : n;
        acc_zero(a);
        std::size_t j = start;
        for (; j + kLanes <= end; j += kLanes) {
            for (int m = 0; m < 4; ++m) {
                __m512d pd = _mm512_cvtps_pd(_mm256_loadu_ps(p + j + 8 * m));
                __m512d qd = _mm512_cvtps_pd(_mm256_loadu_ps(q + j + 8 * m));
                __m512d r = _mm512_sub_pd(_mm512_mul_pd(pd, vQ), _mm512_mul_pd(qd, vP));
                a.r[m] = _mm512_add_pd(a.r[m], _mm512_max_pd(r, z));
            }
        }
        if (j == end) {
            out[c] = acc_fold(a);
        } else {
            out[c] = acc_fold_tail(a, j, end, [=](std::size_t t) {
                double r = (double)p[t] * Q - (double)q[t] * P;
                return r > 0.0 ? r : 0.0;
            });
        }
    }
}

AVX512 float quick_sum_avx512(const float* x, std::size_t n, float* mn) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    __m512 m = _mm512_set1_ps(std::numeric_limits<float>::infinity());
    std::size_t j = 0;
    for (; j + 64 <= n; j += 64) {
        __m512 a = _mm512_loadu_ps(x + j), b = _mm512_loadu_ps(x + j + 16);
        __m512 c = _mm512_loadu_ps(x + j + 32), d = _mm512_loadu_ps(x + j + 48);
        s0 = _mm512_add_ps(s0, a); s1 = _mm512_add_ps(s1, b);
        s2 = _mm512_add_ps(s2, c); s3 = _mm512_add_ps(s3, d);
        m = _mm512_min_ps(m, _mm512_min_ps(_mm512_min_ps(a, b), _mm512_min_ps(c, d)));
    }
    float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
    float mm = _mm512_reduce_min_ps(m);
    for (; j < n; ++j) { s += x[j]; mm = x[j] < mm ? x[j] : mm; }
    *mn = mm;
    return s;
}

}  // namespace

const Kernels* avx512_kernels() {
    static Kernels k = {"avx512", nullptr, chunk_sums_avx512, residual_chunk_sums_avx512, quick_sum_avx512};
    const Kernels* avx2 = avx2_kernels();
    if (!avx2 || !__builtin_cpu_supports("avx512f")) return nullptr;
    k.argmax = avx2->argmax;
    return &k;
}

}  // namespace specgguf

#else
namespace specgguf {
const Kernels* avx512_kernels() { return nullptr; }
}  // namespace specgguf
#endif
