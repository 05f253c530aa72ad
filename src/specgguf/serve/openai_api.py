"""OpenAI request bodies to specgguf calls, with OpenAI-style errors.

:func:`parse` checks a ``/v1/completions`` or ``/v1/chat/completions`` body
field by field and returns a :class:`Call`, or raises :class:`BadRequest`
with the offending ``param``: the server answers it as a 400 with
``{"error": {"message", "type", "param", "code"}}``. Penalties,
``logit_bias``, ``response_format`` (JSON object or schema), ``grammar``,
llama-server's ``json_schema``, ``logprobs``/``top_logprobs``, ``n`` and a
list ``prompt`` become settings; a chat's ``tools`` and their fields a
:class:`~specgguf.api.tools.ToolCalling`; fields that would change the
output and that specgguf does not implement (mirostat, ...) are refused by
name (``code: "unsupported_parameter"``), never ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, List, Optional, Union

from ..config import GenerationConfig
from ..llama.text import check_messages
from ..api.request_fields import (NEUTRAL_HTTP, TOOL_FIELDS, FieldError, Unsupported, check_neutral, grammar_of,
                                  logprobs_of)
from ..api.tools import ToolCalling, tools_of


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


IGNORED = {"model", "user", "metadata", "store", "service_tier"}
SAMPLING = {"max_tokens": "max_tokens", "max_completion_tokens": "max_tokens", "temperature": "temperature",
            "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "seed": "seed", "stop": "stop",
            "k": "k", "p_min": "p_min", "drafter_invariant": "drafter_invariant",
            "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
            "repeat_penalty": "repeat_penalty", "repeat_last_n": "penalty_last_n", "logit_bias": "logit_bias",
            "grammar": "grammar"}
COMMON = set(NEUTRAL_HTTP) | IGNORED | set(SAMPLING) | {"stream", "stream_options", "response_format", "json_schema",
                                                    "n", "logprobs", *TOOL_FIELDS}
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
    tools: Optional[ToolCalling] = None  # a chat's tools (specgguf.api.tools)
    fmt: str = "generic"                 # the template's tool format, once the server has read it

    @property
    def prompt(self):
        return self.prompts[0]

    def configs(self) -> List[GenerationConfig]:
        """One config per choice: with a seed, choice j of a prompt samples with
        ``seed + j`` (the same seed would give n equal texts)."""
        seed = self.config.seed
        return [self.config if seed is None or j == 0 else replace(self.config, seed=(seed + j) % 2**64)
                for _ in self.prompts for j in range(self.n)]


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


def _field_error(e: FieldError) -> BadRequest:
    return BadRequest(str(e), e.field, "unsupported_parameter" if isinstance(e, Unsupported) else None)


def _config(body: dict, kind: str, defaults: GenerationConfig) -> GenerationConfig:
    settings = {SAMPLING[k]: v for k, v in body.items() if k in SAMPLING and v is not None}
    stop = settings.get("stop")
    if isinstance(stop, list) and len(stop) > 4:
        raise BadRequest("stop takes at most 4 sequences", "stop")
    bias = settings.get("logit_bias")
    if isinstance(bias, dict) and any(isinstance(v, (int, float)) and not -100 <= v <= 100 for v in bias.values()):
        raise BadRequest("logit_bias values must be in [-100, 100]", "logit_bias")
    try:
        grammar, lp = grammar_of(body), logprobs_of(body, kind == "chat")
    except FieldError as e:
        raise _field_error(e) from None
    if grammar is not None:
        settings["grammar"] = grammar
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
    try:
        check_neutral(body, NEUTRAL_HTTP)
        tools = tools_of(body, kind == "chat")
    except FieldError as e:
        raise _field_error(e) from None
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
                echo, model if isinstance(model, str) else None, n, tools=tools)
