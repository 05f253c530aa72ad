// The scalar reference kernels, the path registry and the two ops.
// The ops are written once over a Kernels table; only the O(V) passes differ
// between paths.
#include "verify.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <limits>

namespace specgguf {

// Folds kLanes accumulators in halves: the canonical order of verify.h.
double fold_lanes(double* l) {
    for (std::size_t half = kLanes / 2; half >= 1; half /= 2)
        for (std::size_t j = 0; j < half; ++j) l[j] += l[j + half];
    return l[0];
}

namespace {

std::size_t argmax_scalar(const float* x, std::size_t n, bool* bad) {
    float best = -std::numeric_limits<float>::infinity();
    std::size_t idx = 0;
    for (std::size_t j = 0; j < n; ++j) {
        float v = x[j];
        if (v != v) { *bad = true; return 0; }  // NaN
        if (v > best) { best = v; idx = j; }
    }
    if (best == std::numeric_limits<float>::infinity()) *bad = true;
    return idx;
}

float chunk_sums_scalar(const float* x, std::size_t n, double* out) {
    float mn = std::numeric_limits<float>::infinity();
    for (std::size_t c = 0, start = 0; start < n; ++c, start += kChunk) {
        std::size_t end = start + kChunk < n ? start + kChunk : n;
        double lanes[kLanes] = {0};
        for (std::size_t j = start; j < end; ++j) {
            lanes[j % kLanes] += (double)x[j];
            if (x[j] < mn) mn = x[j];
        }
        out[c] = fold_lanes(lanes);
    }
    return mn;
}

void residual_chunk_sums_scalar(const float* p, const float* q, std::size_t n,
                                double P, double Q, double* out) {
    for (std::size_t c = 0, start = 0; start < n; ++c, start += kChunk) {
        std::size_t end = start + kChunk < n ? start + kChunk : n;
        double lanes[kLanes] = {0};
        for (std::size_t j = start; j < end; ++j) {
            double r = (double)p[j] * Q - (double)q[j] * P;
            lanes[j % kLanes] += r > 0.0 ? r : 0.0;
        }
        out[c] = fold_lanes(lanes);
    }
}

float quick_sum_scalar(const float* x, std::size_t n, float* mn) {
    float s = 0.0f, m = std::numeric_limits<float>::infinity();
    for (std::size_t j = 0; j < n; ++j) {
        s += x[j];
        m = x[j] < m ? x[j] : m;
    }
    *mn = m;
    return s;
}

const Kernels kScalar = {"scalar", argmax_scalar, chunk_sums_scalar,
                         residual_chunk_sums_scalar, quick_sum_scalar};

double total(const double* chunks, std::size_t nc) {
    double s = 0.0;
    for (std::size_t c = 0; c < nc; ++c) s += chunks[c];
    return s;
}

// Inverse-CDF sample over chunked masses (see verify.h). mass(j) must be the
// same elementwise value the chunk sums were built from.
template <class Mass>
std::size_t sample(const double* chunks, std::size_t nc, std::size_t v,
                   double tot, double u, Mass mass) {
    const double target = u * tot;
    double cum = 0.0;
    std::size_t c = 0;
    for (; c < nc; ++c) {
        if (cum + chunks[c] > target) break;
        cum += chunks[c];
    }
    if (c == nc) {  // u*tot rounded up to tot: take the last chunk with mass
        c = nc - 1;
        while (c > 0 && !(chunks[c] > 0.0)) --c;
    }
    std::size_t start = c * kChunk, end = start + kChunk < v ? start + kChunk : v;
    std::size_t last = start;
    for (std::size_t j = start; j < end; ++j) {
        double m = mass(j);
        if (m > 0.0) {
            last = j;
            cum += m;
            if (cum > target) return j;
        }
    }
    return last;  // rounding inside the chunk: its last token with mass
}

}  // namespace

const Kernels& scalar_kernels() { return kScalar; }

std::size_t available_kernels(const Kernels** out, std::size_t cap) {
    std::size_t n = 0;
    const Kernels* all[] = {&kScalar, avx2_kernels(), avx512_kernels(), neon_kernels()};
    for (const Kernels* k : all)
        if (k && n < cap) out[n++] = k;
    return n;
}

Result verify_greedy(const Kernels& kern, const float* target, std::size_t k,
                     std::size_t v, const std::int64_t* draft) {
    for (std::size_t i = 0; i <= k; ++i) {
        bool bad = false;
        std::size_t a = kern.argmax(target + i * v, v, &bad);
        if (bad) return {kBadTarget, 0, 0, (std::int64_t)i};
        if (i == k || draft[i] != (std::int64_t)a)
            return {kOk, (std::int64_t)i, (std::int64_t)a, -1};
    }
    return {kOk, 0, 0, -1};  // unreachable
}

Result accept(const Kernels& kern, const float* target, const float* draft_probs,
              std::size_t k, std::size_t v, const std::int64_t* draft,
              const double* u, double* scratch) {
    const std::size_t nc = n_chunks(v);
    // Row total with validation; returns NaN-free total or sets status.
    auto row_total = [&](const float* row, int bad, int zero, std::size_t i,
                         Result* err) -> double {
        float mn = kern.chunk_sums(row, v, scratch);
        double t = total(scratch, nc);
        if (!std::isfinite(t) || mn < 0.0f) *err = {bad, 0, 0, (std::int64_t)i};
        else if (t == 0.0) *err = {zero, 0, 0, (std::int64_t)i};
        return t;
    };
    Result err = {kOk, 0, 0, -1};
    // Bound on how far a float32 sum (any order) of v non-negative values can
    // be from the canonical double sum, relative: v * 2^-24 for the float
    // sum, v * 2^-52 for the double one, and slack for the products below.
    const double delta = (double)v * (0x1p-24 + 0x1p-52) + 1e-12;
    for (std::size_t i = 0; i < k; ++i) {
        const float* p = target + i * v;
        const float* q = draft_probs + i * v;
        const std::size_t t = (std::size_t)draft[i];
        // Most positions are decided by quick float sums: when u is further
        // from the threshold than the sums' error bound allows, the exact
        // decision is certain. Otherwise (and for bad input) the exact path.
        float pmin, qmin;
        const double Pq = kern.quick_sum(p, v, &pmin), Qq = kern.quick_sum(q, v, &qmin);
        if (std::isfinite(Pq) && std::isfinite(Qq) && pmin >= 0.0f && qmin >= 0.0f && Pq > 0.0 &&
            Qq > 0.0 && delta < 0.25) {
            const double lhs = u[i] * (double)q[t], rhs = (double)p[t];
            if (lhs * Pq * (1 + delta) < rhs * Qq * (1 - delta)) continue;  // surely accepted
        }
        double P = row_total(p, kBadTarget, kZeroTarget, i, &err);
        if (err.status) return err;
        double Q = row_total(q, kBadDraft, kZeroDraft, i, &err);
        if (err.status) return err;
        // u < (p_t/P) / (q_t/Q), without the divisions' rounding.
        if (u[i] * (double)q[t] * P < (double)p[t] * Q) continue;

        kern.residual_chunk_sums(p, q, v, P, Q, scratch);
        double R = total(scratch, nc);
        std::size_t tok;
        if (R > P * Q * 1e-15) {
            tok = sample(scratch, nc, v, R, u[k], [&](std::size_t j) {
                double r = (double)p[j] * Q - (double)q[j] * P;
                return r > 0.0 ? r : 0.0;
            });
        } else {  // p and q equal up to rounding: the residual is noise, use p
            kern.chunk_sums(p, v, scratch);
            tok = sample(scratch, nc, v, P, u[k],
                         [&](std::size_t j) { return (double)p[j]; });
        }
        return {kOk, (std::int64_t)i, (std::int64_t)tok, -1};
    }
    const float* p = target + k * v;
    double P = row_total(p, kBadTarget, kZeroTarget, k, &err);
    if (err.status) return err;
    std::size_t tok = sample(scratch, nc, v, P, u[k],
                             [&](std::size_t j) { return (double)p[j]; });
    return {kOk, (std::int64_t)k, (std::int64_t)tok, -1};
}

Result accept_onehot(const Kernels& kern, const float* target, std::size_t k, std::size_t v,
                     const std::int64_t* draft, const double* u, double* scratch) {
    const std::size_t nc = n_chunks(v);
    for (std::size_t i = 0; i <= k; ++i) {
        const float* p = target + i * v;
        float mn = kern.chunk_sums(p, v, scratch);
        double P = total(scratch, nc);
        if (!std::isfinite(P) || mn < 0.0f) return {kBadTarget, 0, 0, (std::int64_t)i};
        if (P == 0.0) return {kZeroTarget, 0, 0, (std::int64_t)i};
        if (i == k)  // all accepted: the bonus from p_K
            return {kOk, (std::int64_t)k,
                    (std::int64_t)sample(scratch, nc, v, P, u[k], [&](std::size_t j) { return (double)p[j]; }),
                    -1};
        const std::size_t t = (std::size_t)draft[i];
        // accept()'s test with q(t) = Q = 1.
        if (u[i] * 1.0 * P < (double)p[t] * 1.0) continue;
        // Residual max(0, p*1 - onehot*P) is p with t zeroed: only t's chunk
        // changes; re-sum it in the canonical order.
        auto mass = [&](std::size_t j) { return j == t ? 0.0 : (double)p[j]; };
        const std::size_t c = t / kChunk, start = c * kChunk, end = std::min(start + kChunk, v);
        double lanes[kLanes] = {0};
        for (std::size_t j = start; j < end; ++j) lanes[j % kLanes] += mass(j);
        scratch[c] = fold_lanes(lanes);
        double R = total(scratch, nc);
        std::size_t tok;
        if (R > P * 1e-15) {
            tok = sample(scratch, nc, v, R, u[k], mass);
        } else {  // all of p's mass is on t (up to rounding): use p
            kern.chunk_sums(p, v, scratch);
            tok = sample(scratch, nc, v, P, u[k], [&](std::size_t j) { return (double)p[j]; });
        }
        return {kOk, (std::int64_t)i, (std::int64_t)tok, -1};
    }
    return {kOk, 0, 0, -1};  // unreachable
}

}  // namespace specgguf
