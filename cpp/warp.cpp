#include "warp.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace specgguf {

namespace {

using Cand = std::pair<float, std::uint32_t>;
constexpr float kInf = std::numeric_limits<float>::infinity();

// "a ranks before b": higher logit, then lower index.
inline bool before(const Cand& a, const Cand& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
}

// Up to this k, top-k keeps a heap of the best k seen (once it is full, one
// compare per logit); beyond it, a linear-time selection.
constexpr std::size_t kHeapMax = 1024;

// Distances below the top, d = f32(top - l) >= 0, in bins of 1/16 octave:
// the top 12 bits of d's float (non-negative floats order like their bits).
// f32 rounding is monotone, so a higher logit never lands in a later bin:
// bins follow the ranking.
constexpr std::size_t kBins = 4096;
inline std::uint32_t bin_of(float d) {
    std::uint32_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    return (bits & 0x7fffffffu) >> 19;  // d is -0.0 where top is -0.0 and l is +0.0
}
inline float bin_floor(std::uint32_t key) {
    const std::uint32_t bits = key << 19;
    float d;
    std::memcpy(&d, &bits, sizeof d);
    return d;
}

// The smallest float f with f >= x: so that (float m) >= f is (double) m >= x.
inline float float_at_least(double x) {
    float f = (float)x;
    return (double)f < x ? std::nextafter(f, kInf) : f;
}

// c = the k best ranked finite logits, ranked.
void select_top_k(const float* l, std::size_t v, std::size_t k, std::vector<Cand>& c) {
    c.clear();
    if (k <= kHeapMax) {
        // The heap's front is the worst kept candidate. Indices rise, so a
        // later equal logit never ranks before a kept one: '>' suffices.
        for (std::size_t j = 0; j < v; ++j) {
            const float x = l[j];
            if (x == -kInf) continue;
            if (c.size() < k) {
                c.emplace_back(x, (std::uint32_t)j);
                std::push_heap(c.begin(), c.end(), before);
            } else if (x > c.front().first) {
                std::pop_heap(c.begin(), c.end(), before);
                c.back() = {x, (std::uint32_t)j};
                std::push_heap(c.begin(), c.end(), before);
            }
        }
    } else {
        for (std::size_t j = 0; j < v; ++j)
            if (l[j] != -kInf) c.emplace_back(l[j], (std::uint32_t)j);
        if (c.size() > k) {
            std::nth_element(c.begin(), c.begin() + k, c.end(), before);
            c.resize(k);
        }
    }
    std::sort(c.begin(), c.end(), before);
}

// Top-k on: the k survivors are few and ranked, so everything after is on
// them. Writes the warp into out; returns the number kept.
std::size_t warp_top_k(const Kernels& kern, const float* l, std::size_t v, std::size_t k, float top,
                       float inv_t, const WarpParams& wp, float* out, WarpScratch& s) {
    select_top_k(l, v, k, s.cand);
    const std::size_t n = s.cand.size();
    s.a.resize(n);
    s.b.resize(n);
    for (std::size_t i = 0; i < n; ++i) s.a[i] = s.cand[i].first;
    kern.exp_row(s.a.data(), n, top, 1.0f, s.b.data());  // masses at temperature 1
    double M = 0.0;
    for (float m : s.b) M += m;
    std::size_t keep = n;
    if (wp.top_p < 1.0) {  // the shortest prefix whose mass reaches top_p M
        const double target = wp.top_p * M;
        double cum = 0.0;
        keep = 0;
        while (keep < n) {
            cum += s.b[keep];
            ++keep;
            if (cum >= target) break;
        }
    }
    const float floor = float_at_least(wp.min_p);  // min-p: m_j >= min_p (the top's m is 1)
    std::size_t kept = 0;
    for (std::size_t i = 0; i < keep; ++i)
        if (s.b[i] >= floor) s.cand[kept++] = s.cand[i];
    for (std::size_t i = 0; i < kept; ++i) s.a[i] = s.cand[i].first;
    kern.exp_row(s.a.data(), kept, top, inv_t, s.b.data());  // the temperature on the kept ones
    double W = 0.0;
    for (std::size_t i = 0; i < kept; ++i) W += s.b[i];
    const float inv = (float)(1.0 / W);  // W >= 1: the top token's e is E(0) = 1
    std::memset(out, 0, v * sizeof(float));
    for (std::size_t i = 0; i < kept; ++i) out[s.cand[i].second] = s.b[i] * inv;
    return kept;
}

// Top-p over the whole row (no top-k), from the masses m (temperature 1)
// with total M. Returns the edge: tokens with d < edge are kept; of the bin
// at the edge, the first `n` of the ranked s.cand. Only that one bin is
// sorted; tokens too light to matter are not even binned.
float nucleus(const float* l, const float* m, std::size_t v, float top, double M, double top_p,
              WarpScratch& s, std::size_t& n) {
    const double target = top_p * M;
    // Tokens lighter than eps = (1 - top_p) M / v hold less than (1 - top_p) M
    // together, so the kept prefix ends before any of them: only distances up
    // to -ln(eps) (plus slack for E's rounding) are binned.
    const double eps = (1.0 - top_p) * M / (double)v;
    const float d_max = (float)std::min(64.0, -std::log(eps) + 1e-3);
    s.bins.assign(kBins, 0.0);
    for (std::size_t j = 0; j < v; ++j) {
        const float d = top - l[j];
        if (d <= d_max) s.bins[bin_of(d)] += m[j];
    }
    double acc = 0.0;
    std::uint32_t b = 0;
    for (; b < kBins && acc + s.bins[b] < target; ++b) acc += s.bins[b];
    n = 0;
    s.cand.clear();
    if (b == kBins) return kInf;  // rounding kept the sum below the target: keep everything
    const float lo = bin_floor(b), hi = bin_floor(b + 1);
    for (std::size_t j = 0; j < v; ++j) {
        const float d = top - l[j];
        if (d >= lo && d < hi) s.cand.emplace_back(l[j], (std::uint32_t)j);
    }
    std::sort(s.cand.begin(), s.cand.end(), before);
    while (n < s.cand.size()) {
        acc += m[s.cand[n].second];
        ++n;
        if (acc >= target) break;
    }
    return lo;
}

// The canonical double sum of x[0..v) (verify.h), the same on every path.
double row_sum(const Kernels& kern, const float* x, std::size_t v, WarpScratch& s) {
    s.chunks.resize(n_chunks(v));
    kern.chunk_sums(x, v, s.chunks.data());
    double total = 0.0;
    for (double c : s.chunks) total += c;
    return total;
}

// Writes out = e * (1 / W), W the canonical sum of e (out); returns how many are > 0.
std::size_t normalize(const Kernels& kern, float* out, std::size_t v, WarpScratch& s) {
    const float inv = (float)(1.0 / row_sum(kern, out, v, s));  // >= 1: the top token's e is E(0) = 1
    std::size_t kept = 0;
    for (std::size_t j = 0; j < v; ++j) {
        out[j] *= inv;
        kept += out[j] > 0.0f;
    }
    return kept;
}

}  // namespace

std::size_t warp_row(const Kernels& kern, const float* logits, std::size_t v, const WarpParams& wp,
                     float* out, WarpScratch& s) {
    bool bad = false;
    const float top = logits[kern.argmax(logits, v, &bad)];
    if (bad || top == -kInf) return 0;  // NaN or +inf; or no finite logit
    const float inv_t = (float)(1.0 / wp.temperature);
    if (wp.top_k > 0 && wp.top_k < v) return warp_top_k(kern, logits, v, wp.top_k, top, inv_t, wp, out, s);
    if (wp.top_p >= 1.0 && wp.min_p <= 0.0) {  // no truncation: the softmax at the temperature
        kern.exp_row(logits, v, top, inv_t, out);
        return normalize(kern, out, v, s);
    }
    // Top-p and/or min-p over the whole row: masses at temperature 1 first.
    s.m.resize(v);
    kern.exp_row(logits, v, top, 1.0f, s.m.data());
    float edge = kInf;
    std::size_t n = 0;
    if (wp.top_p < 1.0) edge = nucleus(logits, s.m.data(), v, top, row_sum(kern, s.m.data(), v, s), wp.top_p, s, n);
    kern.exp_row(logits, v, top, inv_t, out);  // the temperature, then the cut
    s.b.resize(n);
    for (std::size_t i = 0; i < n; ++i) s.b[i] = out[s.cand[i].second];
    const float floor = float_at_least(wp.min_p);
    const float* m = s.m.data();
    for (std::size_t j = 0; j < v; ++j) out[j] = (top - logits[j] < edge && m[j] >= floor) ? out[j] : 0.0f;
    for (std::size_t i = 0; i < n; ++i)
        if (m[s.cand[i].second] >= floor) out[s.cand[i].second] = s.b[i];
    return normalize(kern, out, v, s);
}

}  // namespace specgguf
