"""k="auto" in the offline simulator: each trace against the best fixed K in
hindsight and against plain decoding, from a fresh state and from a poisoned
one (costs stored while another process held the CPU: the draft's 3x, the
target's 1.5x: a record that says drafting loses). No
model runs; a policy is judged here before it is benchmarked.

Traces: the synthetic regimes of specgguf.engine.simulator.regimes(), and the
recorded traces in tests/data/ (bench/record_trace.py).

    .venv/bin/python bench/simulate.py [--seeds 3]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from specgguf.engine import simulator

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    traces = simulator.regimes() + [simulator.load_trace(p) for p in sorted(DATA.glob("trace_*.json"))]
    seeds = range(args.seeds)
    print(f"| trace | k=auto / oracle (fresh) | best fixed K | k=auto / plain | k=auto / oracle (poisoned state) |")
    print("|---|---|---|---|---|")
    for t in traces:
        fresh = simulator.score(t, seeds)
        bad = simulator.score(t, seeds, poison=simulator.busy_record(t))
        print(f"| {t.name} | {statistics.median(fresh['vs_oracle']):.3f} (min {min(fresh['vs_oracle']):.3f}) | "
              f"{statistics.median(fresh['best_k'])} | {statistics.median(fresh['vs_plain']):.3f} | "
              f"{statistics.median(bad['vs_oracle']):.3f} (min {min(bad['vs_oracle']):.3f}) |", flush=True)


if __name__ == "__main__":
    main()
