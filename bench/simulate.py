"""k="auto" in the offline simulator: each trace against the best fixed K in
hindsight and against plain decoding, from a fresh state, from a poisoned
one (stored evidence that the draft accepts 0.1, as a run whose text did not
suit the draft leaves it: a record that says drafting loses), and with each
call a new process on one store, as the CLI runs them. No model runs; a
policy is judged here before it is benchmarked.

Traces: the synthetic regimes of specgguf.testing.simulator.regimes(), and the
recorded traces in tests/data/ (bench/record_trace.py).

With --engine, the same traces as the engine runs them (serve with
parallel > 1: one request at a time, each new to its slot, the draft
measured on its prompt in its first round), from a fresh engine.

With --workloads, the traces recorded on real work with the lookup
(tests/data/workloads_*.json, bench/record_trace.py --workload): per
workload, each way a user runs the pair (the draft model alone, the lookup
alone, both: the defaults) against plain decoding, replayed in one process
as bench/workloads.py runs them, and the ceiling in hindsight
(simulator.hindsight: no rejected draft, no catch-up) of the lookup alone
and of both. ``--target-ms`` re-prices them at other target costs (for
example a policy's ``costs.target`` after real work in process): a batch's
price grows with the context before it (on Zen 4 a 6-token round costs
1.7x a token after 80 tokens, 2.2-2.4x after 300-400), and each trace is
timed after as much as its prompts hold (BENCHMARKS.md, "Real work").

With --ablate, each of the policy's numbers (engine.policy.Tuning) set to
the value that turns its feature off, or to a neighbour: the worst change,
over the traces, of k=auto's speed against the best fixed K (the minimum
over seeds, from a fresh state, a poisoned one, through the engine, one process a call, and in the
phases below). A number is kept only if some trace loses more than 0.01 without it.

With --phases, each trace also in phases real runs showed that the recordings do not hold: plain
decoding 25% faster from the third call (a fast phase speeds the memory-bound one-token forward, not
batches or the draft), slow one-token forwards after each prompt (a warm-up), and batches dearer as
the context grows past the prompt (measured on Zen 4; a token's price hardly moves), and plain
decoding 40% slower in the first three calls (this Zen 4 flips from its slow phase to its fast one
inside a process). Besides k=auto / the best fixed K it prints k=auto / each call's own best K: after
a flip the best K changes, and a policy that keeps drafting loses to that, not to one K for the trace.

    .venv/bin/python bench/simulate.py [--seeds 3] [--engine | --phases | --workloads [--target-ms 15,22.4,...]]
    .venv/bin/python bench/simulate.py --ablate decay,guard   (about a minute a variant)
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace
from pathlib import Path

from specgguf.engine.policy import Tuning
from specgguf.testing import simulator

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"

# Each number's feature turned off (or moved to a neighbour), by the Tuning field it sets.
VARIANTS = {
    "decay": dict(decay=1.0), "shrink": dict(shrink=1e6), "shrink_low": dict(shrink=1.0),
    "guard": dict(guard=0.0), "thin": dict(thin=1.0), "probe_k": dict(probe_k=0), "odds": dict(odds=1.0),
    "retry": dict(retry=10 ** 9), "retry_max": dict(retry_max=Tuning.retry),
    "retry_gain": dict(retry_gain=1.0), "retry_gain_high": dict(retry_gain=1.1),
    "doubt": dict(doubt=1e9), "draft_guess": dict(draft_guess=0.0), "draft_guess_high": dict(draft_guess=0.3),
    "slope_guess": dict(slope_guess=0.0), "slope_guess_high": dict(slope_guess=0.2),
    "unknown_left": dict(unknown_left=10 ** 6), "steady": dict(steady=1), "steady_high": dict(steady=9),
    "spike": dict(spike=1e9), "pace_share": dict(pace_share=0.0), "settle": dict(settle=1),
    "stale": dict(stale=10 ** 9), "stale_low": dict(stale=1),
    "reread": dict(reread=10 ** 9), "reread_gain_low": dict(reread_gain=1.1), "plain_reads": dict(plain_reads=0),
    "retry_share": dict(retry_share=1e9), "reread_any": dict(reread_any=10 ** 9),
    "reread_again": dict(reread_again=0.0),
}

# What real runs showed and the recorded traces do not (BENCHMARKS.md, "Real work"): plain decoding
# faster from the third call on (the memory-bound target's one-token forwards in a fast phase; its
# batches and the draft unchanged), one-token forwards slow for the first 8 after each prompt, and
# batches growing dearer with the context (simulator.Costs.context); and the other way, a slow phase first.
PHASES = {"plain 25% faster from the third call": dict(one_token=((2, 10 ** 9, 0.75),)),
          "8 slow one-token forwards after each prompt": dict(warm_up=(8, 1.08)),
          "batches dearer with the context": dict(context=1.0),
          "plain 40% slower in the first three calls": dict(one_token=((0, 2, 1.4),))}


def phased(trace, phase: str):
    return replace(trace, costs=replace(trace.costs, **PHASES[phase]), name=f"{trace.name}, {phase}")


def long_flip(seeds, tuning=Tuning()) -> list:
    """A server's long process through a phase flip: the Zen 4 fast-phase trace's calls four times over, plain
    decoding 80% slower in the first six (as slow as this Zen 4's slow phase); per seed, k=auto / each call's best
    fixed K, and k=auto / plain decoding over the last twelve calls (real chat there read 0.90-1.01)."""
    t = simulator.load_trace(DATA / "trace_zen4_fast_good_draft.json")
    t = replace(t, calls=t.calls * 4, costs=replace(t.costs, one_token=((0, 5, 1.8),)), name="a long process")
    out = []
    for s in seeds:
        auto, plain = [], []
        whole = simulator.replay(t, "auto", s, tuning=tuning, calls=auto)
        simulator.replay(t, 0, s, calls=plain)
        rate = lambda calls: sum(c[0] for c in calls[12:]) / sum(c[1] for c in calls[12:])  # noqa: E731
        out.append((whole / simulator.oracle_per_call(t, s), rate(auto) / rate(plain)))
    return out


def worst(traces, seeds, tuning):
    """Per trace: the minimum over seeds of k=auto / best fixed K, fresh, poisoned, in the engine,
    one process a call, and fresh in each of PHASES; and a long process through a phase flip (long_flip)."""
    hows = lambda t: (dict(), dict(poison=simulator.poor_record(t)), dict(engine=True), dict(processes=True))  # noqa
    got = {t.name: [min(simulator.score(t, seeds, tuning=tuning, **how)["vs_oracle"]) for how in hows(t)]
           + [min(simulator.score(phased(t, p), seeds, tuning=tuning)["vs_oracle"]) for p in PHASES] for t in traces}
    got["a long process through a phase flip (/ each call's best K)"] = [min(x for x, _ in long_flip(seeds, tuning))]
    return got


def phases(traces, seeds) -> None:
    """Each trace as recorded and in each of PHASES: k=auto / the best fixed K, in one process and one
    process a call, and in one process / each call's own best fixed K (simulator.oracle_per_call)."""
    print("| trace | as recorded | " + " | ".join(PHASES) + " |")
    print("|---|---|" + "---|" * len(PHASES))
    for t in traces:
        cells = []
        for trace in [t] + [phased(t, p) for p in PHASES]:
            got = [statistics.median(simulator.score(trace, seeds, processes=p)["vs_oracle"]) for p in (False, True)]
            got.append(statistics.median(simulator.replay(trace, "auto", s) / simulator.oracle_per_call(trace, s)
                                         for s in seeds))
            cells.append("%.3f / %.3f / %.3f" % tuple(got))
        print(f"| {t.name} | " + " | ".join(cells) + " |", flush=True)
    got = long_flip(seeds)
    print(f"\n{' '.join(long_flip.__doc__.split(';')[0].split())}: k=auto / each call's best K "
          f"{statistics.median(x for x, _ in got):.3f}, the last twelve calls k=auto / plain "
          f"{statistics.median(y for _, y in got):.3f} (median of {len(got)} seeds)")


def ablate(traces, seeds, names) -> None:
    base = worst(traces, seeds, Tuning())
    print("| number set to | worst change | trace |")
    print("|---|---|---|")
    for name in names:
        got = worst(traces, seeds, replace(Tuning(), **VARIANTS[name]))
        change = {t: min(a - b for a, b in zip(got[t], base[t])) for t in got}
        t = min(change, key=change.get)
        print(f"| {name}: {VARIANTS[name]} | {change[t]:+.3f} | {t} |", flush=True)


def workloads(seeds, target_ms=None, prompt_ms=None) -> None:
    """Each workload trace, each mode and the ceilings (module docstring); ``target_ms``: the target's
    rounds of 1..9 tokens priced at these milliseconds instead, ``prompt_ms`` a prompt token."""
    modes = list(simulator.MODES)[1:]
    for path in sorted(DATA.glob("workloads_*.json")):
        trace = simulator.load_trace(path)
        if target_ms or prompt_ms:
            costs = replace(trace.costs, target=[ms / 1e3 for ms in target_ms] if target_ms else trace.costs.target,
                            target_per_token=prompt_ms / 1e3 if prompt_ms else trace.costs.target_per_token)
            trace = replace(trace, costs=costs, name=trace.name + ", re-priced")
        print(f"{trace.name}: tokens/s over plain decoding's, median over {len(seeds)} seeds\n")
        print("| workload | " + " | ".join(modes) + " | ceiling in hindsight: lookup alone | both |")
        print("|---|" + "---|" * (len(modes) + 2))
        for w, got in simulator.by_workload(trace, seeds).items():
            calls = [c for c in trace.calls if c.workload == w]
            plain = sum(simulator.hindsight(c, trace.costs, model=False, lookup=None) for c in calls)
            ceilings = [plain / sum(simulator.hindsight(c, trace.costs, model=m) for c in calls)
                        for m in (False, True)]
            print(f"| {w} | " + " | ".join(f"{statistics.median(got[m]):.2f}x" for m in modes) +
                  "".join(f" | {x:.2f}x" for x in ceilings) + " |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--engine", action="store_true", help="through the engine's policy (serve) instead")
    ap.add_argument("--workloads", action="store_true", help="the workload traces, each mode against plain")
    ap.add_argument("--target-ms", help="with --workloads: the target's rounds of 1..9 tokens at these ms "
                                        "(comma-separated)")
    ap.add_argument("--prompt-ms", type=float, help="with --workloads: a prompt token's ms")
    ap.add_argument("--ablate", metavar="NAMES", help=f"comma-separated, or 'all': {', '.join(VARIANTS)}")
    ap.add_argument("--phases", action="store_true", help="each trace also in phases real runs showed: "
                                                           "k=auto / oracle, in one process / one a call, "
                                                           "and / each call's best K")
    args = ap.parse_args()
    traces = simulator.regimes() + [simulator.load_trace(p) for p in sorted(DATA.glob("trace_*.json"))]
    seeds = range(args.seeds)
    target_ms = [float(x) for x in args.target_ms.split(",")] if args.target_ms else None
    if target_ms is not None and len(target_ms) != 9:
        ap.error(f"--target-ms: 9 values (rounds of 1..9 tokens), got {len(target_ms)}")
    if (target_ms or args.prompt_ms) and not args.workloads:
        ap.error("--target-ms and --prompt-ms re-price the workload traces: use them with --workloads")
    if args.workloads:
        return workloads(seeds, target_ms, args.prompt_ms)
    if args.ablate:
        names = list(VARIANTS) if args.ablate == "all" else args.ablate.split(",")
        unknown = [n for n in names if n not in VARIANTS]
        if unknown:
            ap.error(f"--ablate: no variant {', '.join(unknown)} (choose from {', '.join(VARIANTS)})")
        return ablate(traces, seeds, names)
    if args.phases:
        return phases(traces, seeds)
    if args.engine:
        print("| trace | engine k=auto / oracle | best fixed K | k=auto / plain |")
        print("|---|---|---|---|")
        for t in traces:
            r = simulator.score(t, seeds, engine=True)
            print(f"| {t.name} | {statistics.median(r['vs_oracle']):.3f} (min {min(r['vs_oracle']):.3f}) | "
                  f"{statistics.median(r['best_k'])} | {statistics.median(r['vs_plain']):.3f} |", flush=True)
        return
    print("| trace | k=auto / oracle (fresh) | best fixed K | k=auto / plain | k=auto / oracle (poisoned state) "
          "| one process a call: / oracle, / plain |")
    print("|---|---|---|---|---|---|")
    for t in traces:
        fresh = simulator.score(t, seeds)
        bad = simulator.score(t, seeds, poison=simulator.poor_record(t))
        cli = simulator.score(t, seeds, processes=True)
        cell = lambda r: f"{statistics.median(r['vs_oracle']):.3f} (min {min(r['vs_oracle']):.3f})"  # noqa: E731
        print(f"| {t.name} | {cell(fresh)} | {statistics.median(fresh['best_k'])} | "
              f"{statistics.median(fresh['vs_plain']):.3f} | {cell(bad)} | {cell(cli)}, "
              f"{statistics.median(cli['vs_plain']):.3f} |", flush=True)


if __name__ == "__main__":
    main()
