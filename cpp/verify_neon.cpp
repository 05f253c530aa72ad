// NEON path (aarch64) of the O(V) kernels. Baseline ARMv8-A only (no
// dotprod/SVE), so it runs on a Cortex-A53/A72 (Pi 3/4) as well as a Pi 5.
// Must agree bit for bit with the scalar kernels.
#include "verify.h"

#if defined(__aarch64__)
#include <arm_neon.h>

#include <limits>

#include "verify_simd.h"

namespace specgguf {
namespace {

// 32 double lanes = 16 registers; register r holds lanes 2r, 2r+1.
struct NeonIsa {
    struct Acc { float64x2_t r[16]; };
    struct Min { float32x4_t m; };
    static void zero(Acc& a) { for (auto& r : a.r) r = vdupq_n_f64(0.0); }
    static void min_init(Min& m) { m.m = vdupq_n_f32(std::numeric_limits<float>::infinity()); }
    static void add32(Acc& a, Min& mn, const float* x) {
        for (int m = 0; m < 16; m += 2) {
            float32x4_t v = vld1q_f32(x + 2 * m);
            mn.m = vminnmq_f32(mn.m, v);
            a.r[m] = vaddq_f64(a.r[m], vcvt_f64_f32(vget_low_f32(v)));
            a.r[m + 1] = vaddq_f64(a.r[m + 1], vcvt_high_f64_f32(v));
        }
    }
    static void add_residual32(Acc& a, const float* p, const float* q, double P, double Q) {
        const float64x2_t vP = vdupq_n_f64(P), vQ = vdupq_n_f64(Q), z = vdupq_n_f64(0.0);
        for (int m = 0; m < 16; m += 2) {
            float32x4_t pv = vld1q_f32(p + 2 * m), qv = vld1q_f32(q + 2 * m);
            // vmulq/vsubq, never vfmsq: an FMA would round differently.
            float64x2_t r0 = vsubq_f64(vmulq_f64(vcvt_f64_f32(vget_low_f32(pv)), vQ),
                                       vmulq_f64(vcvt_f64_f32(vget_low_f32(qv)), vP));
            float64x2_t r1 = vsubq_f64(vmulq_f64(vcvt_high_f64_f32(pv), vQ),
                                       vmulq_f64(vcvt_high_f64_f32(qv), vP));
            a.r[m] = vaddq_f64(a.r[m], vmaxq_f64(r0, z));
            a.r[m + 1] = vaddq_f64(a.r[m + 1], vmaxq_f64(r1, z));
        }
    }
    // Canonical fold (verify.h): lanes j += j+16, +8, +4, +2, +1.
    static double fold(Acc& a) {
        for (int m = 0; m < 8; ++m) a.r[m] = vaddq_f64(a.r[m], a.r[m + 8]);
        for (int m = 0; m < 4; ++m) a.r[m] = vaddq_f64(a.r[m], a.r[m + 4]);
        for (int m = 0; m < 2; ++m) a.r[m] = vaddq_f64(a.r[m], a.r[m + 2]);
        float64x2_t s = vaddq_f64(a.r[0], a.r[1]);
        return vgetq_lane_f64(s, 0) + vgetq_lane_f64(s, 1);
    }
    static void spill(Acc& a, double* lanes) { for (int m = 0; m < 16; ++m) vst1q_f64(lanes + 2 * m, a.r[m]); }
    static float min_value(const Min& mn) { return vminnmvq_f32(mn.m); }
};

// fmax propagates NaN, so a NaN anywhere shows up in the chunk max.
std::size_t argmax_neon(const float* x, std::size_t n, bool* bad) {
    const float ninf = -std::numeric_limits<float>::infinity();
    float best = ninf;
    std::size_t best_chunk = 0;
    for (std::size_t start = 0; start < n; start += kChunk) {
        std::size_t end = start + kChunk < n ? start + kChunk : n;
        float32x4_t m0 = vdupq_n_f32(ninf), m1 = m0, m2 = m0, m3 = m0;
        std::size_t j = start;
        for (; j + 16 <= end; j += 16) {
            m0 = vmaxq_f32(m0, vld1q_f32(x + j));
            m1 = vmaxq_f32(m1, vld1q_f32(x + j + 4));
            m2 = vmaxq_f32(m2, vld1q_f32(x + j + 8));
            m3 = vmaxq_f32(m3, vld1q_f32(x + j + 12));
        }
        float cm = vmaxvq_f32(vmaxq_f32(vmaxq_f32(m0, m1), vmaxq_f32(m2, m3)));
        for (; j < end; ++j) cm = (x[j] > cm || x[j] != x[j]) ? x[j] : cm;
        if (cm != cm) { *bad = true; return 0; }
        if (cm > best) { best = cm; best_chunk = start; }
    }
    if (best == std::numeric_limits<float>::infinity()) { *bad = true; return 0; }
    std::size_t end = best_chunk + kChunk < n ? best_chunk + kChunk : n;
    for (std::size_t j = best_chunk; j < end; ++j)
        if (x[j] == best) return j;
    return best_chunk;
}

float quick_sum_neon(const float* x, std::size_t n, float* mn) {
    float32x4_t s0 = vdupq_n_f32(0.0f), s1 = s0, s2 = s0, s3 = s0;
    float32x4_t m = vdupq_n_f32(std::numeric_limits<float>::infinity());
    std::size_t j = 0;
    for (; j + 16 <= n; j += 16) {
        float32x4_t a = vld1q_f32(x + j), b = vld1q_f32(x + j + 4);
        float32x4_t c = vld1q_f32(x + j + 8), d = vld1q_f32(x + j + 12);
        s0 = vaddq_f32(s0, a); s1 = vaddq_f32(s1, b);
        s2 = vaddq_f32(s2, c); s3 = vaddq_f32(s3, d);
        m = vminq_f32(m, vminq_f32(vminq_f32(a, b), vminq_f32(c, d)));  // NaN-propagating
    }
    float s = vaddvq_f32(vaddq_f32(vaddq_f32(s0, s1), vaddq_f32(s2, s3)));
    float mm = vminvq_f32(m);
    for (; j < n; ++j) { s += x[j]; mm = (x[j] < mm || x[j] != x[j]) ? x[j] : mm; }
    *mn = mm;
    return s;
}

}  // namespace

extern const Kernels kNeonKernels = {"neon", argmax_neon, chunk_sums_t<NeonIsa>,
                                     residual_chunk_sums_t<NeonIsa>, quick_sum_neon};

}  // namespace specgguf
#endif
