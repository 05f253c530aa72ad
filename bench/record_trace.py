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

``--workload code-edit,doc-quote,...`` records the built-in workloads'
items (specgguf.cli.workloads; a second turn's first answer is a call too)
instead of the chat prompts, each call with what the lookup in front of the
draft proposes at every output position, given the true text before it and
the earlier calls in its memory (``lookup``: the suffix length it matched,
the tokens it proposed, how many of them are the text's), and the budget the
answer may end before: the simulator then replays the lookup's rounds and
the model's side by side.

``--temperature T --seed S``: the answers are the target's seeded samples
(GenerationConfig's default warp, as the server's), verified by
the shared-noise race as a seeded run is: the text is the same whatever is
drafted, a lookup token is kept if it is the text's, and ``agree[i]`` is
whether the draft's own race pick (its warped row, the same noise) is the
text's token. Greedy by default.

Writes JSON that simulator.load_trace reads (tests/data/ holds the ones the
tests replay). Regime: the pair given, on this machine.

    .venv/bin/python bench/record_trace.py --draft smollm2-135m-q4_1 --out tests/data/trace_good_draft.json
    .venv/bin/python bench/record_trace.py --workload code-edit,doc-quote,second-turn --tokens 128 \
        --name "recorded: code edits, quotes, second turns, greedy" --out tests/data/workloads_here.json
    .venv/bin/python bench/record_trace.py --workload chat --tokens 128 --name "recorded: open chat, greedy" \
        --out tests/data/workloads_here_chat.json
    .venv/bin/python bench/record_trace.py --workload code-edit,doc-quote --items 6 --tokens 128 \
        --temperature 0.8 --seed 1234 --name "recorded: code edits, quotes" --out tests/data/workloads_here_t08.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

import specgguf
from specgguf import GenerationConfig
from specgguf.llama import models
from specgguf.engine.policy import Policy
from specgguf.engine.rounds import Request, Rounds
from specgguf.ops.sampling import Sampler
from specgguf.ops.verify import race_pick

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


def costs(pair, ids, repeats: int, context: int = 80) -> dict:
    """Medians of forward timings, each on a cache cut to lack what the forward
    reads, ``context`` tokens before it: a round's target batch of b tokens
    (b - 1 of them proposals, b output rows); a draft's catch-up of n tokens;
    a prompt's reading (one row). A batch's price grows with the context
    before it where one token's does not (Zen 4, F32 target, 8 tokens: 1.8x
    a token after 80 tokens, 2.8x after 300-600; stock kernels alike)."""
    target, draft = pair.target.model, pair.draft_model.model
    base = (list(ids) * (2 + (context + 64) // len(ids)))[:context + 64]  # the timings, not the text, matter

    def timed(model, n, rows, proposed=0):
        model.eval(base[:-n], 1)
        # a draft's forwards take the stock kernels where that pays (llama.model.stock_pays), as a round's do
        stock = model is draft and getattr(model, "stock_pays", False)
        return seconds(lambda: model.eval_many([(0, base, rows, proposed)], row_invariant=not stock))

    def meds(fns, n=repeats):
        """Each timing's median over ``n`` passes, the timings in turns within a pass: timed one
        size after another, a slow spell made 4- and 5-token batches dearer than 6-token ones."""
        got = [[] for _ in fns]
        for _ in range(n):
            for out, fn in zip(got, fns):
                out.append(fn())
        return [statistics.median(x) for x in got]

    few = max(3, repeats // 3)
    t = meds([lambda b=b: timed(target, b, b, b - 1) for b in range(1, 10)])
    d = meds([lambda n=n: timed(draft, n, 1) for n in range(1, 10)])
    long = meds([lambda n=n: timed(draft, n, 1) for n in (32, 64)], few)
    read = meds([lambda n=n: timed(target, n, 1) for n in (32, 64)], few)
    singles = [timed(target, 1, 1) for _ in range(repeats)]
    return {"target": t, "draft": d, "catchup_per_token": float(max(0.0, (long[1] - long[0]) / 32)),
            "target_per_token": float(max(0.0, (read[1] - read[0]) / 32)),
            "noise": float(np.std(np.log(singles)))}


def answer(pair, llm, messages: list, tokens: int, config: GenerationConfig) -> tuple:
    """(prompt ids, the target's answer under ``config``, agree: whether the draft's
    pick given the true text before each answer position is the target's token:
    its argmax greedy, its race pick with the position's noise when sampling)."""
    ids = llm.tokenize(messages, chat=True)
    out = llm.generate(ids, config=replace(config, max_tokens=tokens, k=0)).tokens
    rows = pair.draft_model.model.eval((ids + out)[:-1], len(out))
    if config.greedy:
        return ids, out, [bool(a) for a in np.argmax(rows, axis=1) == np.array(out)]
    sampler = Sampler.from_config(config, origin=len(ids))
    picks = race_pick(sampler.warp(rows), sampler.seed, 0)
    return ids, out, [bool(a) for a in np.asarray(picks) == np.array(out)]


def agreement(pair, llm, prompt: str, tokens: int, config: GenerationConfig) -> tuple:
    ids, _, agree = answer(pair, llm, [{"role": "user", "content": prompt}], tokens, config)
    return len(ids), agree, prompt_measure(pair, ids, config)


def workload_calls(pair, llm, names, n_items: int, tokens: int, config: GenerationConfig) -> list:
    """The workloads' items as calls, in order, each with the lookup's proposals (module docstring)."""
    from specgguf.cli.workloads import REVISE, items
    from specgguf.ops.suffix import SuffixDrafter
    look, calls = SuffixDrafter(16384, n_min=2), []  # as the pair's lookup: its memory spans the calls

    def call(messages, workload):
        ids, out, agree = answer(pair, llm, messages, tokens, config)
        proposals = []
        for p in range(len(out)):
            got = look.propose(ids + out[:p], 32).tokens
            run = next((i for i, (a, b) in enumerate(zip(got, out[p:])) if a != b), min(len(got), len(out) - p))
            proposals.append([look.matched, len(got), run])
        c = {"prompt": len(ids), "agree": agree, "measure": prompt_measure(pair, ids, config), "lookup": proposals,
             "budget": tokens, "workload": workload}
        calls.append(c)
        print(f"  {messages[-1]['content'][:40]!r}: {len(ids)} + {len(out)} tokens, agreement {np.mean(agree):.2f}, "
              f"lookup runs {sum(r for _, _, r in proposals)}", flush=True)
        return pair.target_llm.detokenize(out).decode("utf-8", errors="replace")

    for name in names:
        for messages, extra in items(name, n_items):
            if name in ("json",) or extra:
                raise SystemExit("--workload records greedy answers without a schema: leave json out")
            first = call(messages, name + (" (first)" if name == "second-turn" else ""))
            if name == "second-turn":
                call(messages + [{"role": "assistant", "content": first}, {"role": "user", "content": REVISE}], name)
    return calls


def prompt_measure(pair, ids, config: GenerationConfig = GenerationConfig()) -> list:
    """``[acceptance, positions]`` a first run under ``config`` measures on the prompt
    ``ids`` in its prompt's round, from empty caches; ``[0, 0]``: too short to say."""
    pair.reset()
    policy, got = Policy(), []
    policy.measured = lambda regime, acceptance, positions: got.append((acceptance, positions))
    sampler = Sampler.from_config(config, origin=len(ids))
    Rounds(pair.target.model, pair.rounds_drafter(sampler)).play([Request(ids, 16, frozenset(), sampler,
                                                                          config.regime, policy)])
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
    ap.add_argument("--workload", help="record these built-in workloads (comma-separated) instead of chat prompts")
    ap.add_argument("--items", type=int, default=3, help="items per workload (default %(default)s)")
    ap.add_argument("--temperature", type=float, default=0.0, help="sample the answers (default: greedy)")
    ap.add_argument("--seed", type=int, default=0, help="the samples' seed (with --temperature)")
    args = ap.parse_args()
    config = GenerationConfig(temperature=args.temperature, seed=args.seed if args.temperature else None)
    if bool(args.out) == bool(args.measure_only):
        ap.error("give one of --out and --measure-only")
    llm = specgguf.SpeculativeLlama(args.target, args.draft)
    pair = llm.pair
    if args.measure_only:
        return add_measure(pair, llm, Path(args.measure_only))
    calls = workload_calls(pair, llm, args.workload.split(","), args.items, args.tokens, config) if args.workload else []
    for p in PROMPTS if not args.workload else []:
        n_prompt, agree, measure = agreement(pair, llm, p, args.tokens, config)
        calls.append({"prompt": n_prompt, "agree": agree, "measure": measure})
        print(f"  {p[:40]!r}: {len(agree)} tokens, agreement {np.mean(agree):.2f}, "
              f"on the prompt {measure[0]:.2f} over {measure[1]}", flush=True)
    pair.reset()
    ids = llm.tokenize([{"role": "user", "content": PROMPTS[2]}], chat=True)
    # Timed after as many tokens as the calls' prompts hold on average (chat: about 40; work: hundreds).
    context = max(80, round(statistics.mean(call["prompt"] for call in calls))) if calls else 80
    c = costs(pair, ids, args.repeats, context)
    print(f"  target per batch size (ms): {[round(1e3 * x, 1) for x in c['target']]}; draft per batch size: "
          f"{[round(1e3 * x, 1) for x in c['draft']]}, then {1e3 * c['catchup_per_token']:.2f} ms/token; "
          f"noise {c['noise']:.3f}; after {context} tokens of context")
    name = args.name or f"recorded: {Path(str(models.fetch(args.target))).stem} + {Path(str(models.fetch(args.draft))).stem}"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    trace = {"name": name, "costs": c, "calls": calls}
    if not config.greedy:  # the simulator's regime: the run's settings
        trace["name"] += f", T = {args.temperature:g} seeded"
        trace["config"] = {k: getattr(config, k) for k in ("temperature", "top_k", "top_p", "min_p", "seed")}
    Path(args.out).write_text(json.dumps(trace, indent=1))
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
