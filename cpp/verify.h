// specgguf verification core: plain C++ over pointers and sizes, no Python.
//
// Layout: every probability/logit matrix is row-major float32, rows of length
// V. Reductions are defined once, here, so that every SIMD path returns
// bit-identical results to the scalar one:
//
//   * A row is cut into chunks of kChunk elements (the last may be short).
//   * Inside a chunk, element j goes to double accumulator lane (j % 32); each
//     lane adds its elements in index order; the chunk sum folds the lanes in
//     halves: l[j] += l[j+16], then l[j] += l[j+8], +4, +2, +1. (32 lanes:
//     fewer would leave the adds latency-bound on a single row.)
//   * A row total is the sequential double sum of its chunk sums.
//
// Sampling from a mass row m with uniform u returns the smallest j whose
// cumulative mass exceeds u * total, where the cumulative mass is the
// sequential sum of the chunk sums before j's chunk plus the sequential
// double sum of m inside the chunk. Both are the same on every path. If no j
// does (u * total rounded up to the total), the last j with mass.
//
// The loop over chunks is written once (verify_simd.h) and instantiated per
// instruction set; each instruction-set file is compiled with its own flags
// (CMakeLists.txt), and the dispatch below checks the CPU before handing out
// a table.
#pragma once
#include <cstddef>
#include <cstdint>

namespace specgguf {

constexpr std::size_t kChunk = 256;
constexpr std::size_t kLanes = 32;

inline std::size_t n_chunks(std::size_t v) { return (v + kChunk - 1) / kChunk; }

// One implementation of the four O(V) kernels. Each instruction set fills one
// table (scalar, AVX2, AVX-512, NEON).
struct Kernels {
    const char* name;
    // Index of the first maximum of x[0..n). Sets *bad if x holds a NaN or
    // +inf (-inf is allowed: masked logits).
    std::size_t (*argmax)(const float* x, std::size_t n, bool* bad);
    // out[c] = sum of chunk c of x (canonical order); returns min(x).
    float (*chunk_sums)(const float* x, std::size_t n, double* out);
    // out[c] = sum over chunk c of max(0, p*Q - q*P) in double (the residual
    // norm(max(0, p/P - q/Q)) scaled by P*Q, so no division is needed).
    void (*residual_chunk_sums)(const float* p, const float* q, std::size_t n,
                                double P, double Q, double* out);
    // A quick float32 sum of x[0..n) in any order (see quick_test_factor);
    // *mn = min(x). Lets accept() decide most positions without the double
    // sums (see verify.cpp); never returned.
    float (*quick_sum)(const float* x, std::size_t n, float* mn);
    // out[j] = E((x[j] - top) * scale), E the warp's float32 exp (warp.h):
    // 0 where the argument is below -64 or -inf. Same bits on every path.
    void (*exp_row)(const float* x, std::size_t n, float top, float scale, float* out);
    // Index of the first j < n with x[j] > t, or n (NaN is never > t). A
    // vector compare per register until a lane passes: what lets top-k and
    // the warp's cuts skip the bulk of a row, which lies far below its top.
    std::size_t (*first_above)(const float* x, std::size_t n, float t);
    // Writes the indices j < n with x[j] > t to idx, in order; returns how
    // many (a bit mask per vector: as cheap for many hits as for few).
    std::size_t (*indices_above)(const float* x, std::size_t n, float t, std::uint32_t* idx);
};

// Folds kLanes accumulators in the canonical order (SIMD paths use it for a
// short last chunk; full chunks fold in registers, in the same order).
double fold_lanes(double* lanes);

const Kernels& scalar_kernels();
// nullptr where this build or this CPU cannot run the path.
const Kernels* avx2_kernels();
const Kernels* avx512_kernels();  // row sums in AVX-512; argmax from AVX2
const Kernels* neon_kernels();

// All paths this process can run, scalar first; best is last.
std::size_t available_kernels(const Kernels** out, std::size_t cap);

// Status codes of the ops. The binding layer turns them into exceptions.
enum Status : int {
    kOk = 0,
    kBadTarget = 1,   // NaN/Inf/negative in a target row that was read
    kBadDraft = 2,    // NaN/Inf/negative in a draft row that was read
    kZeroTarget = 3,  // a target row that was read has zero total mass
    kZeroDraft = 4,   // a draft row that was read has zero total mass
};

struct Result {
    int status;
    std::int64_t n_accepted;
    std::int64_t token;
    std::int64_t bad_row;  // row index that caused a non-OK status
};

// Greedy verification. target: [k+1, v]; draft: [k] (already range-checked).
Result verify_greedy(const Kernels& kern, const float* target, std::size_t k,
                     std::size_t v, const std::int64_t* draft);

// The factor F >= 1 that makes accept()'s quick test rigorous for rows of v
// non-negative floats: if fl(u * q_t * Pq) * F < fl(p_t * Qq), with Pq, Qq
// float32 sums in any order, then the double totals' test accepts too
// (verify.cpp derives it). +inf where v is too large for a useful bound.
double quick_test_factor(std::size_t v);

// Speculative sampling with explicit uniforms u[0..k], each in [0, 1).
// Positions where u is far from the threshold are decided from quick_sum's
// float32 totals under quick_test_factor; the rest from the double totals. The
// result is always the one the double totals give.
// target: [k+1, v]; draft_probs: [k, v]; draft: [k]. scratch holds at least
// n_chunks(v) doubles.
Result accept(const Kernels& kern, const float* target, const float* draft_probs,
              std::size_t k, std::size_t v, const std::int64_t* draft,
              const double* u, double* scratch);

// Speculative sampling against a point-mass draft (n-gram / prompt-lookup
// proposals): q_i = one-hot(draft[i]), so no draft rows exist. Accept t_i
// iff u[i] * P_i < p_i(t_i); on rejection sample from p_i without t_i.
// Returns exactly what accept() returns with explicit one-hot draft rows.
Result accept_onehot(const Kernels& kern, const float* target, std::size_t k, std::size_t v,
                     const std::int64_t* draft, const double* u, double* scratch);

// ---- Drafter-invariant sampling (an exponential race on shared noise) ----
//
// Output position `pos` of a seeded generation owns one exponential variate
// per token, E(seed, pos, t) = -log U(seed, pos, t), where U is a
// counter-based uniform in (0, 1): a hash of (seed, pos, t), nothing else.
// The token picked from masses w at that position is
//     argmin over {t : w_t > 0} of E(seed, pos, t) / w_t   (ties: lower t).
// Because E/w_t is exponential with rate w_t, the minimum falls on t with
// probability w_t / sum(w) (the exponential race): an exact sample of w.

// The uniform U(seed, pos, t) in (0, 1), 53 random bits.
double race_uniform(std::uint64_t seed, std::uint64_t pos, std::uint64_t token);

// The token the race picks from w[0..v) at `pos`; kBadTarget status for NaN,
// Inf or negative masses, kZeroTarget for an all-zero row (token is then -1).
std::int64_t race_pick(const float* w, std::size_t v, std::uint64_t seed, std::uint64_t pos,
                       int* status);

// Drafter-invariant verification. target: [k+1, v] masses; draft: [k] ids.
// Position i's target token is race_pick(target row i, pos + i); draft token
// i is accepted iff it equals that token; at the first mismatch the target's
// token is emitted; after k matches, the target's token at row k. The emitted
// tokens are therefore the race picks of the target rows, whatever the draft:
// exactly what plain (non-speculative) race sampling with the same seed emits.
Result accept_invariant(const float* target, std::size_t k, std::size_t v,
                        const std::int64_t* draft, std::uint64_t seed, std::uint64_t pos);

}  // namespace specgguf
