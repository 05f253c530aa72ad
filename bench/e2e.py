"""End-to-end speed on a real GGUF pair: speculative vs target-only, one run.

For each configuration, over the same prompts: tokens/s, the ratio to
target-only decoding measured beside it (each generation paired with a
target-only one on the same prompt, just before or after: the column
"base"; "median" is the median of the per-generation ratios, which one
slow moment moves less), acceptance rate, mean accepted
length, where the time went (draft and target callbacks, the verification
op, warping, and everything outside the two models' forwards), and the K
chosen. Configurations: k="auto" and fixed K in {1, 2, 4, 8}, a good and a
poor draft, greedy and temperature 0.8, and the n-gram draft on a copy-heavy
prompt. Also llama-cpp-python's own ``Llama.generate`` greedy loop as a
second baseline, and the peak RSS.
Usage:

    .venv/bin/python bench/e2e.py [--tokens 96] [--threads 2] [--reps 1] [--quick]
"""

from __future__ import annotations

import argparse
import resource
import time

import llama_cpp
import numpy as np

from specgguf import models
from specgguf.api import SpeculativeLlama
from specgguf.policy import DraftPolicy

PROMPTS = [
    "Write a detailed essay about the history of the printing press.",
    "Explain, step by step, how a bicycle stays upright while moving.",
    "Write a short story about a robot who learns to paint.",
]


def llama_generate_baseline(llm, prompts_ids, n):
    """Greedy decoding through llama-cpp-python's own loop (no specgguf)."""
    total_tok, total_s = 0, 0.0
    for ids in prompts_ids:
        llm.reset()
        t0 = time.perf_counter()
        count = 0
        for tok in llm.generate(ids, temp=0.0, top_k=1, reset=True):
            count += 1
            if count == n or llm.token_eos() == tok:
                break
        total_s += time.perf_counter() - t0
        total_tok += count
    llm.reset()
    return total_tok / total_s


AGG_KEYS = ("seconds", "draft_seconds", "target_seconds", "verify_seconds", "warp_seconds",
            "overhead_seconds", "drafted", "accepted", "rounds")


def empty():
    return dict(tokens=0, k_hist={}, **{key: 0.0 for key in AGG_KEYS})


def add(agg, res):
    agg["tokens"] += len(res.tokens)
    for key in AGG_KEYS:
        agg[key] += res.stats[key]
    for k, c in res.stats["k_hist"].items():
        agg["k_hist"][k] = agg["k_hist"].get(k, 0) + c


def run(spec, prompts_ids, n, base=None, reps=1, **kw):
    """Aggregate stats of one configuration over all prompts (``reps`` times).

    With ``base`` (a SpeculativeLlama), each generation is paired with a
    target-only one on the same prompt, run right before or after it (the
    order alternates): the returned baseline saw the same machine load, so
    the ratio of the two is far less noisy than one against a baseline timed
    minutes earlier.
    """
    agg, base_agg = empty(), empty()
    agg["pair_ratios"] = []
    for i, ids in enumerate(prompts_ids * reps):
        plain = dict(kw, k=0)
        if base is not None and i % 2 == 0:
            b = base.generate(ids, max_tokens=n, **plain)
        res = spec.generate(ids, max_tokens=n, **kw)
        if base is not None and i % 2 == 1:
            b = base.generate(ids, max_tokens=n, **plain)
        add(agg, res)
        if base is not None:
            add(base_agg, b)
            agg["pair_ratios"].append(res.stats["tokens_per_second"] / b.stats["tokens_per_second"])
    return agg, base_agg


def ceiling(costs, a):
    """Leviathan et al.'s expected speedup at per-token acceptance ``a``, best K."""
    policy = DraftPolicy(8, costs)
    return max(policy.rate(k, [a] * 8) for k in range(9)) / policy.rate(0)


def row(name, r, base):
    tps = r["tokens"] / r["seconds"]
    base_tps = base["tokens"] / base["seconds"]
    acc = r["accepted"] / r["drafted"] if r["drafted"] else 0.0
    pct = lambda key: 100 * r[key] / r["seconds"]
    top_k = sorted(r["k_hist"].items(), key=lambda kv: -kv[1])[:3]
    med = float(np.median(r["pair_ratios"])) if r.get("pair_ratios") else 1.0
    print(f"{name:<28} {tps:>6.1f} {base_tps:>6.1f} {tps / base_tps:>5.2f}x {med:>5.2f}x {acc:>6.2f} "
          f"{r['accepted'] / r['rounds']:>6.2f} "
          f"{pct('draft_seconds'):>6.1f} {pct('target_seconds'):>7.1f} {pct('verify_seconds'):>7.2f} "
          f"{pct('warp_seconds'):>5.1f} {pct('overhead_seconds'):>6.1f}  {top_k}", flush=True)


HEADER = (f"{'configuration':<28} {'tok/s':>6} {'base':>6} {'ratio':>6} {'median':>6} {'accept':>6} {'m.acc':>6} {'draft%':>6} "
          f"{'target%':>7} {'verify%':>7} {'warp%':>5} {'outside%':>6}  most chosen K (K: rounds)")

COPY_PROMPT = ("Rewrite this Python function with the variable names `data` -> `values` and `total` -> "
               "`acc`, keeping everything else identical:\n\n"
               "def mean(data):\n    total = 0\n    for x in data:\n        total += x\n"
               "    if len(data) == 0:\n        return 0.0\n    return total / len(data)\n\n"
               "def variance(data):\n    m = mean(data)\n    total = 0\n    for x in data:\n"
               "        total += (x - m) ** 2\n    return total / len(data)\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="one prompt, fewer configurations")
    ap.add_argument("--reps", type=int, default=1, help="run each prompt this many times")
    args = ap.parse_args()
    _, pairs = models.load_lock()
    tname, good, poor = pairs["default"]["target"], pairs["default"]["draft"], pairs["poor-draft"]["draft"]
    load = lambda name: llama_cpp.Llama(str(models.fetch(name)), n_ctx=2048, n_threads=args.threads,
                                        n_threads_batch=args.threads, verbose=False)
    target = load(tname)
    spec = {"good": SpeculativeLlama(target, load(good)), "poor": SpeculativeLlama(target, load(poor)),
            "ngram": SpeculativeLlama(target, "ngram")}
    prompts = PROMPTS[:1] if args.quick else PROMPTS
    ids = [spec["good"].tokenize([{"role": "user", "content": p}], chat=True) for p in prompts]
    n = args.tokens
    for s in spec.values():
        s.costs()  # calibrate (or load the stored calibration) before timing anything
        s.generate(ids[0], max_tokens=8, k=0)  # page the models in
    for which in ("good", "poor"):
        c, acc = spec[which].costs(), spec[which].prior_acceptance(greedy=True)
        print(f"{which} draft calibration: target T(1..9) {' '.join(f'{t * 1e3:.1f}' for t in c.target)} ms, "
              f"draft {c.draft * 1e3:.1f} ms/token, greedy acceptance {acc:.2f}; the formula's best "
              f"speedup at these costs: {ceiling(c, acc):.2f}x (at acceptance 1: {ceiling(c, 1.0):.2f}x)")
    print(f"target {tname}; good draft {good}; poor draft {poor}; {args.threads} threads; "
          f"{len(ids)} prompts x {n} tokens x {args.reps} reps; ratios against paired target-only runs")
    print(f"llama-cpp-python Llama.generate greedy, target only: "
          f"{llama_generate_baseline(target, ids, n):.1f} tok/s")
    ks = ["auto", 2, 4] if args.quick else ["auto", 1, 2, 4, 8]
    r = args.reps
    for temp in (0.0, 0.8):
        print(f"\n-- temperature {temp}" + (" (top-k 40, top-p 0.95, min-p 0.05; unseeded, "
                                             "as a user runs it)" if temp else " (greedy)"))
        print(HEADER)
        plain, _ = run(spec["good"], ids, n, reps=r, k=0, temperature=temp)
        row("target only (k=0)", plain, plain)
        for which in ("good", "poor"):
            for k in ks:
                row(f"{which} draft k={k}", *run(spec[which], ids, n, spec["good"], r, k=k, temperature=temp))
            if temp > 0:  # seeded: a fresh policy per call on the stored calibration
                row(f"{which} draft k=auto seed=1",
                    *run(spec[which], ids, n, spec["good"], r, k="auto", temperature=temp, seed=1))
    print("\n-- copy-heavy prompt (rename variables in code), greedy")
    print(HEADER)
    copy_ids = [spec["good"].tokenize([{"role": "user", "content": COPY_PROMPT}], chat=True)]
    plain, _ = run(spec["good"], copy_ids, n, reps=r, k=0)
    row("target only (k=0)", plain, plain)
    for k in ["auto", 4]:
        row(f"ngram k={k}", *run(spec["ngram"], copy_ids, n, spec["good"], r, k=k))
    row("good draft k=auto", *run(spec["good"], copy_ids, n, spec["good"], r, k="auto"))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\npeak RSS: {rss:.0f} MiB (target F32 515 MiB + Q4_1 94 MiB + Q2_K 84 MiB files, mmapped)")


if __name__ == "__main__":
    main()
