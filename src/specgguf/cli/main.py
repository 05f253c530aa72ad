"""Command line.

    python -m specgguf [--draft D] [--target T] -p PROMPT     generate
    python -m specgguf serve ...                             OpenAI-compatible server
    python -m specgguf calibrate [--draft D] [--target T]    time the forwards, store the draft's acceptance
    python -m specgguf bench [--draft D] [--target T]        which draft length pays here: a table
    python -m specgguf bench --workload NAME|FILE            which drafts pay on real work
    python -m specgguf check-pair --target T --draft D      how a draft serves a target (tokenizers)
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

from .options import Parser, add_generation_args, add_model_args, config_from_args, load_pair

DESCRIPTION = """\
Speculative decoding with two GGUF models: a small draft proposes tokens, the
target verifies them in one batched forward, and the output is exactly the
target's (token for token when greedy; the same distribution when sampling).
With no --draft/--target it uses the default pair from models.lock, fetching
it on first use. Text streams to stdout; stats and logs go to stderr."""

EPILOG = """\
other commands (each has --help):
  python -m specgguf serve        an OpenAI-compatible HTTP server
  python -m specgguf calibrate    time the forwards, store the draft's acceptance
  python -m specgguf bench        which draft length pays on this machine (table, --plot);
                                  --workload NAME|FILE: which drafts pay on real work
  python -m specgguf check-pair   how a draft can serve a target (tokenizers) and its acceptance
  python -m specgguf rpc-server   a worker for --rpc (the target over several machines)
  python -m specgguf models list | fetch NAME | verify"""


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__
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
        try:
            with open(args.prompt_file, "rb") as f:
                data, source = f.read(), args.prompt_file
        except OSError as e:
            raise OSError(f"--prompt-file {args.prompt_file}: {e.strerror.lower()}") from None
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
    may swallow a KeyboardInterrupt raised in a callback) and once the text is
    out (the models' teardown runs in ``__del__``, where an exception is only
    printed and the exit status would stay 0), exit 130 at once (a fetch
    leaves only a temporary file, removed by the next one); while generating,
    raise KeyboardInterrupt and also set ``hit``, which the run checks after
    each token, so the interrupt is never lost."""

    def __init__(self) -> None:
        self.hit = False
        self.at_once = True

    def __call__(self, signum, frame) -> None:
        if self.at_once:
            try:
                sys.stdout.flush()
            except (OSError, ValueError):
                pass
            print("\nspecgguf: interrupted", file=sys.stderr, flush=True)
            os._exit(130)
        self.hit = True
        raise KeyboardInterrupt


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    commands = {"models": "models_main", "serve": "serve_main", "calibrate": "calibrate_main",
                "bench": "bench_main", "rpc-server": "rpc_server_main", "check-pair": "check_pair_main"}
    interrupt = Interrupt()
    try:
        if argv[:1] and argv[0] in commands:
            from . import commands as cmd
            if argv[0] in ("models", "calibrate", "bench", "check-pair"):  # C calls that may swallow a KeyboardInterrupt
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
    stop.at_once = False
    if stop.hit:
        raise KeyboardInterrupt
    stream = not (args.json or args.no_stream)
    res, shown = None, False
    try:
        for piece in llm.run([{"role": "user", "content": prompt}] if args.chat else prompt, chat=args.chat,
                             config=config, should_stop=lambda: stop.hit):
            if not isinstance(piece, str):
                res = piece
            elif stream:
                sys.stdout.write(piece)
                sys.stdout.flush()
                shown = True
    except (Exception, KeyboardInterrupt):
        if shown:  # end the line of text before the error
            print(flush=True)
        raise
    finally:
        stop.at_once = True
    if stop.hit:
        raise KeyboardInterrupt
    if args.json:
        print(json.dumps({"text": res.text, "tokens": res.tokens, "sources": res.sources,
                          "finish_reason": res.finish_reason, "stats": res.stats}))
    else:
        print("" if stream else res.text, flush=True)
    if res.stats.get("context_full"):
        print(f"specgguf: the generation stopped at the end of the context window ({llm.n_ctx} tokens, "
              "prompt included); --ctx sets a larger one", file=sys.stderr)
    if args.stats:
        print_stats(res.stats)
    return 0


EXACTNESS = {True: "bit-identical to plain decoding (llama.cpp's batch invariance is on)",
             False: "exact up to rounding (llama.cpp without batch invariance: near-ties may flip; "
                    "see python -m specgguf check-pair)"}


def print_stats(s: dict) -> None:
    print(f"specgguf: {s['completion_tokens']} tokens in {s['seconds']:.2f} s ({s['tokens_per_second']:.1f} tok/s "
          f"with the prompt's evaluation, {s['decode_tokens_per_second']:.1f} tok/s after the first token; "
          f"{s['finish_reason']}); rounds {s['rounds']}, drafted {s['drafted']}, accepted {s['accepted']} "
          f"({100 * s['acceptance_rate']:.1f}%), mean accepted {s['mean_accepted']:.2f}; "
          f"verification {s['verification']}, " + EXACTNESS[bool(s.get("bit_identical"))] + "\n"
          f"specgguf: acceptance per position {[round(x, 2) for x in s['position_acceptance']]}; "
          f"K chosen per round {s['k_hist']}; drafting stopped by {s['stop_reasons']}; tokens by source "
          f"{s.get('tokens_by_source')}\n"
          f"specgguf: time: draft {s['draft_seconds']:.2f} s (and {s['measure_seconds']:.2f} s measuring it), "
          f"target {s['target_seconds']:.2f} s, "
          f"verify {s['verify_seconds'] * 1e3:.1f} ms, warp {s['warp_seconds'] * 1e3:.1f} ms, outside "
          f"the forwards {100 * s['overhead_seconds'] / max(s['seconds'], 1e-9):.1f}%", file=sys.stderr)
    if s.get("why"):
        print(f"specgguf: k=auto: {s['why']}", file=sys.stderr)
