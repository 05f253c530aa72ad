"""k="auto" on every path a user can take, from an empty state folder.

Paths: the CLI (one process per call, as a shell user runs it), ``generate``
with model paths, ``generate`` with ``llama_cpp.Llama`` objects,
``SpeculativeLlama``, ``specgguf serve`` driven by the openai client, and
``Llama(draft_model=DraftModel(...))``. Each repetition is a fresh process
(fresh ``serve``, fresh CLI processes) with its own empty state folder: no
stored costs, no learned acceptance, no calibration. It is how a new user
meets the product; nothing is warmed or calibrated first.

In that process, calls of --tokens tokens go through the path in turns: for
each prompt, every K asked for (``auto`` and fixed K) in a rotating order,
so every K sees the same prompts, seeds and stretch of the machine's speed.
The lookup's memory of earlier requests is off (``lookup_memory=0``,
``--lookup-memory 0``): each prompt is asked once per K, and a memory would
replay the first answer to the later calls (3x, a regime no new chat
meets; ``bench/workloads.py --turns 2`` measures that one). The lookup
over the current text stays on, as a user gets it.
k="auto" learns across the calls as it would for a user (the fixed-K calls
touch nothing it learns). Printed per path and temperature: tokens/s per K
(median over repetitions of each process's total), and two ratios measured
in the same processes: auto / the best fixed K (the issue's good-draft
target: >= 0.95) and auto / plain decoding (k=0; the poor draft's floor:
>= 0.98), and the share of auto's time its draft spent being measured (its
reading of a prompt scored against the target's: what a fresh process pays
to learn the draft, and a CLI call where the state folder does not price the
draft yet or says it may pay; the paths whose results carry
``measure_seconds``). ``--control K`` adds a second arm of fixed K: its ratio to the best
fixed K is what a rule that always chose K reads, the measurement's own floor
(the best of several noisy arms reads high). For DraftModel, k=0 is
DraftModel(k=0) on the same Llama (llama-cpp-python then decodes one token a
step, with logits_all as any draft forces).

Regime: the default SmolLM2 pair on this machine (an F32 135M target whose
Q4_1 draft costs about half a target step: drafting's ceiling is 1.0-1.4x by machine;
--draft smollm2-135m-q2_k is the poor draft). Timings run alone; nothing
else may use the CPU.

    .venv/bin/python bench/paths.py [--paths cli,generate,generate-llama,speculative-llama,serve,draftmodel]
        [--draft smollm2-135m-q4_1] [--ks auto,0,4,8] [--control 0] [--temps 0,0.8] [--reps 2] [--prompts 4] [--tokens 96]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from common import PROMPTS, free_port  # bench/common.py

ROOT = Path(__file__).resolve().parent.parent
PATHS = ("cli", "generate", "generate-llama", "speculative-llama", "serve", "draftmodel")


AGAIN = " again"  # a control arm's label: "0 again" is k=0 in a second arm


def kval(k: str):
    """An arm's K: "auto", a fixed K, or a control's (the same K in a second arm)."""
    k = k.removesuffix(AGAIN)
    return k if k == "auto" else int(k)


class Caller:
    """One path, loaded in this process: ``call(prompt, k, temp, seed) -> (tokens, seconds)``."""

    def __init__(self, path: str, target: str, draft: str, args) -> None:
        import specgguf
        from specgguf.llama import models
        self.path, self.args, self.n = path, args, args.tokens
        self.names = (target, draft)
        self.files = (str(models.resolve_model(target)), str(models.resolve_model(draft)))
        self.proc = None
        if path == "speculative-llama":
            self.llm = specgguf.SpeculativeLlama(target, draft, n_threads=args.threads, lookup_memory=0)
        elif path == "generate-llama":
            import llama_cpp
            load = lambda f: llama_cpp.Llama(f, n_ctx=2048, n_threads=args.threads, verbose=False)
            self.objs = (load(self.files[0]), load(self.files[1]))
        elif path == "draftmodel":
            import llama_cpp
            self.drafts = {k: specgguf.DraftModel(draft, k=kval(k), n_threads=args.threads, n_ctx=2048)
                           for k in args.arms}
            self.llm = llama_cpp.Llama(self.files[0], n_ctx=2048, n_threads=args.threads, verbose=False,
                                       draft_model=self.drafts[args.ks[0]])
        elif path == "serve":
            self._start_server()

    def _start_server(self) -> None:
        import httpx
        import openai
        port = free_port()
        self.proc = subprocess.Popen([sys.executable, "-m", "specgguf", "serve", "--port", str(port),
                                      "--threads", str(self.args.threads), "--lookup-memory", "0",
                                      *self.pair_args()],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            raise RuntimeError("specgguf serve did not come up")
        self.client = openai.OpenAI(base_url=base + "/v1", api_key="none")

    def pair_args(self) -> list:
        """The pair on a command line: the CLI and serve must run the pair asked for, not the default."""
        return ["--target", self.names[0], "--draft", self.names[1]]

    def close(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=30)

    def call(self, prompt: str, k: str, temp: float, seed: int) -> tuple:
        import specgguf
        msgs = [{"role": "user", "content": prompt}]
        measure = None  # seconds the draft's measurement took, where the path reports it
        t0 = time.perf_counter()
        if self.path == "cli":
            out = subprocess.run([sys.executable, "-m", "specgguf", "-p", prompt, "--chat", "-n", str(self.n),
                                  "-k", str(kval(k)), "--temp", str(temp), "--seed", str(seed), "--json",
                                  "--threads", str(self.args.threads), *self.pair_args()],
                                 capture_output=True, text=True, check=True)
            s = json.loads(out.stdout)["stats"]
            return s["completion_tokens"], s["seconds"], s["measure_seconds"]  # the generation, not the load
        if self.path == "speculative-llama":
            r = self.llm.generate(msgs, max_tokens=self.n, k=kval(k), temperature=temp, seed=seed)
            n, measure = len(r.tokens), r.stats["measure_seconds"]
        elif self.path in ("generate", "generate-llama"):
            t, d = self.objs if self.path == "generate-llama" else self.names
            r = specgguf.generate(msgs, target=t, draft=d, max_tokens=self.n, k=kval(k), temperature=temp,
                                  seed=seed, n_threads=self.args.threads, lookup_memory=0)
            n, measure = len(r.tokens), r.stats["measure_seconds"]
        elif self.path == "serve":
            r = self.client.chat.completions.create(model="specgguf", messages=msgs, max_tokens=self.n,
                                                    temperature=temp, seed=seed, extra_body={"k": kval(k)})
            n = r.usage.completion_tokens
        else:  # draftmodel
            self.llm.draft_model = self.drafts[k]
            r = self.llm.create_chat_completion(msgs, max_tokens=self.n, temperature=temp, seed=seed)
            n = r["usage"]["completion_tokens"]
        return n, time.perf_counter() - t0, measure


def child(args) -> None:
    caller = Caller(args.child, *args.pair, args)
    try:
        caller.call(PROMPTS[-1], args.ks[-1], 0.0, 0)  # loads, first-touch of the weights: not timed
        arms = args.arms
        for temp in args.temps:
            for i, prompt in enumerate(PROMPTS[:args.prompts]):
                order = arms[i % len(arms):] + arms[:i % len(arms)]
                for k in order:
                    n, s, m = caller.call(prompt, k, temp, 1000 + i)
                    print(json.dumps({"temp": temp, "k": k, "prompt": i, "tokens": n, "seconds": s, "measure": m}),
                          flush=True)
    finally:
        caller.close()


def run_child(path: str, args) -> list:
    env = dict(os.environ, SPECGGUF_STATE=tempfile.mkdtemp(prefix="specgguf-paths-"))
    cmd = [sys.executable, __file__, "--child", path, "--draft", args.draft, "--target", args.target,
           "--ks", ",".join(args.ks), "--temps", ",".join(map(str, args.temps)), "--prompts", str(args.prompts),
           "--tokens", str(args.tokens), "--threads", str(args.threads), "--control", args.control]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{path} failed:\n{out.stderr[-3000:]}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def summarize(path: str, temp: float, procs: list, ks: list) -> str:
    """One table row: tokens/s per K (median over processes), and auto against the best fixed K and k=0.

    With a control arm (the same fixed K again), control / the best fixed K is what a rule that always
    chose that K would read: the best of several noisy arms is biased up, and this measures by how much.
    """
    rates = {k: [] for k in ks}
    vs_best, vs_plain, control = [], [], []
    for rows in procs:
        mine = [r for r in rows if r["temp"] == temp]
        per = {k: sum(r["tokens"] for r in mine if r["k"] == k) / sum(r["seconds"] for r in mine if r["k"] == k)
               for k in ks}
        for k in ks:
            rates[k].append(per[k])
        fixed = [k for k in ks if k != "auto" and not k.endswith(AGAIN)]
        if "auto" in per and fixed:
            vs_best.append(per["auto"] / max(per[k] for k in fixed))
        for k in ks:
            if k.endswith(AGAIN) and fixed:
                control.append(per[k] / max(per[j] for j in fixed))
        if "auto" in per and "0" in per:
            vs_plain.append(per["auto"] / per["0"])
    auto = [r for rows in procs for r in rows if r["temp"] == temp and r["k"] == "auto"]
    known = [r for r in auto if r.get("measure") is not None]
    learn = f"{100 * sum(r['measure'] for r in known) / sum(r['seconds'] for r in known):.1f}%" if known else "-"
    cells = " | ".join(f"{statistics.median(rates[k]):.1f}" for k in ks)
    ratio = lambda xs: f"{statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})" if xs else "-"
    tail = f" {ratio(control)} |" if control else ""
    return f"| {path} | {temp:g} | {cells} | {ratio(vs_best)} | {ratio(vs_plain)} | {len(auto)} | {learn} |{tail}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--paths", default=",".join(PATHS))
    ap.add_argument("--target", default="smollm2-135m-f32")
    ap.add_argument("--draft", default="smollm2-135m-q4_1")
    ap.add_argument("--ks", default="auto,0,4,8", help="K per call: auto and fixed K, comma-separated")
    ap.add_argument("--control", default="", metavar="K",
                    help="add a second arm of fixed K (e.g. 0): its ratio to the best fixed K is the spread "
                         "a rule that always picked K would read")
    ap.add_argument("--temps", default="0,0.8")
    ap.add_argument("--reps", type=int, default=2, help="fresh processes per path")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.ks = args.ks.split(",")
    args.arms = args.ks + ([args.control + AGAIN] if args.control else [])
    args.temps = [float(t) for t in args.temps.split(",")]
    args.pair = (args.target, args.draft)
    if args.child:
        return child(args)
    paths = args.paths.split(",")
    bad = [p for p in paths if p not in PATHS]
    if bad:
        ap.error(f"unknown path(s) {bad}; choose from {', '.join(PATHS)}")
    results = {p: [] for p in paths}
    for rep in range(args.reps):
        for p in paths[rep % len(paths):] + paths[:rep % len(paths)]:
            t0 = time.time()
            results[p].append(run_child(p, args))
            print(f"# rep {rep + 1}/{args.reps} {p}: {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    print(f"\n{args.target} + {args.draft}, {args.tokens} tokens x {args.prompts} prompts per K per process, "
          f"{args.reps} fresh processes per path, each from an empty state folder\n")
    control = f" k={args.control} again / best fixed K |" if args.control else ""
    print("| path | T | " + " | ".join(f"k={k} tok/s" for k in args.arms)
          + " | auto / best fixed K | auto / k=0 | auto calls | auto's time measuring the draft |" + control)
    print("|---|---|" + "---|" * (len(args.arms) + 4) + ("---|" if control else ""))
    for p in paths:
        for temp in args.temps:
            print(summarize(p, temp, results[p], args.arms))


if __name__ == "__main__":
    main()
