// The scalar kernels, the path registry and the ops.
// The ops are written once over a Kernels table; only the O(V) passes differ
// between paths, and their chunk loop is written once too (verify_simd.h).
#include "verify.h"

#include <cmath>
#include <limits>

#include "verify_simd.h"

namespace specgguf {

// Folds kLanes accumulators in halves: the canonical order of verify.h.
double fold_lanes(double* l) {
    for (std::size_t half = kLanes / 2; half >= 1; half /= 2)
        for (std::size_t j = 0; j < half; ++j) l[j] += l[j + half];
    return l[0];
}

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// The scalar instruction set for verify_simd.h: 32 doubles in an array.
struct ScalarIsa {
    struct Acc { double l[kLanes]; };
    struct Min { float m; };
    static void zero(Acc& a) { for (double& x : a.l) x = 0.0; }
    static void min_init(Min& m) { m.m = kInf; }
    static void add32(Acc& a, Min& m, const float* x) {
        for (std::size_t l = 0; l < kLanes; ++l) {
            a.l[l] += (double)x[l];
            m.m = x[l] < m.m ? x[l] : m.m;
        }
    }
    static void add_residual32(Acc& a, const float* p, const float* q, double P, double Q) {
        for (std::size_t l = 0; l < kLanes; ++l) {
            const double r = (double)p[l] * Q - (double)q[l] * P;
            a.l[l] += r > 0.0 ? r : 0.0;
        }
    }
    static double fold(Acc& a) { return fold_lanes(a.l); }
    static void spill(Acc& a, double* lanes) { for (std::size_t l = 0; l < kLanes; ++l) lanes[l] = a.l[l]; }
    static float min_value(const Min& m) { return m.m; }
};

std::size_t argmax_scalar(const float* x, std::size_t n, bool* bad) {
    float best = -kInf;
    std::size_t idx = 0;
    for (std::size_t j = 0; j < n; ++j) {
        float v = x[j];
        if (v != v) { *bad = true; return 0; }  // NaN
        if (v > best) { best = v; idx = j; }
    }
    if (best == kInf) *bad = true;
    return idx;
}

float quick_sum_scalar(const float* x, std::size_t n, float* mn) {
    float s = 0.0f, m = kInf;
    for (std::size_t j = 0; j < n; ++j) {
        s += x[j];
        m = x[j] < m ? x[j] : m;
    }
    *mn = m;
    return s;
}

const Kernels kScalar = {"scalar", argmax_scalar, chunk_sums_t<ScalarIsa>,
                         residual_chunk_sums_t<ScalarIsa>, quick_sum_scalar, exp_row_t<FloatLane>,
                         first_above_t<FloatLane>, indices_above_t<FloatLane>};

double total(const double* chunks, std::size_t nc) {
    double s = 0.0;
    for (std::size_t c = 0; c < nc; ++c) s += chunks[c];
    return s;
}

// The last index with mass (chunk sums > 0 mean some element is > 0).
template <class Mass>
std::size_t last_with_mass(const double* chunks, std::size_t nc, std::size_t v, Mass mass) {
    std::size_t c = nc - 1;
    while (c > 0 && !(chunks[c] > 0.0)) --c;
    std::size_t j = c * kChunk + kChunk < v ? c * kChunk + kChunk : v;
    while (j > c * kChunk && !(mass(j - 1) > 0.0)) --j;
    return j > c * kChunk ? j - 1 : c * kChunk;
}

// Inverse-CDF sample over chunked masses (see verify.h). mass(j) must be the
// same elementwise value the chunk sums were built from.
template <class Mass>
std::size_t sample(const double* chunks, std::size_t nc, std::size_t v,
                   double tot, double u, Mass mass) {
    const double target = u * tot;
    double cum = 0.0;
    for (std::size_t c = 0; c < nc; ++c) {
        if (!(cum + chunks[c] > target)) {
            cum += chunks[c];
            continue;
        }
        const std::size_t start = c * kChunk, end = start + kChunk < v ? start + kChunk : v;
        std::size_t last = start;
        for (std::size_t j = start; j < end; ++j) {
            const double m = mass(j);
            if (m > 0.0) {
                last = j;
                cum += m;
                if (cum > target) return j;
            }
        }
        return last;  // the sums inside the chunk rounded below its chunk sum
    }
    // No cumulative mass exceeds u * tot. Unreachable for float32 masses:
    // their double totals are normal, so u < 1 gives u * tot < tot, and the
    // chunk sums add up to tot in this very order. Kept as a guard that gives
    // the contract's answer: the last token with mass.
    return last_with_mass(chunks, nc, v, mass);
}

}  // namespace

// Why F makes the quick test rigorous. With u = 2^-24 and e = 2^-53, a float
// sum of n >= 1 non-negative floats in any order (any tree, no overflow) is
// within gf = n u / (1 - n u) of the true sum S, relatively; the canonical
// double sum within gd = n e / (1 - n e). So the double total P_d satisfies
// P_d <= Pq (1 + gd) / (1 - gf) and Q_d >= Qq (1 - gd) / (1 + gf). The
// double test compares L_d = fl(fl(u q_t) P_d) (two roundings) with
// R_d = fl(p_t Q_d) (one), and the quick test's own L and R round alike, so
//   L_d <= L (1+e)^2/(1-e)^2 (1+gd)/(1-gf),  R_d >= R (1-e)/(1+e) (1-gd)/(1+gf).
// F is the ratio of those factors, raised by 16 e to cover the rounding of
// computing F and of L * F; then L * F < R implies L_d < R_d.
double quick_test_factor(std::size_t v) {
    const double n = (double)(v ? v : 1), uf = 0x1p-24, e = 0x1p-53;
    if (n * uf >= 0.25) return std::numeric_limits<double>::infinity();
    const double gf = n * uf / (1.0 - n * uf), gd = n * e / (1.0 - n * e);
    const double up = (1.0 + e) * (1.0 + e) / ((1.0 - e) * (1.0 - e)) * (1.0 + gd) / (1.0 - gf);
    const double down = (1.0 - e) / (1.0 + e) * (1.0 - gd) / (1.0 + gf);
    return up / down * (1.0 + 16.0 * e);
}

const Kernels& scalar_kernels() { return kScalar; }

// The instruction-set files export their tables; the CPU is checked here,
// in code compiled for the baseline, before a table is handed out.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
extern const Kernels kAvx2Kernels;
extern const Kernels kAvx512Kernels;
const Kernels* avx2_kernels() { return __builtin_cpu_supports("avx2") ? &kAvx2Kernels : nullptr; }
const Kernels* avx512_kernels() {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("avx512f") ? &kAvx512Kernels : nullptr;
}
#else
const Kernels* avx2_kernels() { return nullptr; }
const Kernels* avx512_kernels() { return nullptr; }
#endif
#if defined(__aarch64__)
extern const Kernels kNeonKernels;
const Kernels* neon_kernels() { return &kNeonKernels; }  // NEON is baseline on aarch64
#else
const Kernels* neon_kernels() { return nullptr; }
#endif

std::size_t available_kernels(const Kernels** out, std::size_t cap) {
    std::size_t n = 0;
    const Kernels* all[] = {&kScalar, avx2_kernels(), avx512_kernels(), neon_kernels()};
    for (const Kernels* k : all)
        if (k && n < cap) out[n++] = k;
    return n;
}

Result verify_greedy(const Kernels& kern, const float* target, std::size_t k,
                     std::size_t v, const std::int64_t* draft) {
    for (std::size_t i = 0;; ++i) {
        bool bad = false;
        std::size_t a = kern.argmax(target + i * v, v, &bad);
        if (bad) return {kBadTarget, 0, 0, (std::int64_t)i};
        if (i == k || draft[i] != (std::int64_t)a)
            return {kOk, (std::int64_t)i, (std::int64_t)a, -1};
    }
}

namespace {

// A row's canonical total into *total; a non-OK Result for bad rows.
Result row_total(const Kernels& kern, const float* row, std::size_t v, std::size_t i, int bad,
                 int zero, double* scratch, double* out) {
    const float mn = kern.chunk_sums(row, v, scratch);
    *out = total(scratch, n_chunks(v));
    if (!std::isfinite(*out) || mn < 0.0f) return {bad, 0, 0, (std::int64_t)i};
    if (*out == 0.0) return {zero, 0, 0, (std::int64_t)i};
    return {kOk, 0, 0, -1};
}

// True when the quick float sums prove accept()'s exact test accepts.
bool surely_accepted(const Kernels& kern, const float* p, const float* q, std::size_t v,
                     std::size_t t, double u, double factor) {
    float pmin, qmin;
    const double Pq = kern.quick_sum(p, v, &pmin), Qq = kern.quick_sum(q, v, &qmin);
    if (!(std::isfinite(Pq) && std::isfinite(Qq) && pmin >= 0.0f && qmin >= 0.0f && Pq > 0.0 && Qq > 0.0))
        return false;  // bad input or an empty row: the exact path reports it
    return u * (double)q[t] * Pq * factor < (double)p[t] * Qq;
}

// The token after a rejection at a row with totals P, Q: a sample of the
// residual max(0, p/P - q/Q), or of p when the residual is rounding noise.
std::size_t resample(const Kernels& kern, const float* p, const float* q, std::size_t v, double P,
                     double Q, double u, double* scratch) {
    const std::size_t nc = n_chunks(v);
    kern.residual_chunk_sums(p, q, v, P, Q, scratch);
    const double R = total(scratch, nc);
    if (R > P * Q * 1e-15) {
        return sample(scratch, nc, v, R, u, [&](std::size_t j) {
            const double r = (double)p[j] * Q - (double)q[j] * P;
            return r > 0.0 ? r : 0.0;
        });
    }
    kern.chunk_sums(p, v, scratch);  // p and q equal up to rounding
    return sample(scratch, nc, v, P, u, [&](std::size_t j) { return (double)p[j]; });
}

}  // namespace

Result accept(const Kernels& kern, const float* target, const float* draft_probs,
              std::size_t k, std::size_t v, const std::int64_t* draft,
              const double* u, double* scratch) {
    const double factor = quick_test_factor(v);
    for (std::size_t i = 0; i < k; ++i) {
        const float* p = target + i * v;
        const float* q = draft_probs + i * v;
        const std::size_t t = (std::size_t)draft[i];
        // Most positions are decided by quick float sums: when u is further
        // from the threshold than their error allows, the exact decision is
        // certain. Otherwise (and for bad input) the exact path.
        if (std::isfinite(factor) && surely_accepted(kern, p, q, v, t, u[i], factor)) continue;
        double P, Q;
        Result r = row_total(kern, p, v, i, kBadTarget, kZeroTarget, scratch, &P);
        if (r.status) return r;
        r = row_total(kern, q, v, i, kBadDraft, kZeroDraft, scratch, &Q);
        if (r.status) return r;
        // u < (p_t/P) / (q_t/Q), without the divisions' rounding.
        if (u[i] * (double)q[t] * P < (double)p[t] * Q) continue;
        return {kOk, (std::int64_t)i, (std::int64_t)resample(kern, p, q, v, P, Q, u[k], scratch), -1};
    }
    const float* p = target + k * v;
    double P;
    Result r = row_total(kern, p, v, k, kBadTarget, kZeroTarget, scratch, &P);
    if (r.status) return r;
    std::size_t tok = sample(scratch, n_chunks(v), v, P, u[k], [&](std::size_t j) { return (double)p[j]; });
    return {kOk, (std::int64_t)k, (std::int64_t)tok, -1};
}

Result accept_onehot(const Kernels& kern, const float* target, std::size_t k, std::size_t v,
                     const std::int64_t* draft, const double* u, double* scratch) {
    const std::size_t nc = n_chunks(v);
    for (std::size_t i = 0;; ++i) {
        const float* p = target + i * v;
        double P;
        Result r = row_total(kern, p, v, i, kBadTarget, kZeroTarget, scratch, &P);
        if (r.status) return r;
        auto from_p = [&](std::size_t j) { return (double)p[j]; };
        if (i == k)  // all accepted: the bonus from p_K
            return {kOk, (std::int64_t)k, (std::int64_t)sample(scratch, nc, v, P, u[k], from_p), -1};
        const std::size_t t = (std::size_t)draft[i];
        if (u[i] * 1.0 * P < (double)p[t] * 1.0) continue;  // accept()'s test with q(t) = Q = 1
        // Residual max(0, p*1 - onehot*P) is p with t zeroed: only t's chunk
        // changes; re-sum it in the canonical order.
        auto without_t = [&](std::size_t j) { return j == t ? 0.0 : (double)p[j]; };
        const std::size_t c = t / kChunk, start = c * kChunk, end = start + kChunk < v ? start + kChunk : v;
        double lanes[kLanes] = {0};
        for (std::size_t j = start; j < end; ++j) lanes[j % kLanes] += without_t(j);
        scratch[c] = fold_lanes(lanes);
        const double R = total(scratch, nc);
        std::size_t tok;
        if (R > P * 1e-15) {
            tok = sample(scratch, nc, v, R, u[k], without_t);
        } else {  // all of p's mass is on t (up to rounding): use p
            kern.chunk_sums(p, v, scratch);
            tok = sample(scratch, nc, v, P, u[k], from_p);
        }
        return {kOk, (std::int64_t)i, (std::int64_t)tok, -1};
    }
}

// ---- Drafter-invariant sampling ----

namespace {

// SplitMix64's finalizer (Steele, Lea, Flood 2014): a bijection on 64-bit
// words whose output passes BigCrush even for sequential inputs.
inline std::uint64_t mix64(std::uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

inline std::uint64_t position_key(std::uint64_t seed, std::uint64_t pos) { return mix64(mix64(seed) ^ pos); }

// 53 bits, centred in their cell: never 0 or 1.
inline double to_unit(std::uint64_t h) { return ((double)(h >> 11) + 0.5) * 0x1p-53; }

}  // namespace

double race_uniform(std::uint64_t seed, std::uint64_t pos, std::uint64_t token) {
    return to_unit(mix64(position_key(seed, pos) ^ token));
}

std::int64_t race_pick(const float* w, std::size_t v, std::uint64_t seed, std::uint64_t pos,
                       int* status) {
    const std::uint64_t key = position_key(seed, pos);
    double best = std::numeric_limits<double>::infinity();
    std::int64_t pick = -1;
    for (std::size_t t = 0; t < v; ++t) {
        const float x = w[t];
        if (!(x >= 0.0f) || x == kInf) {  // NaN fails x >= 0
            *status = kBadTarget;
            return -1;
        }
        if (x > 0.0f) {
            // -log(u) >= 1 - u (to an ulp in double), so a token whose bound
            // already loses cannot win: skip its log. The 1e-12 margin covers
            // log's rounding, so the pick is the one the full loop makes.
            const double u = to_unit(mix64(key ^ t));
            if (1.0 - u > best * (double)x * (1.0 + 1e-12)) continue;
            const double e = -std::log(u) / (double)x;
            if (e < best) {
                best = e;
                pick = (std::int64_t)t;
            }
        }
    }
    if (pick < 0) *status = kZeroTarget;
    return pick;
}

Result accept_invariant(const float* target, std::size_t k, std::size_t v,
                        const std::int64_t* draft, std::uint64_t seed, std::uint64_t pos) {
    for (std::size_t i = 0;; ++i) {
        int status = kOk;
        const std::int64_t y = race_pick(target + i * v, v, seed, pos + i, &status);
        if (status) return {status, 0, 0, (std::int64_t)i};
        if (i == k || draft[i] != y) return {kOk, (std::int64_t)i, y, -1};
    }
}

}  // namespace specgguf
