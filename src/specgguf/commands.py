"""The CLI's subcommands other than generation: models, calibrate, serve, rpc-server."""

from __future__ import annotations

import argparse
from typing import List

from .options import Parser, add_model_args, load_pair


def models_main(argv: List[str]) -> int:
    from . import models
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
    print(f"target T(1..{len(c['target'])}) " + " ".join(f"{t * 1e3:.1f}" for t in c["target"])
          + f" ms; draft {c['draft'] * 1e3:.2f} ms/token; catch-up {c['draft_prefill'] * 1e3:.2f} ms/token")
    if out["acceptance"]:
        a = out["acceptance"]
        print(f"acceptance on the fixed text: greedy {a['greedy']:.2f}, sampled at 0.8 {a['sampled']:.2f}")
    return 0


def serve_main(argv: List[str]) -> int:
    from .server import main
    return main(argv)


def rpc_server_main(argv: List[str]) -> int:
    from .rpc import worker_main
    return worker_main(argv)
