"""Bit-identical on the whole corpus: how many texts differ from plain decoding.

The corpus (tests/corpus.py: code to complete, documentation prose to
continue, questions about pasted code as chats, all built from the standard
library's own text) runs through the default pair:

* greedy: each K (and "auto") against ``k=0``, token for token;
* seeded (T=0.8, drafter-invariant, the default with a seed): each K and the
  poor draft against ``k=0``;
* ``--parallel N``: the same prompts N at a time through shared rounds (the
  server's engine), each against its plain text alone.

Prints, per kind and setting, the texts compared and how many differ (the
target: 0). Not a timing: any machine load is fine. Run it in slices to keep
each run short:

    python bench/exactness.py --prompts 0:100 --ks 1,2,3,4,5,6,7,8,auto
    python bench/exactness.py --prompts 100:200 --seeded --ks 2,6,auto
    python bench/exactness.py --prompts 0:100 --parallel 4 --ks 4,auto
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tests.corpus import corpus  # noqa: E402


def ks(text):
    return [k if k == "auto" else int(k) for k in text.split(",")]


def main() -> None:
    import tempfile
    # a new user's state, and the user's own left alone (k="auto" stores what it learns)
    os.environ["SPECGGUF_STATE"] = tempfile.mkdtemp(prefix="specgguf-bench-")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", default="0:300", help="a slice A:B[:STEP] of the corpus's 300 prompts (default %(default)s)")
    ap.add_argument("--ks", type=ks, default=ks("1,2,3,4,5,6,7,8,auto"), help="draft lengths (default 1..8,auto)")
    ap.add_argument("--tokens", type=int, default=48, help="tokens per text (default %(default)s)")
    ap.add_argument("--seeded", action="store_true", help="T=0.8 with a seed per prompt instead of greedy")
    ap.add_argument("--parallel", type=int, default=1, help="run the prompts N at a time in shared rounds")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2, help="threads per model (1 leaves a core free: the texts "
                                                             "do not depend on it; default %(default)s)")
    ap.add_argument("--target-type", default="f32", choices=["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_k_m",
                                                             "q4_k_m", "q6_k"],
                    help="the default target converted to this type (bench/invariance.py derives it once; "
                         "default %(default)s)")
    a = ap.parse_args()
    from specgguf import SpeculativeLlama
    from specgguf.llama import models
    from specgguf.llama.invariance import batch_invariance
    lo, hi, step = ([int(x) for x in a.prompts.split(":")] + [1])[:3]
    chosen = list(range(300))[lo:hi:step]
    every = corpus()
    items = [every[i] for i in chosen]
    from bench.invariance import model_file
    target = str(model_file(a.target_type))
    spec = SpeculativeLlama(target, models.fetch("smollm2-135m-q4_1"), n_ctx=a.ctx, n_threads=a.threads,
                            parallel=a.parallel)
    poor = None if a.parallel > 1 else SpeculativeLlama(target, models.fetch("smollm2-135m-q2_k"), n_ctx=a.ctx,
                                                        n_threads=a.threads)
    mode = "seeded T=0.8" if a.seeded else "greedy"
    print(f"# exactness: {a.target_type} target, {len(items)} prompts [{a.prompts}], {a.tokens} tokens, {mode}, "
          f"parallel {a.parallel}, "
          f"batch invariance under {batch_invariance()} tokens", flush=True)
    compared, differ, first = Counter(), Counter(), {}
    t0 = time.time()

    def settings(i):
        return dict(max_tokens=a.tokens, temperature=0.8, seed=1000 + i) if a.seeded else dict(max_tokens=a.tokens, temperature=0)

    def note(kind, name, same, i):
        compared[kind, name] += 1
        if not same:
            differ[kind, name] += 1
            first.setdefault((kind, name), chosen[i])

    if a.parallel > 1:
        for start in range(0, len(items), a.parallel):
            group = items[start:start + a.parallel]

            def alone_text(p, s):  # each from empty caches, as below (see the one-prompt branch)
                spec.reset()
                return spec.generate(p, k=0, **s).tokens

            def together(k, s):
                spec.reset()
                return spec.generate_many([p for _, p in group], k=k, **s)
            alone = [alone_text(p, settings(start + j)) for j, (_, p) in enumerate(group)]
            for k in a.ks:
                if a.seeded:  # generate_many shares one seed: one per group
                    s = settings(start)
                    alone_s = [alone_text(p, s) for _, p in group]
                    got = together(k, s)
                    for j, ((kind, _), r) in enumerate(zip(group, got)):
                        note(kind, f"k={k}", r.tokens == alone_s[j], start + j)
                else:
                    got = together(k, settings(start))
                    for j, ((kind, _), r) in enumerate(zip(group, got)):
                        note(kind, f"k={k}", r.tokens == alone[j], start + j)
            print(f"  {start + len(group)}/{len(items)} prompts, {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    else:
        def run(llm, prompt, k, i):  # from empty caches, as plain decoding's text was made: a cached
            llm.reset()              # prompt's last token is read again alone, which plain decoding
            return llm.generate(prompt, k=k, **settings(i)).tokens  # would do too (another state)
        for i, (kind, prompt) in enumerate(items):
            plain = run(spec, prompt, 0, i)
            for k in a.ks:
                note(kind, f"k={k}", run(spec, prompt, k, i) == plain, i)
            note(kind, "poor k=4", run(poor, prompt, 4, i) == plain, i)
            if (i + 1) % 10 == 0:
                print(f"  {i + 1}/{len(items)} prompts, {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    names = list(dict.fromkeys(n for _, n in compared))
    print(f"{'kind':6} " + " ".join(f"{n:>10}" for n in names))
    for kind in ("code", "prose", "chat"):
        if any(k == kind for k, _ in compared):
            print(f"{kind:6} " + " ".join(f"{differ[kind, n]:>3}/{compared[kind, n]:<6}" for n in names))
    total = sum(differ.values())
    print(f"differing texts: {total} of {sum(compared.values())} ({time.time() - t0:.0f} s)"
          + ("" if not first else f"; first at prompts {dict((f'{k}/{n}', i) for (k, n), i in first.items())}"))
    sys.exit(1 if total else 0)


if __name__ == "__main__":
    main()
