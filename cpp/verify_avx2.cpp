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
    static float min_value(const Min& mn) { return hmin(mn.m); }

    using Vf = __m256;
    static constexpr std::size_t kWidth = 8;
    static Vf splat(float x) { return _mm256_set1_ps(x); }
    static Vf load(const float* x) { return _mm256_loadu_ps(x); }
    static void store(float* p, Vf x) { _mm256_storeu_ps(p, x); }
    static Vf add(Vf a, Vf b) { return _mm256_add_ps(a, b); }
    static Vf sub(Vf a, Vf b) { return _mm256_sub_ps(a, b); }
    static Vf mul(Vf a, Vf b) { return _mm256_mul_ps(a, b); }
    static Vf min(Vf a, Vf b) { return _mm256_min_ps(a, b); }
    static Vf max(Vf a, Vf b) { return _mm256_max_ps(a, b); }
    static Vf pow2(Vf n) {
        const __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
        return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
    }
    static Vf zero_below(Vf y, Vf x, Vf lim) { return _mm256_and_ps(y, _mm256_cmp_ps(x, lim, _CMP_GE_OQ)); }
    static Vf nan_or(Vf acc, Vf a, Vf b) { return _mm256_or_ps(acc, _mm256_cmp_ps(a, b, _CMP_UNORD_Q)); }
    static bool any(Vf m) { return _mm256_movemask_ps(m) != 0; }
    static unsigned gt_mask(Vf x, Vf t) { return (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(x, t, _CMP_GT_OQ)); }
    static float hsum(Vf v) {
        alignas(32) float l[8];
        _mm256_store_ps(l, v);
        float s = 0.0f;
        for (float x : l) s += x;
        return s;
    }
    static float hmin(Vf v) {
        __m128 h = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        h = _mm_min_ps(h, _mm_movehl_ps(h, h));
        return _mm_cvtss_f32(_mm_min_ss(h, _mm_shuffle_ps(h, h, 1)));
    }
    static float hmax(Vf v) {
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        return _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 1)));
    }
};

}  // namespace

// Used by the AVX-512 table too: greedy is already at its memory floor.
std::size_t argmax_avx2_path(const float* x, std::size_t n, bool* bad) { return argmax_t<Avx2Isa>(x, n, bad); }

extern const Kernels kAvx2Kernels = {"avx2", argmax_avx2_path, chunk_sums_t<Avx2Isa>,
                                     residual_chunk_sums_t<Avx2Isa>, quick_sum_t<Avx2Isa>,
                                     exp_row_t<Avx2Isa>, first_above_t<Avx2Isa>,
                                     indices_above_t<Avx2Isa>};

}  // namespace specgguf
#endif
