// The chunk / fold / tail loop of the row-sum kernels, written once.
//
// Each instruction-set file (verify.cpp for scalar, verify_avx2.cpp,
// verify_avx512.cpp, verify_neon.cpp) is compiled with its own flags and
// includes this header after defining a traits struct `Isa` that says how to
// add 32 floats into 32 double lanes, how to fold the lanes, and how to spill
// them to memory. The templates below are instantiated once per file.
//
// Everything here sits in an anonymous namespace: each file gets its own
// copy, compiled with that file's flags, so the linker can never hand an
// AVX-512 instantiation to the scalar path (a template with external linkage
// would be merged across files).
//
// An Isa provides:
//   struct Acc;                                        // 32 double lanes
//   struct Min;                                        // a running float minimum
//   static void zero(Acc&);
//   static void min_init(Min&);
//   static void add32(Acc&, Min&, const float* x);     // lane l += x[l], l < 32
//   static void add_residual32(Acc&, const float* p, const float* q, double P, double Q);
//                                                      // lane l += max(0, p[l]*Q - q[l]*P)
//   static double fold(Acc&);                          // the canonical fold (verify.h)
//   static void spill(Acc&, double* lanes);            // lanes[l] = lane l
//   static float min_value(const Min&);
// and, for the float-vector kernels (quick_sum_t, argmax_t, exp_row_t):
//   using Vf; static constexpr std::size_t kWidth;     // floats per vector
//   static Vf splat(float); static Vf load(const float*); static void store(float*, Vf);
//   static Vf add(Vf, Vf); static Vf sub(Vf, Vf); static Vf mul(Vf, Vf);
//   static Vf min(Vf, Vf); static Vf max(Vf, Vf);
//   static float hsum(Vf);  static float hmin(Vf); static float hmax(Vf);
//   static Vf nan_or(Vf acc, Vf a, Vf b);              // acc | (a or b is NaN)
//   static bool any(Vf);                               // any lane of a mask set
//   static Vf pow2(Vf n);                              // 2^n, n integral in [-126, 127]
//   static Vf zero_below(Vf y, Vf x, Vf lim);          // x >= lim ? y : 0, per lane
//   static unsigned gt_mask(Vf x, Vf t);               // bit l set iff lane l has x > t (never for NaN)
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "verify.h"

namespace specgguf {
namespace {

// Runs `body(acc, j)` for every full 32-element block of each chunk, then the
// short tail of the last chunk element by element through `tail(j)` (a
// double), and writes each chunk's canonical sum to out[c].
template <class Isa, class Body, class Tail>
inline void for_each_chunk(std::size_t n, double* out, Body body, Tail tail) {
    typename Isa::Acc a;
    for (std::size_t c = 0, start = 0; start < n; ++c, start += kChunk) {
        const std::size_t end = start + kChunk < n ? start + kChunk : n;
        Isa::zero(a);
        std::size_t j = start;
        for (; j + kLanes <= end; j += kLanes) body(a, j);
        if (j == end) {
            out[c] = Isa::fold(a);
            continue;
        }
        double lanes[kLanes];
        Isa::spill(a, lanes);
        for (; j < end; ++j) lanes[j % kLanes] += tail(j);
        out[c] = fold_lanes(lanes);
    }
}

template <class Isa>
float chunk_sums_t(const float* x, std::size_t n, double* out) {
    typename Isa::Min mn;
    Isa::min_init(mn);
    float tail_min = std::numeric_limits<float>::infinity();
    for_each_chunk<Isa>(
        n, out, [&](typename Isa::Acc& a, std::size_t j) { Isa::add32(a, mn, x + j); },
        [&](std::size_t t) {
            tail_min = x[t] < tail_min ? x[t] : tail_min;
            return (double)x[t];
        });
    const float m = Isa::min_value(mn);
    return m < tail_min ? m : tail_min;
}

template <class Isa>
void residual_chunk_sums_t(const float* p, const float* q, std::size_t n, double P, double Q,
                           double* out) {
    for_each_chunk<Isa>(
        n, out,
        [&](typename Isa::Acc& a, std::size_t j) { Isa::add_residual32(a, p + j, q + j, P, Q); },
        [&](std::size_t t) {
            const double r = (double)p[t] * Q - (double)q[t] * P;
            return r > 0.0 ? r : 0.0;
        });
}

// A float32 sum of x[0..n) in four vector accumulators, then the tail in
// order (any order is allowed: see quick_test_factor); *mn = min(x).
template <class Isa>
float quick_sum_t(const float* x, std::size_t n, float* mn) {
    using V = typename Isa::Vf;
    constexpr std::size_t w = Isa::kWidth;
    V s0 = Isa::splat(0.0f), s1 = s0, s2 = s0, s3 = s0;
    V m = Isa::splat(std::numeric_limits<float>::infinity());
    std::size_t j = 0;
    for (; j + 4 * w <= n; j += 4 * w) {
        V a = Isa::load(x + j), b = Isa::load(x + j + w), c = Isa::load(x + j + 2 * w), d = Isa::load(x + j + 3 * w);
        s0 = Isa::add(s0, a); s1 = Isa::add(s1, b); s2 = Isa::add(s2, c); s3 = Isa::add(s3, d);
        m = Isa::min(m, Isa::min(Isa::min(a, b), Isa::min(c, d)));
    }
    float s = Isa::hsum(Isa::add(Isa::add(s0, s1), Isa::add(s2, s3))), mm = Isa::hmin(m);
    for (; j < n; ++j) {
        s += x[j];
        mm = x[j] < mm ? x[j] : mm;
    }
    *mn = mm;
    return s;
}

// Index of the first maximum of x[0..n); *bad for a NaN or +inf. Per chunk:
// the max in four accumulators (NaNs noted on the side, since a vector max
// may drop them); the first chunk whose max is strictly larger wins, then the
// first index of the max inside it.
template <class Isa>
std::size_t argmax_t(const float* x, std::size_t n, bool* bad) {
    using V = typename Isa::Vf;
    constexpr std::size_t w = Isa::kWidth;
    constexpr float inf = std::numeric_limits<float>::infinity();
    V nan = Isa::splat(0.0f);
    float best = -inf;
    std::size_t best_chunk = 0;
    for (std::size_t start = 0; start < n; start += kChunk) {
        const std::size_t end = start + kChunk < n ? start + kChunk : n;
        V m0 = Isa::splat(-inf), m1 = m0, m2 = m0, m3 = m0;
        std::size_t j = start;
        for (; j + 4 * w <= end; j += 4 * w) {
            V a = Isa::load(x + j), b = Isa::load(x + j + w), c = Isa::load(x + j + 2 * w), d = Isa::load(x + j + 3 * w);
            nan = Isa::nan_or(Isa::nan_or(nan, a, b), c, d);
            m0 = Isa::max(m0, a); m1 = Isa::max(m1, b); m2 = Isa::max(m2, c); m3 = Isa::max(m3, d);
        }
        float cm = Isa::hmax(Isa::max(Isa::max(m0, m1), Isa::max(m2, m3)));
        for (; j < end; ++j) {
            if (x[j] != x[j]) { *bad = true; return 0; }
            if (x[j] > cm) cm = x[j];
        }
        if (cm != cm) { *bad = true; return 0; }
        if (cm > best) { best = cm; best_chunk = start; }
    }
    if (Isa::any(nan) || best == inf) { *bad = true; return 0; }
    const std::size_t end = best_chunk + kChunk < n ? best_chunk + kChunk : n;
    for (std::size_t j = best_chunk; j < end; ++j)
        if (x[j] == best) return j;
    return best_chunk;  // only reached for an all -inf row: index 0
}

// One float lane: the scalar path's exp_row and every SIMD path's tail.
struct FloatLane {
    using Vf = float;
    static constexpr std::size_t kWidth = 1;
    static Vf splat(float x) { return x; }
    static Vf load(const float* x) { return *x; }
    static void store(float* p, Vf x) { *p = x; }
    static Vf add(Vf a, Vf b) { return a + b; }
    static Vf sub(Vf a, Vf b) { return a - b; }
    static Vf mul(Vf a, Vf b) { return a * b; }
    static Vf max(Vf a, Vf b) { return a > b ? a : b; }
    static Vf pow2(Vf n) {
        const std::uint32_t bits = (std::uint32_t)((std::int32_t)n + 127) << 23;
        float y;
        std::memcpy(&y, &bits, sizeof y);
        return y;
    }
    static Vf zero_below(Vf y, Vf x, Vf lim) { return x >= lim ? y : 0.0f; }
    static unsigned gt_mask(Vf x, Vf t) { return x > t ? 1u : 0u; }
};

// Index of the first j < n with x[j] > t, or n: one compare per vector until
// a vector has such a lane, then that vector lane by lane.
template <class Isa>
std::size_t first_above_t(const float* x, std::size_t n, float t) {
    constexpr std::size_t w = Isa::kWidth;
    const typename Isa::Vf vt = Isa::splat(t);
    std::size_t j = 0;
    while (j + w <= n && !Isa::gt_mask(Isa::load(x + j), vt)) j += w;
    for (; j < n; ++j)
        if (x[j] > t) return j;
    return n;
}

// The indices j < n with x[j] > t into idx, in order; returns how many.
template <class Isa>
std::size_t indices_above_t(const float* x, std::size_t n, float t, std::uint32_t* idx) {
    constexpr std::size_t w = Isa::kWidth;
    const typename Isa::Vf vt = Isa::splat(t);
    std::size_t j = 0, c = 0;
    for (; j + w <= n; j += w)
        for (unsigned m = Isa::gt_mask(Isa::load(x + j), vt); m; m &= m - 1)
            idx[c++] = (std::uint32_t)(j + (std::size_t)__builtin_ctz(m));
    for (; j < n; ++j)
        if (x[j] > t) idx[c++] = (std::uint32_t)j;
    return c;
}

// E(x), the warp's exp (cpp/warp.h), on every lane: Cephes' expf (range
// reduction by n = round(x log2 e) with ln 2 in two parts, a degree-5
// polynomial, then 2^n), written with separately rounded adds and
// multiplies only, so that every path returns the same bits. E(x) = 0 below
// kExpFloor, which keeps every result, and every probability made from it,
// a normal float: flush-to-zero modes cannot change a warp.
constexpr float kExpFloor = -64.0f;

template <class Isa>
inline typename Isa::Vf exp_lanes(typename Isa::Vf x) {
    using V = typename Isa::Vf;
    const V lim = Isa::splat(kExpFloor);
    const V xc = Isa::max(x, lim);  // -inf -> the floor; results there are zeroed below
    const V magic = Isa::splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
    const V n = Isa::sub(Isa::add(Isa::mul(xc, Isa::splat(1.44269504088896341f)), magic), magic);
    V r = Isa::sub(xc, Isa::mul(n, Isa::splat(0.693359375f)));
    r = Isa::sub(r, Isa::mul(n, Isa::splat(-2.12194440e-4f)));
    V p = Isa::splat(1.9875691500e-4f);
    p = Isa::add(Isa::mul(p, r), Isa::splat(1.3981999507e-3f));
    p = Isa::add(Isa::mul(p, r), Isa::splat(8.3334519073e-3f));
    p = Isa::add(Isa::mul(p, r), Isa::splat(4.1665795894e-2f));
    p = Isa::add(Isa::mul(p, r), Isa::splat(1.6666665459e-1f));
    p = Isa::add(Isa::mul(p, r), Isa::splat(5.0000001201e-1f));
    const V y = Isa::add(Isa::add(Isa::mul(p, Isa::mul(r, r)), r), Isa::splat(1.0f));
    return Isa::zero_below(Isa::mul(y, Isa::pow2(n)), x, lim);
}

// out[j] = E((x[j] - top) * scale) for j < n; -inf gives 0.
template <class Isa>
void exp_row_t(const float* x, std::size_t n, float top, float scale, float* out) {
    constexpr std::size_t w = Isa::kWidth;
    const typename Isa::Vf vt = Isa::splat(top), vs = Isa::splat(scale);
    std::size_t j = 0;
    for (; j + w <= n; j += w) Isa::store(out + j, exp_lanes<Isa>(Isa::mul(Isa::sub(Isa::load(x + j), vt), vs)));
    for (; j < n; ++j) out[j] = exp_lanes<FloatLane>((x[j] - top) * scale);
}

}  // namespace
}  // namespace specgguf
