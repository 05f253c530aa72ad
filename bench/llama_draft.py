"""llama-cpp-python's Llama with specgguf.DraftModel, against Llama without a
draft, Llama with its own prompt-lookup draft, and specgguf.generate, on the
same pair and prompts, greedy and at temperature 0.8.

Each configuration runs in its own process (so its peak RSS is its own):
tokens/s over all prompts, the draft's acceptance, and the peak RSS, which
shows what `logits_all=True` costs: Llama forces it with any draft model,
an n_ctx x n_vocab float32 buffer (2048 x 49152 x 4 bytes = 384 MiB here).
Regime: the default 135M pair on this machine (see BENCHMARKS.md).

    .venv/bin/python bench/llama_draft.py [--tokens 96] [--threads 2] [--reps 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, resource, sys, time
import llama_cpp
import specgguf
from specgguf.llama import models
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
kind, temp, tokens, threads, reps = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
prompts = ["Write a detailed essay about the history of the printing press.",
           "Explain, step by step, how a bicycle stays upright while moving.",
           "Write a short story about a robot who learns to paint."]
tname, dname = models.default_pair()
draft = None
if kind == "specgguf":
    llm = specgguf.SpeculativeLlama(tname, dname, n_threads=threads)
else:
    if kind == "DraftModel":
        draft = specgguf.DraftModel(dname, n_threads=threads, n_ctx=2048)
    elif kind == "prompt lookup":
        draft = LlamaPromptLookupDecoding(num_pred_tokens=10)
    llm = llama_cpp.Llama(str(models.fetch(tname)), n_ctx=2048, n_threads=threads, n_threads_batch=threads,
                          verbose=False, draft_model=draft)
n = secs = 0
acc = []
for rep in range(reps):
    for i, p in enumerate(prompts):
        m = [{"role": "user", "content": p}]
        kw = dict(max_tokens=tokens, temperature=temp, top_k=40, top_p=0.95, min_p=0.05, seed=100 * rep + i)
        if kind == "specgguf":
            kw.update(drafter_invariant=False)  # exact p/q, as sampled runs use by default without a seed
        llm.reset()
        t0 = time.perf_counter()
        r = llm.create_chat_completion(m, **kw)
        secs += time.perf_counter() - t0
        n += r["usage"]["completion_tokens"]
        if kind == "specgguf":
            acc.append(r["speculation"]["acceptance_rate"])
out = {"tps": n / secs, "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
if kind == "DraftModel":
    out["acceptance"] = draft.stats["acceptance_rate"]
    out["k"] = draft.stats["k_chosen"]
elif acc:
    out["acceptance"] = sum(acc) / len(acc)
print(json.dumps(out))
"""

KINDS = ["no draft", "DraftModel", "prompt lookup", "specgguf"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    env = dict(os.environ, SPECGGUF_STATE=tempfile.mkdtemp(prefix="specgguf-llama-draft-"))
    print(f"default pair, {args.threads} threads, 3 chat prompts x {args.tokens} tokens x {args.reps}; "
          "Llama configurations through create_chat_completion; each in its own process")
    for temp in (0.0, 0.8):
        print(f"\n-- temperature {temp}")
        print(f"{'configuration':<34} {'tok/s':>7} {'vs no draft':>11} {'acceptance':>10} {'peak RSS':>9}")
        base = None
        for kind in KINDS:
            out = subprocess.run([sys.executable, "-c", CHILD, kind, str(temp), str(args.tokens), str(args.threads),
                                  str(args.reps)], env=env, capture_output=True, text=True)
            if out.returncode:
                print(f"{kind}: failed: {out.stderr[-500:]}")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            base = base or r["tps"]
            label = {"no draft": "Llama, no draft", "DraftModel": "Llama + specgguf.DraftModel",
                     "prompt lookup": "Llama + LlamaPromptLookupDecoding",
                     "specgguf": "specgguf.SpeculativeLlama"}[kind]
            acc = f"{r['acceptance']:.2f}" if "acceptance" in r else "-"
            print(f"{label:<34} {r['tps']:>7.1f} {r['tps'] / base:>10.2f}x {acc:>10} {r['rss']:>6.0f} MiB"
                  + (f"   K chosen {r['k']}" if "k" in r else ""), flush=True)


if __name__ == "__main__":
    main()
