"""How much identical fresh processes differ, and which load option changes it.

Plain decoding (k = 0) of the same greedy chat answer in N fresh Python
processes per variant, variants taken in turns (A B C A B C ...) so that the
machine's drift falls on all of them alike. Each process loads the default
pair's target (and, in the variants that say so, the draft), generates one
warm-up answer, then times --reps answers; it prints its median tokens/s.
Reported per variant: the median over processes and the range (max/min).

Variants (what specgguf controls about a process):
  mmap          the weights mapped from the file (llama.cpp's default)
  no-mmap       the weights read into the process's own memory
  mmap+draft    as mmap, with the draft model loaded beside (as serve -k 0)

    .venv/bin/python bench/process_spread.py [--procs 6] [--tokens 128] [--variants mmap,no-mmap,mmap+draft]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, os, statistics, sys, time
import specgguf
from specgguf.llama import models
variant, tokens, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tname, dname = models.default_pair()
load = dict(n_threads=int(os.environ.get("THREADS", os.cpu_count())))
if variant == "no-mmap":  # no option for it yet: the loader, with llama.cpp's use_mmap=False
    import functools
    from specgguf.llama import pair
    pair.load_llama = functools.partial(pair.load_llama, use_mmap=False)
llm = specgguf.SpeculativeLlama(tname, dname if variant == "mmap+draft" else "ngram", **load)
msgs = [{"role": "user", "content": "Write a detailed essay about the history of the printing press."}]
llm.generate(msgs, max_tokens=16, k=0)
rates = []
for _ in range(reps):
    r = llm.generate(msgs, max_tokens=tokens, k=0)
    rates.append(r.stats["completion_tokens"] / r.stats["seconds"])
print(json.dumps({"tps": statistics.median(rates)}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--procs", type=int, default=6, help="fresh processes per variant (6)")
    ap.add_argument("--tokens", type=int, default=128, help="tokens per answer (128)")
    ap.add_argument("--reps", type=int, default=3, help="timed answers per process (3)")
    ap.add_argument("--variants", default="mmap,no-mmap,mmap+draft")
    args = ap.parse_args()
    variants = args.variants.split(",")
    env = dict(os.environ, SPECGGUF_STATE=tempfile.mkdtemp(prefix="specgguf-spread-"))
    got = {v: [] for v in variants}
    for i in range(args.procs):
        for v in variants:
            out = subprocess.run([sys.executable, "-c", CHILD, v, str(args.tokens), str(args.reps)], env=env,
                                 check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            got[v].append(json.loads(out.stdout.strip().splitlines()[-1])["tps"])
            print(f"  process {i + 1} {v}: {got[v][-1]:.1f} tok/s", flush=True)
    print(f"\nplain decoding, {args.tokens} tokens, median of {args.reps} answers per process, "
          f"{args.procs} fresh processes per variant, in turns\n")
    print("| variant | tok/s median | range | max/min |")
    print("|---|---|---|---|")
    for v in variants:
        x = got[v]
        print(f"| {v} | {statistics.median(x):.1f} | {min(x):.1f}-{max(x):.1f} | {max(x) / min(x):.2f} |")


if __name__ == "__main__":
    main()
