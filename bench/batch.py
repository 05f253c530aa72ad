"""N requests together (SpeculativeLlama(parallel=N).generate_many) against
the same N one after another (parallel=1), in-process, same run.

Both objects load the same pair in this process from an empty state folder;
each repetition times the N requests one after another on the one-slot
object, then together on the N-slot one, and checks that every text is the
same. Reports the time ratio (together / one after another: the issue's
target is <= 0.7 at N=4), the aggregate tokens/s of each, and the K the
engine chose.

Regime: the default pair on this machine (an F32 135M target whose draft
costs as much per batched token as the target's marginal token, so the
engine's rounds are mostly batched plain decoding at 4 slots).

    .venv/bin/python bench/batch.py [--n 4] [--tokens 128] [--reps 3] [--temps 0,0.8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from common import PROMPTS  # bench/common.py


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--n", type=int, default=4, help="requests (and slots) (4)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--temps", default="0,0.8")
    args = ap.parse_args()
    os.environ["SPECGGUF_STATE"] = tempfile.mkdtemp(prefix="specgguf-bench-state-")
    from specgguf import SpeculativeLlama
    from specgguf.llama.models import default_pair
    t, d = default_pair()
    one = SpeculativeLlama(t, d)
    many = SpeculativeLlama(t, d, parallel=args.n)
    prompts = [[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}] for i in range(args.n)]
    one.generate("Hello", max_tokens=4)
    many.generate("Hello", max_tokens=4)
    print(f"{args.n} chat requests of up to {args.tokens} tokens, default pair, in-process, fresh state")
    print("| T | one after another tok/s | together tok/s | time together / one after another | same text | "
          "engine's K (rounds) |")
    print("|---|---|---|---|---|---|")
    for temp in [float(x) for x in args.temps.split(",")]:
        kw = dict(max_tokens=args.tokens, temperature=temp, seed=3 if temp else None)
        ratios, seq_tps, tog_tps, same, ks = [], [], [], True, {}
        for _ in range(args.reps):
            t0 = time.perf_counter()
            alone = [one.generate(p, **kw) for p in prompts]
            t1 = time.perf_counter()
            together = many.generate_many(prompts, **kw)
            t2 = time.perf_counter()
            n = sum(r.stats["completion_tokens"] for r in alone)
            ratios.append((t2 - t1) / (t1 - t0))
            seq_tps.append(n / (t1 - t0))
            tog_tps.append(sum(r.stats["completion_tokens"] for r in together) / (t2 - t1))
            same &= [r.tokens for r in alone] == [r.tokens for r in together]
            for r in together:
                for k, c in r.stats["k_hist"].items():
                    ks[k] = ks.get(k, 0) + c
        print(f"| {temp:g} | {statistics.median(seq_tps):.1f} | {statistics.median(tog_tps):.1f} | "
              f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) | {same} | "
              f"{dict(sorted(ks.items()))} |", flush=True)


if __name__ == "__main__":
    main()
