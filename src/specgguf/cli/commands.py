"""The CLI's subcommands other than generation: models, calibrate, check-pair, bench, serve, rpc-server."""

from __future__ import annotations

import argparse
import os
import sys
from typing import List

from ..config import K_MAX
from .options import Parser, _number, add_model_args, load_pair
from .workloads import WORKLOADS
from ..engine.calibration import ForwardCosts


def models_main(argv: List[str]) -> int:
    from ..llama import models
    entries, pairs = models.load_lock()
    names = ", ".join(list(entries) + [p for p in pairs if p not in entries])
    ap = Parser(prog="python -m specgguf models", description=models.__doc__.replace("``", "'"),
                formatter_class=argparse.RawDescriptionHelpFormatter)
    what = {"list": "list the pinned models and pairs, and how each is pinned",
            "fetch": "fetch models by name, or both models of a pair (e.g. 'default')",
            "verify": "re-hash every fetched file against its pin"}
    sub = ap.add_subparsers(dest="cmd", parser_class=Parser, metavar="{list,fetch,verify}")
    parsers = {name: sub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
               for name, text in what.items()}
    parsers["fetch"].add_argument("name", nargs="+", help=f"a model or a pair: {names}")
    args = ap.parse_args(argv)
    if args.cmd is None:  # `models` alone: what it can do
        print(ap.format_usage() + "\n" + "\n".join(f"  {name:8} {text}" for name, text in what.items()))
        return 0
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
                description="Measure the draft's acceptance on a fixed text, once (stored: later runs of the "
                "pair start from it), and time this machine's forwards (shown with the draft length the "
                "formula picks at them; not stored: every run times its own rounds, since identical "
                "processes here differ by 20%%). Runs never need it: they learn as they go.")
    add_model_args(ap)
    args = ap.parse_args(argv)
    out = load_pair(args).calibrate()
    c = out["costs"]
    costs = ForwardCosts.from_dict(c)
    print(f"target T(1..{len(c['target'])}) " + " ".join(f"{t * 1e3:.1f}" for t in c["target"])
          + f" ms; draft: a round's first token {costs.draft_cost(1) * 1e3:.2f} ms, "
          f"then {c['draft'] * 1e3:.2f} ms/token; catch-up {c['draft_prefill'] * 1e3:.2f} ms/token")
    if out["acceptance"]:
        a = out["acceptance"]
        print(f"acceptance on the fixed text: greedy {a['greedy']:.2f}, sampled at 0.8 {a['sampled']:.2f}")
        from .bench import rate
        best = max(range(9), key=lambda k: rate(k, a["greedy"], costs))
        print(f"the formula at these costs, greedy: K={best}, {rate(best, a['greedy'], costs) / rate(0, 0, costs):.2f}x "
              "plain decoding (forwards only: a live round also warps, verifies and runs Python)")
    return 0


CHECK_PAIR_DESCRIPTION = """\
Say how a draft can serve a target, and how well: the mode the pair gets
(same vocabulary; padded, one model with a few extra rows; cross-tokenizer,
the draft proposing text for the target's tokenizer; or refused, and why),
then the draft's acceptance on a short sample text, greedy and sampled at
0.8, at K=4, and whether the greedy output equals the target's alone. Loading
runs the same check: a pair that cannot work is refused there too."""

CHECK_TEXT = "Write a short essay about the history of the printing press.\n\n"


def check_pair_main(argv: List[str]) -> int:
    ap = Parser(prog="python -m specgguf check-pair", description=CHECK_PAIR_DESCRIPTION)
    add_model_args(ap)
    ap.add_argument("-n", "--tokens", type=_number(int, 8, 1024), default=48,
                    help="tokens generated on the sample text, 8-1024 (48)")
    args = ap.parse_args(argv)
    if args.draft == "ngram":
        ap.error("check-pair checks a draft model; --draft ngram needs no check")
    llm = load_pair(args)  # refuses a pair that cannot work, naming the model
    print(f"target: {llm.names[0]} ({llm.pair.target_llm.n_vocab()} tokens)")
    print(f"draft:  {llm.names[1]} ({llm.pair.draft_llm.n_vocab()} tokens)")
    print(f"mode:   {llm.pair.mode.mode}: {llm.pair.mode.detail}", flush=True)
    say = lambda msg: print(f"specgguf: {msg} ...", file=sys.stderr, flush=True)  # noqa: E731
    say(f"the target alone, {args.tokens} tokens")
    plain = llm.generate(CHECK_TEXT, max_tokens=args.tokens, temperature=0, k=0).tokens
    for name, settings in (("greedy", dict(temperature=0)), ("sampled at 0.8", dict(temperature=0.8, seed=0,
                                                                                     drafter_invariant=False))):
        say(f"acceptance, {name}, at K=4")
        r = llm.generate(CHECK_TEXT, max_tokens=args.tokens, k=4, **settings)
        st = r.stats
        line = (f"acceptance, {name}: {st['acceptance_rate']:.2f} ({st['accepted']} of {st['drafted']} "
                f"drafted tokens, {st['mean_accepted']:.2f} a round)")
        if name == "greedy":
            line += "; output identical to the target alone: " + ("yes" if r.tokens == plain else "NO")
        print(line, flush=True)
    say("the target's batches against one token at a time")
    print(exactness_line(llm.pair.target.model, llm.tokenize(CHECK_TEXT) + plain))
    return 0


def exactness_line(model, ids: List[int]) -> str:
    """check-pair's verdict on the target's arithmetic here: a verification
    batch's rows against the same tokens one per forward, bit for bit."""
    from ..llama.invariance import patched, probe
    got = [probe(model, ids, batch=b) for b in (2, 9)]
    rows, same = sum(g["rows"] for g in got), sum(g["identical"] for g in got)
    if same == rows:
        return (f"exactness: bit-identical here: the target scores batches of 2 and 9 tokens exactly as one "
                f"token at a time ({rows} positions compared bit for bit); greedy output is plain greedy's token "
                "for token")
    diff, flips = max(g["max_diff"] for g in got), sum(g["argmax_flips"] for g in got)
    if got[0]["invariant_tokens"]:
        why = "a kernel of this build still varies with the batch"
    elif patched():
        why = "batch invariance is turned off (SPECGGUF_BATCH_INVARIANT=0)"
    else:
        why = "llama.cpp was built without scripts/patches/llama-batch-invariant.patch (scripts/setup.sh applies it)"
    return (f"exactness: up to rounding here: {rows - same} of {rows} positions differ between a batch and one "
            f"token at a time (max logit difference {diff:.1e}, {flips} top-token flips): {why}; a near-tie "
            "can then go the other way than in plain decoding")


BENCH_DESCRIPTION = """\
Measure which draft length pays on this machine for a pair: plain decoding
(K=0), each fixed K and k="auto" (the default) on a few prompts, in turns
(a different configuration first each turn, so a slow spell of the machine
falls on all alike), then a table of the median tok/s, each against plain
decoding, and the formula's ceiling at the acceptance and forward costs the
same runs measured; and the draft length to use. Every generation reads its
prompt; tok/s counts what comes after the first token (the prompt's
evaluation, the same at every K, is left out). The default pair takes about two minutes on a
2-core x86-64 machine. Learned state goes to a temporary folder: k="auto"
starts as a new user's does, and nothing stored is changed."""


def _ks(text: str) -> list:
    out = []
    for part in text.split(","):
        part = part.strip()
        if part == "auto":
            out.append("auto")
        elif "-" in part:
            lo, hi = (int(x) for x in part.split("-", 1))
            out.extend(range(lo, hi + 1))
        else:
            out.append(int(part))
    if not out or any(k != "auto" and not 0 <= k <= K_MAX for k in out):
        raise ValueError
    return list(dict.fromkeys(out))


def bench_main(argv: List[str]) -> int:
    ap = Parser(prog="python -m specgguf bench", description=BENCH_DESCRIPTION,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--prompts", metavar="FILE", help="a text file of prompts, one per line (default: three "
                    "built-in writing prompts)")
    ap.add_argument("--workload", metavar="NAME|FILE", help="which drafts pay on real work: plain decoding, the "
                    "draft model alone, the lookup alone and both (the defaults), on a built-in workload ("
                    f"{', '.join(WORKLOADS)}) or your own: a .jsonl file of {{\"messages\": [...]}} or "
                    "{\"prompt\": \"...\"} objects, or a text file of prompts separated by lines of ---")
    ap.add_argument("--items", type=_number(int, 1), default=3, help="prompts taken from a built-in workload (3)")
    ap.add_argument("--no-chat", dest="chat", action="store_false", help="give the prompts as plain text "
                    "(default: as a user message through the target's chat template)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per generation (64)")
    ap.add_argument("--turns", type=int, default=2, help="times each configuration runs on each prompt (2)")
    ap.add_argument("--ks", default="0-8,auto", help=f"configurations: draft lengths 0-{K_MAX} (0 = plain "
                    "decoding), ranges and 'auto' (0-8,auto)")
    ap.add_argument("--temp", type=float, default=0.0, help="temperature (0: greedy); sampling uses top-k 40, "
                    "top-p 0.95, min-p 0.05")
    ap.add_argument("--plot", metavar="PNG", help="draw tok/s against K with the ceiling to this file "
                    "(needs matplotlib: pip install 'specgguf[plot]')")
    args = ap.parse_args(argv)
    try:
        ks = _ks(args.ks)
    except ValueError:
        ap.error(f"--ks {args.ks!r}: expected draft lengths 0-{K_MAX}, ranges like 0-8, and 'auto'")
    if args.tokens < 2 or args.turns < 1:
        ap.error("--tokens must be >= 2 and --turns >= 1")
    if args.workload:
        if args.prompts or args.ks != "0-8,auto" or args.plot:
            ap.error("--workload compares draft sources: it takes no --prompts, --ks or --plot")
        return _bench_workload(args)
    return _bench_ks(args, ks)


def _bench_ks(args: argparse.Namespace, ks: list) -> int:
    """``bench``: plain decoding and each K in ``ks`` of the draft model, in
    turns on the prompts; the table, the measured costs, the K to use."""
    import tempfile
    from . import bench
    if args.plot:
        bench.pyplot()  # before minutes of runs, not after
    prompts = bench.PROMPTS
    if args.prompts:
        with open(args.prompts, encoding="utf-8") as f:
            prompts = [line.strip() for line in f if line.strip()]
        if not prompts:
            raise ValueError(f"--prompts {args.prompts}: no prompt in the file (one per line)")
    os.environ["SPECGGUF_STATE"] = tempfile.mkdtemp(prefix="specgguf-bench-")
    if args.lookup is None and args.draft != "ngram":
        # K is the draft model's: a lookup in front would draft whatever K, and from its memory
        # replay each prompt's earlier turns (every K then read 3-7x plain). --workload compares them.
        args.lookup = False
    llm = load_pair(args)
    items = [[{"role": "user", "content": p}] if args.chat else p for p in prompts]
    print(f"specgguf bench: target {llm.names[0]}, draft {llm.names[1]}"
          f"{' (the draft model alone: --workload compares it with the lookup)' if args.lookup is False else ''}; "
          f"{len(items)} prompts x {args.tokens} tokens x {args.turns} turn{'s' if args.turns > 1 else ''}; "
          f"K in {', '.join(map(str, ks))}; temperature {args.temp:g}",
          file=sys.stderr, flush=True)
    report = bench.Report.of(bench.measure(llm, items, ks, args.tokens, args.turns, bench.Progress(),
                                              temperature=args.temp))
    print("\n".join(report.table()))
    if report.forwards:
        print(f"measured: acceptance {report.acceptance:.2f} per draft token; forwards per round: "
              + ", ".join(f"K={k} {t * 1e3:.1f} ms" for k, t in sorted(report.forwards.items())))
    print(report.recommendation())
    if args.plot:
        report.plot(args.plot, f"{llm.names[0]} + {llm.names[1]}, temperature {args.temp:g}, "
                               f"{args.tokens} tokens x {len(items)} prompts x {args.turns} turns")
        print(f"plot: {args.plot}")
    return 0


def _bench_workload(args: argparse.Namespace) -> int:
    """``bench --workload``: plain decoding, the draft model alone, the lookup
    alone and both on a workload, each generation from empty caches; the
    three pairs share one load of the models."""
    import tempfile
    from . import bench
    from ..api.speculative import SpeculativeLlama
    from ..config import response_format_grammar
    from .workloads import REVISE, items, read_workload
    work = items(args.workload, args.items) if args.workload in WORKLOADS else read_workload(args.workload)
    os.environ["SPECGGUF_STATE"] = tempfile.mkdtemp(prefix="specgguf-bench-")
    args.lookup = None  # each source is measured: the defaults' pair has both
    both = load_pair(args)
    shared = dict(n_ctx=args.ctx, n_threads=args.threads, verbose=args.verbose)
    target, draft = both.pair.target_llm, both.pair.draft_llm
    if draft is None:  # --draft ngram: the lookup is the only source
        configs = {"plain": (both, 0), "lookup": (both, "auto")}
    else:
        configs = {"plain": (both, 0), "model": (SpeculativeLlama(target, draft, lookup=False, **shared), "auto"),
                   "lookup": (SpeculativeLlama(target, "ngram", **shared), "auto"), "both": (both, "auto")}
    prepared = []
    for prompt, extra in work:
        own = {}
        for field, value in extra.items():
            if field != "response_format":
                raise ValueError(f"--workload {args.workload}: a request field {field!r} is not taken here "
                                 "(response_format is)")
            own["grammar"] = response_format_grammar(value)
        if args.workload == "second-turn":  # the first turn, as the user saw it, in the context
            first = both.create_chat_completion(prompt, max_tokens=args.tokens, temperature=0, k=0)
            prompt = prompt + [first["choices"][0]["message"], {"role": "user", "content": REVISE}]
        prepared.append((prompt, own))
    print(f"specgguf bench: target {both.names[0]}, draft {both.names[1]}; workload {args.workload}: "
          f"{len(prepared)} prompts x {args.tokens} tokens x {args.turns} turn{'s' if args.turns > 1 else ''}; "
          f"temperature {args.temp:g}", file=sys.stderr, flush=True)
    seed = dict(seed=1234) if args.temp > 0 else {}
    runs = bench.measure_configs(configs, prepared, args.tokens, args.turns, bench.Progress(),
                                 temperature=args.temp, **seed)
    print("\n".join(bench.sources_table(runs)))
    return 0


def serve_main(argv: List[str]) -> int:
    from .serve import main
    return main(argv)


def rpc_server_main(argv: List[str]) -> int:
    from ..llama.rpc import DEFAULT_PORT, WARNING, is_loopback, server_binary
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
    # The worker computes the target's layers: batch-invariant as this machine's specgguf is
    # (see specgguf.llama.invariance; the variable is read by the patched llama.cpp).
    from ..llama.invariance import INVARIANT_TOKENS
    os.environ.setdefault("GGML_CPU_BATCH_INVARIANT", os.environ.get("SPECGGUF_BATCH_INVARIANT", str(INVARIANT_TOKENS)))
    os.execv(binary, cmd)  # the worker takes this process over (same pid; signals reach it)
