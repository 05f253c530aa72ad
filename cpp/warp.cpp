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
// compare per logit). Beyond it, the heap's floor rose too slowly (top-k
// 1000: thousands of insertions, 500 us a row at V = 49152), so the row's
// logits above a threshold taken from a sample are gathered and selected.
constexpr std::size_t kHeapMax = 64;
constexpr std::size_t kSampleStride = 16;

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

// c = every (logit, index) with logit > t, by index.
void gather_above(const Kernels& kern, const float* l, std::size_t v, float t, std::vector<Cand>& c,
                  WarpScratch& s) {
    s.idx.resize(v);
    const std::size_t n = kern.indices_above(l, v, t, s.idx.data());
    c.resize(n);
    for (std::size_t i = 0; i < n; ++i) c[i] = {l[s.idx[i]], s.idx[i]};
}

// A logit with, most likely, about 2k + 8 kSampleStride logits of the row
// above it: the one ranked 2k / kSampleStride + 8 in a strided sample of the
// finite logits; -inf when the sample is too short to tell.
float sample_threshold(const float* l, std::size_t v, std::size_t k, WarpScratch& s) {
    s.a.clear();
    for (std::size_t j = 0; j < v; j += kSampleStride)
        if (l[j] != -kInf) s.a.push_back(l[j]);
    const std::size_t r = 2 * k / kSampleStride + 8;
    if (r >= s.a.size()) return -kInf;
    std::nth_element(s.a.begin(), s.a.begin() + r, s.a.end(), [](float a, float b) { return a > b; });
    return s.a[r];
}

// c = the k best ranked finite logits, ranked.
void select_top_k(const Kernels& kern, const float* l, std::size_t v, std::size_t k, std::vector<Cand>& c,
                  WarpScratch& s) {
    c.clear();
    if (k <= kHeapMax) {
        // The heap's front is the worst kept candidate. Indices rise, so a
        // later equal logit never ranks before a kept one: '>' suffices. Once
        // the heap is full, first_above skips the logits that lose (most of
        // a row: a vector compare each).
        std::size_t j = 0;
        for (; j < v && c.size() < k; ++j) {
            if (l[j] == -kInf) continue;
            c.emplace_back(l[j], (std::uint32_t)j);
            std::push_heap(c.begin(), c.end(), before);
        }
        while (c.size() == k && (j += kern.first_above(l + j, v - j, c.front().first)) < v) {
            std::pop_heap(c.begin(), c.end(), before);
            c.back() = {l[j], (std::uint32_t)j};
            std::push_heap(c.begin(), c.end(), before);
            ++j;
        }
    } else {
        // Every logit above t ranks before every logit at or below it, so when
        // at least k lie above t the k best are among them. Ties at t or an
        // unlucky sample leave fewer: then every finite logit.
        const float t = sample_threshold(l, v, k, s);
        gather_above(kern, l, v, t, c, s);
        if (c.size() < k && t != -kInf) gather_above(kern, l, v, -kInf, c, s);
        if (c.size() > k) {
            std::nth_element(c.begin(), c.begin() + k, c.end(), before);
            c.resize(k);
        }
    }
    std::sort(c.begin(), c.end(), before);
}

// The kept tokens c[0..n) (their logits and indices) into out: e_j at the
// temperature, times f32(1 / W), W their double sum in c's order; zeros
// elsewhere. Returns n.
std::size_t write_kept(const Kernels& kern, const std::vector<Cand>& c, std::size_t n, std::size_t v, float top,
                       float inv_t, float* out, WarpScratch& s) {
    s.a.resize(n);
    s.b.resize(n);
    for (std::size_t i = 0; i < n; ++i) s.a[i] = c[i].first;
    kern.exp_row(s.a.data(), n, top, inv_t, s.b.data());
    double W = 0.0;
    for (std::size_t i = 0; i < n; ++i) W += s.b[i];
    const float inv = (float)(1.0 / W);  // W >= 1: the top token's e is E(0) = 1
    std::memset(out, 0, v * sizeof(float));
    for (std::size_t i = 0; i < n; ++i) out[c[i].second] = s.b[i] * inv;
    return n;
}

// Top-k on: the k survivors are few and ranked, so everything after is on
// them. Writes the warp into out; returns the number kept.
std::size_t warp_top_k(const Kernels& kern, const float* l, std::size_t v, std::size_t k, float top,
                       float inv_t, const WarpParams& wp, float* out, WarpScratch& s) {
    select_top_k(kern, l, v, k, s.cand, s);
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
    return write_kept(kern, s.cand, kept, v, top, inv_t, out, s);  // the temperature on the kept ones
}

// Into s.idx, by index: every j with l[j] above top - d less a margin (a
// vector compare pass), a superset of the j with f32(top - l[j]) <= d, the
// distance as the definition computes it. Returns how many.
std::size_t near_top(const Kernels& kern, const float* l, std::size_t v, float top, float d, WarpScratch& s) {
    const double t = (double)top - (double)d;
    s.idx.resize(v);
    return kern.indices_above(l, v, (float)(t - 1e-2 - 1e-6 * std::fabs(t)), s.idx.data());
}

// Every (logit, index) with f32(top - logit) <= d, by index, into c: the
// row's tokens within d of its top.
void gather_within(const Kernels& kern, const float* l, std::size_t v, float top, float d, std::vector<Cand>& c,
                   WarpScratch& s) {
    const std::size_t n = near_top(kern, l, v, top, d, s);
    c.clear();
    for (std::size_t i = 0; i < n; ++i)
        if (top - l[s.idx[i]] <= d) c.emplace_back(l[s.idx[i]], s.idx[i]);
}

// Top-p over the whole row (no top-k), from the masses m (temperature 1)
// with total M: appends the kept tokens to `kept`. Tokens lighter than
// eps = (1 - top_p) M / v hold less than (1 - top_p) M together, so the kept
// prefix ends before any of them: only tokens within -ln(eps) of the top
// (plus slack for E's rounding) are looked at, binned by distance, and only
// the bin where the mass reaches top_p M is sorted. Two scalar loops over
// those tokens (bin; keep), each reading a token's distance once: the
// window holds a quarter of an LM row and more, so these loops are the cost.
void nucleus(const Kernels& kern, const float* l, const float* m, std::size_t v, float top, double M,
             double top_p, WarpScratch& s, std::vector<Cand>& kept) {
    const double target = top_p * M;
    const double eps = (1.0 - top_p) * M / (double)v;
    const float window = (float)std::min(64.0, -std::log(eps) + 1e-3);
    const std::size_t near = near_top(kern, l, v, top, window, s);
    s.bins.assign(kBins, 0.0);
    s.keys.resize(near);
    std::size_t n = 0;  // s.idx[0..n): the tokens within the window; s.keys: their bins
    for (std::size_t i = 0; i < near; ++i) {
        const std::uint32_t j = s.idx[i];
        const float d = top - l[j];
        if (d > window) continue;
        const std::uint32_t key = bin_of(d);
        s.bins[key] += m[j];
        s.idx[n] = j;
        s.keys[n++] = (std::uint16_t)key;
    }
    double acc = 0.0;
    std::uint32_t b = 0;
    for (; b < kBins && acc + s.bins[b] < target; ++b) acc += s.bins[b];
    if (b == kBins) {  // rounding kept the sum below the target: keep everything
        gather_above(kern, l, v, -kInf, kept, s);
        return;
    }
    s.cand.clear();  // the edge bin's tokens; those of earlier bins go straight to `kept`
    for (std::size_t i = 0; i < n; ++i) {
        const std::uint32_t j = s.idx[i];
        if (s.keys[i] < b) kept.emplace_back(l[j], j);
        else if (s.keys[i] == b) s.cand.emplace_back(l[j], j);
    }
    std::sort(s.cand.begin(), s.cand.end(), before);
    for (const Cand& c : s.cand) {
        kept.push_back(c);
        acc += m[c.second];
        if (acc >= target) break;
    }
}

// The canonical double sum of x[0..v) (verify.h), the same on every path.
double row_sum(const Kernels& kern, const float* x, std::size_t v, WarpScratch& s) {
    s.chunks.resize(n_chunks(v));
    kern.chunk_sums(x, v, s.chunks.data());
    double total = 0.0;
    for (double c : s.chunks) total += c;
    return total;
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
        const float inv = (float)(1.0 / row_sum(kern, out, v, s));  // >= 1: the top token's e is E(0) = 1
        for (std::size_t j = 0; j < v; ++j) out[j] *= inv;
        return v;
    }
    // Top-p and/or min-p over the whole row: the kept tokens found first, the
    // temperature's exps taken on them alone.
    const float floor = float_at_least(wp.min_p);
    std::vector<Cand>& kept = s.kept;
    kept.clear();
    if (wp.top_p >= 1.0) {
        // Min-p alone keeps E(l - top) >= min_p: tokens within -ln(min_p) of the
        // top (E is 0 below -64; within a few ulp of exp above, which the
        // margin of gather_within covers); their masses decide.
        gather_within(kern, logits, v, top, (float)(-std::max(std::log(wp.min_p), -64.0) + 1e-2), kept, s);
        s.a.resize(kept.size());
        s.b.resize(kept.size());
        for (std::size_t i = 0; i < kept.size(); ++i) s.a[i] = kept[i].first;
        kern.exp_row(s.a.data(), kept.size(), top, 1.0f, s.b.data());
        std::size_t n = 0;
        for (std::size_t i = 0; i < kept.size(); ++i)
            if (s.b[i] >= floor) kept[n++] = kept[i];
        return write_kept(kern, kept, n, v, top, inv_t, out, s);
    }
    s.m.resize(v);  // top-p: the masses at temperature 1, and their canonical total
    kern.exp_row(logits, v, top, 1.0f, s.m.data());
    nucleus(kern, logits, s.m.data(), v, top, row_sum(kern, s.m.data(), v, s), wp.top_p, s, kept);
    std::size_t n = 0;
    for (const Cand& c : kept)  // min-p, of those
        if (s.m[c.second] >= floor) kept[n++] = c;
    return write_kept(kern, kept, n, v, top, inv_t, out, s);
}

}  // namespace specgguf
