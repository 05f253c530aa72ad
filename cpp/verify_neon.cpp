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

    using Vf = float32x4_t;
    static constexpr std::size_t kWidth = 4;
    static Vf splat(float x) { return vdupq_n_f32(x); }
    static Vf load(const float* x) { return vld1q_f32(x); }
    static void store(float* p, Vf x) { vst1q_f32(p, x); }
    static Vf add(Vf a, Vf b) { return vaddq_f32(a, b); }
    static Vf sub(Vf a, Vf b) { return vsubq_f32(a, b); }
    static Vf mul(Vf a, Vf b) { return vmulq_f32(a, b); }  // never vfmaq: an FMA rounds once
    static Vf pow2(Vf n) {
        return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23));
    }
    static Vf zero_below(Vf y, Vf x, Vf lim) {
        return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(y), vcgeq_f32(x, lim)));
    }
    static Vf min(Vf a, Vf b) { return vminq_f32(a, b); }  // NaN-propagating
    static Vf max(Vf a, Vf b) { return vmaxq_f32(a, b); }  // NaN-propagating: the chunk max shows it
    static Vf nan_or(Vf acc, Vf, Vf) { return acc; }
    static bool any(Vf) { return false; }
    static unsigned gt_mask(Vf x, Vf t) {
        const uint32x4_t bits = {1u, 2u, 4u, 8u};
        return vaddvq_u32(vandq_u32(vcgtq_f32(x, t), bits));
    }
    static float hsum(Vf v) { return vaddvq_f32(v); }
    static float hmin(Vf v) { return vminvq_f32(v); }
    static float hmax(Vf v) { return vmaxvq_f32(v); }
};

}  // namespace

extern const Kernels kNeonKernels = {"neon", argmax_t<NeonIsa>, chunk_sums_t<NeonIsa>,
                                     residual_chunk_sums_t<NeonIsa>, quick_sum_t<NeonIsa>,
                                     exp_row_t<NeonIsa>, first_above_t<NeonIsa>,
                                     indices_above_t<NeonIsa>};

}  // namespace specgguf
#endif
