"""The OpenAI-shaped arguments both surfaces take: one definition for
llama-cpp-python's ``create_*completion`` keywords (:mod:`specgguf.api.completions`)
and the server's request bodies (:mod:`specgguf.serve.openai_api`).

Which arguments are accepted only at the value that means "not used" (mirostat,
typical-p, ...: anything else would change the output, so it is
refused by name, never ignored), and how the ones that become settings are
read: the one grammar a call may ask for (``grammar``, a JSON
``response_format`` or llama-server's ``json_schema``), and ``logprobs``
(completions: the alternatives per token; chat: ``logprobs=True`` with
``top_logprobs``). Every error is a :class:`FieldError` naming its field,
which the server answers as a 400 with that ``param``.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from ..config import TOP_LOGPROBS_MAX, response_format_grammar, schema_grammar


class FieldError(ValueError):
    """A bad argument; ``field`` names it, and the message starts with it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class Unsupported(FieldError):
    """An argument specgguf does not implement, set to a value that would change the output."""


# Accepted only at the value that means "not used", on both surfaces, and on each alone.
NEUTRAL = {"suffix": None, "typical_p": 1.0, "tfs_z": 1.0, "mirostat_mode": 0}
NEUTRAL_LLAMA = {**NEUTRAL, "stopping_criteria": None, "logits_processor": None, "n": 1}
NEUTRAL_HTTP = {**NEUTRAL, "best_of": 1}
# Tool calling's fields (read by :mod:`specgguf.api.tools`): chat only.
TOOL_FIELDS = ("tools", "functions", "function_call", "tool_choice", "parallel_tool_calls")
GRAMMARS = ("grammar", "response_format", "json_schema")


def _unused(value: Any, neutral: Any = None) -> bool:
    return value is None or value is False or value == neutral or (isinstance(value, (list, tuple, dict))
                                                                   and not value)


def check_neutral(args: Mapping[str, Any], table: Mapping[str, Any]) -> None:
    """Raise :class:`Unsupported` for an argument of ``table`` (NEUTRAL_LLAMA
    or NEUTRAL_HTTP) set to anything but its neutral value. A
    long value (a list) is named, not repeated."""
    for name, neutral in table.items():
        value = args.get(name)
        if not _unused(value, neutral):
            shown = f"a list of {len(value)}" if isinstance(value, (list, tuple)) else repr(value)[:60]
            raise Unsupported(name, f"{name}={shown} is not supported by specgguf (only {neutral!r} or absent)")


def grammar_of(args: Mapping[str, Any]) -> Optional[str]:
    """The GBNF text of the one grammar ``args`` asks for, or None: ``grammar``
    (GBNF text, or llama-cpp-python's ``LlamaGrammar``), ``response_format``
    (``json_object``, ``json_schema``; ``text`` is none) or llama-server's
    ``json_schema``. Two of them raise."""
    asked = [k for k in GRAMMARS if not _unused(args.get(k)) and args.get(k) != {"type": "text"}]
    if len(asked) > 1:
        raise FieldError(asked[1], f"{asked[1]} and {asked[0]} each set a grammar: give one")
    if not asked:
        return None
    name, value = asked[0], args[asked[0]]
    try:
        if name == "grammar":  # checked and compiled with the other settings
            return value if isinstance(value, str) else getattr(value, "_grammar", value)
        return schema_grammar(value) if name == "json_schema" else response_format_grammar(value)
    except (TypeError, ValueError) as e:
        raise FieldError(name, str(e)) from None


def logprobs_of(args: Mapping[str, Any], chat: bool) -> Optional[int]:
    """How many alternatives per token to report with each token's
    log-probability, or None for no logprobs: chat asks with
    ``logprobs=True`` and ``top_logprobs`` (0..20), completions with
    ``logprobs=N``."""
    lp, name = args.get("logprobs"), "logprobs"
    if chat:
        top = args.get("top_logprobs")
        if lp not in (None, True, False):
            raise FieldError("logprobs", "logprobs must be true or false")
        if top is not None and not lp:
            raise FieldError("top_logprobs", "top_logprobs needs logprobs: true")
        if not lp:
            return None
        lp, name = (0 if top is None else top), "top_logprobs"
    elif lp is None or lp is False:
        return None
    if not isinstance(lp, int) or isinstance(lp, bool) or not 0 <= lp <= TOP_LOGPROBS_MAX:
        raise FieldError(name, f"{name} must be an int in [0, {TOP_LOGPROBS_MAX}] (alternatives per token)")
    return lp
