"""Speculative against target-only decoding on the default pair, in Python:
the measurement `python -m specgguf bench` makes, through specgguf.cli.bench.

One generation per configuration is not a measurement on a small machine
(identical runs differ by 10-20%): each configuration runs on each prompt
once per turn, in a different order each turn, and the table shows medians.

    .venv/bin/python examples/compare_speed.py [--temp 0.8] [-n 64] [--turns 3]
"""

import argparse
import os
import tempfile

os.environ.setdefault("SPECGGUF_STATE", tempfile.mkdtemp())  # k="auto" starts as a new user's, stores nothing

from specgguf import SpeculativeLlama  # noqa: E402
from specgguf.cli import bench  # noqa: E402  (what `python -m specgguf bench` measures)
from specgguf.llama import models  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--temp", type=float, default=0.0)
ap.add_argument("-n", type=int, default=64)
ap.add_argument("--turns", type=int, default=3)
args = ap.parse_args()

llm = SpeculativeLlama(*models.default_pair())
prompts = [[{"role": "user", "content": p}] for p in bench.PROMPTS]
runs = bench.measure(llm, prompts, [0, 2, 4, "auto"], args.n, args.turns, bench.Progress(), temperature=args.temp)
report = bench.Report.of(runs)
print("\n".join(report.table()))
print(report.recommendation())
