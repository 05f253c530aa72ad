// Logit warping for sampling, plain C++ (no Python). The same function warps
// the draft's and the target's rows, which is what keeps p/q verification
// exact. Order as llama-cpp-python's default chain: top-k, then top-p and
// min-p on the softmax of the untempered survivors, then temperature.
#pragma once
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace specgguf {

struct WarpParams {
    double temperature;  // > 0
    std::size_t top_k;   // 0 or >= v: off
    double top_p;        // in [0, 1]; 1: off
    double min_p;        // in [0, 1]; 0: off
};

// Writes all v entries of out: the kept tokens' probabilities (summing to 1
// up to float rounding) and zeros elsewhere. Candidates are ordered by logit,
// ties to the lower index. Returns the number of kept tokens; 0 means the row
// has a NaN or +inf, or no finite logit (out is then unspecified).
std::size_t warp_row(const float* logits, std::size_t v, const WarpParams& wp, float* out,
                     std::vector<std::pair<float, std::uint32_t>>& scratch);

}  // namespace specgguf
