"""End-to-end speed on a real GGUF pair: speculative vs target-only, one run.

For each configuration, over the same prompts: tokens/s, the ratio to
target-only decoding measured in this run, acceptance rate, mean accepted
length, and where the time went (draft forwards, target forwards, warping,
everything else: verification + Python). Also llama-cpp-python's own
``Llama.generate`` greedy loop as a second baseline, and the peak RSS.
Usage:

    .venv/bin/python bench/e2e.py [--tokens 96] [--threads 2] [--pair default]
"""

from __future__ import annotations

import argparse
import resource
import time

import llama_cpp
import numpy as np

from specgguf import models
from specgguf.api import SpeculativeLlama

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


def run(spec, prompts_ids, n, **kw):
    agg = dict(tokens=0, seconds=0.0, draft_seconds=0.0, target_seconds=0.0, warp_seconds=0.0,
               other_seconds=0.0, drafted=0, accepted=0, rounds=0)
    for ids in prompts_ids:
        res = spec.generate(ids, max_tokens=n, **kw)
        s = res.stats
        agg["tokens"] += len(res.tokens)
        for key in ("seconds", "draft_seconds", "target_seconds", "warp_seconds", "other_seconds",
                    "drafted", "accepted", "rounds"):
            agg[key] += s[key]
    return agg


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pair", default="default", help="a pair name from models.lock")
    args = ap.parse_args()
    _, pairs = models.load_lock()
    tname, dname = pairs[args.pair]["target"], pairs[args.pair]["draft"]
    _, poor = pairs["poor-draft"]["target"], pairs["poor-draft"]["draft"]
    load = lambda name: llama_cpp.Llama(str(models.fetch(name)), n_ctx=2048, n_threads=args.threads,
                                        n_threads_batch=args.threads, verbose=False)
    target, draft, poor_draft = load(tname), load(dname), load(poor)
    spec = {"good": SpeculativeLlama(target, draft), "poor": SpeculativeLlama(target, poor_draft)}
    ids = [spec["good"].tokenize([{"role": "user", "content": p}], chat=True) for p in PROMPTS]
    n = args.tokens
    print(f"target {tname}, drafts: good = {dname}, poor = {poor}; {args.threads} threads; "
          f"{len(ids)} prompts x {n} tokens")
    base_llama = llama_generate_baseline(target, ids, n)
    rows = []
    for temp in (0.0, 0.8):
        base = run(spec["good"], ids, n, k=0, temperature=temp, seed=1)
        base_tps = base["tokens"] / base["seconds"]
        rows.append((f"target only (k=0), temp {temp}", base, base_tps))
        for which in ("good", "poor"):
            for k in (2, 4):
                r = run(spec[which], ids, n, k=k, temperature=temp, seed=1)
                rows.append((f"{which} draft k={k}, temp {temp}", r, base_tps))
    print(f"llama-cpp-python Llama.generate greedy (target only): {base_llama:.1f} tok/s")
    print(f"{'configuration':<30} {'tok/s':>6} {'ratio':>6} {'accept':>7} {'mean acc':>8} "
          f"{'draft%':>6} {'target%':>7} {'warp%':>6} {'other%':>6}")
    for name, r, base_tps in rows:
        tps = r["tokens"] / r["seconds"]
        acc = r["accepted"] / r["drafted"] if r["drafted"] else 0.0
        pct = lambda key: 100 * r[key] / r["seconds"]
        print(f"{name:<30} {tps:>6.1f} {tps / base_tps:>5.2f}x {acc:>7.2f} "
              f"{r['accepted'] / r['rounds']:>8.2f} {pct('draft_seconds'):>6.1f} {pct('target_seconds'):>7.1f} "
              f"{pct('warp_seconds'):>6.1f} {pct('other_seconds'):>6.1f}")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS: {rss:.0f} MiB (three models loaded: F32 target 515 MiB + two drafts)")


if __name__ == "__main__":
    main()
