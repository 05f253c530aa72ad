"""Command line: ``python -m specgguf [--draft D] [--target T] -p PROMPT`` and
``python -m specgguf models list|fetch NAME|verify``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional

DESCRIPTION = """\
Speculative decoding with two GGUF models: a small draft proposes tokens, the
target verifies them in one batched forward, and the output is exactly the
target's (token for token when greedy; the same distribution when sampling).
With no --draft/--target it uses the default pair from models.lock, fetching
it on first use. Text streams to stdout; stats and logs go to stderr."""


def _positive(kind, low):
    def parse(s: str):
        try:
            v = kind(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{s!r} is not a valid {kind.__name__}")
        if v < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {s}")
        return v
    return parse


def _unit(s: str) -> float:
    v = _positive(float, 0.0)(s)
    if v > 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {s}")
    return v


def _k_arg(s: str):
    return "auto" if s == "auto" else _positive(int, 0)(s)


def _p_min_arg(s: str):
    return "auto" if s == "auto" else _unit(s)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m specgguf", description=DESCRIPTION,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Models: python -m specgguf models list | fetch NAME | verify")
    ap.add_argument("--target", help="target GGUF: a path or a models.lock name (default: the default pair)")
    ap.add_argument("--draft", help="draft GGUF: a path or a models.lock name (default: the default "
                    "pair), or 'ngram' for model-free prompt-lookup drafting")
    ap.add_argument("--ngram", action="store_true", help="with a draft model: try a prompt lookup first "
                    "each round, fall back to the model")
    ap.add_argument("-p", "--prompt", help="prompt text (else --prompt-file, else stdin)")
    ap.add_argument("--prompt-file", help="read the prompt from this file")
    ap.add_argument("--chat", action="store_true", help="treat the prompt as one user message and "
                    "apply the target's chat template")
    ap.add_argument("-n", "--max-tokens", type=_positive(int, 0), default=256, help="max new tokens (256)")
    ap.add_argument("--temp", type=_positive(float, 0.0), default=0.0,
                    help="temperature; 0 = greedy, identical to the target alone (0)")
    ap.add_argument("--top-k", type=_positive(int, 0), default=40, help="top-k, 0 = off (40)")
    ap.add_argument("--top-p", type=_unit, default=0.95, help="top-p (0.95)")
    ap.add_argument("--min-p", type=_unit, default=0.05, help="min-p (0.05)")
    ap.add_argument("-k", "--draft-max", type=_k_arg, default="auto",
                    help="draft tokens per round, 0 = plain target decoding, or 'auto': chosen each "
                    "round from live acceptance and measured costs, backing off to 0 when drafting "
                    "does not pay (auto)")
    ap.add_argument("--p-min", type=_p_min_arg, default=None,
                    help="stop drafting when the draft's confidence in its next token is below this "
                    "(a number in [0, 1], or 'auto' to learn it; default: off)")
    ap.add_argument("--seed", type=int, help="seed for reproducible sampling")
    ap.add_argument("--ctx", type=_positive(int, 16), default=2048, help="context window (2048)")
    ap.add_argument("--threads", type=_positive(int, 1), help="threads (default: every core)")
    ap.add_argument("--stats", action="store_true", help="print acceptance and timing to stderr")
    ap.add_argument("--json", action="store_true", help="print one JSON object (text, tokens, stats) "
                    "to stdout instead of streaming")
    ap.add_argument("--no-stream", action="store_true", help="print the text at the end")
    ap.add_argument("--verbose", action="store_true", help="show llama.cpp's own logs")
    return ap


def models_main(argv: List[str]) -> int:
    from . import models
    ap = argparse.ArgumentParser(prog="python -m specgguf models", description=models.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="list pinned models and pairs")
    f = sub.add_parser("fetch", help="fetch a model (or 'default': the default pair)")
    f.add_argument("name")
    sub.add_parser("verify", help="re-hash every fetched file")
    args = ap.parse_args(argv)
    if args.cmd == "list":
        entries, pairs = models.load_lock()
        for e in entries.values():
            where = "fetched" if models.local_path(e).exists() else "-"
            print(f"{e.name:24} {e.source:12} {'' if e.verified else 'UNVERIFIED':10} {where:8} {e.description}")
        for name, p in pairs.items():
            print(f"pair {name:19} target={p['target']} draft={p['draft']}")
    elif args.cmd == "fetch":
        names = list(models.default_pair()) if args.name == "default" else [args.name]
        for n in names:
            print(models.fetch(n))
    else:
        lines = models.verify_all()
        print("\n".join(lines))
        return 1 if any("MISMATCH" in l for l in lines) else 0
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["models"]:
            return models_main(argv[1:])
        return run(build_parser().parse_args(argv))
    except KeyboardInterrupt:
        print("\nspecgguf: interrupted", file=sys.stderr)
        return 130
    except (ValueError, TypeError, OSError) as e:
        print(f"specgguf: error: {e}", file=sys.stderr)
        return 1


def run(args: argparse.Namespace) -> int:
    from . import models
    from .api import SpeculativeLlama

    if args.prompt is not None:
        prompt = args.prompt
    elif args.prompt_file:
        with open(args.prompt_file, encoding="utf-8") as f:
            prompt = f.read()
    elif not sys.stdin.isatty():
        prompt = sys.stdin.read()
    else:
        raise ValueError("no prompt: give -p TEXT, --prompt-file FILE, or pipe text on stdin")
    target, draft = args.target, args.draft
    if target is None or draft is None:
        dt, dd = models.default_pair()
        target, draft = target or dt, draft or dd
    if args.ngram and draft == "ngram":
        raise ValueError("--ngram adds a prompt lookup in front of a draft model; --draft ngram already is one")
    if args.p_min == "auto" and args.draft_max != "auto":
        raise ValueError("--p-min auto is learned by the automatic draft length: use it with -k auto")
    llm = SpeculativeLlama(target, draft, ngram=args.ngram, n_ctx=args.ctx, n_threads=args.threads,
                           verbose=args.verbose)
    kw = dict(max_tokens=args.max_tokens, temperature=args.temp, top_k=args.top_k, top_p=args.top_p,
              min_p=args.min_p, k=args.draft_max, p_min=args.p_min, seed=args.seed, chat=args.chat)
    if args.chat:
        prompt = [{"role": "user", "content": prompt}]
    stream = not (args.json or args.no_stream)
    res = None
    for piece in llm.run(prompt, **kw):
        if not isinstance(piece, str):
            res = piece
        elif stream:
            sys.stdout.write(piece)
            sys.stdout.flush()
    if args.json:
        print(json.dumps({"text": res.text, "tokens": res.tokens, "finish_reason": res.finish_reason,
                          "stats": res.stats}))
    else:
        print("" if stream else res.text, flush=True)
    stats = res.stats
    if args.stats:
        s = stats
        print(f"specgguf: {s['emitted']} tokens in {s['seconds']:.2f} s ({s['tokens_per_second']:.1f} tok/s); "
              f"rounds {s['rounds']}, drafted {s['drafted']}, accepted {s['accepted']} "
              f"({100 * s['acceptance_rate']:.1f}%), mean accepted {s['mean_accepted']:.2f}\n"
              f"specgguf: acceptance per position {[round(x, 2) for x in s['position_acceptance']]}; "
              f"K chosen per round {s['k_hist']}; drafting stopped by {s['stop_reasons']}\n"
              f"specgguf: time: draft {s['draft_seconds']:.2f} s, target {s['target_seconds']:.2f} s, "
              f"verify {s['verify_seconds'] * 1e3:.1f} ms, warp {s['warp_seconds'] * 1e3:.1f} ms, outside "
              f"the forwards {100 * s['overhead_seconds'] / max(s['seconds'], 1e-9):.1f}%", file=sys.stderr)
    return 0
