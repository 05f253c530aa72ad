"""Speculative vs target-only on the default pair: speed and acceptance.

    .venv/bin/python examples/compare_speed.py [--temp 0.8]
"""

import argparse

from specgguf import SpeculativeLlama, models

ap = argparse.ArgumentParser()
ap.add_argument("--temp", type=float, default=0.0)
ap.add_argument("-n", type=int, default=96)
args = ap.parse_args()

target, draft = models.default_pair()
llm = SpeculativeLlama(target, draft)
msgs = [{"role": "user", "content": "Write a detailed essay about the history of the printing press."}]
llm.generate(msgs, chat=True, max_tokens=16)  # warm-up: page in both models
for k in (0, 2, 4, "auto"):
    r = llm.generate(msgs, chat=True, max_tokens=args.n, k=k, temperature=args.temp, seed=0)
    s = r.stats
    label = "target only" if k == 0 else f"speculative k={k}"
    if k == "auto":
        label += f" {s['k_hist']}"
    print(f"{label:16} {s['tokens_per_second']:6.1f} tok/s  acceptance {s['acceptance_rate']:.2f}  "
          f"mean accepted {s['mean_accepted']:.2f}  draft {s['draft_seconds']:.2f} s  "
          f"target {s['target_seconds']:.2f} s")
