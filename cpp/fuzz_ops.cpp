// Coverage-guided fuzzing of the ops (libFuzzer; built and run by
// scripts/test_sanitizers.sh with clang, -fsanitize=fuzzer,address,undefined).
// The input bytes choose K, V, the rows (raw float bit patterns: NaN, Inf,
// denormals and negatives included), the draft tokens and the uniforms. Every
// path this CPU runs must return the scalar path's result, and every result
// must be in range. Any crash, sanitizer report or mismatch is a finding.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "verify.h"
#include "warp.h"

using namespace specgguf;

namespace {

struct Reader {
    const std::uint8_t* p;
    std::size_t n;
    template <class T> T take() {
        T x{};
        std::size_t m = n < sizeof(T) ? n : sizeof(T);
        std::memcpy(&x, p, m);
        p += m;
        n -= m;
        return x;
    }
};

void check(bool ok, const char* what) {
    if (!ok) {
        std::fprintf(stderr, "fuzz_ops: %s\n", what);
        std::abort();
    }
}

bool same(const Result& a, const Result& b) {
    return a.status == b.status && (a.status != kOk || (a.n_accepted == b.n_accepted && a.token == b.token));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    Reader r{data, size};
    const std::size_t k = r.take<std::uint8_t>() % 9, v = 1 + r.take<std::uint16_t>() % 700;
    std::vector<float> target((k + 1) * v), draft(k * v);
    for (float& x : target) x = r.take<float>();
    for (float& x : draft) x = r.take<float>();
    std::vector<std::int64_t> tok(k);
    for (auto& t : tok) t = (std::int64_t)(r.take<std::uint32_t>() % v);  // the bindings check the range
    std::vector<double> u(k + 1);
    for (double& x : u) {
        x = (double)(r.take<std::uint32_t>() >> 1) / 2147483648.0;  // [0, 1), as the bindings require
    }
    const std::uint64_t seed = r.take<std::uint64_t>();
    std::vector<double> s0(n_chunks(v)), s1(n_chunks(v));
    const Kernels* ks[8];
    const std::size_t nk = available_kernels(ks, 8);
    const Kernels& ref = scalar_kernels();
    const Result g = verify_greedy(ref, target.data(), k, v, tok.data());
    const Result a = accept(ref, target.data(), draft.data(), k, v, tok.data(), u.data(), s0.data());
    const Result o = accept_onehot(ref, target.data(), k, v, tok.data(), u.data(), s0.data());
    const Result inv = accept_invariant(target.data(), k, v, tok.data(), seed, 7);
    for (const Result* x : {&g, &a, &o, &inv}) {
        if (x->status == kOk) {
            check(x->n_accepted >= 0 && (std::size_t)x->n_accepted <= k, "n_accepted out of range");
            check(x->token >= 0 && (std::size_t)x->token < v, "token out of range");
        }
    }
    for (std::size_t i = 0; i < nk; ++i) {
        check(same(verify_greedy(*ks[i], target.data(), k, v, tok.data()), g), "verify_greedy differs by path");
        check(same(accept(*ks[i], target.data(), draft.data(), k, v, tok.data(), u.data(), s1.data()), a),
              "accept differs by path");
        check(same(accept_onehot(*ks[i], target.data(), k, v, tok.data(), u.data(), s1.data()), o),
              "accept_onehot differs by path");
    }
    std::vector<float> out(v), other(v);
    WarpScratch scratch;
    const WarpParams wp{0.5 + (seed % 7) * 0.3, (std::size_t)(seed % 50), (seed % 11) / 10.0, (seed % 5) / 10.0};
    const std::size_t kept = warp_row(ref, target.data(), v, wp, out.data(), scratch);
    if (kept) {
        double sum = 0;
        for (float x : out) {
            check(x >= 0.0f && x <= 1.0f, "warp produced a value outside [0, 1]");
            sum += x;
        }
        check(sum > 0.99 && sum < 1.01, "warp's probabilities do not sum to 1");
    }
    for (std::size_t i = 0; i < nk; ++i) {
        const std::size_t kept_i = warp_row(*ks[i], target.data(), v, wp, other.data(), scratch);
        check(kept_i == kept && (!kept || std::memcmp(out.data(), other.data(), v * sizeof(float)) == 0),
              "warp differs by path");
    }
    return 0;
}
