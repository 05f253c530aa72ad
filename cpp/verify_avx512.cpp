// AVX-512 path of the row-sum kernels (argmax reuses AVX2: greedy is already
// at its memory floor). The double accumulation is conversion-bound, and
// AVX-512 converts 8 floats per instruction instead of 4. This file alone is
// compiled with -mavx512f (CMakeLists.txt); verify.cpp checks the CPU before
// handing the table out. Must agree bit for bit with the scalar kernels.
#include "verify.h"

#if defined(__x86_64__) && defined(__AVX512F__)
#include <immintrin.h>

#include <limits>

#include "verify_simd.h"

namespace specgguf {

std::size_t argmax_avx2_path(const float* x, std::size_t n, bool* bad);

namespace {

// 32 double lanes = 4 registers; register r holds lanes 8r..8r+7.
struct Avx512Isa {
    struct Acc { __m512d r[4]; };
    struct Min { __m512 m; };
    static void zero(Acc& a) { for (auto& r : a.r) r = _mm512_setzero_pd(); }
    static void min_init(Min& m) { m.m = _mm512_set1_ps(std::numeric_limits<float>::infinity()); }
    static void add32(Acc& a, Min& mn, const float* x) {
        for (int m = 0; m < 4; m += 2) {
            __m512 v = _mm512_loadu_ps(x + 8 * m);
            mn.m = _mm512_min_ps(mn.m, v);
            a.r[m] = _mm512_add_pd(a.r[m], _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
            a.r[m + 1] = _mm512_add_pd(
                a.r[m + 1], _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
        }
    }
    static void add_residual32(Acc& a, const float* p, const float* q, double P, double Q) {
        const __m512d vP = _mm512_set1_pd(P), vQ = _mm512_set1_pd(Q), z = _mm512_setzero_pd();
        for (int m = 0; m < 4; ++m) {
            __m512d pd = _mm512_cvtps_pd(_mm256_loadu_ps(p + 8 * m));
            __m512d qd = _mm512_cvtps_pd(_mm256_loadu_ps(q + 8 * m));
            __m512d r = _mm512_sub_pd(_mm512_mul_pd(pd, vQ), _mm512_mul_pd(qd, vP));
            a.r[m] = _mm512_add_pd(a.r[m], _mm512_max_pd(r, z));
        }
    }
    // Canonical fold (verify.h): lanes j += j+16, +8, +4, +2, +1.
    static double fold(Acc& a) {
        __m512d s = _mm512_add_pd(_mm512_add_pd(a.r[0], a.r[2]), _mm512_add_pd(a.r[1], a.r[3]));
        __m256d h = _mm256_add_pd(_mm512_castpd512_pd256(s), _mm512_extractf64x4_pd(s, 1));
        __m128d q = _mm_add_pd(_mm256_castpd256_pd128(h), _mm256_extractf128_pd(h, 1));
        return _mm_cvtsd_f64(_mm_add_sd(q, _mm_unpackhi_pd(q, q)));
    }
    static void spill(Acc& a, double* lanes) { for (int m = 0; m < 4; ++m) _mm512_storeu_pd(lanes + 8 * m, a.r[m]); }
    static float min_value(const Min& mn) { return _mm512_reduce_min_ps(mn.m); }

    using Vf = __m512;
    static constexpr std::size_t kWidth = 16;
    static Vf splat(float x) { return _mm512_set1_ps(x); }
    static Vf load(const float* x) { return _mm512_loadu_ps(x); }
    static void store(float* p, Vf x) { _mm512_storeu_ps(p, x); }
    static Vf add(Vf a, Vf b) { return _mm512_add_ps(a, b); }
    static Vf sub(Vf a, Vf b) { return _mm512_sub_ps(a, b); }
    static Vf mul(Vf a, Vf b) { return _mm512_mul_ps(a, b); }
    static Vf min(Vf a, Vf b) { return _mm512_min_ps(a, b); }
    static Vf max(Vf a, Vf b) { return _mm512_max_ps(a, b); }
    static Vf pow2(Vf n) {
        const __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
        return _mm512_castsi512_ps(_mm512_slli_epi32(e, 23));
    }
    static Vf zero_below(Vf y, Vf x, Vf lim) { return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lim, _CMP_GE_OQ), y); }
    static unsigned gt_mask(Vf x, Vf t) { return (unsigned)_mm512_cmp_ps_mask(x, t, _CMP_GT_OQ); }
    static float hsum(Vf v) { return _mm512_reduce_add_ps(v); }
    static float hmin(Vf v) { return _mm512_reduce_min_ps(v); }
};

}  // namespace

extern const Kernels kAvx512Kernels = {"avx512", argmax_avx2_path, chunk_sums_t<Avx512Isa>,
                                       residual_chunk_sums_t<Avx512Isa>, quick_sum_t<Avx512Isa>,
                                       exp_row_t<Avx512Isa>, first_above_t<Avx512Isa>,
                                       indices_above_t<Avx512Isa>};

}  // namespace specgguf
#endif
