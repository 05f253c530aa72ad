"""The settings of one generation: :class:`GenerationConfig`, validated once.

Every surface builds one (``generate()``, ``SpeculativeLlama``, the CLI, the
server, the Llama-shaped methods) and everything below it reads it: the
adapter warps with its sampling fields, the decoder verifies with the rule
it names, the draft policy reads ``k`` and ``p_min``. Bad values raise
``TypeError`` / ``ValueError`` naming the argument, at the call (also for
``stream=True``), before any model work.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, fields, replace
from typing import Any, Mapping, Optional, Sequence, Tuple, Union

from .checks import check_int as _int, check_p_min, check_real as _float

K_MAX = 32  # the largest fixed draft length accepted
AUTO_K_MAX = 8  # the largest draft length k="auto" considers
LOOKUP_K_MAX = 32  # ... and lets a lookup propose: a copy costs nothing to draft and pays long
TOP_LOGPROBS_MAX = 20  # as OpenAI's


def check_k(value: object) -> Union[int, str]:
    """A draft length setting: ``"auto"`` or an int in [0, K_MAX] (TypeError / ValueError as ``check_int``)."""
    if isinstance(value, str):
        if value != "auto":
            raise ValueError(f"k must be an int in [0, {K_MAX}] or 'auto', got {value!r}")
        return value
    return _int("k", value, 0, K_MAX)


def _bias(value: object) -> Tuple[Tuple[int, float], ...]:
    """``{token id (int or its decimal string, as JSON sends it): added logit}``."""
    if value is None:
        return ()
    if isinstance(value, tuple):
        value = dict(value)
    if not isinstance(value, Mapping):
        raise TypeError(f"logit_bias must be a mapping of token id to a number, got {type(value).__name__}")
    out = {}
    for key, bias in value.items():
        try:
            tok = int(key) if not isinstance(key, bool) else None
        except (TypeError, ValueError):
            tok = None
        if tok is None or tok < 0 or (isinstance(key, float)):
            raise ValueError(f"logit_bias: {key!r} is not a token id (an int >= 0)")
        # -inf bans the token (as llama.cpp takes it); anything else must be finite.
        out[tok] = -math.inf if bias == -math.inf else _float(f"logit_bias[{key!r}]", bias, -math.inf)
    return tuple(sorted(out.items()))


def schema_grammar(schema: Any) -> str:
    """A JSON schema (a dict, or its JSON text) as GBNF, converted as llama.cpp
    converts it (llama-cpp-python's port of ``json_schema_to_grammar``)."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf
    text = schema if isinstance(schema, str) else json.dumps(schema)
    try:
        gbnf = json_schema_to_gbnf(text)
    except Exception as e:  # the converter raises bare exceptions for what it cannot express
        raise ValueError(f"json schema: cannot convert it to a grammar: {type(e).__name__}: {e}") from None
    # llama-cpp-python's port lets a string hold raw control characters ([^"\\]), which JSON
    # forbids: a sampled string with a newline in it did not parse. llama.cpp's own rule:
    return gbnf.replace('char ::= [^"\\\\] |', 'char ::= [^"\\\\\\x7F\\x00-\\x1F] |')


def response_format_grammar(fmt: Any) -> Optional[str]:
    """The grammar an OpenAI ``response_format`` asks for: None for text;
    any JSON value for ``{"type": "json_object"}`` (with a ``"schema"``, as
    llama-cpp-python takes it, that schema); the schema of
    ``{"type": "json_schema", "json_schema": {"schema": ...}}``."""
    if fmt is None:
        return None
    if not isinstance(fmt, Mapping) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise ValueError("response_format must be {\"type\": \"text\" | \"json_object\" | \"json_schema\"}, "
                         f"got {fmt!r}")
    if fmt["type"] == "text":
        return None
    if fmt["type"] == "json_object":
        if fmt.get("schema") is not None:
            return schema_grammar(fmt["schema"])
        from llama_cpp.llama_grammar import JSON_GBNF
        return JSON_GBNF
    spec = fmt.get("json_schema")
    if not isinstance(spec, Mapping) or not isinstance(spec.get("schema"), Mapping):
        raise ValueError("response_format json_schema needs {\"json_schema\": {\"name\": ..., \"schema\": {...}}}")
    return schema_grammar(spec["schema"])


def _stops(value: object) -> Tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, Sequence) or not all(isinstance(s, str) for s in value):
        raise TypeError("stop must be a string or a list of strings")
    return tuple(s for s in value if s)


# The settings applied to a row before the warp (specgguf.ops.logits): a regime of their own.
RULE_FIELDS = ("logit_bias", "repeat_penalty", "frequency_penalty", "presence_penalty", "penalty_last_n", "grammar",
               "grammar_trigger")


@dataclass(frozen=True)
class GenerationConfig:
    """Sampling and drafting settings of one generation (frozen, validated).

    Attributes:
        max_tokens: at most this many new tokens (fewer if the context fills).
        temperature: 0 = greedy, token for token the target's greedy output;
            > 0 = sampling from the target's warped distribution.
        top_k, top_p, min_p: warping before sampling, applied identically to
            both models (0 / 1.0 / 0.0 switch each off).
        k: draft tokens per round (0 = plain target decoding) or ``"auto"``:
            chosen each round from live acceptance and measured costs.
        p_min: stop a round's drafting when the draft's confidence in its next
            token is below this (None: off; ``"auto"``: learned; needs k="auto").
        seed: int in [0, 2**64) for reproducible sampling (None: fresh entropy).
        stop: strings that end the text (not included).
        drafter_invariant: verify by the shared-noise race (see
            :func:`specgguf.accept_invariant`): the text is exactly plain
            seeded sampling's, whatever the draft, K or timings. None (the
            default) turns it on for seeded sampling runs, and for unseeded
            ones under a grammar without top-k (fresh entropy: exact all the
            same, and it checks a few race winners against the grammar where
            p/q would mask every row).
        logit_bias: ``{token id: added logit}`` (a dict; held as sorted pairs).
        repeat_penalty, frequency_penalty, presence_penalty, penalty_last_n:
            llama.cpp's penalties over the last ``penalty_last_n`` generated
            tokens (1.0 / 0 / 0 switch them off; see
            :class:`~specgguf.ops.logits.Penalties`).
        grammar: GBNF text the output must match (llama.cpp's grammar
            engine); see :func:`schema_grammar` and
            :func:`response_format_grammar` for JSON.
        grammar_trigger: start the grammar lazily: the text is free until
            this string appears in it, and from its first character on the
            grammar holds (its root then matches the trigger and what
            follows, as a tool call's ``<tool_call>...``). None: from the start.
        logprobs: report each token's log-probability under the target with
            this many alternatives (0..20); None: not reported.

    Every rule above is applied to each verified row given the tokens before
    it, and to the draft's rows, so the output is plain decoding's with the
    same settings (:mod:`specgguf.ops.logits`).
    """

    max_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    k: Union[int, str] = "auto"
    p_min: Union[None, float, str] = None
    seed: Optional[int] = None
    stop: Tuple[str, ...] = ()
    drafter_invariant: Optional[bool] = None
    logit_bias: Tuple[Tuple[int, float], ...] = ()
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    penalty_last_n: int = 64
    grammar: Optional[str] = None
    grammar_trigger: Optional[str] = None
    logprobs: Optional[int] = None

    def __post_init__(self) -> None:
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen)
        set_("max_tokens", _int("max_tokens", self.max_tokens, 0))
        set_("temperature", _float("temperature", self.temperature, 0.0))
        set_("top_k", _int("top_k", self.top_k, 0))
        set_("top_p", _float("top_p", self.top_p, 0.0, 1.0))
        set_("min_p", _float("min_p", self.min_p, 0.0, 1.0))
        set_("k", check_k(self.k))
        set_("p_min", check_p_min(self.p_min))
        if self.p_min == "auto" and self.k != "auto":
            raise ValueError("p_min='auto' is set by the automatic draft length's costs: use it with k='auto'")
        if self.seed is not None:
            set_("seed", _int("seed", self.seed, 0, 2**64 - 1))
        set_("stop", _stops(self.stop))
        if self.drafter_invariant is not None and not isinstance(self.drafter_invariant, bool):
            raise TypeError(f"drafter_invariant must be True, False or None, got {self.drafter_invariant!r}")
        set_("logit_bias", _bias(self.logit_bias))
        set_("repeat_penalty", _float("repeat_penalty", self.repeat_penalty, 0.0))
        if self.repeat_penalty == 0.0:
            raise ValueError("repeat_penalty must be > 0 (1.0: off)")
        set_("frequency_penalty", _float("frequency_penalty", self.frequency_penalty, -2.0, 2.0))
        set_("presence_penalty", _float("presence_penalty", self.presence_penalty, -2.0, 2.0))
        set_("penalty_last_n", _int("penalty_last_n", self.penalty_last_n, 0))
        if self.grammar is not None:
            if not isinstance(self.grammar, str):
                raise TypeError(f"grammar must be GBNF text (a str), got {type(self.grammar).__name__}")
            if not self.grammar.strip():
                set_("grammar", None)
        if self.grammar_trigger is not None:
            if not isinstance(self.grammar_trigger, str) or not self.grammar_trigger:
                raise ValueError(f"grammar_trigger must be a non-empty string, got {self.grammar_trigger!r}")
            if self.grammar is None:
                raise ValueError("grammar_trigger starts a grammar: set grammar too")
        if self.logprobs is not None:
            set_("logprobs", _int("logprobs", self.logprobs, 0, TOP_LOGPROBS_MAX))

    @classmethod
    def from_kwargs(cls, config: Optional["GenerationConfig"] = None, **kwargs) -> "GenerationConfig":
        """``config`` (or the defaults) with ``kwargs`` replaced; unknown names
        raise TypeError, as a misspelled keyword argument would."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"unknown generation setting(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        if config is not None and not isinstance(config, cls):
            raise TypeError(f"config must be a GenerationConfig, got {type(config).__name__}")
        return replace(config, **kwargs) if config is not None else cls(**kwargs)

    @property
    def greedy(self) -> bool:
        """True for temperature 0: the one greedy flag every layer reads."""
        return self.temperature == 0.0

    @property
    def verification(self) -> str:
        """The rule that accepts drafts: ``"greedy"``, ``"invariant"`` (the
        shared-noise race) or ``"exact"`` (the min(1, p/q) rule)."""
        if self.greedy:
            return "greedy"
        # Unseeded, the race with fresh entropy is as exact as p/q; under a grammar
        # without top-k it checks a few race winners instead of masking every row.
        race_default = self.seed is not None or (self.grammar is not None and self.top_k == 0)
        invariant = race_default if self.drafter_invariant is None else self.drafter_invariant
        return "invariant" if invariant else "exact"

    @property
    def regime(self) -> str:
        """What a draft's acceptance depends on besides the models: greedy, or
        the warp settings (rounded), so evidence learned at one temperature is
        never used at another."""
        base = "greedy" if self.greedy else (f"t{self.temperature:.2f}-k{self.top_k}-p{self.top_p:.2f}-"
                                             f"m{self.min_p:.2f}-{self.verification}")
        rules = tuple(getattr(self, name) for name in RULE_FIELDS)
        if rules == tuple(GenerationConfig.__dataclass_fields__[name].default for name in RULE_FIELDS):
            return base
        return base + "-r" + hashlib.sha256(repr(rules).encode()).hexdigest()[:8]
