"""The CLI's subcommands other than generation: models, calibrate, serve, rpc-server."""

from __future__ import annotations

import argparse
import os
import sys
from typing import List

from .options import Parser, add_model_args, load_pair
from .engine.policy import CostModel


def models_main(argv: List[str]) -> int:
    from .llama import models
    ap = Parser(prog="python -m specgguf models", description=models.__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=Parser)
    sub.add_parser("list", help="list the pinned models and pairs, and how each is pinned")
    f = sub.add_parser("fetch", help="fetch models by name, or both models of a pair (e.g. 'default')")
    f.add_argument("name", nargs="+")
    sub.add_parser("verify", help="re-hash every fetched file against its pin")
    args = ap.parse_args(argv)
    if args.cmd == "list":
        print("\n".join(models.list_lines()))
    elif args.cmd == "fetch":
        for n in models.expand_names(args.name):
            print(models.fetch(n))
    else:
        lines = models.verify_all()
        print("\n".join(lines))
        return 1 if any("MISMATCH" in line for line in lines) else 0
    return 0


def calibrate_main(argv: List[str]) -> int:
    ap = Parser(prog="python -m specgguf calibrate",
                description="Time this machine's forwards for a pair and measure the draft's acceptance "
                "on a fixed text, once; later runs start from the stored figures instead of a "
                "conservative guess. Runs never need it: they learn from their own timed forwards.")
    add_model_args(ap)
    args = ap.parse_args(argv)
    out = load_pair(args).calibrate()
    c = out["costs"]
    first = CostModel.from_dict(c).draft_cost(1)
    print(f"target T(1..{len(c['target'])}) " + " ".join(f"{t * 1e3:.1f}" for t in c["target"])
          + f" ms; draft: a round's first token {first * 1e3:.2f} ms, "
          f"then {c['draft'] * 1e3:.2f} ms/token; catch-up {c['draft_prefill'] * 1e3:.2f} ms/token")
    if out["acceptance"]:
        a = out["acceptance"]
        print(f"acceptance on the fixed text: greedy {a['greedy']:.2f}, sampled at 0.8 {a['sampled']:.2f}")
    return 0


def serve_main(argv: List[str]) -> int:
    from .serve.command import main
    return main(argv)


def rpc_server_main(argv: List[str]) -> int:
    from .llama.rpc import DEFAULT_PORT, WARNING, is_loopback, server_binary
    ap = Parser(prog="python -m specgguf rpc-server",
                description="Run a llama.cpp rpc-server worker: another machine's specgguf puts the target's "
                "layers on it with --rpc HOST:PORT. " + WARNING.format(where="the address you give")[18:])
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1; anything else "
                    "needs --allow-remote)")
    ap.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port ({DEFAULT_PORT})")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="CPU threads (every core)")
    ap.add_argument("--cache", action="store_true", help="keep received weights in a local cache "
                    "($LLAMA_CACHE/rpc, else ~/.cache/llama.cpp/rpc), so a later load sends only hashes")
    ap.add_argument("--allow-remote", action="store_true", help="allow a non-loopback --host (see the warning)")
    args = ap.parse_args(argv)
    if not 0 < args.port < 65536:
        ap.error(f"--port must be in [1, 65535], got {args.port}")
    if args.threads < 1:
        ap.error(f"--threads must be >= 1, got {args.threads}")
    if not is_loopback(args.host):
        if not args.allow_remote:
            ap.error(f"--host {args.host} is not loopback: the RPC protocol is unauthenticated and "
                     "unencrypted; add --allow-remote on a trusted network")
        print(WARNING.format(where=f"{args.host}:{args.port}"), file=sys.stderr, flush=True)
    binary = server_binary()
    cmd = [str(binary), "-H", args.host, "-p", str(args.port), "-t", str(args.threads)] + (["-c"] if args.cache else [])
    print(f"specgguf: rpc-server listening on {args.host}:{args.port} ({args.threads} threads)", file=sys.stderr,
          flush=True)
    os.execv(binary, cmd)  # the worker takes this process over (same pid; signals reach it)
