#include "warp.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace specgguf {

namespace {
using Cand = std::pair<float, std::uint32_t>;
// "a ranks before b": higher logit, then lower index.
inline bool before(const Cand& a, const Cand& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
}
}  // namespace

std::size_t warp_row(const float* logits, std::size_t v, const WarpParams& wp, float* out,
                     std::vector<Cand>& c) {
    const float inf = std::numeric_limits<float>::infinity();
    const std::size_t k = (wp.top_k > 0 && wp.top_k < v) ? wp.top_k : v;
    c.clear();
    c.reserve(k);
    // Top-k by a heap whose front is the worst kept candidate. Indices rise,
    // so a later equal logit never ranks before a kept one: '>' suffices.
    for (std::size_t j = 0; j < v; ++j) {
        float x = logits[j];
        if (!(x < inf)) return 0;  // NaN or +inf
        if (x == -inf) continue;
        if (c.size() < k) {
            c.emplace_back(x, (std::uint32_t)j);
            std::push_heap(c.begin(), c.end(), before);
        } else if (x > c.front().first) {
            std::pop_heap(c.begin(), c.end(), before);
            c.back() = {x, (std::uint32_t)j};
            std::push_heap(c.begin(), c.end(), before);
        }
    }
    if (c.empty()) return 0;
    std::sort(c.begin(), c.end(), before);

    // Softmax at temperature 1 for top-p / min-p.
    const double top = c[0].first;
    double total = 0.0;
    for (const Cand& x : c) total += std::exp((double)x.first - top);
    std::size_t keep = c.size();
    if (wp.top_p < 1.0) {  // smallest prefix whose mass reaches top_p
        double cum = 0.0;
        std::size_t i = 0;
        while (i < c.size()) {
            cum += std::exp((double)c[i].first - top) / total;
            ++i;
            if (cum >= wp.top_p) break;
        }
        keep = std::min(keep, i);
    }
    if (wp.min_p > 0.0) {  // p_i >= min_p * p_0, i.e. exp(l_i - l_0) >= min_p
        std::size_t i = 1;
        while (i < c.size() && std::exp((double)c[i].first - top) >= wp.min_p) ++i;
        keep = std::min(keep, i);
    }
    // Temperature on the survivors.
    std::memset(out, 0, v * sizeof(float));
    double w = 0.0;
    for (std::size_t i = 0; i < keep; ++i) w += std::exp(((double)c[i].first - top) / wp.temperature);
    for (std::size_t i = 0; i < keep; ++i)
        out[c[i].second] = (float)(std::exp(((double)c[i].first - top) / wp.temperature) / w);
    return keep;
}

}  // namespace specgguf
