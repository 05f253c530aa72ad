"""Real work, not only open chat: how fast each draft source decodes the text
people give a local model, against plain decoding in the same sitting.

Workloads, built from text any Python (and Debian) install carries, none
written for the benchmark, the items picked with a fixed seed:

* code-edit: a standard-library function, asked to add type hints, to add a
  docstring, or to rename a variable (the answer reprints the code);
* doc-quote: a documentation page (a README Debian installs with a package,
  else a standard-library module's docstring), asked to repeat a passage;
* second-turn: a code edit's answer in the context, asked to revise it;
* json: a module's docstring, fields extracted under a JSON schema;
* chat: open chat (bench/common.py's prompts).

Modes, each in fresh processes taken in turns (the default pair):
``plain`` (k=0), ``model`` (the draft model alone, k="auto"), ``lookup``
(draft="ngram": the lookup alone), ``default`` (both, as a user gets them).
Each request's tok/s is its completion tokens over its whole time (prompt
included: what a user waits); the table gives medians per workload and
mode, each mode's ratio to plain, the share of tokens each source gave, and
whether greedy texts were identical across modes (they must be).
Regime: the models given on this machine, one request at a time.

    .venv/bin/python bench/workloads.py --items 3 --turns 2 --tokens 128
    .venv/bin/python bench/workloads.py --workload code-edit,doc-quote --temperature 0.8
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from specgguf.cli.workloads import REVISE, WORKLOADS, items  # noqa: E402

MODES = ("plain", "model", "lookup", "default")


def worker(mode: str, a: argparse.Namespace) -> None:
    """One process: load ``mode``'s pair, run every item, print one JSON line per request."""
    from specgguf import SpeculativeLlama
    from specgguf.llama import models
    target = a.target or models.fetch("smollm2-135m-f32")
    draft = a.draft or models.fetch("smollm2-135m-q4_1")
    load = dict(n_ctx=a.ctx, n_threads=a.threads)
    spec = (SpeculativeLlama(target, "ngram", **load) if mode == "lookup" else
            SpeculativeLlama(target, draft, lookup=mode == "default", **load))
    k = 0 if mode == "plain" else "auto"
    settings = dict(max_tokens=a.tokens, temperature=a.temperature, k=k)
    if a.temperature > 0:
        settings["seed"] = 1234
    for workload in a.workload:
        for i, (messages, extra) in enumerate(items(workload, a.items, a.seed)):
            if workload == "second-turn":  # the first turn, untimed, in the context as the user saw it
                first = spec.create_chat_completion(messages, **settings)
                messages = messages + [first["choices"][0]["message"], {"role": "user", "content": REVISE}]
            t0 = time.perf_counter()
            out = spec.create_chat_completion(messages, **settings, **extra)
            seconds = time.perf_counter() - t0
            text = out["choices"][0]["message"]["content"] or ""
            print(json.dumps({"workload": workload, "item": i, "mode": mode, "seconds": seconds,
                              "tokens": out["usage"]["completion_tokens"],
                              "sources": out["speculation"].get("tokens_by_source"),
                              "text": hashlib.sha256(text.encode()).hexdigest()[:16]}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", type=lambda s: s.split(","), default=list(WORKLOADS),
                    help=f"which, comma-separated (default: all: {','.join(WORKLOADS)})")
    ap.add_argument("--modes", type=lambda s: s.split(","), default=list(MODES), help="default: all")
    ap.add_argument("--items", type=int, default=3, help="requests per workload (default %(default)s)")
    ap.add_argument("--turns", type=int, default=1, help="fresh processes per mode, in turns (default %(default)s)")
    ap.add_argument("--tokens", type=int, default=128, help="max tokens per answer (default %(default)s)")
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default); else seeded sampling")
    ap.add_argument("--seed", type=int, default=0, help="which items are picked (default %(default)s)")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    bad = [w for w in a.workload if w not in WORKLOADS] + [m for m in a.modes if m not in MODES]
    if bad:
        ap.error(f"unknown workload or mode: {', '.join(bad)}")
    if a.worker:
        return worker(a.worker, a)
    os.environ.setdefault("SPECGGUF_STATE", tempfile.mkdtemp(prefix="specgguf-bench-"))  # a new user's state
    rows, t0 = [], time.time()
    argv = [a for a in sys.argv[1:]]
    for turn in range(a.turns):
        order = a.modes[turn % len(a.modes):] + a.modes[:turn % len(a.modes)]
        for mode in order:
            env = dict(os.environ, SPECGGUF_STATE=tempfile.mkdtemp(prefix="specgguf-bench-"))
            out = subprocess.run([sys.executable, __file__, *argv, "--worker", mode], env=env,
                                 capture_output=True, text=True)
            if out.returncode:
                sys.exit(f"{mode} failed:\n{out.stderr[-2000:]}")
            rows += [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
            print(f"  turn {turn + 1}/{a.turns}, {mode} done ({time.time() - t0:.0f} s)", file=sys.stderr)
    report(rows, a)


def report(rows: list, a: argparse.Namespace) -> None:
    mode_name = "greedy" if a.temperature == 0 else f"T={a.temperature} seeded"
    print(f"# workloads: {a.items} requests each, up to {a.tokens} tokens, {mode_name}, {a.turns} turn(s); "
          "tok/s median (ratio to plain); tokens from draft/lookup")
    print("| workload | " + " | ".join(a.modes) + " | identical texts |")
    print("|---|" + "---|" * (len(a.modes) + 1))
    for w in a.workload:
        cells, texts = [], {}
        rate = {m: statistics.median([r["tokens"] / r["seconds"] for r in rows if r["workload"] == w and
                                      r["mode"] == m]) for m in a.modes}
        for m in a.modes:
            mine = [r for r in rows if r["workload"] == w and r["mode"] == m]
            src = {s: sum((r["sources"] or {}).get(s, 0) for r in mine) for s in ("draft", "lookup")}
            total = sum(r["tokens"] for r in mine) or 1
            ratio = f" ({rate[m] / rate['plain']:.2f}x)" if "plain" in rate and m != "plain" else ""
            cells.append(f"{rate[m]:.1f}{ratio} {100 * src['draft'] / total:.0f}%/{100 * src['lookup'] / total:.0f}%")
            for r in mine:
                texts.setdefault(r["item"], set()).add(r["text"])
        same = sum(len(v) == 1 for v in texts.values())
        print(f"| {w} | " + " | ".join(cells) + f" | {same}/{len(texts)} |")


if __name__ == "__main__":
    main()
