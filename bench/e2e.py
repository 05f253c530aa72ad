"""End-to-end speed on a real GGUF pair: speculative vs target-only, one run.

Regime: whatever this machine makes of the default pair (SmolLM2-135M F32
target, Q4_1 good draft, Q2_K poor draft); on a 2-core x86 CI machine the
135M target is compute- or cache-bound, not the memory-bound regime of a
1B-8B target on a board. Say so when quoting a figure.

Every generation is paired with a target-only generation on the same prompt,
run right before or after it ("base"); "ratio" is tokens/s over those, and
"median" the median of the per-pair ratios. "ceiling" is Leviathan et al.'s
expected speedup at the run's own acceptance per draft position and the
forwards' seconds per round the same generations measured (the draft's and
the target's at K, the paired runs' at plain decoding), first rounds (which
evaluate the prompt) left out: specgguf.cli.bench.fixed_k_ceiling, the figure
`python -m specgguf bench` prints. For k=auto, whose rounds mix sizes, it is
the best K at the run's per-token acceptance and the costs calibrated at the start (as a round runs
them: SpeculativeLlama.calibrate) rescaled to the paired runs' single-token
cost. "eff" = ratio / ceiling: how much of the formula's speedup survives
everything it leaves out.
The first greedy row pairs plain decoding with itself: the spread of its
ratios around 1.00 is this machine's pairing noise in the same minutes.
The models' KV caches are emptied before each generation, so every one
evaluates its prompt. State (costs, learned acceptance) lives in a temporary
folder: the run starts as a new user would, with nothing stored.

    .venv/bin/python bench/e2e.py [--tokens 96] [--threads 2] [--reps 2] [--quick]
        [--drafts good,poor] [--ks auto,1,2,4,8] [--temps 0,0.8]
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile

import llama_cpp
import numpy as np

from specgguf.llama import models
from specgguf.api import SpeculativeLlama
from specgguf.engine.calibration import ForwardCosts
from specgguf.cli.bench import ceiling, fixed_k_ceiling, per_token_acceptance, steady  # the figures `specgguf bench` prints

PROMPTS = [
    "Write a detailed essay about the history of the printing press.",
    "Explain, step by step, how a bicycle stays upright while moving.",
    "Write a short story about a robot who learns to paint.",
]
COPY_PROMPT = ("Rewrite this Python function with the variable names `data` -> `values` and `total` -> "
               "`acc`, keeping everything else identical:\n\n"
               "def mean(data):\n    total = 0\n    for x in data:\n        total += x\n"
               "    if len(data) == 0:\n        return 0.0\n    return total / len(data)\n\n"
               "def variance(data):\n    m = mean(data)\n    total = 0\n    for x in data:\n"
               "        total += (x - m) ** 2\n    return total / len(data)\n")
KEYS = ("seconds", "draft_seconds", "target_seconds", "verify_seconds", "warp_seconds", "overhead_seconds",
        "drafted", "accepted", "rounds", "completion_tokens")


def run_costs(res, bases, k, calibrated: ForwardCosts) -> ForwardCosts:
    """The costs these generations measured (see the module docstring)."""
    t1 = steady(bases, "target_seconds")
    if k == "auto":
        f = t1 / calibrated.target[0]
        first = None if calibrated.draft_first is None else calibrated.draft_first * f
        return ForwardCosts(calibrated.draft * f, [t * f for t in calibrated.target], calibrated.draft_prefill * f, first)
    draft = sum(s["draft_seconds"] for s in res) / max(1, sum(s["drafted"] for s in res))
    target = [t1] + [t1] * (k - 1) + [steady(res, "target_seconds")]
    return ForwardCosts(draft, target)


def run(spec, base, ids, n, reps, **kw):
    """Each generation paired with a target-only one on ``base`` (k=0, same
    settings; alternating which runs first)."""
    res, bases, ratios = [], [], []
    for i, x in enumerate(ids * reps):
        jobs = [("base", base, dict(kw, k=0)), ("spec", spec, kw)]
        out = {}
        for name, obj, settings in (jobs if i % 2 == 0 else jobs[::-1]):
            obj.reset()
            out[name] = obj.generate(x, max_tokens=n, **settings).stats
        res.append(out["spec"])
        bases.append(out["base"])
        ratios.append(out["spec"]["tokens_per_second"] / out["base"]["tokens_per_second"])
    return res, bases, ratios


def row(name, res, bases, ratios, costs, k):
    total = {key: sum(s[key] for s in res) for key in KEYS}
    btot = sum(s["completion_tokens"] for s in bases) / sum(s["seconds"] for s in bases)
    tps = total["completion_tokens"] / total["seconds"]
    a = per_token_acceptance(res)
    if k == "auto":  # rounds of mixed K: the best K at the calibrated costs
        ceil = ceiling(run_costs(res, bases, k, costs), a, k)
    else:  # what `specgguf bench` prints for a fixed K
        ceil = fixed_k_ceiling(res, bases, k) if k else 1.0
    pct = lambda key: 100 * total[key] / total["seconds"]  # noqa: E731
    khist = {}
    for s in res:
        for kk, c in s["k_hist"].items():
            khist[kk] = khist.get(kk, 0) + c
    top = sorted(khist.items(), key=lambda kv: -kv[1])[:3]
    print(f"{name:<30} {tps:>6.1f} {btot:>6.1f} {tps / btot:>5.2f}x {np.median(ratios):>5.2f}x {a:>6.2f} "
          f"{ceil:>6.2f}x {tps / btot / ceil:>5.2f} {pct('draft_seconds'):>6.1f} {pct('target_seconds'):>7.1f} "
          f"{pct('overhead_seconds'):>6.1f}  {top}", flush=True)


HEADER = (f"{'configuration':<30} {'tok/s':>6} {'base':>6} {'ratio':>6} {'median':>6} {'accept':>6} {'ceiling':>7} "
          f"{'eff':>5} {'draft%':>6} {'target%':>7} {'outside%':>6}  most chosen K (K: rounds)")


def copy_heavy(spec, base, good_costs: ForwardCosts, args) -> None:
    """Greedy rows on a prompt whose answer mostly copies it: n-gram drafting's regime."""
    print("\n-- copy-heavy prompt (rename variables in code), greedy")
    print(HEADER)
    copy_ids = [base.tokenize([{"role": "user", "content": COPY_PROMPT}])]
    ngram_costs = ForwardCosts(draft=1e-5 * good_costs.target[0], target=good_costs.target)
    for k in ["auto", 4]:
        row(f"ngram k={k}", *run(spec["ngram"], base, copy_ids, args.tokens, args.reps, k=k), ngram_costs, k)
    row("good k=auto", *run(spec["good"], base, copy_ids, args.tokens, args.reps, k="auto"), good_costs, "auto")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2, help="run each prompt this many times")
    ap.add_argument("--quick", action="store_true", help="one prompt, fewer configurations")
    ap.add_argument("--drafts", default="good,poor", help="which drafts' rows to run (good,poor); the "
                    "copy-heavy rows run with the good draft")
    ap.add_argument("--ks", default=None, help="draft lengths of the unseeded rows, e.g. auto,4 "
                    "(default auto,1,2,4,8; --quick: auto,4)")
    ap.add_argument("--temps", default="0,0.8", help="which temperatures' sections to run: 0 (greedy, with "
                    "the noise-floor row) and/or 0.8 (sampled, with the seeded rows)")
    args = ap.parse_args()
    temps = [float(t) for t in args.temps.split(",")]
    if not temps or any(t not in (0.0, 0.8) for t in temps):
        ap.error(f"--temps takes 0 and/or 0.8, got {args.temps!r}")
    os.environ["SPECGGUF_STATE"] = tempfile.mkdtemp(prefix="specgguf-bench-state-")
    tname, good = models.default_pair()
    poor = models.load_lock()[1]["poor-draft"]["draft"]
    load = lambda name: llama_cpp.Llama(str(models.fetch(name)), n_ctx=2048, n_threads=args.threads,  # noqa: E731
                                        n_threads_batch=args.threads, verbose=False)
    target = load(tname)
    spec = {"good": SpeculativeLlama(target, load(good)), "poor": SpeculativeLlama(target, load(poor)),
            "ngram": SpeculativeLlama(target, "ngram")}
    base = spec["good"]
    prompts = PROMPTS[:1] if args.quick else PROMPTS
    ids = [base.tokenize([{"role": "user", "content": p}]) for p in prompts]
    costs = {}
    for which in ("good", "poor"):
        cal = spec[which].calibrate(progress=lambda m: None)
        costs[which] = ForwardCosts.from_dict(cal["costs"])
        c, a = costs[which], cal["acceptance"]
        print(f"{which} draft, measured as a round runs them: target T(1..9) "
              f"{' '.join(f'{t * 1e3:.1f}' for t in c.target)} ms, draft: a round's first token "
              f"{c.draft_cost(1) * 1e3:.1f} ms, then {c.draft * 1e3:.1f} ms/token "
              f"(catch-up {c.draft_prefill * 1e3:.1f} ms/token); acceptance on a fixed text {a['greedy']:.2f} "
              f"greedy, {a['sampled']:.2f} sampled at 0.8; ceiling at acceptance 1: {ceiling(c, 1.0, 'auto'):.2f}x")
    # What the runs below learn starts from nothing: forget the calibration just made.
    os.environ["SPECGGUF_STATE"] = tempfile.mkdtemp(prefix="specgguf-bench-state-")
    spec = {w: SpeculativeLlama(target, s.pair.draft_llm if s.pair.draft_llm else "ngram") for w, s in spec.items()}
    base = SpeculativeLlama(target, "ngram")  # target-only baselines: k=0 never drafts
    print(f"target {tname}; good draft {good}; poor draft {poor}; {args.threads} threads; {len(ids)} prompts x "
          f"{args.tokens} tokens x {args.reps} reps; ratios against paired target-only runs")
    ks = ["auto", 4] if args.quick else ["auto", 1, 2, 4, 8]
    if args.ks:
        ks = [k if k == "auto" else int(k) for k in args.ks.split(",")]
    for temp in temps:
        print(f"\n-- temperature {temp}" + (" (top-k 40, top-p 0.95, min-p 0.05)" if temp else " (greedy)"))
        print(HEADER)
        if temp == 0:  # the same configuration on both sides: how far the ratios stray from 1.00 here
            row("target alone (noise floor)", *run(base, base, ids, args.tokens, args.reps, k=0), costs["good"], 0)
        for which in args.drafts.split(","):
            for k in ks:
                extra = {} if temp == 0 else {"drafter_invariant": False}
                label = f"{which} k={k}" + (" p/q" if temp else "")
                row(label, *run(spec[which], base, ids, args.tokens, args.reps, k=k, temperature=temp, **extra),
                    costs[which], k)
            if temp > 0:
                for seed_kw, label in (({"seed": 1}, "seed=1 invariant"), ({"seed": 1, "drafter_invariant": False},
                                                                           "seed=1 p/q")):
                    row(f"{which} k=auto {label}", *run(spec[which], base, ids, args.tokens, args.reps, k="auto",
                                                         temperature=temp, **seed_kw), costs[which], "auto")
                row(f"{which} k=4 invariant", *run(spec[which], base, ids, args.tokens, args.reps, k=4,
                                                     temperature=temp, drafter_invariant=True), costs[which], 4)
    if "good" in args.drafts.split(","):
        copy_heavy(spec, base, costs["good"], args)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\npeak RSS: {rss:.0f} MiB (target F32 515 MiB + Q4_1 94 MiB + Q2_K 84 MiB files, mmapped)")


if __name__ == "__main__":
    main()
