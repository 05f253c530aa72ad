"""Record a trace of a real pair for the offline simulator (specgguf.testing.simulator).

Two things decide how a draft-length policy fares, and both are measured
here on this machine with the real models:

* costs: the target's and the draft's forwards over 1..9 tokens (a round's
  batch; the draft's first forward in a round evaluates what it skipped),
  and the draft's cost per token of longer catch-ups (from 32 and 64),
  medians of --repeats timings each, with the spread of single-token target
  forwards as the trace's noise;
* agreement: for each prompt, the target's greedy answer, then the draft
  scored on the true text at every output position in one batched forward:
  agree[i] = the draft's argmax is the target's token i; and what a first
  run measures of the draft on the prompt itself, from empty caches
  (``measure``: acceptance and positions, as SpeculativeLlama's first run
  scores the prompt's text rows).

``--measure-only TRACE`` adds ``measure`` to a trace recorded before it
existed (its calls are PROMPTS in order; the same pair must be given).

Writes JSON that simulator.load_trace reads (tests/data/ holds the ones the
tests replay). Regime: the pair given, on this machine.

    .venv/bin/python bench/record_trace.py --draft smollm2-135m-q4_1 --out tests/data/trace_good_draft.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

import specgguf
from specgguf import GenerationConfig
from specgguf.llama import models
from specgguf.engine.policy import Policy
from specgguf.engine.rounds import Request, Rounds
from specgguf.ops.sampling import Sampler

PROMPTS = [
    "Write a short story about a robot who learns to paint.",
    "Explain how a bicycle stays upright while moving.",
    "Write a detailed essay about the history of the printing press.",
    "Give a beginner's guide to growing tomatoes on a balcony.",
    "Describe how a compiler turns source code into a running program.",
    "Explain why the seasons change over the course of a year.",
]


def seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def costs(pair, ids, repeats: int) -> dict:
    """Medians of forward timings. ``eval(seq, b)`` on a cache that holds
    ``seq`` evaluates its last b tokens again, with b output rows: a round's
    target batch; a catch-up of n is a cut of n tokens, then one eval."""
    target, draft = pair.target.model, pair.draft_model.model
    base = list(ids)
    target.eval(base, 1)
    draft.eval(base, 1)

    def med(fn, n=repeats):
        return statistics.median(seconds(fn) for _ in range(n))

    def catchup(n):
        draft.eval(base[:-n], 1)
        return seconds(lambda: draft.eval(base, 1))

    t = [med(lambda: target.eval(base, b)) for b in range(1, 10)]
    d = [statistics.median(catchup(n) for _ in range(repeats)) for n in range(1, 10)]
    long = [statistics.median(catchup(n) for _ in range(max(3, repeats // 3))) for n in (32, 64)]
    singles = [seconds(lambda: target.eval(base, 1)) for _ in range(repeats)]
    return {"target": t, "draft": d, "catchup_per_token": float(max(0.0, (long[1] - long[0]) / 32)),
            "noise": float(np.std(np.log(singles)))}


def agreement(pair, llm, prompt: str, tokens: int) -> tuple:
    ids = llm.tokenize([{"role": "user", "content": prompt}], chat=True)
    out = llm.generate(ids, max_tokens=tokens, k=0).tokens
    seq = ids + out
    rows = pair.draft_model.model.eval(seq[:-1], len(out))
    return len(ids), [bool(a) for a in np.argmax(rows, axis=1) == np.array(out)], prompt_measure(pair, ids)


def prompt_measure(pair, ids) -> list:
    """``[acceptance, positions]`` a first greedy run measures on the prompt
    ``ids`` in its prompt's round, from empty caches; ``[0, 0]``: too short to say."""
    pair.reset()
    policy, got = Policy(), []
    policy.measured = lambda regime, acceptance, positions: got.append((acceptance, positions))
    sampler = Sampler.from_config(GenerationConfig(), origin=len(ids))
    Rounds(pair.target.model, pair.rounds_drafter(sampler)).play([Request(ids, 16, frozenset(), sampler, "greedy",
                                                                          policy)])
    return [float(got[0][0]), int(got[0][1])] if got else [0.0, 0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--target", default="smollm2-135m-f32")
    ap.add_argument("--draft", default="smollm2-135m-q4_1")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--name", help="the trace's name (default: from the models)")
    ap.add_argument("--out", help="where to write the trace")
    ap.add_argument("--measure-only", metavar="TRACE", help="add the prompt measurement to TRACE instead")
    args = ap.parse_args()
    if bool(args.out) == bool(args.measure_only):
        ap.error("give one of --out and --measure-only")
    llm = specgguf.SpeculativeLlama(args.target, args.draft)
    pair = llm.pair
    if args.measure_only:
        return add_measure(pair, llm, Path(args.measure_only))
    calls = []
    for p in PROMPTS:
        n_prompt, agree, measure = agreement(pair, llm, p, args.tokens)
        calls.append({"prompt": n_prompt, "agree": agree, "measure": measure})
        print(f"  {p[:40]!r}: {len(agree)} tokens, agreement {np.mean(agree):.2f}, "
              f"on the prompt {measure[0]:.2f} over {measure[1]}", flush=True)
    pair.reset()
    ids = llm.tokenize([{"role": "user", "content": PROMPTS[2]}], chat=True)
    c = costs(pair, ids, args.repeats)
    print(f"  target per batch size (ms): {[round(1e3 * x, 1) for x in c['target']]}; draft per batch size: "
          f"{[round(1e3 * x, 1) for x in c['draft']]}, then {1e3 * c['catchup_per_token']:.2f} ms/token; "
          f"noise {c['noise']:.3f}")
    name = args.name or f"recorded: {Path(str(models.fetch(args.target))).stem} + {Path(str(models.fetch(args.draft))).stem}"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"name": name, "costs": c, "calls": calls}, indent=1))
    print(f"wrote {args.out}")


def add_measure(pair, llm, path: Path) -> None:
    text = path.read_text()
    d = json.loads(text)
    if len(d["calls"]) != len(PROMPTS):
        raise SystemExit(f"{path}: {len(d['calls'])} calls, not one per prompt ({len(PROMPTS)})")
    for call, p in zip(d["calls"], PROMPTS):
        ids = llm.tokenize([{"role": "user", "content": p}], chat=True)
        if len(ids) != call["prompt"]:
            raise SystemExit(f"{path}: a prompt of {call['prompt']} tokens where {p[:30]!r} has {len(ids)}")
        call["measure"] = prompt_measure(pair, ids)
        print(f"  {p[:40]!r}: agreement {np.mean(call['agree']):.2f}, on the prompt "
              f"{call['measure'][0]:.2f} over {call['measure'][1]}", flush=True)
    path.write_text(json.dumps(d, indent=1 if "\n" in text.strip() else None))  # as it was written
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
