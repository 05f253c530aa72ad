"""The first generation on a pair this machine has never seen, against the next.

Each repetition is a fresh process with an empty state folder (no stored
costs, no learned acceptance, no file identities): it loads the default pair,
then times one generation and the same generation again. "reset" empties the
KV caches between the two (the state effect alone); "as used" keeps them (a
repeated prompt is then cached, as in a chat or a server). The load itself,
which includes identifying the files by sha256 once, is timed apart. The
lookup's memory of earlier requests is off: it would replay the first answer
to the same prompt asked again (3.5x, a regime no new chat meets).

    .venv/bin/python bench/first_call.py [--reps 5] [--tokens 96] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

CHILD = """
import json, sys, time
import specgguf
t0 = time.perf_counter()
llm = specgguf.SpeculativeLlama("smollm2-135m-f32", "smollm2-135m-q4_1", n_threads=int(sys.argv[2]),
                                lookup_memory=0)
load = time.perf_counter() - t0
m = [{"role": "user", "content": "Why is the sky blue? Explain it to a child."}]
out = {"load": load}
for mode in ("reset", "as used"):
    times = []
    for _ in range(2):
        if mode == "reset":
            llm.reset()
        t0 = time.perf_counter()
        r = llm.generate(m, max_tokens=int(sys.argv[1]), k="auto")
        times.append(time.perf_counter() - t0)
    out[mode] = times
    out["k_" + mode] = r.stats["k_hist"]
print(json.dumps(out))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    rows = []
    for rep in range(args.reps):
        env = dict(os.environ, SPECGGUF_STATE=tempfile.mkdtemp(prefix="specgguf-first-"))
        out = subprocess.run([sys.executable, "-c", CHILD, str(args.tokens), str(args.threads)], env=env,
                             capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(r)
        print(f"rep {rep + 1}: load {r['load']:.2f} s; reset: first {r['reset'][0]:.2f} s, next "
              f"{r['reset'][1]:.2f} s ({r['reset'][0] / r['reset'][1]:.2f}x); as used: first "
              f"{r['as used'][0]:.2f} s, next {r['as used'][1]:.2f} s", flush=True)
    for mode in ("reset",):
        ratios = [r[mode][0] / r[mode][1] for r in rows]
        print(f"\nfirst / next generation ({mode} between them), {args.tokens} tokens, default pair: median "
              f"{np.median(ratios):.2f}x, range {min(ratios):.2f}-{max(ratios):.2f}x over {len(rows)} fresh processes")
    print(f"load (with sha256 identification of both files): median {np.median([r['load'] for r in rows]):.2f} s")


if __name__ == "__main__":
    main()
