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

}  // namespace
}  // namespace specgguf
