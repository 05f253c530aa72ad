"""The command-line options the generate, serve and calibrate commands share,
and what they build: a GenerationConfig and a loaded SpeculativeLlama."""

from __future__ import annotations

import argparse
import json
import os
import re
from typing import List, Optional

from ..checks import check_int, check_real
from ..config import AUTO_K_MAX, K_MAX


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (the usage block is in --help)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"specgguf: error: {message} (see {self.prog} --help)\n")


def _number(kind, low, high=None):
    """An argparse type: a kind (int or float) in [low, high], checked as the API checks it."""
    check = check_int if kind is int else check_real

    def parse(s: str):
        try:
            v = kind(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{s!r} is not a valid {kind.__name__}") from None
        try:
            return check("value", v, low, *(() if high is None else (high,)))
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e).replace("value must be", "must be")) from None
    return parse


def _auto_or(parse):
    return lambda s: "auto" if s == "auto" else parse(s)


def add_model_args(ap: argparse.ArgumentParser) -> None:
    """The options that choose and load models (generate, serve, calibrate)."""
    ap.add_argument("--target", help="target GGUF: a path or a models.lock name (default: the default pair)")
    ap.add_argument("--draft", help="draft GGUF: a path or a models.lock name (default: the default "
                    "pair), or 'ngram' for model-free prompt-lookup drafting")
    ap.add_argument("--lookup", dest="lookup", action="store_true", default=None,
                    help="with a draft model: look the text up first each round (in the context and earlier "
                    "prompts and answers: a copy drafts for free), the model drafting elsewhere, each with its "
                    "own K. The default")
    ap.add_argument("--no-lookup", dest="lookup", action="store_false", help="the draft model alone")
    ap.add_argument("--ngram", dest="lookup", action="store_true", help=argparse.SUPPRESS)  # --lookup's former name
    ap.add_argument("--lookup-memory", type=_number(int, 0), default=16384, metavar="TOKENS",
                    help="tokens of earlier prompts and answers the lookup keeps, in memory only (16384, "
                    "about 10 MB)")
    ap.add_argument("--ctx", type=_number(int, 256), default=2048,
                    help="context window in tokens, >= 256 (2048)")
    ap.add_argument("--threads", type=_number(int, 1), help="threads (default: every core)")
    ap.add_argument("--no-flash-attn", dest="flash_attn", action="store_false",
                    help="turn off llama.cpp's flash attention (on by default, as in llama-server: about 5%% "
                    "faster per token; off matches a llama-cpp-python Llama made with its defaults)")
    ap.add_argument("--rpc", help="host:port[,host:port...] of rpc-server workers: put the target's "
                    "layers on them (see `python -m specgguf rpc-server --help`)")
    ap.add_argument("--draft-rpc", action="store_true", help="with --rpc: put the draft on the workers too")
    ap.add_argument("--tensor-split", help="with --rpc: comma-separated share of layers per worker")
    ap.add_argument("--chat-template-file", metavar="FILE",
                    help="a Jinja chat template to use instead of the GGUF's (e.g. one that renders tools: "
                    "tool calls are then written and read in its format, Hermes <tool_call>, Mistral "
                    "[TOOL_CALLS] or Llama 3 JSON; others get a generic JSON format)")
    ap.add_argument("--verbose", action="store_true", help="show llama.cpp's own logs")


def add_generation_args(ap: argparse.ArgumentParser) -> None:
    """The generation defaults (generate, serve)."""
    ap.add_argument("-n", "--max-tokens", type=_number(int, 0), default=256, help="max new tokens (256)")
    ap.add_argument("--temp", type=_number(float, 0.0), default=0.0,
                    help="temperature; 0 = greedy, identical to the target alone (0)")
    ap.add_argument("--top-k", type=_number(int, 0), default=40, help="top-k, 0 = off (40)")
    ap.add_argument("--top-p", type=_number(float, 0.0, 1.0), default=0.95, help="top-p (0.95)")
    ap.add_argument("--min-p", type=_number(float, 0.0, 1.0), default=0.05, help="min-p (0.05)")
    ap.add_argument("-k", "--draft-max", type=_auto_or(_number(int, 0, K_MAX)), default="auto",
                    help=f"draft tokens per round, 0-{K_MAX} (0 = plain target decoding), or 'auto': chosen "
                    f"each round, 0-{AUTO_K_MAX}, from live acceptance and measured costs, backing off to 0 when "
                    "drafting does not pay (auto; `python -m specgguf bench` measures which K pays here)")
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
    ap.add_argument("--repeat-penalty", type=_number(float, 0.0), default=1.0,
                    help="penalise tokens among the last --repeat-last-n generated, as llama.cpp (1.0 = off)")
    ap.add_argument("--repeat-last-n", type=_number(int, 0), default=64, help="tokens the penalties look back (64)")
    ap.add_argument("--presence-penalty", type=_number(float, -2.0, 2.0), default=0.0,
                    help="subtract this from a token seen before (0 = off)")
    ap.add_argument("--frequency-penalty", type=_number(float, -2.0, 2.0), default=0.0,
                    help="subtract this times a token's count (0 = off)")
    ap.add_argument("--logit-bias", action="append", default=[], metavar="TOKEN_ID(+|-)BIAS",
                    help="add BIAS to a token's logit, e.g. 15043+1.5 or 2-inf (repeatable)")
    fmt = ap.add_mutually_exclusive_group()
    fmt.add_argument("--grammar-file", help="constrain the output to this GBNF grammar (llama.cpp's format)")
    fmt.add_argument("--json-schema", help="constrain the output to JSON matching this schema: inline JSON "
                     "or a file (converted to a grammar as llama.cpp does); '{}' for any JSON value")


def _logit_bias(items: List[str]) -> dict:
    out = {}
    for item in items:
        m = re.fullmatch(r"\s*(\d+)\s*([+-])\s*(inf|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)\s*", item)
        if not m:
            raise ValueError(f"--logit-bias {item!r}: expected TOKEN_ID+BIAS or TOKEN_ID-BIAS, e.g. 15043+1.5")
        out[int(m.group(1))] = float(m.group(2) + m.group(3))
    return out


def _grammar(args: argparse.Namespace) -> Optional[str]:
    from ..config import schema_grammar
    if getattr(args, "grammar_file", None):
        with open(args.grammar_file, encoding="utf-8") as f:
            return f.read()
    schema = getattr(args, "json_schema", None)
    if schema is None:
        return None
    if not schema.lstrip().startswith("{") and os.path.exists(schema):
        with open(schema, encoding="utf-8") as f:
            schema = f.read()
    try:
        json.loads(schema)
    except ValueError as e:
        raise ValueError(f"--json-schema: not JSON ({e})") from None
    return schema_grammar(schema)


def config_from_args(args: argparse.Namespace):
    """The GenerationConfig of the generation options (ValueError/OSError for
    a bad --logit-bias, --grammar-file or --json-schema)."""
    from ..config import GenerationConfig
    return GenerationConfig(max_tokens=args.max_tokens, temperature=args.temp, top_k=args.top_k,
                            top_p=args.top_p, min_p=args.min_p, k=args.draft_max, p_min=args.p_min,
                            seed=args.seed, drafter_invariant=args.drafter_invariant,
                            stop=getattr(args, "stop", None), repeat_penalty=args.repeat_penalty,
                            penalty_last_n=args.repeat_last_n, presence_penalty=args.presence_penalty,
                            frequency_penalty=args.frequency_penalty, logit_bias=_logit_bias(args.logit_bias),
                            grammar=_grammar(args))


def pair_names(args: argparse.Namespace) -> tuple:
    """``(target, draft)`` the model options name, the default pair filling in what they leave out."""
    target, draft = args.target, args.draft
    if target is None or draft is None:
        from ..llama import models
        dt, dd = models.default_pair()
        target, draft = target or dt, draft or dd
    return target, draft


def load_pair(args: argparse.Namespace, **kw):
    """The SpeculativeLlama the model options ask for (default pair filled in)."""
    from ..api.speculative import SpeculativeLlama
    target, draft = pair_names(args)
    split = [float(x) for x in args.tensor_split.split(",")] if args.tensor_split else None
    template = None
    if args.chat_template_file:
        try:
            with open(args.chat_template_file, encoding="utf-8") as f:
                template = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise OSError(f"--chat-template-file {args.chat_template_file}: "
                          f"{getattr(e, 'strerror', None) or e}") from None
        if not template.strip():
            raise ValueError(f"--chat-template-file {args.chat_template_file} is empty")
    return SpeculativeLlama(target, draft, lookup=args.lookup, lookup_memory=args.lookup_memory,
                            n_ctx=args.ctx, n_threads=args.threads,
                            flash_attn=args.flash_attn,
                            verbose=args.verbose, rpc=args.rpc, draft_rpc=args.draft_rpc,
                            tensor_split=split, chat_template=template, **kw)
