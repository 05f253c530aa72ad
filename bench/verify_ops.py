"""Speed of the verification ops against the numpy reference and the streaming floor.

For each (V, K) and case, prints the median microseconds per call of
specgguf, of the plain numpy reference (specgguf.testing.reference) and of the floor
(np.max streaming over the same number of bytes the op must read), with the
ratios, all measured in this one run. Then the warp (logits to sampling
probabilities) per row at V = 49152 (SmolLM2) and 262144 (Gemma 3) for each
truncation setting, against the targets of 100 and 400 us a row, and the
drafter-invariant race's pick per row. Then the lookup
(:class:`~specgguf.ops.suffix.SuffixDrafter`): its cost per round with 32k
tokens of earlier texts indexed (the target: at most 50 us). Usage:

    .venv/bin/python bench/verify_ops.py [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import specgguf
from specgguf.testing import reference
from specgguf.ops import sampling


def median_us(fn, calls, repeats=15):
    """Median over `repeats` batches of the mean time per call, in microseconds."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(times)


def cycle(items):
    state = {"i": 0}

    def nxt():
        state["i"] = (state["i"] + 1) % len(items)
        return items[state["i"]]
    return nxt


def cases(v, k, rng):
    """(name, op, spec_fn, ref_fn, rows_read) for one (V, K)."""
    logits = rng.standard_normal((k + 1, v)).astype(np.float32) * 3
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    top = p.argmax(1)
    # A realistic draft: the target's distribution, perturbed (acceptance ~0.7).
    q = p[:k] * np.exp(0.8 * rng.standard_normal((k, v))).astype(np.float32)
    q /= q.sum(1, keepdims=True)
    cq = np.cumsum(q.astype(np.float64), axis=1)
    draws = []
    for _ in range(256):
        toks = np.array([min(np.searchsorted(cq[i], rng.random() * cq[i, -1], side="right"), v - 1)
                         for i in range(k)])
        draws.append((toks, rng.random(k + 1)))
    nxt = cycle(draws)
    miss = top[:k].copy()
    miss[2:] = (miss[2:] + 1) % v  # greedy realistic: 2 accepted, miss at position 2
    u_all = np.full(k + 1, 0.5)
    out = [
        ("greedy all-accepted", lambda: specgguf.verify_greedy(logits, top[:k]),
         lambda: reference.verify_greedy(logits, top[:k]), k + 1),
        ("greedy miss at 2", lambda: specgguf.verify_greedy(logits, miss),
         lambda: reference.verify_greedy(logits, miss), 3),
        ("sampled all-accepted", lambda: specgguf.accept_uniforms(p, p[:k], top[:k], u_all),
         lambda: reference.accept_uniforms(p, p[:k], top[:k], u_all), 2 * k + 1),
    ]
    # Realistic sampled: rows read vary per draw; the floor uses the mean.
    rows = []
    for toks, u in draws:
        n, _, _ = reference.accept_uniforms(p, q, toks, u)
        rows.append(2 * n + (3 if n == k else 4))  # read p,q per row (+p,q again on a reject)
    out.append(("sampled realistic", lambda: specgguf.accept_uniforms(p, q, *nxt()),
                lambda: reference.accept_uniforms(p, q, *nxt()), float(np.mean(rows))))
    return out


WARPS = [("none (OpenAI default)", (0.8, 0, 1.0, 0.0)), ("top-k 40, top-p .95, min-p .05", (0.8, 40, 0.95, 0.05)),
         ("top-p 0.95", (0.8, 0, 0.95, 0.0)), ("top-p 0.9, min-p 0.05", (0.8, 0, 0.9, 0.05)),
         ("min-p 0.05", (0.8, 0, 1.0, 0.05)), ("top-k 1000", (0.8, 1000, 1.0, 0.0))]


def warp_rows(rng, scale):
    """Per-row warp time on LM-like rows (a few strong tokens over a long
    tail; the nucleus at top-p 0.95 holds a few hundred tokens), and the
    race's pick on the untruncated warp."""
    print(f"\nwarp, one row, {specgguf.get_kernel()}: median us per row (target: 100 at V=49152, 400 at V=262144)")
    for v, target in [(49152, 100), (262144, 400)]:
        row = (rng.standard_normal((1, v)) * 2 + np.where(rng.random((1, v)) < 2e-3, 9.0, 0.0)).astype(np.float32)
        calls = max(5, int((2000 if v < 100000 else 400) * scale))
        for name, setting in WARPS:
            t = median_us(lambda: sampling.warp(row, *setting), calls)
            print(f"{v:>7}    {name:<32} {t:>8.1f}u {'ok' if t <= target else 'OVER'}")
        w = sampling.warp(row, 0.8, 0, 1.0, 0.0)
        pos = iter(range(10**9))
        t = median_us(lambda: specgguf.ops.verify.race_pick(w, 5, next(pos)), calls)
        print(f"{v:>7}    {'race pick (untruncated row)':<32} {t:>8.1f}u")


def lookup_rounds(scale: float) -> None:
    """The lookup's cost per decoding round: earlier texts (the standard
    library's source through the SmolLM2 tokenizer) fill its memory to
    ``memory`` tokens; then a new text grows by a round's tokens (1-9) and
    is looked up for 16 tokens, as the engine asks each round."""
    import importlib
    import inspect
    import llama_cpp
    from specgguf.llama.models import fetch
    from specgguf.ops.suffix import SuffixDrafter
    tok = llama_cpp.Llama(str(fetch("smollm2-135m-q4_1")), vocab_only=True, verbose=False)
    names = ("argparse", "difflib", "inspect", "textwrap", "tokenize", "pathlib", "zipfile", "csv", "shlex", "calendar")
    texts = [tok.tokenize(inspect.getsource(importlib.import_module(m)).encode(), add_bos=False) for m in names]
    stream = [t for text in texts for t in text]
    rng = np.random.default_rng(5)
    for memory in (4096, 32768):
        d = SuffixDrafter(memory, n_min=4)
        at = 0
        while at < min(len(stream), memory + 2048):  # earlier texts, 2048 tokens each
            d.propose(stream[at:at + 2048], 1)
            at += 2048
        context = list(stream[at:at + 300])
        steps = [int(x) for x in rng.integers(1, 10, 4000)]
        rounds = max(50, int(2000 * scale))
        times = []
        for i in range(rounds):
            context.extend(stream[(at + 300 + 7 * i) % len(stream):][:steps[i]])
            t0 = time.perf_counter()
            d.propose(context, 16)
            times.append((time.perf_counter() - t0) * 1e6)
        print(f"lookup: {len(d.stream)} tokens indexed (memory {memory}), a round's lookup of 16 tokens: "
              f"median {statistics.median(times):.1f} us, 90th percentile {np.percentile(times, 90):.1f} us "
              f"(target: 50 us)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer calls (a smoke run)")
    args = ap.parse_args()
    scale = 0.1 if args.quick else 1.0
    rng = np.random.default_rng(0)
    print(f"kernel: {specgguf.get_kernel()} (available: {', '.join(specgguf.kernels())})")
    print(f"{'V':>7} {'K':>2} {'case':<22} {'specgguf':>9} {'numpy':>9} {'floor':>8} "
          f"{'numpy/ours':>10} {'ours/floor':>10}")
    for v, k in [(32000, 4), (128256, 5)]:
        calls = max(5, int((4000 if v < 100000 else 1000) * scale))
        for name, ours, ref, rows in cases(v, k, rng):
            buf = rng.random((int(np.ceil(rows)), v), dtype=np.float32)
            frac = rows / np.ceil(rows)
            floor = median_us(lambda: np.max(buf), calls) * frac
            t_ours = median_us(ours, calls)
            t_ref = median_us(ref, max(5, calls // 20))
            print(f"{v:>7} {k:>2} {name:<22} {t_ours:>8.1f}u {t_ref:>8.1f}u {floor:>7.1f}u "
                  f"{t_ref / t_ours:>9.1f}x {t_ours / floor:>9.2f}x")
    warp_rows(rng, scale)
    lookup_rounds(scale)
    # Call overhead: a tiny vocabulary, where the O(V) work is negligible.
    v, k = 1000, 4
    t = rng.random((k + 1, v), dtype=np.float32)
    toks = t[:k].argmax(1)
    g = np.random.default_rng(1)
    calls = int(20000 * scale) + 100
    print(f"call overhead at V = {v}, K = {k}: verify_greedy "
          f"{median_us(lambda: specgguf.verify_greedy(t, toks), calls):.2f} us, "
          f"accept(generator) {median_us(lambda: specgguf.accept(t, t[:k], toks, g), calls):.2f} us")


if __name__ == "__main__":
    main()
