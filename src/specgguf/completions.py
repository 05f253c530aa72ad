"""llama-cpp-python's ``create_completion`` / ``create_chat_completion``, on
a :class:`~specgguf.SpeculativeLlama`.

Same keyword names, same defaults, same return shapes (including the
streaming chunks), so code written for ``llama_cpp.Llama`` switches by
changing only the constructor. Speculation stats ride along under one extra
key, ``"speculation"`` (in the response, or the last chunk of a stream).

Arguments that would change the output and that specgguf does not implement
(penalties, logit bias, grammars, logprobs, tools, ...) raise ``ValueError``
naming the argument; none is silently ignored.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Dict, Iterator, List, Optional, Union

from .config import GenerationConfig
from .llama.text import check_messages

# (argument, the value that means "not used"): anything else would change the output.
UNSUPPORTED = {
    "suffix": None, "logprobs": None, "top_logprobs": None, "frequency_penalty": 0.0,
    "presence_penalty": 0.0, "repeat_penalty": 1.0, "typical_p": 1.0, "tfs_z": 1.0, "mirostat_mode": 0,
    "stopping_criteria": None, "logits_processor": None, "grammar": None, "logit_bias": None,
    "functions": None, "function_call": None, "tools": None, "tool_choice": None, "n": 1,
}
IGNORED = {"mirostat_tau", "mirostat_eta", "model", "user", "response_format", "stream_options",
           "penalize_nl", "parallel_tool_calls"}


def check_unsupported(kwargs: Dict[str, Any]) -> None:
    """Raise ValueError for an argument whose value specgguf cannot honour."""
    for name, neutral in UNSUPPORTED.items():
        value = kwargs.get(name, neutral)
        if value is None or value == neutral or (name == "logprobs" and value is False):
            continue
        if name in ("logit_bias", "tools", "functions") and not value:
            continue  # empty: nothing asked
        raise ValueError(f"{name}={value!r} is not supported by specgguf (it would change the output; "
                         f"exact speculative decoding samples the target's own distribution)")
    fmt = kwargs.get("response_format")
    if fmt and not (isinstance(fmt, dict) and fmt.get("type") in (None, "text")):
        raise ValueError(f"response_format={fmt!r} is not supported by specgguf (only plain text)")
    unknown = sorted(set(kwargs) - set(UNSUPPORTED) - IGNORED - {"response_format"})
    if unknown:
        raise TypeError(f"unexpected keyword argument(s): {', '.join(unknown)}")


def speculation(stats: dict) -> dict:
    """The stats that ride along under "speculation" (like llama-server's
    timings.draft_n / draft_n_accepted)."""
    return {"drafted": stats["drafted"], "accepted": stats["accepted"],
            "acceptance_rate": stats["acceptance_rate"], "rounds": stats["rounds"],
            "k_chosen": {str(k): n for k, n in stats["k_hist"].items()}, "verification": stats["verification"],
            "tokens_per_second": stats["tokens_per_second"]}


def _settings(max_tokens: Optional[int], n_ctx: int, **kw) -> GenerationConfig:
    # llama-cpp-python: max_tokens None or <= 0 means "up to the context window".
    limit = n_ctx if max_tokens is None or max_tokens <= 0 else max_tokens
    return GenerationConfig.from_kwargs(max_tokens=limit, **{k: v for k, v in kw.items() if v is not None})


class CompletionMethods:
    """The Llama-shaped methods; the host class provides ``run``, ``n_ctx`` and ``names``."""

    def create_completion(self, prompt: Union[str, List[int]], max_tokens: Optional[int] = 16,
                          temperature: float = 0.8, top_p: float = 0.95, min_p: float = 0.05,
                          echo: bool = False, stop: Union[None, str, List[str]] = None, top_k: int = 40,
                          stream: bool = False, seed: Optional[int] = None, **kwargs
                          ) -> Union[dict, Iterator[dict]]:
        """Text after ``prompt``, as ``llama_cpp.Llama.create_completion`` returns it.
        specgguf extensions: ``k``, ``p_min``, ``drafter_invariant``."""
        ext = {k: kwargs.pop(k) for k in ("k", "p_min", "drafter_invariant") if k in kwargs}
        check_unsupported(kwargs)
        config = _settings(max_tokens, self.n_ctx, temperature=temperature, top_p=top_p, min_p=min_p,
                           top_k=top_k, stop=stop, seed=seed, **ext)
        run = self.run(prompt, config=config)
        prefix = prompt if echo and isinstance(prompt, str) else ""
        shape = Shapes("cmpl", kwargs.get("model") or self.names[0])
        if stream:
            return shape.text_chunks(run, prefix)
        return shape.text_response(_drain(run), prefix)

    def create_chat_completion(self, messages: List[dict], temperature: float = 0.2, top_p: float = 0.95,
                               top_k: int = 40, min_p: float = 0.05, stream: bool = False,
                               stop: Union[None, str, List[str]] = None, seed: Optional[int] = None,
                               max_tokens: Optional[int] = None, **kwargs) -> Union[dict, Iterator[dict]]:
        """The assistant's reply to ``messages``, rendered by the GGUF's chat
        template, as ``llama_cpp.Llama.create_chat_completion`` returns it."""
        ext = {k: kwargs.pop(k) for k in ("k", "p_min", "drafter_invariant") if k in kwargs}
        check_unsupported(kwargs)
        config = _settings(max_tokens, self.n_ctx, temperature=temperature, top_p=top_p, min_p=min_p,
                           top_k=top_k, stop=stop, seed=seed, **ext)
        run = self.run(check_messages(messages), chat=True, config=config)
        shape = Shapes("chatcmpl", kwargs.get("model") or self.names[0])
        if stream:
            return shape.chat_chunks(run)
        return shape.chat_response(_drain(run))

    def __call__(self, prompt: Union[str, List[int]], **kwargs) -> Union[dict, Iterator[dict]]:
        """``llm(prompt, ...)`` is :meth:`create_completion`, as for ``llama_cpp.Llama``."""
        return self.create_completion(prompt, **kwargs)


def _drain(run: Iterator) -> Any:
    result = None
    for item in run:
        if not isinstance(item, str):
            result = item
    return result


class Shapes:
    """Response dicts of one call (llama-cpp-python's and OpenAI's shapes): one id, one creation time."""

    def __init__(self, prefix: str, model: str) -> None:
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model

    def head(self, kind: str) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    @staticmethod
    def usage(stats: dict) -> dict:
        p, c = stats["prompt_tokens"], stats["completion_tokens"]
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def text_response(self, res, prefix: str = "") -> dict:
        choice = {"text": prefix + res.text, "index": 0, "logprobs": None, "finish_reason": res.finish_reason}
        return {**self.head("text_completion"), "choices": [choice], "usage": self.usage(res.stats),
                "speculation": speculation(res.stats)}

    def chat_response(self, res) -> dict:
        choice = {"index": 0, "message": {"role": "assistant", "content": res.text}, "logprobs": None,
                  "finish_reason": res.finish_reason}
        return {**self.head("chat.completion"), "choices": [choice], "usage": self.usage(res.stats),
                "speculation": speculation(res.stats)}

    def text_chunks(self, run: Iterator, prefix: str = "") -> Iterator[dict]:
        chunk = lambda text, finish: {**self.head("text_completion"), "choices": [  # noqa: E731
            {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}]}
        if prefix:
            yield chunk(prefix, None)
        for item in run:
            if isinstance(item, str):
                yield chunk(item, None)
            else:
                yield {**chunk("", item.finish_reason), "speculation": speculation(item.stats)}

    def chat_chunks(self, run: Iterator) -> Iterator[dict]:
        chunk = lambda delta, finish: {**self.head("chat.completion.chunk"), "choices": [  # noqa: E731
            {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        yield chunk({"role": "assistant"}, None)
        for item in run:
            if isinstance(item, str):
                yield chunk({"content": item}, None)
            else:
                yield {**chunk({}, item.finish_reason), "speculation": speculation(item.stats)}
