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
// and, for the float-vector kernels (quick_sum_t, argmax_t):
//   using Vf; static constexpr std::size_t kWidth;     // floats per vector
//   static Vf splat(float); static Vf load(const float*);
//   static Vf add(Vf, Vf); static Vf min(Vf, Vf); static Vf max(Vf, Vf);
//   static float hsum(Vf);  static float hmin(Vf); static float hmax(Vf);
//   static Vf nan_or(Vf acc, Vf a, Vf b);              // acc | (a or b is NaN)
//   static bool any(Vf);                               // any lane of a mask set
#pragma once
#include <cstddef>
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

}  // namespace
}  // namespace specgguf
