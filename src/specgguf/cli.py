"""Command line.

    python -m specgguf [--draft D] [--target T] -p PROMPT     generate
    python -m specgguf serve ...                             OpenAI-compatible server
    python -m specgguf calibrate [--draft D] [--target T]    measure and store this machine's costs
    python -m specgguf rpc-server [--host H] [--port P]      a worker for --rpc
    python -m specgguf models list | fetch NAME | verify

Text streams to stdout; stats and errors go to stderr. A bad option or file
prints one line and exits 2 (usage) or 1 (anything else); Ctrl-C exits 130
at any moment; a closed pipe (``| head``) ends quietly.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import List, Optional

DESCRIPTION = """\
Speculative decoding with two GGUF models: a small draft proposes tokens, the
target verifies them in one batched forward, and the output is exactly the
target's (token for token when greedy; the same distribution when sampling).
With no --draft/--target it uses the default pair from models.lock, fetching
it on first use. Text streams to stdout; stats and logs go to stderr."""

EPILOG = """\
other commands (each has --help):
  python -m specgguf serve        an OpenAI-compatible HTTP server
  python -m specgguf calibrate    measure this machine's forward costs once
  python -m specgguf rpc-server   a worker for --rpc (the target over several machines)
  python -m specgguf models list | fetch NAME | verify"""


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (the usage block is in --help)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _number(kind, low, high=None):
    def parse(s: str):
        try:
            v = kind(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{s!r} is not a valid {kind.__name__}") from None
        if v != v or v < low or (high is not None and v > high):
            raise argparse.ArgumentTypeError(f"must be {'>= ' + str(low) if high is None else f'in [{low}, {high}]'}, got {s}")
        return v
    return parse


def _auto_or(parse):
    return lambda s: "auto" if s == "auto" else parse(s)


def add_model_args(ap: argparse.ArgumentParser) -> None:
    """The options that choose and load models (generate, serve, calibrate)."""
    ap.add_argument("--target", help="target GGUF: a path or a models.lock name (default: the default pair)")
    ap.add_argument("--draft", help="draft GGUF: a path or a models.lock name (default: the default "
                    "pair), or 'ngram' for model-free prompt-lookup drafting")
    ap.add_argument("--ngram", action="store_true", help="with a draft model: try a prompt lookup first "
                    "each round, fall back to the model")
    ap.add_argument("--ctx", type=_number(int, 256), default=2048,
                    help="context window in tokens, >= 256 (2048)")
    ap.add_argument("--threads", type=_number(int, 1), help="threads (default: every core)")
    ap.add_argument("--rpc", help="host:port[,host:port...] of rpc-server workers: put the target's "
                    "layers on them (see `python -m specgguf rpc-server --help`)")
    ap.add_argument("--draft-rpc", action="store_true", help="with --rpc: put the draft on the workers too")
    ap.add_argument("--tensor-split", help="with --rpc: comma-separated share of layers per worker")
    ap.add_argument("--verbose", action="store_true", help="show llama.cpp's own logs")


def add_generation_args(ap: argparse.ArgumentParser) -> None:
    """The generation defaults (generate, serve)."""
    ap.add_argument("-n", "--max-tokens", type=_number(int, 0), default=256, help="max new tokens (256)")
    ap.add_argument("--temp", type=_number(float, 0.0), default=0.0,
                    help="temperature; 0 = greedy, identical to the target alone (0)")
    ap.add_argument("--top-k", type=_number(int, 0), default=40, help="top-k, 0 = off (40)")
    ap.add_argument("--top-p", type=_number(float, 0.0, 1.0), default=0.95, help="top-p (0.95)")
    ap.add_argument("--min-p", type=_number(float, 0.0, 1.0), default=0.05, help="min-p (0.05)")
    ap.add_argument("-k", "--draft-max", type=_auto_or(_number(int, 0, 32)), default="auto",
                    help="draft tokens per round, 0 = plain target decoding, or 'auto': chosen each "
                    "round from live acceptance and measured costs, backing off to 0 when drafting "
                    "does not pay (auto)")
    ap.add_argument("--p-min", type=_auto_or(_number(float, 0.0, 1.0)), default=None,
                    help="stop drafting when the draft's confidence in its next token is below this "
                    "(a number in [0, 1], or 'auto' to learn it; default: off)")
    ap.add_argument("--seed", type=_number(int, 0, 2**64 - 1), help="seed for reproducible sampling")
    inv = ap.add_mutually_exclusive_group()
    inv.add_argument("--drafter-invariant", dest="drafter_invariant", action="store_true", default=None,
                     help="verify by the shared-noise race: the text is exactly plain seeded sampling's, "
                     "whatever the draft (default for seeded sampling)")
    inv.add_argument("--exact-pq", dest="drafter_invariant", action="store_false",
                     help="verify sampled drafts by the min(1, p/q) rule even with --seed (accepts a "
                     "little more; a seed then reproduces only with the same settings and state)")


def config_from_args(args: argparse.Namespace):
    from .config import GenerationConfig
    return GenerationConfig(max_tokens=args.max_tokens, temperature=args.temp, top_k=args.top_k,
                            top_p=args.top_p, min_p=args.min_p, k=args.draft_max, p_min=args.p_min,
                            seed=args.seed, drafter_invariant=args.drafter_invariant,
                            stop=getattr(args, "stop", None))


def load_pair(args: argparse.Namespace, **kw):
    """The SpeculativeLlama the model options ask for (default pair filled in)."""
    from . import models
    from .api import SpeculativeLlama
    target, draft = args.target, args.draft
    if target is None or draft is None:
        dt, dd = models.default_pair()
        target, draft = target or dt, draft or dd
    split = [float(x) for x in args.tensor_split.split(",")] if args.tensor_split else None
    return SpeculativeLlama(target, draft, ngram=args.ngram, n_ctx=args.ctx, n_threads=args.threads,
                            verbose=args.verbose, rpc=args.rpc, draft_rpc=args.draft_rpc,
                            tensor_split=split, **kw)


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    ap = Parser(prog="python -m specgguf", description=DESCRIPTION, epilog=EPILOG,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=f"specgguf {__version__}")
    ap.add_argument("-p", "--prompt", help="prompt text (else --prompt-file, else stdin)")
    ap.add_argument("--prompt-file", help="read the prompt from this file")
    ap.add_argument("--chat", action="store_true", help="treat the prompt as one user message and "
                    "apply the target's chat template")
    add_model_args(ap)
    add_generation_args(ap)
    ap.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    ap.add_argument("--stats", action="store_true", help="print acceptance and timing to stderr")
    ap.add_argument("--json", action="store_true", help="print one JSON object (text, tokens, stats) "
                    "to stdout instead of streaming")
    ap.add_argument("--no-stream", action="store_true", help="print the text at the end")
    return ap


def read_prompt(args: argparse.Namespace) -> str:
    """The prompt from -p, --prompt-file or stdin; undecodable bytes are
    replaced, with a warning naming the source and the first bad byte."""
    if args.prompt is not None:
        return args.prompt
    if args.prompt_file:
        with open(args.prompt_file, "rb") as f:
            data, source = f.read(), args.prompt_file
    elif not sys.stdin.isatty():
        data, source = sys.stdin.buffer.read(), "stdin"
    else:
        raise ValueError("no prompt: give -p TEXT, --prompt-file FILE, or pipe text on stdin")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        print(f"specgguf: warning: {source} is not valid UTF-8 (first bad byte at offset {e.start}); "
              "undecodable bytes were replaced by U+FFFD", file=sys.stderr)
        return data.decode("utf-8", errors="replace")


class Interrupt:
    """SIGINT for the CLI. While models load or files are fetched (C code that
    may swallow a KeyboardInterrupt raised in a callback), exit 130 at once
    (a fetch leaves only a temporary file, removed by the next one); while
    generating, raise KeyboardInterrupt and also set ``hit``, which the run
    checks once per round, so the interrupt is never lost."""

    def __init__(self) -> None:
        self.hit = False
        self.loading = True

    def __call__(self, signum, frame) -> None:
        if self.loading:
            print("\nspecgguf: interrupted", file=sys.stderr, flush=True)
            os._exit(130)
        self.hit = True
        raise KeyboardInterrupt


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    commands = {"models": "models_main", "serve": "serve_main", "calibrate": "calibrate_main",
                "rpc-server": "rpc_server_main"}
    interrupt = Interrupt()
    try:
        if argv[:1] and argv[0] in commands:
            from . import commands as cmd
            if argv[0] in ("models", "calibrate"):  # C calls that may swallow a KeyboardInterrupt
                signal.signal(signal.SIGINT, interrupt)
            return getattr(cmd, commands[argv[0]])(argv[1:])
        return run(build_parser().parse_args(argv), interrupt)
    except KeyboardInterrupt:
        print("\nspecgguf: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _quiet_stdout()
        return 141  # as a Unix tool killed by SIGPIPE
    except (ValueError, TypeError, OSError, RuntimeError) as e:
        print(f"specgguf: error: {e}", file=sys.stderr)
        return 1


def _quiet_stdout() -> None:
    # Python flushes stdout at exit; a closed pipe would print another error.
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except OSError:
        pass


def run(args: argparse.Namespace, stop: Interrupt) -> int:
    signal.signal(signal.SIGINT, stop)
    config = config_from_args(args)
    prompt = read_prompt(args)
    llm = load_pair(args)
    stop.loading = False
    if stop.hit:
        raise KeyboardInterrupt
    stream = not (args.json or args.no_stream)
    res = None
    for piece in llm.run([{"role": "user", "content": prompt}] if args.chat else prompt, chat=args.chat,
                         config=config, should_stop=lambda: stop.hit):
        if not isinstance(piece, str):
            res = piece
        elif stream:
            sys.stdout.write(piece)
            sys.stdout.flush()
    if stop.hit:
        raise KeyboardInterrupt
    if args.json:
        print(json.dumps({"text": res.text, "tokens": res.tokens, "finish_reason": res.finish_reason,
                          "stats": res.stats}))
    else:
        print("" if stream else res.text, flush=True)
    if args.stats:
        print_stats(res.stats)
    return 0


def print_stats(s: dict) -> None:
    print(f"specgguf: {s['completion_tokens']} tokens in {s['seconds']:.2f} s ({s['tokens_per_second']:.1f} tok/s, "
          f"{s['finish_reason']}); rounds {s['rounds']}, drafted {s['drafted']}, accepted {s['accepted']} "
          f"({100 * s['acceptance_rate']:.1f}%), mean accepted {s['mean_accepted']:.2f}; "
          f"verification {s['verification']}\n"
          f"specgguf: acceptance per position {[round(x, 2) for x in s['position_acceptance']]}; "
          f"K chosen per round {s['k_hist']}; drafting stopped by {s['stop_reasons']}\n"
          f"specgguf: time: draft {s['draft_seconds']:.2f} s, target {s['target_seconds']:.2f} s, "
          f"verify {s['verify_seconds'] * 1e3:.1f} ms, warp {s['warp_seconds'] * 1e3:.1f} ms, outside "
          f"the forwards {100 * s['overhead_seconds'] / max(s['seconds'], 1e-9):.1f}%", file=sys.stderr)
