// pybind11 layer: checks and converts arguments, then calls the plain C++
// ops in verify.cpp. No arithmetic on probabilities happens here.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "verify.h"
#include "warp.h"

namespace py = pybind11;
using namespace specgguf;

namespace {

std::atomic<const Kernels*> g_kernel{nullptr};  // process-wide; set_kernel may race a running op

std::vector<const Kernels*> all_kernels() {
    const Kernels* ks[8];
    std::size_t n = available_kernels(ks, 8);
    return {ks, ks + n};
}

const Kernels* find_kernel(const std::string& name) {
    for (const Kernels* k : all_kernels())
        if (name == k->name) return k;
    return nullptr;
}

std::string kernel_names() {
    std::string s;
    for (const Kernels* k : all_kernels()) s += (s.empty() ? "" : ", ") + std::string(k->name);
    return s;
}

std::string shape_str(const py::array& a) {
    std::string s = "(";
    for (py::ssize_t i = 0; i < a.ndim(); ++i)
        s += (i ? ", " : "") + std::to_string(a.shape(i));
    return s + (a.ndim() == 1 ? ",)" : ")");
}

py::array as_array(py::handle obj, const char* name) {
    py::array a = py::array::ensure(obj);
    if (!a) throw py::type_error(std::string(name) + " must be an array of numbers, got " +
                                 std::string(py::str(py::type::of(obj).attr("__name__"))));
    return a;
}

// A [rows, V] float32 C-contiguous view (no copy when it already is one).
// rows is K+1 (target) or K (draft) for K draft tokens.
py::array_t<float> as_matrix(py::handle obj, const char* name, std::size_t rows, std::size_t k) {
    const std::string want = std::string(rows == k ? "(K, V)" : "(K+1, V)") + " = (" +
                             std::to_string(rows) + ", V) for K = " + std::to_string(k) +
                             " draft tokens";
    py::array a = as_array(obj, name);
    char kind = a.dtype().kind();
    if (kind != 'f' && kind != 'i' && kind != 'u')
        throw py::type_error(std::string(name) + " must hold real numbers (float32 preferred), got dtype " +
                             std::string(py::str(a.dtype())));
    if (a.ndim() != 2 || (std::size_t)a.shape(0) != rows)
        throw py::value_error(std::string(name) + " has shape " + shape_str(a) + "; expected " + want);
    if (a.shape(1) == 0) throw py::value_error(std::string(name) + " has V = 0 columns");
    return py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(a);
}

py::array_t<std::int64_t> as_tokens(py::handle obj, const std::string& name = "draft_tokens") {
    py::array a = as_array(obj, name.c_str());
    if (a.ndim() != 1)
        throw py::value_error(name + " must be 1-D [K], got shape " + shape_str(a));
    char kind = a.dtype().kind();
    if (a.size() > 0 && kind != 'i' && kind != 'u')
        throw py::type_error(name + " must be integer token ids, got dtype " +
                             std::string(py::str(a.dtype())));
    return py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>::ensure(a);
}

void check_token_range(const std::int64_t* t, std::size_t k, std::size_t v) {
    for (std::size_t i = 0; i < k; ++i)
        if (t[i] < 0 || (std::size_t)t[i] >= v)
            throw py::value_error("draft_tokens[" + std::to_string(i) + "] = " + std::to_string(t[i]) +
                                  " is out of range for V = " + std::to_string(v));
}

py::tuple result_or_raise(const Result& r) {
    std::string row = std::to_string(r.bad_row);
    switch (r.status) {
        case kOk: return py::make_tuple(r.n_accepted, r.token);
        case kBadTarget:
            throw py::value_error("target_probs row " + row + " contains NaN, Inf or a negative value");
        case kBadDraft:
            throw py::value_error("draft_probs row " + row + " contains NaN, Inf or a negative value");
        case kZeroTarget: throw py::value_error("target_probs row " + row + " has zero total mass");
        case kZeroDraft: throw py::value_error("draft_probs row " + row + " has zero total mass");
    }
    throw py::value_error("internal error: unknown status");
}

// Big inputs release the GIL; small ones keep it (the release costs more).
constexpr std::size_t kReleaseGil = 1 << 16;

py::tuple py_verify_greedy(py::handle target_probs, py::handle draft_tokens) {
    auto tok = as_tokens(draft_tokens);
    const std::size_t k = (std::size_t)tok.size();
    auto tp = as_matrix(target_probs, "target_probs", k + 1, k);
    const std::size_t v = (std::size_t)tp.shape(1);
    check_token_range(tok.data(), k, v);
    Result r;
    if ((k + 1) * v >= kReleaseGil) {
        py::gil_scoped_release nogil;
        r = verify_greedy(*g_kernel.load(), tp.data(), k, v, tok.data());
    } else {
        r = verify_greedy(*g_kernel.load(), tp.data(), k, v, tok.data());
    }
    if (r.status == kBadTarget)
        throw py::value_error("target_probs row " + std::to_string(r.bad_row) + " contains NaN or +Inf");
    return result_or_raise(r);
}

py::array_t<double> as_uniforms(py::handle obj, std::size_t k) {
    py::array a = as_array(obj, "uniforms");
    if (a.dtype().kind() != 'f') throw py::type_error("uniforms must be floats in [0, 1)");
    auto u = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(a);
    if (u.ndim() != 1 || (std::size_t)u.size() != k + 1)
        throw py::value_error("uniforms must have shape (K+1,) = (" + std::to_string(k + 1) +
                              ",), got " + shape_str(u));
    for (std::size_t i = 0; i <= k; ++i)
        if (!(u.data()[i] >= 0.0 && u.data()[i] < 1.0))
            throw py::value_error("uniforms[" + std::to_string(i) + "] = " +
                                  std::to_string(u.data()[i]) + " is not in [0, 1)");
    return u;
}

// Shared by accept and accept_uniforms: uniforms come from `draw` only after
// every argument has been checked, so a bad call consumes no random draws.
template <class Draw>
py::tuple accept_impl(py::handle target_probs, py::handle draft_probs, py::handle draft_tokens,
                      Draw draw) {
    auto tok = as_tokens(draft_tokens);
    const std::size_t k = (std::size_t)tok.size();
    auto tp = as_matrix(target_probs, "target_probs", k + 1, k);
    const std::size_t v = (std::size_t)tp.shape(1);
    auto dp = as_matrix(draft_probs, "draft_probs", k, k);
    if ((std::size_t)dp.shape(1) != v)
        throw py::value_error("draft_probs has shape " + shape_str(dp) + " but target_probs has " +
                              shape_str(tp) + ": V must match");
    check_token_range(tok.data(), k, v);
    auto u = as_uniforms(draw(k), k);
    static thread_local std::vector<double> scratch;
    scratch.resize(n_chunks(v));
    Result r;
    if ((2 * k + 1) * v >= kReleaseGil) {
        py::gil_scoped_release nogil;
        r = accept(*g_kernel.load(), tp.data(), dp.data(), k, v, tok.data(), u.data(), scratch.data());
    } else {
        r = accept(*g_kernel.load(), tp.data(), dp.data(), k, v, tok.data(), u.data(), scratch.data());
    }
    return result_or_raise(r);
}

// accept_onehot: uniforms come from `draw` only after every check, as in accept_impl.
template <class Draw>
py::tuple accept_onehot_impl(py::handle target_probs, py::handle draft_tokens, Draw draw) {
    auto tok = as_tokens(draft_tokens);
    const std::size_t k = (std::size_t)tok.size();
    auto tp = as_matrix(target_probs, "target_probs", k + 1, k);
    const std::size_t v = (std::size_t)tp.shape(1);
    check_token_range(tok.data(), k, v);
    auto u = as_uniforms(draw(k), k);
    static thread_local std::vector<double> scratch;
    scratch.resize(n_chunks(v));
    Result r;
    {
        py::gil_scoped_release nogil;
        r = accept_onehot(*g_kernel.load(), tp.data(), k, v, tok.data(), u.data(), scratch.data());
    }
    return result_or_raise(r);
}

// A seed or position: a Python int in [0, 2^64).
std::uint64_t as_u64(py::handle obj, const char* name) {
    if (!py::isinstance<py::int_>(obj) || py::isinstance<py::bool_>(obj)) {
        // numpy integer scalars are accepted through __index__.
        if (!py::hasattr(obj, "__index__") || py::isinstance<py::bool_>(obj))
            throw py::type_error(std::string(name) + " must be an int, got " +
                                 std::string(py::str(py::type::of(obj).attr("__name__"))));
    }
    py::int_ v = py::reinterpret_steal<py::int_>(PyNumber_Index(obj.ptr()));
    if (!v) throw py::error_already_set();
    if (v < py::int_(0) || v >= py::int_(py::module_::import("builtins").attr("pow")(2, 64)))
        throw py::value_error(std::string(name) + " must be in [0, 2**64), got " + std::string(py::str(v)));
    return v.cast<std::uint64_t>();
}

py::tuple py_accept_invariant(py::handle target_probs, py::handle draft_tokens, py::handle seed,
                              py::handle position) {
    auto tok = as_tokens(draft_tokens);
    const std::size_t k = (std::size_t)tok.size();
    auto tp = as_matrix(target_probs, "target_probs", k + 1, k);
    const std::size_t v = (std::size_t)tp.shape(1);
    check_token_range(tok.data(), k, v);
    const std::uint64_t s = as_u64(seed, "seed"), pos = as_u64(position, "position");
    Result r;
    {
        py::gil_scoped_release nogil;
        r = accept_invariant(tp.data(), k, v, tok.data(), s, pos);
    }
    return result_or_raise(r);
}

py::array_t<std::int64_t> py_race_pick(py::handle probs, py::handle seed, py::handle position) {
    py::array a = as_array(probs, "probs");
    if (a.ndim() != 2) throw py::value_error("probs must be 2-D [n, V], got shape " + shape_str(a));
    const std::size_t n = (std::size_t)a.shape(0);
    auto w = as_matrix(probs, "probs", n, n);
    const std::size_t v = (std::size_t)w.shape(1);
    const std::uint64_t s = as_u64(seed, "seed"), pos = as_u64(position, "position");
    py::array_t<std::int64_t> out((py::ssize_t)n);
    int status = kOk;
    std::size_t row = 0;
    {
        py::gil_scoped_release nogil;
        for (; row < n && status == kOk; ++row)
            out.mutable_data()[row] = race_pick(w.data() + row * v, v, s, pos + row, &status);
    }
    if (status == kBadTarget)
        throw py::value_error("probs row " + std::to_string(row - 1) + " contains NaN, Inf or a negative value");
    if (status == kZeroTarget) throw py::value_error("probs row " + std::to_string(row - 1) + " has zero total mass");
    return out;
}

py::array_t<double> py_race_uniforms(py::handle seed, py::handle position, py::handle tokens) {
    const std::uint64_t s = as_u64(seed, "seed"), pos = as_u64(position, "position");
    auto t = as_tokens(tokens, "tokens");
    py::array_t<double> out(t.size());
    for (py::ssize_t i = 0; i < t.size(); ++i) {
        if (t.data()[i] < 0) throw py::value_error("tokens must be >= 0");
        out.mutable_data()[i] = race_uniform(s, pos, (std::uint64_t)t.data()[i]);
    }
    return out;
}

py::array_t<float> py_warp(py::handle logits, double temperature, long long top_k, double top_p,
                          double min_p) {
    if (!(temperature > 0.0) || !std::isfinite(temperature))
        throw py::value_error("temperature must be a finite number > 0 (0 means greedy: no warping), got " +
                              std::to_string(temperature));
    if (top_k < 0) throw py::value_error("top_k must be >= 0 (0 = off), got " + std::to_string(top_k));
    if (!(top_p >= 0.0 && top_p <= 1.0)) throw py::value_error("top_p must be in [0, 1], got " + std::to_string(top_p));
    if (!(min_p >= 0.0 && min_p <= 1.0)) throw py::value_error("min_p must be in [0, 1], got " + std::to_string(min_p));
    py::array a = as_array(logits, "logits");
    const char kind = a.dtype().kind();
    if (kind != 'f' && kind != 'i' && kind != 'u')
        throw py::type_error("logits must hold real numbers (float32 preferred), got dtype " +
                             std::string(py::str(a.dtype())));
    if (a.ndim() != 2) throw py::value_error("logits must be 2-D [n, V], got shape " + shape_str(a));
    const std::size_t n = (std::size_t)a.shape(0);
    auto lg = as_matrix(logits, "logits", n, n);
    const std::size_t v = (std::size_t)lg.shape(1);
    py::array_t<float> out({(py::ssize_t)n, (py::ssize_t)v});
    const WarpParams wp{temperature, (std::size_t)top_k, top_p, min_p};
    std::size_t bad_row = n;
    {
        py::gil_scoped_release nogil;
        const Kernels& kern = *g_kernel.load();
        thread_local WarpScratch scratch;  // kept per thread: a row's buffers are not allocated per call
        for (std::size_t r = 0; r < n && bad_row == n; ++r)
            if (!warp_row(kern, lg.data() + r * v, v, wp, out.mutable_data() + r * v, scratch)) bad_row = r;
    }
    if (bad_row != n)
        throw py::value_error("logits row " + std::to_string(bad_row) +
                              " contains NaN or +inf, or has no finite value");
    return out;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
    m.doc() = "specgguf compiled verification ops (see specgguf.ops.verify for the documented API)";
    g_kernel = all_kernels().back();
    if (const char* env = std::getenv("SPECGGUF_KERNEL"); env && *env && std::string(env) != "auto") {
        const Kernels* k = find_kernel(env);
        if (!k)
            throw py::value_error("SPECGGUF_KERNEL=" + std::string(env) +
                                  " is not available on this CPU/build; available: " + kernel_names());
        g_kernel = k;
    }

    m.def("verify_greedy", &py_verify_greedy, py::arg("target_probs"), py::arg("draft_tokens"));
    m.def(
        "accept",
        [](py::handle t, py::handle d, py::handle tok, py::handle generator) {
            return accept_impl(t, d, tok, [&](std::size_t k) { return generator.attr("random")(k + 1); });
        },
        py::arg("target_probs"), py::arg("draft_probs"), py::arg("draft_tokens"), py::arg("generator"));
    m.def(
        "accept_uniforms",
        [](py::handle t, py::handle d, py::handle tok, py::handle uniforms) {
            return accept_impl(t, d, tok, [&](std::size_t) { return uniforms; });
        },
        py::arg("target_probs"), py::arg("draft_probs"), py::arg("draft_tokens"), py::arg("uniforms"));
    m.def(
        "accept_onehot",
        [](py::handle t, py::handle tok, py::handle generator) {
            return accept_onehot_impl(t, tok, [&](std::size_t k) { return generator.attr("random")(k + 1); });
        },
        py::arg("target_probs"), py::arg("draft_tokens"), py::arg("generator"));
    m.def(
        "accept_onehot_uniforms",
        [](py::handle t, py::handle tok, py::handle uniforms) {
            return accept_onehot_impl(t, tok, [&](std::size_t) { return uniforms; });
        },
        py::arg("target_probs"), py::arg("draft_tokens"), py::arg("uniforms"));
    m.def("accept_invariant", &py_accept_invariant, py::arg("target_probs"), py::arg("draft_tokens"),
          py::arg("seed"), py::arg("position"));
    m.def("race_pick", &py_race_pick, py::arg("probs"), py::arg("seed"), py::arg("position"));
    m.def("race_uniforms", &py_race_uniforms, py::arg("seed"), py::arg("position"), py::arg("tokens"));
    m.def("warp", &py_warp, py::arg("logits"), py::arg("temperature"), py::arg("top_k"), py::arg("top_p"),
          py::arg("min_p"));
    m.def("kernels", [] {
        std::vector<std::string> names;
        for (const Kernels* k : all_kernels()) names.push_back(k->name);
        return names;
    }, "Names of the kernel paths this CPU can run, scalar first.");
    m.def("get_kernel", [] { return std::string(g_kernel.load()->name); });
    m.def("set_kernel", [](const std::string& name) {
        const Kernels* k = name == "auto" ? all_kernels().back() : find_kernel(name);
        if (!k) throw py::value_error("kernel '" + name + "' is not available; available: " + kernel_names());
        g_kernel = k;
    });
}
