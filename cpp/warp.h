// Logit warping for sampling, plain C++ (no Python). The same function warps
// the draft's and the target's rows, which is what keeps p/q verification
// exact. Order as llama-cpp-python's default chain: top-k, then top-p and
// min-p on the softmax of the untempered survivors, then temperature.
//
// The definition, for one row l[0..v) (specgguf.ops.reference.warp is the same in
// numpy):
//   * top = the largest logit; ranking = by logit, ties to the lower index;
//     -inf logits are never kept.
//   * E(x) = the kernels' float32 exp (Kernels::exp_row): within a few ulp of
//     exp(x), and 0 for x < -64 (a ratio below 1.6e-28 to the top token).
//   * top-k keeps the k best ranked; m_j = E(f32(l_j - top)) are the masses
//     at temperature 1, and M their double sum over the top-k survivors.
//   * top-p keeps the shortest ranked prefix whose cumulative m reaches
//     top_p * M (sums of masses, not of m / M: exact where ties make the
//     masses small integers); min-p then keeps, of those, the tokens with
//     m_j >= min_p.
//   * p_j = e_j * f32(1 / W) on the kept tokens, with
//     e_j = E(f32(f32(l_j - top) * f32(1 / temperature))) and W their double
//     sum (in an order warp.cpp fixes, the same on every path); 0 elsewhere.
//
// Cost: O(v), and most of a row is only compared, never exped. With no
// truncation: vector passes for the max, the exps, their sum and the
// scaling. Min-p alone: one compare pass finds the tokens within -ln(min_p)
// of the top, and only those get exps. Top-p without top-k: the masses'
// exp pass and their total (the definition needs M), then only the tokens
// heavy enough to matter are binned by distance below the top (1/16 octave
// a bin), only the bin where the mass reaches top_p is sorted, and the
// temperature's exps are taken on the kept tokens alone. Top-k is a heap
// (k <= 64) whose full state skips every logit below its worst kept one a
// vector compare at a time; beyond, the logits above a threshold read off a
// strided sample are gathered and selected; then everything on the k
// survivors.
#pragma once
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "verify.h"

namespace specgguf {

struct WarpParams {
    double temperature;  // > 0
    std::size_t top_k;   // 0 or >= v: off
    double top_p;        // in [0, 1]; 1: off
    double min_p;        // in [0, 1]; 0: off
};

// Reusable buffers of warp_row, so a batch of rows allocates once.
struct WarpScratch {
    std::vector<std::pair<float, std::uint32_t>> cand;  // (logit, index), ranked
    std::vector<std::pair<float, std::uint32_t>> kept;  // the tokens a whole-row cut keeps
    std::vector<std::uint32_t> idx;                     // indices a compare pass found
    std::vector<float> a, b;                            // gathered logits, their exps
    std::vector<float> m;                               // a row's masses at temperature 1
    std::vector<double> bins;                           // mass per distance bin (top-p)
    std::vector<std::uint16_t> keys;                    // the bin of each token near the top (top-p)
    std::vector<double> chunks;                         // canonical chunk sums of a row
};

// Writes all v entries of out: the kept tokens' probabilities (summing to 1
// up to float rounding) and zeros elsewhere. Returns the number of tokens
// the truncation kept (E may still give some of them 0); 0 means the row has
// a NaN or +inf, or no finite logit (out is then unspecified). Same result
// with every Kernels table.
std::size_t warp_row(const Kernels& kern, const float* logits, std::size_t v, const WarpParams& wp,
                     float* out, WarpScratch& s);

}  // namespace specgguf
