"""Where a round's time goes: each llama_decode timed by model and batch
size, back to back and inside real generations, in one run.

Back to back: the same forward repeated (cut back and evaluated again) with
nothing between calls, and with 2 ms of busy Python between calls (what a
round does between forwards), for the target at 1 and 5 tokens and the draft
at 1 and 2 tokens. In a run: the same sizes as a greedy k=4 generation of
the default pair issues them (the draft's 2-token forward is its catch-up
after a round that accepted everything: it evaluates its last proposal and
the bonus token), and the share of the round spent outside llama_decode.
Regime: the default 135M pair on this machine.

    .venv/bin/python bench/forwards.py [--threads 2] [--reps 60]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import llama_cpp
import numpy as np

from specgguf.llama import model as llama_model
from specgguf.llama import models
from specgguf.api import SpeculativeLlama
from specgguf.llama.model import LlamaModel

PROMPT = [{"role": "user", "content": "Write a detailed essay about the history of the printing press."}]


def back_to_back(model: LlamaModel, ctx, b: int, reps: int, gap: float = 0.0) -> float:
    times = []
    for i in range(reps):
        t0 = time.perf_counter()
        model.eval(ctx + [7 + i % 3] * b, b)
        times.append(time.perf_counter() - t0)
        end = time.perf_counter() + gap
        while time.perf_counter() < end:
            pass
    return 1e3 * float(np.median(times))


def in_run(spec: SpeculativeLlama, target, reps: int):
    """Median ms of each (model, batch size) llama_decode in greedy k=4 generations."""
    seen = {}
    original = llama_model.LlamaModel._decode

    def timed(self, todo):
        t0 = time.perf_counter()
        original(self, todo)
        key = ("target" if self.llm is target else "draft", len(todo))
        seen.setdefault(key, []).append(time.perf_counter() - t0)

    llama_model.LlamaModel._decode = timed
    outside = []
    try:
        for _ in range(max(1, reps // 30)):
            spec.reset()
            r = spec.generate(PROMPT, max_tokens=96, k=4)
            outside.append(r.stats["overhead_seconds"] / r.stats["seconds"])
    finally:
        llama_model.LlamaModel._decode = original
    return {k: 1e3 * float(np.median(v)) for k, v in seen.items() if len(v) >= 5}, float(np.mean(outside))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=60)
    args = ap.parse_args()
    os.environ["SPECGGUF_STATE"] = tempfile.mkdtemp(prefix="specgguf-forwards-")
    tname, dname = models.default_pair()
    load = lambda n: llama_cpp.Llama(str(models.fetch(n)), n_ctx=1024, n_threads=args.threads,  # noqa: E731
                                     n_threads_batch=args.threads, verbose=False)
    target, draft = load(tname), load(dname)
    t, d = LlamaModel(target), LlamaModel(draft)
    ctx = [int(target.token_bos())] + [100 + i % 500 for i in range(159)]
    t.eval(ctx, 1)
    d.eval(ctx, 1)
    print(f"default pair, {args.threads} threads, context 160 tokens; medians of {args.reps} forwards (ms)")
    print(f"{'forward':<22} {'back to back':>12} {'2 ms gaps':>10} {'in a k=4 run':>13}")
    rows = [("target", t, 1), ("target", t, 5), ("draft", d, 1), ("draft", d, 2)]
    b2b = [(back_to_back(m, ctx, b, args.reps), back_to_back(m, ctx, b, args.reps, 0.002)) for _, m, b in rows]
    t.reset()
    d.reset()
    live, outside = in_run(SpeculativeLlama(target, draft), target, args.reps)
    for (name, _, b), (plain, gapped) in zip(rows, b2b):
        run = live.get((name, b))
        print(f"{name + f' x {b}':<22} {plain:>12.1f} {gapped:>10.1f} {run if run is not None else float('nan'):>13.1f}")
    print(f"outside llama_decode in those runs (warp, verify, Python): {100 * outside:.1f}% of the time")
    if ("draft", 2) in live and ("draft", 1) in live:
        print(f"the draft's 2-token catch-up costs {live[('draft', 2)] / live[('draft', 1)]:.2f}x a 1-token forward")


if __name__ == "__main__":
    main()
