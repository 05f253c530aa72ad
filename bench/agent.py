"""An agent's loop through the real ``openai`` client: tools declared with
JSON-schema parameters, the model's calls run for real and their results
fed back, the whole context re-sent every turn, against ``specgguf serve``
and llama-server ``--jinja`` with the same model files, threads and context.

The tools read the Python standard library on this machine (none written
for the benchmark): ``list_functions(module)``, ``read_source(module,
function)``, ``search_docs(module, words)``. Each task asks about one
module's function (picked with a fixed seed) and runs a fixed plan of
turns: two turns that must call a tool (``tool_choice="required"``), then
an answer (``"none"``); whatever the model calls is run, a bad call gets an
error text back, as an agent framework does (a turn with no call where one
was required is followed by the user's "Use the tools.").

Configurations, each in fresh processes taken in turns: ``sg`` (specgguf's
defaults), ``sg-k0`` (its plain decoding), ``ls`` (llama-server, no draft),
``ls-draft`` (``-md``), ``ls-ngram`` (``--spec-type ngram-mod``, when the
binary has it). Per configuration: the median over turns of tokens per
second (completion tokens over the turn's whole time, the re-sent context
included) and of seconds per turn, with ranges over processes; the ratio
to the best llama-server configuration of the same sitting; and whether
specgguf's transcript equals its own ``-k 0`` one (greedy: it must); and
how many turns that required a call made one (the servers write different
texts: a server that answers in words where a call was required writes
longer turns, so its tok/s is not the same work).
Regime: one client, greedy, the models given, this machine.

    .venv/bin/python bench/agent.py --tasks 3 --procs 2
    .venv/bin/python bench/agent.py --chat-template-file examples/templates/hermes-tools.jinja
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vs_llama_server as vs  # noqa: E402  (bench/: its server commands and fresh processes)

MODULES = ("textwrap", "shlex", "fnmatch", "posixpath", "calendar", "difflib", "string", "csv", "pprint", "glob")
TOOLS = [
    {"type": "function", "function": {
        "name": "list_functions", "description": "List the public functions a Python standard-library module defines",
        "parameters": {"type": "object", "properties": {"module": {"type": "string", "description": "e.g. textwrap"}},
                       "required": ["module"]}}},
    {"type": "function", "function": {
        "name": "read_source", "description": "Read the source code of one function of a standard-library module",
        "parameters": {"type": "object", "properties": {"module": {"type": "string"}, "function": {"type": "string"}},
                       "required": ["module", "function"]}}},
    {"type": "function", "function": {
        "name": "search_docs", "description": "Lines of a module's documentation that contain some words",
        "parameters": {"type": "object", "properties": {"module": {"type": "string"},
                                                        "words": {"type": "array", "items": {"type": "string"},
                                                                  "minItems": 1, "maxItems": 4}},
                       "required": ["module", "words"]}}},
]
PLAN = ("required", "required", "none")


def _module(name):
    if name not in MODULES:
        raise ValueError(f"unknown module {name!r}; known: {', '.join(MODULES)}")
    return importlib.import_module(name)


def run_tool(name: str, arguments: str) -> str:
    """The tool's real answer, or an error text (as an agent framework returns it)."""
    try:
        args = json.loads(arguments)
        mod = _module(args.get("module"))
        if name == "list_functions":
            return ", ".join(n for n, f in inspect.getmembers(mod, inspect.isfunction)
                             if not n.startswith("_") and f.__module__ == mod.__name__)
        if name == "read_source":
            return inspect.getsource(getattr(mod, args["function"]))[:3000]
        if name == "search_docs":
            words = [w.lower() for w in args["words"]]
            lines = [ln for ln in (inspect.getdoc(mod) or "").splitlines() if any(w in ln.lower() for w in words)]
            return "\n".join(lines[:20]) or "no line matches"
        return f"error: no tool named {name}"
    except Exception as e:  # noqa: BLE001  (the model's arguments may be anything)
        return f"error: {type(e).__name__}: {e}"


def tasks(n: int, seed: int) -> list:
    rng = random.Random(seed)
    out = []
    for mod in rng.sample(MODULES, n):
        m = importlib.import_module(mod)
        funcs = sorted(f for f, v in inspect.getmembers(m, inspect.isfunction)
                       if not f.startswith("_") and v.__module__ == mod)
        out.append(f"In the Python module {mod}, what does the function {rng.choice(funcs)} do? "
                   "Use the tools to look at the module and read the function's source, then explain it.")
    return out


def agent(url: str, task: str, tokens: int) -> tuple:
    """One task's loop: ``([(completion tokens, seconds, call required, call made)]
    per turn, transcript)``."""
    import openai
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    messages = [{"role": "user", "content": task}]
    turns = []
    for choice in PLAN:
        t0 = time.perf_counter()
        r = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, tool_choice=choice,
                                           temperature=0, max_tokens=tokens, seed=1)
        msg = r.choices[0].message
        turns.append((r.usage.completion_tokens, time.perf_counter() - t0,
                      choice == "required", bool(msg.tool_calls)))
        calls = [{"id": c.id, "type": "function", "function": {"name": c.function.name,
                                                               "arguments": c.function.arguments}}
                 for c in msg.tool_calls or []]
        messages.append({"role": "assistant", "content": msg.content or "", **({"tool_calls": calls} if calls else {})})
        for c in calls:
            messages.append({"role": "tool", "tool_call_id": c["id"],
                             "content": run_tool(c["function"]["name"], c["function"]["arguments"])})
        if not calls:  # no call where one was required: the loop goes on as a user would push it
            messages.append({"role": "user", "content": "Use the tools."})
    transcript = [(m["role"], m.get("content"), [c["function"] for c in m.get("tool_calls", [])]) for m in messages]
    return turns, transcript


def has_ngram_mod(binary: str) -> bool:
    out = subprocess.run([binary, "--help"], capture_output=True, text=True)
    return "ngram-mod" in out.stdout + out.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=3)
    ap.add_argument("--procs", type=int, default=2, help="fresh processes per configuration, taken in turns")
    ap.add_argument("--tokens", type=int, default=128, help="max tokens per turn")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--draft-n-max", type=int, default=16)
    ap.add_argument("--configs", default="sg,sg-k0,ls,ls-draft,ls-ngram")
    ap.add_argument("--llama-server", help="llama-server binary (default: scripts/build_llama_server.sh)")
    ap.add_argument("--chat-template-file", help="a chat template for both servers (default: the GGUF's; "
                    "examples/templates/hermes-tools.jinja renders tools for ChatML models)")
    ap.add_argument("--target", help="target GGUF (default: the default pair's)")
    ap.add_argument("--draft", help="draft GGUF (default: the default pair's)")
    args = ap.parse_args()
    args.jinja = True  # llama-server renders and parses tools only with --jinja
    from specgguf.llama import models
    target = Path(args.target or models.fetch("smollm2-135m-f32"))
    draft = Path(args.draft or models.fetch("smollm2-135m-q4_1"))
    configs = args.configs.split(",")
    if any(c.startswith("ls") for c in configs):
        args.llama_server = args.llama_server or vs.llama_server_binary()
        if "ls-ngram" in configs and not has_ngram_mod(args.llama_server):
            configs.remove("ls-ngram")
    work = tasks(args.tasks, args.seed)
    rates = {c: [] for c in configs}
    seconds = {c: [] for c in configs}
    per_proc = {c: [] for c in configs}
    transcripts, calls = {}, {}
    with httpx.Client(timeout=600) as http:
        for p in range(args.procs):
            for c in configs:
                with vs.fresh_server(c, args, target, draft, http, 1) as url:
                    turns, texts = [], []
                    for task in work:
                        t, tr = agent(url, task, args.tokens)
                        turns += t
                        texts.append(tr)
                rates[c] += [n / s for n, s, _, _ in turns if n]
                seconds[c] += [s for _, s, _, _ in turns]
                per_proc[c].append(statistics.median(n / s for n, s, _, _ in turns if n))
                calls[c] = (sum(made for _, _, req, made in turns if req), sum(req for _, _, req, _ in turns))
                transcripts.setdefault(c, texts)
                print(f"  process {p + 1}/{args.procs} {c}: {per_proc[c][-1]:.1f} tok/s per turn (median)",
                      file=sys.stderr, flush=True)
    ls_best = max((statistics.median(rates[c]) for c in configs if c.startswith("ls")), default=None)
    print(f"agent loop: {args.tasks} tasks x {len(PLAN)} turns ({', '.join(PLAN)}), <= {args.tokens} tokens a turn, "
          f"greedy, {args.procs} fresh processes per configuration, {target.name} / {draft.name}, "
          f"{args.threads} threads")
    print(f"{'config':10} {'tok/s per turn':>15} {'range (processes)':>18} {'s per turn':>11} {'vs ls best':>11} "
          f"{'calls made where required':>26}")
    for c in configs:
        r = statistics.median(rates[c])
        ratio = f"{r / ls_best:.2f}x" if ls_best else "-"
        print(f"{c:10} {r:15.1f} {min(per_proc[c]):8.1f}-{max(per_proc[c]):<9.1f} "
              f"{statistics.median(seconds[c]):11.2f} {ratio:>11} {calls[c][0]:>19} of {calls[c][1]}")
    if "sg" in transcripts and "sg-k0" in transcripts:
        same = sum(a == b for a, b in zip(transcripts["sg"], transcripts["sg-k0"]))
        print(f"specgguf's transcripts equal to its -k 0: {same} of {len(work)}")


if __name__ == "__main__":
    main()
