"""OpenAI request bodies to specgguf calls, with OpenAI-style errors.

:func:`parse` checks a ``/v1/completions`` or ``/v1/chat/completions`` body
field by field and returns a :class:`Call`, or raises :class:`BadRequest`
with the offending ``param``: the server answers it as a 400 with
``{"error": {"message", "type", "param", "code"}}``. Fields that would change
the output and that specgguf does not implement are refused by name
(``code: "unsupported_parameter"``), never ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional, Union

from ..config import GenerationConfig
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
NEUTRAL = {"n": 1, "best_of": 1, "logprobs": None, "top_logprobs": None, "presence_penalty": 0,
           "frequency_penalty": 0, "repeat_penalty": 1, "logit_bias": None, "suffix": None, "tools": None,
           "tool_choice": None, "functions": None, "function_call": None, "parallel_tool_calls": None,
           "grammar": None, "typical_p": 1, "tfs_z": 1, "mirostat_mode": 0}
IGNORED = {"model", "user", "metadata", "store", "service_tier"}
SAMPLING = {"max_tokens": "max_tokens", "max_completion_tokens": "max_tokens", "temperature": "temperature",
            "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "seed": "seed", "stop": "stop",
            "k": "k", "p_min": "p_min", "drafter_invariant": "drafter_invariant"}
COMMON = set(NEUTRAL) | IGNORED | set(SAMPLING) | {"stream", "stream_options", "response_format"}
FIELDS = {"completions": COMMON | {"prompt", "echo"}, "chat": COMMON | {"messages"}}


@dataclass
class Call:
    """What a request asks for."""

    kind: str                    # "completions" or "chat"
    prompt: Union[str, List[int], List[dict]]
    config: GenerationConfig
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with usage
    echo: bool = False
    model: Optional[str] = None
    ids: List[int] = field(default_factory=list)  # the prompt's tokens, once the server has them


def _empty(value: Any) -> bool:
    return value is None or value == {} or value == [] or value is False


def _check_neutral(body: dict) -> None:
    for name, neutral in NEUTRAL.items():
        if name in body and not _empty(body[name]) and body[name] != neutral:
            raise BadRequest(f"{name}={body[name]!r} is not supported by specgguf: exact speculative decoding "
                             f"samples the target's own distribution, and {name} would change it",
                             name, "unsupported_parameter")
    fmt = body.get("response_format")
    if not _empty(fmt) and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise BadRequest("response_format: only {\"type\": \"text\"} is supported", "response_format",
                         "unsupported_parameter")


def _prompt(body: dict, kind: str):
    if kind == "chat":
        if "messages" not in body:
            raise BadRequest("'messages' is required", "messages")
        try:
            return check_messages(body["messages"])
        except (TypeError, ValueError) as e:
            raise BadRequest(str(e), "messages") from None
    if "prompt" not in body:
        raise BadRequest("'prompt' is required", "prompt")
    p = body["prompt"]
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]  # a batch of one
    if isinstance(p, str) or (isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool)
                                                                 for t in p)):
        return p
    raise BadRequest("prompt must be a string or a list of token ids (one prompt per request)", "prompt")


def _config(body: dict, defaults: GenerationConfig) -> GenerationConfig:
    settings = {SAMPLING[k]: v for k, v in body.items() if k in SAMPLING and v is not None}
    stop = settings.get("stop")
    if isinstance(stop, list) and len(stop) > 4:
        raise BadRequest("stop takes at most 4 sequences", "stop")
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
    model = body.get("model")
    return Call(kind, _prompt(body, kind), _config(body, defaults), stream, bool(opts.get("include_usage")),
                echo, model if isinstance(model, str) else None)
