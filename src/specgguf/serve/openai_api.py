"""OpenAI request bodies to specgguf calls, with OpenAI-style errors.

:func:`parse` checks a ``/v1/completions`` or ``/v1/chat/completions`` body
field by field and returns a :class:`Call`, or raises :class:`BadRequest`
with the offending ``param``: the server answers it as a 400 with
``{"error": {"message", "type", "param", "code"}}``. Penalties,
``logit_bias``, ``response_format`` (JSON object or schema), ``grammar``,
llama-server's ``json_schema``, ``logprobs``/``top_logprobs``, ``n`` and a
list ``prompt`` become settings; fields that would change the output and
that specgguf does not implement (tools, mirostat, ...) are refused by name
(``code: "unsupported_parameter"``), never ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, List, Optional, Union

from ..config import TOP_LOGPROBS_MAX, GenerationConfig, response_format_grammar, schema_grammar
from ..llama.text import check_messages


class BadRequest(ValueError):
    """A request the server answers with a 4xx and an OpenAI-style body."""

    def __init__(self, message: str, param: Optional[str] = None, code: Optional[str] = None,
                 status: int = 400, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.param, self.code, self.status, self.kind = param, code, status, kind

    def body(self) -> dict:
        return error_body(str(self), self.kind, self.param, self.code)


def error_body(message: str, kind: str = "invalid_request_error", param: Optional[str] = None,
               code: Optional[str] = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


# Fields accepted with only their neutral value (anything else would change the output).
NEUTRAL = {"best_of": 1, "suffix": None, "tools": None, "functions": None, "function_call": None,
           "parallel_tool_calls": None, "typical_p": 1, "tfs_z": 1, "mirostat_mode": 0}
IGNORED = {"model", "user", "metadata", "store", "service_tier"}
SAMPLING = {"max_tokens": "max_tokens", "max_completion_tokens": "max_tokens", "temperature": "temperature",
            "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "seed": "seed", "stop": "stop",
            "k": "k", "p_min": "p_min", "drafter_invariant": "drafter_invariant",
            "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
            "repeat_penalty": "repeat_penalty", "repeat_last_n": "penalty_last_n", "logit_bias": "logit_bias",
            "grammar": "grammar"}
COMMON = set(NEUTRAL) | IGNORED | set(SAMPLING) | {"stream", "stream_options", "response_format", "json_schema",
                                                    "n", "logprobs", "tool_choice"}
FIELDS = {"completions": COMMON | {"prompt", "echo"}, "chat": COMMON | {"messages", "top_logprobs"}}
N_MAX = 16  # choices per request


@dataclass
class Call:
    """What a request asks for: ``n`` choices for each prompt, choice
    ``index = prompt_index * n + j``."""

    kind: str                    # "completions" or "chat"
    prompts: List[Union[str, List[int], List[dict]]]
    config: GenerationConfig
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with usage
    echo: bool = False
    model: Optional[str] = None
    n: int = 1
    ids: List[List[int]] = field(default_factory=list)  # each prompt's tokens, once the server has them

    @property
    def prompt(self):
        return self.prompts[0]

    def configs(self) -> List[GenerationConfig]:
        """One config per choice: with a seed, choice j of a prompt samples with
        ``seed + j`` (the same seed would give n equal texts)."""
        seed = self.config.seed
        return [self.config if seed is None or j == 0 else replace(self.config, seed=(seed + j) % 2**64)
                for _ in self.prompts for j in range(self.n)]


def _empty(value: Any) -> bool:
    return value is None or value == {} or value == [] or value is False


def _check_neutral(body: dict) -> None:
    for name, neutral in NEUTRAL.items():
        if name in body and not _empty(body[name]) and body[name] != neutral:
            raise BadRequest(f"{name} is not supported by specgguf (only {neutral!r} or absent)", name,
                             "unsupported_parameter")
    choice = body.get("tool_choice")
    if choice not in (None, "none", "auto"):
        raise BadRequest("tool_choice: specgguf does not call tools (only \"none\" or \"auto\" without tools)",
                         "tool_choice", "unsupported_parameter")


def _prompts(body: dict, kind: str) -> list:
    if kind == "chat":
        if "messages" not in body:
            raise BadRequest("'messages' is required", "messages")
        try:
            return [check_messages(body["messages"])]
        except (TypeError, ValueError) as e:
            raise BadRequest(str(e), "messages") from None
    if "prompt" not in body:
        raise BadRequest("'prompt' is required", "prompt")
    p = body["prompt"]
    ids = lambda v: isinstance(v, list) and v and all(isinstance(t, int) and not isinstance(t, bool)  # noqa: E731
                                                       for t in v)
    if isinstance(p, str) or ids(p):
        return [p]
    if isinstance(p, list) and p and all(isinstance(q, str) or ids(q) for q in p):
        if len(p) > N_MAX:
            raise BadRequest(f"prompt: at most {N_MAX} prompts per request, got {len(p)}", "prompt")
        return list(p)
    raise BadRequest("prompt must be a string, a list of token ids, or a list of those", "prompt")


def _grammar(body: dict) -> Optional[str]:
    """The grammar of ``response_format`` or llama-server's ``json_schema`` (one at most)."""
    asked = [k for k in ("grammar", "response_format", "json_schema") if not _empty(body.get(k))
             and body.get(k) != {"type": "text"}]
    if len(asked) > 1:
        raise BadRequest(f"{asked[0]} and {asked[1]} each set a grammar: give one", asked[1])
    try:
        if body.get("json_schema") not in (None, {}):
            return schema_grammar(body["json_schema"])
        return response_format_grammar(body.get("response_format"))
    except (TypeError, ValueError) as e:
        raise BadRequest(str(e), "json_schema" if "json_schema" in asked else "response_format") from None


def _logprobs(body: dict, kind: str) -> Optional[int]:
    lp = body.get("logprobs")
    if kind == "chat":
        top = body.get("top_logprobs")
        if lp not in (None, True, False):
            raise BadRequest("logprobs must be true or false", "logprobs")
        if top is not None and not lp:
            raise BadRequest("top_logprobs needs logprobs: true", "top_logprobs")
        if not lp:
            return None
        if top is not None and (not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= TOP_LOGPROBS_MAX):
            raise BadRequest(f"top_logprobs must be an int in [0, {TOP_LOGPROBS_MAX}]", "top_logprobs")
        return top or 0
    if lp is None or lp is False:
        return None
    if not isinstance(lp, int) or isinstance(lp, bool) or not 0 <= lp <= TOP_LOGPROBS_MAX:
        raise BadRequest(f"logprobs must be an int in [0, {TOP_LOGPROBS_MAX}] (the alternatives per token)", "logprobs")
    return lp


def _config(body: dict, kind: str, defaults: GenerationConfig) -> GenerationConfig:
    settings = {SAMPLING[k]: v for k, v in body.items() if k in SAMPLING and v is not None}
    stop = settings.get("stop")
    if isinstance(stop, list) and len(stop) > 4:
        raise BadRequest("stop takes at most 4 sequences", "stop")
    bias = settings.get("logit_bias")
    if isinstance(bias, dict) and any(isinstance(v, (int, float)) and not -100 <= v <= 100 for v in bias.values()):
        raise BadRequest("logit_bias values must be in [-100, 100]", "logit_bias")
    grammar = _grammar(body)
    if grammar is not None:
        settings["grammar"] = grammar
    lp = _logprobs(body, kind)
    if lp is not None:
        settings["logprobs"] = lp
    try:
        return GenerationConfig.from_kwargs(defaults, **settings)
    except (TypeError, ValueError) as e:
        param = next((k for k in sorted(SAMPLING, key=len, reverse=True) if str(e).startswith(SAMPLING[k])
                      and k in body), None)
        raise BadRequest(str(e), param) from None


def parse(body: Any, kind: str, defaults: GenerationConfig) -> Call:
    """A request body (already decoded from JSON) as a :class:`Call`."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    unknown = sorted(set(body) - FIELDS[kind])
    if unknown:
        raise BadRequest(f"unrecognized request argument supplied: {unknown[0]}", unknown[0])
    _check_neutral(body)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("stream must be true or false", "stream")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise BadRequest("stream_options must be an object", "stream_options")
    echo = body.get("echo", False)
    if not isinstance(echo, bool):
        raise BadRequest("echo must be true or false", "echo")
    n = body.get("n", 1)
    if n is None:
        n = 1
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= N_MAX:
        raise BadRequest(f"n must be an int in [1, {N_MAX}]", "n")
    prompts = _prompts(body, kind)
    if len(prompts) * n > N_MAX:
        raise BadRequest(f"{len(prompts)} prompts x n={n} is more than {N_MAX} choices", "n")
    model = body.get("model")
    return Call(kind, prompts, _config(body, kind, defaults), stream, bool(opts.get("include_usage")),
                echo, model if isinstance(model, str) else None, n)
