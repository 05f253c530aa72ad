// AVX2 path of the O(V) kernels. This file alone is compiled with -mavx2
// (CMakeLists.txt); it only exports a table, and verify.cpp checks the CPU
// before handing it out. Must agree bit for bit with the scalar kernels.
#include "verify.h"

#if defined(__x86_64__) && defined(__AVX2__)
#include <immintrin.h>

#include <limits>

#include "verify_simd.h"

namespace specgguf {
namespace {

// 32 double lanes = 8 registers; register r holds lanes 4r..4r+3.
struct Avx2Isa {
    struct Acc { __m256d r[8]; };
    struct Min { __m256 m; };
    static void zero(Acc& a) { for (auto& r : a.r) r = _mm256_setzero_pd(); }
    static void min_init(Min& m) { m.m = _mm256_set1_ps(std::numeric_limits<float>::infinity()); }
    static void add32(Acc& a, Min& mn, const float* x) {
        for (int m = 0; m < 8; m += 2) {
            __m256 v = _mm256_loadu_ps(x + 4 * m);
            mn.m = _mm256_min_ps(mn.m, v);
            a.r[m] = _mm256_add_pd(a.r[m], _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
            a.r[m + 1] = _mm256_add_pd(a.r[m + 1], _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
        }
    }
    static void add_residual32(Acc& a, const float* p, const float* q, double P, double Q) {
        const __m256d vP = _mm256_set1_pd(P), vQ = _mm256_set1_pd(Q), z = _mm256_setzero_pd();
        for (int m = 0; m < 8; ++m) {
            __m256d pd = _mm256_cvtps_pd(_mm_loadu_ps(p + 4 * m));
            __m256d qd = _mm256_cvtps_pd(_mm_loadu_ps(q + 4 * m));
            __m256d r = _mm256_sub_pd(_mm256_mul_pd(pd, vQ), _mm256_mul_pd(qd, vP));
            a.r[m] = _mm256_add_pd(a.r[m], _mm256_max_pd(r, z));
        }
    }
    // Canonical fold (verify.h): lanes j += j+16, +8, +4, +2, +1.
    static double fold(Acc& a) {
        for (int m = 0; m < 4; ++m) a.r[m] = _mm256_add_pd(a.r[m], a.r[m + 4]);
        for (int m = 0; m < 2; ++m) a.r[m] = _mm256_add_pd(a.r[m], a.r[m + 2]);
        __m256d s = _mm256_add_pd(a.r[0], a.r[1]);
        __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
        return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
    }
    static void spill(Acc& a, double* lanes) { for (int m = 0; m < 8; ++m) _mm256_storeu_pd(lanes + 4 * m, a.r[m]); }
    static float min_value(const Min& mn) {
        __m128 h = _mm_min_ps(_mm256_castps256_ps128(mn.m), _mm256_extractf128_ps(mn.m, 1));
        h = _mm_min_ps(h, _mm_movehl_ps(h, h));
        return _mm_cvtss_f32(_mm_min_ss(h, _mm_shuffle_ps(h, h, 1)));
    }
};

inline float hmax8(__m256 m) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
}

// Per chunk: max in 4 accumulators (NaN caught by cmpunord, since maxps
// drops it); remember the first chunk whose max is strictly larger, then find
// the first index of the max inside it.
std::size_t argmax_avx2(const float* x, std::size_t n, bool* bad) {
    const float ninf = -std::numeric_limits<float>::infinity();
    __m256 nan = _mm256_setzero_ps();
    float best = ninf;
    std::size_t best_chunk = 0;
    for (std::size_t start = 0; start < n; start += kChunk) {
        std::size_t end = start + kChunk < n ? start + kChunk : n;
        __m256 m0 = _mm256_set1_ps(ninf), m1 = m0, m2 = m0, m3 = m0;
        std::size_t j = start;
        for (; j + 32 <= end; j += 32) {
            __m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + j + 8);
            __m256 c = _mm256_loadu_ps(x + j + 16), d = _mm256_loadu_ps(x + j + 24);
            nan = _mm256_or_ps(nan, _mm256_or_ps(_mm256_cmp_ps(a, b, _CMP_UNORD_Q),
                                                 _mm256_cmp_ps(c, d, _CMP_UNORD_Q)));
            m0 = _mm256_max_ps(m0, a); m1 = _mm256_max_ps(m1, b);
            m2 = _mm256_max_ps(m2, c); m3 = _mm256_max_ps(m3, d);
        }
        float cm = hmax8(_mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
        for (; j < end; ++j) {
            if (x[j] != x[j]) { *bad = true; return 0; }
            if (x[j] > cm) cm = x[j];
        }
        if (cm > best) { best = cm; best_chunk = start; }
    }
    if (_mm256_movemask_ps(nan) || best == std::numeric_limits<float>::infinity()) {
        *bad = true;
        return 0;
    }
    std::size_t end = best_chunk + kChunk < n ? best_chunk + kChunk : n;
    for (std::size_t j = best_chunk; j < end; ++j)
        if (x[j] == best) return j;
    return best_chunk;  // only reached for an all -inf row: index 0
}

float quick_sum_avx2(const float* x, std::size_t n, float* mn) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    __m256 m = _mm256_set1_ps(std::numeric_limits<float>::infinity());
    std::size_t j = 0;
    for (; j + 32 <= n; j += 32) {
        __m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + j + 8);
        __m256 c = _mm256_loadu_ps(x + j + 16), d = _mm256_loadu_ps(x + j + 24);
        s0 = _mm256_add_ps(s0, a); s1 = _mm256_add_ps(s1, b);
        s2 = _mm256_add_ps(s2, c); s3 = _mm256_add_ps(s3, d);
        m = _mm256_min_ps(m, _mm256_min_ps(_mm256_min_ps(a, b), _mm256_min_ps(c, d)));
    }
    alignas(32) float l[8], ml[8];
    _mm256_store_ps(l, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    _mm256_store_ps(ml, m);
    float s = 0.0f, mm = std::numeric_limits<float>::infinity();
    for (int i = 0; i < 8; ++i) { s += l[i]; mm = ml[i] < mm ? ml[i] : mm; }
    for (; j < n; ++j) { s += x[j]; mm = x[j] < mm ? x[j] : mm; }
    *mn = mm;
    return s;
}

}  // namespace

// Used by the AVX-512 table too: greedy is already at its memory floor.
std::size_t argmax_avx2_path(const float* x, std::size_t n, bool* bad) { return argmax_avx2(x, n, bad); }

extern const Kernels kAvx2Kernels = {"avx2", argmax_avx2, chunk_sums_t<Avx2Isa>,
                                     residual_chunk_sums_t<Avx2Isa>, quick_sum_avx2};

}  // namespace specgguf
#endif
