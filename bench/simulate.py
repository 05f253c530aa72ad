"""k="auto" in the offline simulator: each trace against the best fixed K in
hindsight and against plain decoding, from a fresh state and from a poisoned
one (stored evidence that the draft accepts 0.1, as a run whose text did not
suit the draft leaves it: a record that says drafting loses). No model runs;
a policy is judged here before it is benchmarked.

Traces: the synthetic regimes of specgguf.testing.simulator.regimes(), and the
recorded traces in tests/data/ (bench/record_trace.py).

With --engine, the same traces as the engine runs them (serve with
parallel > 1: one request at a time, each new to its slot, the draft
measured on its prompt in its first round), from a fresh engine.

    .venv/bin/python bench/simulate.py [--seeds 3] [--engine]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from specgguf.testing import simulator

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--engine", action="store_true", help="through the engine's policy (serve) instead")
    args = ap.parse_args()
    traces = simulator.regimes() + [simulator.load_trace(p) for p in sorted(DATA.glob("trace_*.json"))]
    seeds = range(args.seeds)
    if args.engine:
        print("| trace | engine k=auto / oracle | best fixed K | k=auto / plain |")
        print("|---|---|---|---|")
        for t in traces:
            r = simulator.score(t, seeds, engine=True)
            print(f"| {t.name} | {statistics.median(r['vs_oracle']):.3f} (min {min(r['vs_oracle']):.3f}) | "
                  f"{statistics.median(r['best_k'])} | {statistics.median(r['vs_plain']):.3f} |", flush=True)
        return
    print(f"| trace | k=auto / oracle (fresh) | best fixed K | k=auto / plain | k=auto / oracle (poisoned state) |")
    print("|---|---|---|---|---|")
    for t in traces:
        fresh = simulator.score(t, seeds)
        bad = simulator.score(t, seeds, poison=simulator.poor_record(t))
        print(f"| {t.name} | {statistics.median(fresh['vs_oracle']):.3f} (min {min(fresh['vs_oracle']):.3f}) | "
              f"{statistics.median(fresh['best_k'])} | {statistics.median(fresh['vs_plain']):.3f} | "
              f"{statistics.median(bad['vs_oracle']):.3f} (min {min(bad['vs_oracle']):.3f}) |", flush=True)


if __name__ == "__main__":
    main()
