"""Is the target's forward batch-invariant here? Per model type, each
position's logits evaluated one token per forward against the same tokens
evaluated in batches (as a verification round evaluates them), bit for bit.

Model types are derived from the default target (F32) with
``llama_model_quantize`` into a cache folder (deterministic files); the text
is a standard-library module's source. Each setting runs in a fresh process
(llama.cpp's switch is process-wide), with specgguf's batch invariance on
(the default) and off (``SPECGGUF_BATCH_INVARIANT=0``: llama.cpp's stock
kernel choice).

    python bench/invariance.py                      # every type, batches 2, 5, 9, 33
    python bench/invariance.py --types f32,q4_k_m --batches 5
    python bench/invariance.py --cost --types f32        # what it costs: forwards and prompts, on vs off
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import time
from pathlib import Path

FTYPES = {"f32": 0, "f16": 1, "bf16": 32, "q8_0": 7, "q4_0": 2, "q4_1": 3, "q5_k_m": 17, "q4_k_m": 15, "q6_k": 18}


def model_file(kind: str) -> Path:
    """The target in ``kind``, derived once into the state's cache folder."""
    from specgguf.llama.models import resolve_model as resolve
    src = resolve("smollm2-135m-f32")
    if kind == "f32":
        return Path(src)
    out = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specgguf" / "derived" / f"smollm2-135m-{kind}.gguf"
    if not out.exists():
        import llama_cpp
        out.parent.mkdir(parents=True, exist_ok=True)
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype, params.allow_requantize = FTYPES[kind], True
        tmp = out.with_suffix(".part")
        if llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params) != 0:
            raise SystemExit(f"invariance: quantizing to {kind} failed")
        tmp.rename(out)
    return out


def text_ids(llm, n: int) -> list:
    import textwrap
    source = inspect.getsource(textwrap)  # real text on every Python install
    return llm.tokenize(source.encode(), add_bos=True)[:n]


def one(kind: str, batches: list, n: int, extra_bufts: bool) -> dict:
    """In this process: the probe for every batch size."""
    from specgguf.llama.invariance import probe
    from specgguf.llama.model import LlamaModel, load_llama
    llm = load_llama(model_file(kind), n_ctx=1024, **({} if extra_bufts else {"use_extra_bufts": False}))
    model = LlamaModel(llm)
    ids = text_ids(llm, n)
    out = {}
    for b in batches:
        t0 = time.perf_counter()
        out[b] = probe(model, ids, batch=b)
        out[b]["seconds"] = round(time.perf_counter() - t0, 2)
    return out


FORWARDS = (1, 2, 5, 9, 17, 33)       # tokens in a verification forward
PROMPTS = (30, 63, 64, 200, 400)      # tokens of a prompt read in one chunk


def cost(kind: str, reps: int) -> dict:
    """In this process: median seconds of the target's forward of each size
    (after a 100-token context) and of reading a prompt of each size."""
    import statistics
    from specgguf.llama.model import LlamaModel, load_llama
    llm = load_llama(model_file(kind), n_ctx=1024)
    model = LlamaModel(llm)
    ids = text_ids(llm, 600)
    out = {}
    for n in FORWARDS:
        ctx, times = ids[:100], []
        model.eval(ctx, 1)
        for i in range(reps):
            t0 = time.perf_counter()
            new = ids[100 + i % 7:100 + i % 7 + n]  # other tokens each time: nothing is reused
            model.eval(ctx + new, n, proposed=n)  # cut back to ctx each time
            times.append(time.perf_counter() - t0)
        out[f"forward {n}"] = statistics.median(times)
    for n in PROMPTS:
        times = []
        for i in range(max(3, reps // 4)):
            model.reset()
            t0 = time.perf_counter()
            model.eval(ids[i:i + n], 1)
            times.append(time.perf_counter() - t0)
        out[f"prompt {n}"] = statistics.median(times)
    return out


def costs(a) -> None:
    """--cost: each size timed with invariance on and off, fresh processes in turns."""
    import statistics
    runs = {"on": [], "off": []}
    for turn in range(a.turns):
        for mode in (("on", "off") if turn % 2 == 0 else ("off", "on")):
            env = dict(os.environ, SPECGGUF_BATCH_INVARIANT="0" if mode == "off" else "64")
            r = subprocess.run([sys.executable, __file__, "--cost-child", a.types.split(",")[0], "--reps", str(a.reps)],
                               env=env, capture_output=True, text=True, check=True)
            runs[mode].append(json.loads(r.stdout.strip().splitlines()[-1]))
    print(f"# the {a.types.split(',')[0]} target's forward, ms (median over {a.turns} processes each, in turns)")
    print(f"{'what':14} {'invariant':>10} {'stock':>10} {'ratio':>7}")
    for key in runs["on"][0]:
        on = statistics.median(r[key] for r in runs["on"]) * 1e3
        off = statistics.median(r[key] for r in runs["off"]) * 1e3
        print(f"{key:14} {on:10.1f} {off:10.1f} {on / off:7.2f}")


def main() -> None:
    import tempfile
    # a new user's state, and the user's own left alone (k="auto" stores what it learns)
    os.environ["SPECGGUF_STATE"] = tempfile.mkdtemp(prefix="specgguf-bench-")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default=",".join(FTYPES), help="model types (default: %(default)s)")
    ap.add_argument("--batches", default="2,5,9,33", help="tokens per batched forward (default: %(default)s)")
    ap.add_argument("--tokens", type=int, default=56, help="text tokens; rows compared: the last 3/4 (default: %(default)s)")
    ap.add_argument("--modes", default="on,off", help="specgguf's invariance on, off, or both (default: %(default)s)")
    ap.add_argument("--no-extra-bufts", action="store_true", help="load without repacked weights (use_extra_bufts=False)")
    ap.add_argument("--cost", action="store_true", help="time the forwards and prompts with invariance on and off instead")
    ap.add_argument("--turns", type=int, default=4, help="--cost: processes per mode (default: %(default)s)")
    ap.add_argument("--reps", type=int, default=20, help="--cost: forwards timed per size (default: %(default)s)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--cost-child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    batches = [int(b) for b in a.batches.split(",")]
    if a.cost_child:
        print(json.dumps(cost(a.cost_child, a.reps)))
        return
    if a.cost:
        costs(a)
        return
    if a.child:
        print(json.dumps(one(a.child, batches, a.tokens, not a.no_extra_bufts)))
        return
    print(f"# rows bit-identical between one-token forwards and batched ones ({a.tokens} text tokens)")
    print(f"{'type':8} {'mode':4} " + " ".join(f"{'batch ' + str(b):>28}" for b in batches))
    for kind in a.types.split(","):
        model_file(kind)
        for mode in a.modes.split(","):
            env = dict(os.environ, SPECGGUF_BATCH_INVARIANT="0" if mode == "off" else os.environ.get("SPECGGUF_BATCH_INVARIANT", "64"))
            cmd = [sys.executable, __file__, "--child", kind, "--batches", a.batches, "--tokens", str(a.tokens)]
            if a.no_extra_bufts:
                cmd.append("--no-extra-bufts")
            r = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if r.returncode:
                print(f"{kind:8} {mode:4} failed: {r.stderr.strip().splitlines()[-1:]}")
                continue
            res = json.loads(r.stdout.strip().splitlines()[-1])
            cells = [f"{v['identical']:>3}/{v['rows']} max {v['max_diff']:.1e} flips {v['argmax_flips']}"
                     for v in (res[str(b)] for b in batches)]
            print(f"{kind:8} {mode:4} " + " ".join(f"{c:>28}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
