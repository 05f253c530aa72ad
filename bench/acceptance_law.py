"""Accepted-length histogram of many rounds with a deliberately imperfect draft,
beside the analytic law of speculative sampling (the seed card's picture).

Prints measured vs analytic mean accepted length, and with matplotlib (the
`plot` extra) writes the histogram as a PNG. Usage:

    .venv/bin/python bench/acceptance_law.py [--rounds 5000] [--png bench/out/acceptance_law.png]
"""

from __future__ import annotations

import argparse
import os

import numpy as np

import specgguf


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5000)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--png", default="bench/out/acceptance_law.png")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    v, k = args.vocab, args.k
    # Zipf-like target, draft = target with log-normal noise (imperfect on purpose).
    p = 1.0 / np.arange(1, v + 1) ** 1.1
    p = p[rng.permutation(v)] / p.sum()
    q = p * np.exp(1.2 * rng.standard_normal(v))
    q /= q.sum()
    a = float(np.minimum(p, q).sum())
    target = np.tile(p.astype(np.float32), (k + 1, 1))
    draft = np.tile(q.astype(np.float32), (k, 1))
    cq = np.cumsum(q)
    lengths = np.empty(args.rounds, np.int64)
    for r in range(args.rounds):
        toks = np.minimum(np.searchsorted(cq, rng.random(k) * cq[-1], side="right"), v - 1)
        lengths[r], _ = specgguf.accept(target, draft, toks, rng)
    hist = np.bincount(lengths, minlength=k + 1) / args.rounds
    law = np.array([a**j * (1 - a) for j in range(k)] + [a**k])
    analytic_mean = sum(a**i for i in range(1, k + 1))
    print(f"V = {v}, K = {k}, rounds = {args.rounds}, per-token acceptance a = sum(min(p, q)) = {a:.3f}")
    print(f"mean accepted length: measured {lengths.mean():.3f}, analytic {analytic_mean:.3f}")
    for j in range(k + 1):
        print(f"  n = {j}: measured {hist[j]:.4f}  analytic {law[j]:.4f}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (pip install 'specgguf[plot]'): no PNG written")
        return
    os.makedirs(os.path.dirname(args.png) or ".", exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    x = np.arange(k + 1)
    ax.bar(x - 0.2, hist, 0.4, label=f"measured ({args.rounds} rounds)")
    ax.bar(x + 0.2, law, 0.4, label="analytic a^n (1-a), a^K")
    ax.set_xlabel("accepted draft tokens per round")
    ax.set_ylabel("fraction of rounds")
    ax.set_title(f"V={v}, K={k}, a={a:.3f}: mean {lengths.mean():.2f} vs {analytic_mean:.2f}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)
    print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
