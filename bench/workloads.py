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
(draft="ngram": the lookup alone), ``default`` (both, as a user gets them);
and llama.cpp's llama-server built from the same llama.cpp
(scripts/build_llama_server.sh), the same files, threads and context,
through its chat completions on loopback: ``ls`` (no draft), ``ls-draft``
(``-md``, --draft-n-max), ``ls-ngram`` (``--spec-type ngram-mod``),
``ls-ngram-cache`` (``--spec-type ngram-cache``; both --ngram-n-max),
``ls-draft-ngram`` (``-md`` with ngram-mod).
Each request's tok/s is its completion tokens over its whole time (prompt
included: what a user waits); a second table leaves out the prompt's
evaluation (the answer's ``timings.prompt_ms``, the same work in every
mode), as llama-server's ``predicted_per_second`` does. The first gives
medians per workload and mode, each mode's ratio to plain, the share of
tokens each source gave, and whether greedy texts were identical across
modes (they must be).
Regime: the models given on this machine, one request at a time; with
``--clients N``, N at once, and then every mode runs as a server with N
slots (specgguf's as ``specgguf serve --parallel N``: ``plain`` is ``-k 0``,
``model`` ``--no-lookup``, ``lookup`` ``--draft ngram``), the speed being
each workload's completion tokens over the wall time of all its requests.

    .venv/bin/python bench/workloads.py --items 3 --turns 2 --tokens 128
    .venv/bin/python bench/workloads.py --modes plain,default,ls,ls-draft,ls-ngram,ls-ngram-cache,ls-draft-ngram
    .venv/bin/python bench/workloads.py --workload code-edit,doc-quote --temperature 0.8
    .venv/bin/python bench/workloads.py --clients 4 --items 8 --modes plain,default,ls,ls-ngram
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
from typing import Optional

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from specgguf.cli.workloads import REVISE, WORKLOADS, items  # noqa: E402

MODES = ("plain", "model", "lookup", "default")
SERVERS = ("ls", "ls-draft", "ls-ngram", "ls-ngram-cache", "ls-draft-ngram")  # llama-server's configurations


def work(a: argparse.Namespace):
    """``(workload, item, messages, extra)`` in order: the items of each workload."""
    for workload in a.workload:
        for i, (messages, extra) in enumerate(items(workload, a.items, a.seed)):
            yield workload, i, messages, extra


SERVED = {"plain": "sg-k0", "model": "sg-model", "lookup": "sg-lookup", "default": "sg"}  # with --clients > 1


def server_rows(mode: str, a: argparse.Namespace) -> list:
    """One fresh server of configuration ``mode`` (llama-server's, or with
    --clients > 1 ``specgguf serve --parallel N``): each workload's items
    through its chat completions, ``a.clients`` at once (a second turn's
    first, untimed, from the same server). One row per request, and per
    workload one ``wall`` row: the seconds from its first request to its last
    answer, what aggregate tok/s is taken over."""
    import concurrent.futures as cf

    import vs_llama_server as vs  # bench/vs_llama_server.py
    from specgguf.llama import models
    target = a.target or models.fetch("smollm2-135m-f32")  # as worker() takes them
    draft = a.draft or models.fetch("smollm2-135m-q4_1")
    a.threads = a.threads or os.cpu_count()
    rows = []
    with vs.bench_client() as client, \
            vs.fresh_server(SERVED.get(mode, mode), a, target, draft, client, a.clients) as url:
        vs.request(client, url, "Hello!", 16, a.temperature, 7)  # warm-up: first-touch of the weights

        def ask(messages, extra):
            body = {"model": "m", "messages": messages, "max_tokens": a.tokens, "temperature": a.temperature,
                    "seed": 1234, **extra}
            t0 = time.perf_counter()
            r = client.post(url + "/v1/chat/completions", json=body)
            r.raise_for_status()
            return r.json(), time.perf_counter() - t0

        def answer(job):
            workload, i, messages, extra = job
            if workload == "second-turn":
                first, _ = ask(messages, {})
                messages = messages + [first["choices"][0]["message"], {"role": "user", "content": REVISE}]
            return workload, i, messages, extra

        def timed(job):
            workload, i, messages, extra = job
            out, seconds = ask(messages, extra)
            text = out["choices"][0]["message"].get("content") or ""
            return {"workload": workload, "item": i, "mode": mode, "seconds": seconds,
                    "tokens": out["usage"]["completion_tokens"], "prompt_seconds": prompt_seconds(out),
                    "sources": (out.get("speculation") or {}).get("tokens_by_source"),
                    "text": hashlib.sha256(text.encode()).hexdigest()[:16]}

        with cf.ThreadPoolExecutor(a.clients) as pool:
            for workload in a.workload:
                jobs = list(pool.map(answer, [j for j in work(a) if j[0] == workload]))
                t0 = time.perf_counter()
                rows += list(pool.map(timed, jobs))
                rows.append({"workload": workload, "mode": mode, "wall": time.perf_counter() - t0})
    return rows


def prompt_seconds(out: dict) -> Optional[float]:
    """The prompt's evaluation as the answer's ``timings`` give it (llama-server's
    ``prompt_ms``; specgguf's is its first round's target forward, which reads
    the prompt): the same work in every mode, which decode speed leaves out.
    None where the answer carries no timings (its decode speed is not shown)."""
    ms = (out.get("timings") or {}).get("prompt_ms")
    return None if ms is None else float(ms) / 1e3


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
    for workload, i, messages, extra in work(a):
        if workload == "second-turn":  # the first turn, untimed, in the context as the user saw it
            first = spec.create_chat_completion(messages, **settings)
            messages = messages + [first["choices"][0]["message"], {"role": "user", "content": REVISE}]
        t0 = time.perf_counter()
        out = spec.create_chat_completion(messages, **settings, **extra)
        seconds = time.perf_counter() - t0
        text = out["choices"][0]["message"]["content"] or ""
        print(json.dumps({"workload": workload, "item": i, "mode": mode, "seconds": seconds,
                          "tokens": out["usage"]["completion_tokens"], "prompt_seconds": prompt_seconds(out),
                          "sources": out["speculation"].get("tokens_by_source"),
                          "text": hashlib.sha256(text.encode()).hexdigest()[:16]}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", type=lambda s: s.split(","), default=list(WORKLOADS),
                    help=f"which, comma-separated (default: all: {','.join(WORKLOADS)})")
    ap.add_argument("--modes", type=lambda s: s.split(","), default=list(MODES),
                    help=f"default: {','.join(MODES)}; llama-server's: {','.join(SERVERS)}")
    ap.add_argument("--draft-n-max", type=int, default=4, help="llama-server -md's --spec-draft-n-max (4)")
    ap.add_argument("--ngram-n-max", type=int, default=16, help="llama-server's n-gram drafts' n-max (16)")
    ap.add_argument("--llama-server", help="llama-server binary (default: scripts/build_llama_server.sh)")
    ap.add_argument("--items", type=int, default=3, help="requests per workload (default %(default)s)")
    ap.add_argument("--clients", type=int, default=1,
                    help="requests at once (default 1: specgguf in process; more: every mode as a server "
                         "with that many slots, specgguf's through `specgguf serve --parallel N`)")
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
    bad = [w for w in a.workload if w not in WORKLOADS] + [m for m in a.modes if m not in MODES + SERVERS]
    if bad:
        ap.error(f"unknown workload or mode: {', '.join(bad)}")
    if a.worker:
        return worker(a.worker, a)
    os.environ.setdefault("SPECGGUF_STATE", tempfile.mkdtemp(prefix="specgguf-bench-"))  # a new user's state
    if any(m in SERVERS for m in a.modes) and not a.llama_server:
        import vs_llama_server as vs
        a.llama_server = vs.llama_server_binary()
    rows, t0 = [], time.time()
    argv = [a for a in sys.argv[1:]]
    for turn in range(a.turns):
        order = a.modes[turn % len(a.modes):] + a.modes[:turn % len(a.modes)]
        for mode in order:
            if mode in SERVERS or a.clients > 1:
                new = server_rows(mode, a)
            else:
                env = dict(os.environ, SPECGGUF_STATE=tempfile.mkdtemp(prefix="specgguf-bench-"))
                out = subprocess.run([sys.executable, __file__, *argv, "--worker", mode], env=env,
                                     capture_output=True, text=True)
                if out.returncode:
                    sys.exit(f"{mode} failed:\n{out.stderr[-2000:]}")
                new = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
            rows += [dict(r, turn=turn) for r in new]
            print(f"  turn {turn + 1}/{a.turns}, {mode} done ({time.time() - t0:.0f} s)", file=sys.stderr)
    report(rows, a)


def tok_s(rows: list, w: str, m: str, decode: bool = False) -> float:
    """Mode m's speed on workload w: with several clients, each turn's
    completion tokens over its wall time, median over turns; else the median
    of each request's tok/s (``decode``: its time less the prompt's
    evaluation; nan if a request's answer did not say it)."""
    mine = [r for r in rows if r["workload"] == w and r["mode"] == m]
    walls = [r for r in mine if "wall" in r]
    if walls and not decode:
        return statistics.median(sum(r.get("tokens", 0) for r in mine if r["turn"] == x["turn"]) / x["wall"]
                                 for x in walls)
    asked = [r for r in mine if "tokens" in r]
    if decode and any(r.get("prompt_seconds") is None for r in asked):
        return float("nan")
    return statistics.median(r["tokens"] / (r["seconds"] - (r["prompt_seconds"] if decode else 0.0)) for r in asked)


def cell(rate: dict, m: str) -> str:
    """Mode m's speed and, beside plain's, its ratio to it."""
    if rate[m] != rate[m]:  # nan: not measured
        return "-"
    return f"{rate[m]:.1f}" + (f" ({rate[m] / rate['plain']:.2f}x)" if "plain" in rate and m != "plain" else "")


def report(rows: list, a: argparse.Namespace) -> None:
    mode_name = "greedy" if a.temperature == 0 else f"T={a.temperature} seeded"
    load = "one at a time: tok/s median per request" if a.clients == 1 else \
        f"{a.clients} clients at once: aggregate tok/s, median over turns"
    print(f"# workloads: {a.items} requests each, up to {a.tokens} tokens, {mode_name}, {a.turns} turn(s), "
          f"{load} (ratio to plain); tokens from draft/lookup")
    print("| workload | " + " | ".join(a.modes) + " | identical texts |")
    print("|---|" + "---|" * (len(a.modes) + 1))
    for w in a.workload:
        cells, texts = [], {}
        rate = {m: tok_s(rows, w, m) for m in a.modes}
        for m in a.modes:
            mine = [r for r in rows if r["workload"] == w and r["mode"] == m and "tokens" in r]
            src = {s: sum((r["sources"] or {}).get(s, 0) for r in mine) for s in ("draft", "lookup")}
            total = sum(r["tokens"] for r in mine) or 1
            shares = "" if m in SERVERS else f" {100 * src['draft'] / total:.0f}%/{100 * src['lookup'] / total:.0f}%"
            cells.append(cell(rate, m) + shares)
            for r in mine if m not in SERVERS else []:  # llama-server's texts need not be specgguf's
                texts.setdefault(r["item"], set()).add(r["text"])
        same = sum(len(v) == 1 for v in texts.values())
        print(f"| {w} | " + " | ".join(cells) + f" | {same}/{len(texts)} |")
    if a.clients == 1:  # the same requests, the prompt's evaluation (the same in every mode) left out
        print("\n# decode speed: completion tokens over each request's time after the prompt's evaluation "
              "(timings.prompt_ms), median (ratio to plain)")
        print("| workload | " + " | ".join(a.modes) + " |")
        print("|---|" + "---|" * len(a.modes))
        for w in a.workload:
            rate = {m: tok_s(rows, w, m, decode=True) for m in a.modes}
            print(f"| {w} | " + " | ".join(cell(rate, m) for m in a.modes) + " |")
        # Whole-request speeds compare like with like only where the answers are as long: llama-server's
        # texts need not be specgguf's, and a request's prompt weighs more in a shorter answer.
        print("\n# the prompt's evaluation (timings.prompt_ms; a cached prefix is not read again), median ms; "
              "completion tokens, median")
        print("| workload | " + " | ".join(a.modes) + " |")
        print("|---|" + "---|" * len(a.modes))
        for w in a.workload:
            mine = [[r for r in rows if r["workload"] == w and r["mode"] == m and "tokens" in r] for m in a.modes]
            ms = [[1e3 * r["prompt_seconds"] for r in x if r.get("prompt_seconds") is not None] for x in mine]
            print(f"| {w} | " + " | ".join((f"{statistics.median(p):.0f} ms" if p else "-") +
                                           f", {statistics.median(r['tokens'] for r in x):.0f}"
                                           for p, x in zip(ms, mine)) + " |")


if __name__ == "__main__":
    main()
