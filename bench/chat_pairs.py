"""Open chat, k=0 and k="auto" back to back in one process, and what auto priced against what its rounds took.

Each chat prompt runs with k=0 and with k="auto" one right after the other (the order alternating), so
both meet the same phase of the machine (this Zen 4 flips between plain decoding at 70-85 and 100-111
tok/s within minutes); the lookup is off, as its memory would copy the pair's first answer. Prints the
median of the per-pair ratios (``--control``: k=0 against k=0 instead, the spread between identical
arms), and from auto's rounds: plain rounds' median seconds and plain decoding's price while drafting
(and the machine's pace), steady drafting rounds' tokens and seconds predicted against run, and the
catch-ups' cost (a round whose draft read more than 3 tokens: a new prompt, or a retry's skipped text).
Regime: the default pair on this machine, greedy, 128 tokens, one request at a time.

    .venv/bin/python bench/chat_pairs.py [--reps 3] [--control]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from common import PROMPTS

from specgguf.engine import policy as policy_module
from specgguf.engine.acceptance import expected_tokens


class RoundLog:
    """What a model policy chose and priced each round, and what the round then took: wraps
    Policy.choose / observe / round_done (lookups, which cost nothing, are left out)."""

    def __init__(self) -> None:
        self.rows: list = []
        p = policy_module.Policy
        self.originals = (p.choose, p.observe, p.round_done)
        choose, observe, done = self.originals
        log = self.rows

        def chose(policy, views):
            ks = choose(policy, views)
            if not policy.costs.free and len(views) == 1:
                regime, v = policy.regime(views[0].regime), views[0]
                log.append(dict(k=ks[0], lag=v.draft_lag, prompt=v.target_lag > 1, plain=policy.costs.target(1),
                                pace=policy.costs.target.pace[0], price=policy.costs.seconds([v.steady()], ks),
                                tokens=expected_tokens(ks[0], regime.per_position())[ks[0]]))
            return ks

        def observed(policy, regime, drafted, accepted, after_miss=False):
            if not policy.costs.free and log and "accepted" not in log[-1]:
                log[-1]["accepted"] = accepted
            return observe(policy, regime, drafted, accepted, after_miss)

        def timed(policy, views, ks, m):
            if not policy.costs.free and m is not None and log and "seconds" not in log[-1]:
                log[-1]["seconds"] = m.target_seconds + m.rest_seconds + sum(f[1] for f in m.draft_forwards)
            return done(policy, views, ks, m)

        p.choose, p.observe, p.round_done = chose, observed, timed

    def close(self) -> None:
        p = policy_module.Policy
        p.choose, p.observe, p.round_done = self.originals

    def brief(self, start: int) -> str:
        """The rounds logged since ``start``: how many drafted, and plain decoding's price meanwhile."""
        rows = [r for r in self.rows[start:] if "seconds" in r and not r["prompt"]]
        drafted = [r for r in rows if r["k"]]
        if not drafted:
            return ""
        return (f"; auto drafted in {len(drafted)} of {len(rows)} rounds, plain priced at "
                f"{1e3 * statistics.median(r['plain'] for r in drafted):.1f} ms meanwhile")

    def report(self) -> str:
        rows = [r for r in self.rows if "seconds" in r and not r["prompt"]]
        plain = [r["seconds"] for r in rows if not r["k"]]
        steady = [r for r in rows if r["k"] and r["lag"] <= 3]
        catch = [r for r in rows if r["k"] and r["lag"] > 3]
        if not plain:
            return "auto ran no plain round"
        one = statistics.median(plain)
        out = [f"auto's plain rounds: {len(plain)}, median {1e3 * one:.1f} ms"]
        if steady:
            tokens = sum(r.get("accepted", 0) + 1 for r in steady)
            seconds = sum(r["seconds"] for r in steady)
            out.append(f"steady drafting rounds: {len(steady)}, {one * tokens / seconds:.3f}x plain as run; "
                       f"tokens a round {statistics.mean(r['tokens'] for r in steady):.2f} predicted, "
                       f"{tokens / len(steady):.2f} run; seconds a round "
                       f"{1e3 * statistics.mean(r['price'] for r in steady):.1f} ms priced, "
                       f"{1e3 * seconds / len(steady):.1f} run; plain decoding priced meanwhile at "
                       f"{1e3 * statistics.median(r['plain'] for r in steady):.1f} ms (pace "
                       f"{min(r['pace'] for r in steady):.2f}-{max(r['pace'] for r in steady):.2f})")
        if catch:
            spent = sum(r["seconds"] for r in catch)
            out.append(f"catch-ups: {len(catch)} rounds, {1e3 * spent:.0f} ms ({spent / one:.0f} plain rounds)")
        return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="passes over the 6 chat prompts (default 3)")
    ap.add_argument("--control", action="store_true", help="k=0 against k=0: the spread between identical arms")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    os.environ["SPECGGUF_STATE"] = tempfile.mkdtemp(prefix="specgguf-chat-pairs-")
    import llama_cpp

    from specgguf.api import SpeculativeLlama
    from specgguf.llama import models

    names = models.default_pair()
    loaded = [llama_cpp.Llama(str(models.fetch(n)), n_ctx=2048, n_threads=args.threads, n_threads_batch=args.threads,
                              verbose=False) for n in names]
    spec = SpeculativeLlama(*loaded, lookup=False)
    other = 0 if args.control else "auto"
    log = RoundLog()

    def rate(prompt: str, k) -> float:
        t0 = time.perf_counter()
        r = spec.create_chat_completion([{"role": "user", "content": prompt}], max_tokens=128, temperature=0.0, k=k)
        return r["usage"]["completion_tokens"] / (time.perf_counter() - t0)

    ratios, plain = [], []
    try:
        for i in range(args.reps * 6):
            prompt, start = PROMPTS[i % 6], len(log.rows)
            if i % 2:
                b, a = rate(prompt, other), rate(prompt, 0)
            else:
                a, b = rate(prompt, 0), rate(prompt, other)
            ratios.append(b / a)
            plain.append(a)
            print(f"  pair {i + 1}/{args.reps * 6}: k=0 {a:.1f} tok/s, {other} {b:.1f} ({b / a:.3f}){log.brief(start)}",
                  flush=True)
    finally:
        log.close()
    print(f"# the default pair, {args.threads} threads, greedy chat of 128 tokens, one process, lookup off: k=0 at "
          f"{statistics.median(plain):.1f} tok/s (median; {min(plain):.0f}-{max(plain):.0f})")
    print(f"k={other} over k=0, median of {len(ratios)} pairs: {statistics.median(ratios):.3f} "
          f"(quartiles {statistics.quantiles(ratios, n=4)[0]:.3f}-{statistics.quantiles(ratios, n=4)[2]:.3f})")
    if not args.control:
        print(log.report())


if __name__ == "__main__":
    main()
