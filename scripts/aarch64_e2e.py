"""The whole pipeline on aarch64: run under qemu-user by scripts/test_aarch64.sh
with llama.cpp cross-built for a Pi core (scripts/build_llama_aarch64.sh),
llama-cpp-python's Python package over it and specgguf with its NEON
extension, in an arm64 Debian Python.

    qemu-aarch64 -cpu cortex-a72 SYSROOT/usr/bin/python3 scripts/aarch64_e2e.py TARGET DRAFT POOR_DRAFT

Checks, on the real pair (exits non-zero on the first that fails):

* greedy speculative decoding (K=4) is token for token the target's plain
  greedy output from llama-cpp-python's own loop on the same Llama, with the
  good draft and with the poor one (whose rejections make the adapter cut the
  KV cache back: at least one round must reject);
* seeded drafter-invariant sampling at 0.8 gives k=0's text;
* the build is batch-invariant: the target (F32) and the draft (Q4_1) score
  a batch of 5 tokens bit for bit as one token at a time
  (scripts/patches/llama-batch-invariant.patch, :func:`specgguf.llama.invariance.probe`).

With ``SPECGGUF_ARM_CORPUS=1`` (about 15 minutes a core, so not in CI's
run): batches of 2, 5 and 9, and texts from the exactness corpus
(tests/corpus.py: one code, one prose, one chat prompt), greedy at K=1, 4
and auto and seeded at K=4, equal to k=0's (a slice: under emulation each
forward takes about a second).
"""

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.corpus

from specgguf import SpeculativeLlama
from specgguf.llama.model import plain_greedy

N = 8  # tokens per answer: under emulation a forward of this pair takes seconds, not milliseconds
PROMPT = "The capital of France is"  # short: the prompt's evaluation is emulated too


def check(what, ok, detail):
    print(f"aarch64 e2e: {what}: {'ok' if ok else 'FAILED'} ({detail})", flush=True)
    if not ok:
        sys.exit(1)


def main(target, draft, poor):
    rejected = 0
    reference = None
    for name in (draft, poor):
        t0 = time.perf_counter()
        llm = SpeculativeLlama(target, name, n_ctx=512, n_threads=2)
        ids = llm.tokenize(PROMPT)
        if reference is None:
            t1 = time.perf_counter()
            reference = plain_greedy(llm.pair.target_llm, ids, N)
            print(f"aarch64 e2e: loaded in {t1 - t0:.0f} s; the target alone: {N} tokens in "
                  f"{time.perf_counter() - t1:.0f} s", flush=True)
        r = llm.generate(PROMPT, max_tokens=N, temperature=0, k=4)
        s = r.stats
        rejected += s["drafted"] - s["accepted"]
        n = len(r.tokens)
        check(f"greedy K=4 with {name} is the target's own greedy output", r.tokens == reference[:n] and n > 0,
              f"{n} tokens {r.text!r}, drafted {s['drafted']}, accepted {s['accepted']}, "
              f"{time.perf_counter() - t0:.0f} s")
        if name == draft:
            outs = [llm.generate(PROMPT, max_tokens=N, temperature=0.8, seed=7, k=k,
                                 drafter_invariant=True) for k in (0, 4)]
            check("seeded drafter-invariant sampling at 0.8 equals k=0", outs[0].tokens == outs[1].tokens,
                  f"{outs[1].text!r}, drafted {outs[1].stats['drafted']}")
        del llm
    check("some draft was rejected, so the KV cache was cut back", rejected > 0, f"{rejected} rejected")
    wide = os.environ.get("SPECGGUF_ARM_CORPUS") == "1"
    invariant(target, draft, batches=(2, 5, 9) if wide else (5,))
    if wide:
        corpus_texts(target, draft)


def corpus_texts(target, draft, tokens=16):
    from tests.corpus import corpus
    every = corpus()
    llm = SpeculativeLlama(target, draft, n_ctx=1024, n_threads=2)
    for kind, prompt in (every[0], every[100], every[200]):
        t0 = time.perf_counter()
        chat = not isinstance(prompt, str)
        for settings, ks in ((dict(temperature=0), (1, 4, "auto")), (dict(temperature=0.8, seed=11), (4,))):
            llm.reset()
            plain = llm.generate(prompt, chat=chat, max_tokens=tokens, k=0, **settings).tokens
            for k in ks:
                llm.reset()  # from empty caches, as plain decoding's text was made
                got = llm.generate(prompt, chat=chat, max_tokens=tokens, k=k, **settings)
                check(f"a {kind} prompt of the corpus, {settings}, K={k}, equals k=0", got.tokens == plain,
                      f"{len(plain)} tokens, drafted {got.stats['drafted']}, {time.perf_counter() - t0:.0f} s")


def invariant(*paths, batches=(5,)):
    from specgguf.llama.invariance import INVARIANT_TOKENS, batch_invariance, probe
    from specgguf.llama.model import LlamaModel, load_llama
    check("llama.cpp's batch invariance is on", batch_invariance() == INVARIANT_TOKENS, f"{batch_invariance()}")
    for path in paths:
        t0 = time.perf_counter()
        llm = load_llama(Path(path), n_ctx=256, n_threads=2)
        ids = llm.tokenize(b"The capital of France is Paris, and the capital of Italy is Rome.", add_bos=True)[:14]
        for batch in batches:
            got = probe(LlamaModel(llm), ids, batch=batch)
            check(f"{path.rsplit('/', 1)[-1]} scores a batch of {batch} as one token at a time, bit for bit",
                  got["identical"] == got["rows"] > 0, f"{got}, {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main(*sys.argv[1:4])
