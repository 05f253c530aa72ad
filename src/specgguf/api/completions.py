"""llama-cpp-python's ``create_completion`` / ``create_chat_completion``, on
a :class:`~specgguf.SpeculativeLlama`.

Same keyword names, same defaults, same return shapes (including the
streaming chunks), so code written for ``llama_cpp.Llama`` switches by
changing only the constructor. Settings given to the object
(``SpeculativeLlama(t, d, k=0, temperature=0)``) are its calls' defaults:
a sampling argument a call leaves out takes the object's setting if it has
one, else llama-cpp-python's default; ``max_tokens`` keeps
llama-cpp-python's meaning (16 for a completion, None: up to the context).
Speculation stats ride along under one extra key, ``"speculation"`` (in
the response, or the last chunk of a stream; each text chunk's holds the
provenance of its tokens, ``sources``), and under llama-server's
``"timings"`` (``draft_n``, ``draft_n_accepted``).

Penalties, ``logit_bias``, ``grammar``, JSON ``response_format`` and
``logprobs`` work as in llama-cpp-python, applied to every verified row
(:mod:`specgguf.ops.logits`). Chat takes ``tools``, ``tool_choice``,
``parallel_tool_calls`` and the legacy ``functions``/``function_call``
(:mod:`specgguf.api.tools`): the answer's ``message.tool_calls`` with
``finish_reason: "tool_calls"``. Arguments that would change the output and
that specgguf does not implement (mirostat, typical-p, ...) raise
``ValueError`` naming the argument; none is silently ignored.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

from ..config import GenerationConfig
from ..llama.text import check_messages
from .request_fields import NEUTRAL_LLAMA, TOOL_FIELDS, check_neutral, grammar_of, logprobs_of
from .tools import ToolCalling, prepare_chat, tools_of


def _fingerprint() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return f"specgguf-{version('specgguf')}"
    except PackageNotFoundError:
        return "specgguf"


FINGERPRINT = _fingerprint()  # system_fingerprint: the package and its version

IGNORED = {"mirostat_tau", "mirostat_eta", "model", "user", "stream_options", "penalize_nl"}
RULES = {"frequency_penalty", "presence_penalty", "repeat_penalty", "logit_bias", "grammar", "response_format",
         "logprobs", "top_logprobs", *TOOL_FIELDS}


def check_unsupported(kwargs: Dict[str, Any]) -> None:
    """Raise ValueError for an argument whose value specgguf cannot honour,
    TypeError for one llama-cpp-python does not take either."""
    check_neutral(kwargs, NEUTRAL_LLAMA)
    unknown = sorted(set(kwargs) - set(NEUTRAL_LLAMA) - IGNORED - RULES)
    if unknown:
        raise TypeError(f"unexpected keyword argument(s): {', '.join(unknown)}")


def rule_settings(kwargs: Dict[str, Any], chat: bool) -> Dict[str, Any]:
    """The :class:`GenerationConfig` settings of llama-cpp-python's arguments
    that change the distribution: penalties, ``logit_bias``, ``grammar`` (a
    ``LlamaGrammar`` or GBNF text), ``response_format`` (JSON), and
    ``logprobs`` (:func:`~specgguf.api.request_fields.logprobs_of`)."""
    out = {k: kwargs[k] for k in ("frequency_penalty", "presence_penalty", "repeat_penalty", "logit_bias")
           if kwargs.get(k) is not None}
    grammar, logprobs = grammar_of(kwargs), logprobs_of(kwargs, chat)
    if grammar is not None:
        out["grammar"] = grammar
    if logprobs is not None:
        out["logprobs"] = logprobs
    return out


def speculation(stats: dict, sources: Optional[List[str]] = None) -> dict:
    """The stats that ride along under "speculation"; ``sources``: each
    completion token's provenance, ``"draft"``, ``"lookup"`` or ``"target"``
    (:attr:`~specgguf.GenerationResult.sources`), and ``tokens_by_source``
    their counts."""
    out = {"drafted": stats["drafted"], "accepted": stats["accepted"],
           "tokens_by_source": stats.get("tokens_by_source"),
           "acceptance_rate": stats["acceptance_rate"], "rounds": stats["rounds"],
           "k_chosen": {str(k): n for k, n in stats["k_hist"].items()}, "verification": stats["verification"],
           "tokens_per_second": stats["tokens_per_second"], "why": stats.get("why")}
    if sources is not None:
        out["sources"] = sources
    return out


def timings(stats: dict) -> dict:
    """llama-server's ``timings`` of one result, so its clients read them:
    ``prompt_ms`` is the first round (the prompt's evaluation and the first
    token), ``predicted_ms`` the rest; ``draft_n`` / ``draft_n_accepted``
    the draft tokens proposed and accepted."""
    n, first = stats["completion_tokens"], stats.get("first_target_seconds", 0.0)
    prompt_n = stats["prompt_tokens"] - stats.get("cached_tokens", 0)
    rest = max(stats["seconds"] - first, 0.0)
    return {"prompt_n": prompt_n, "prompt_ms": first * 1e3,
            "prompt_per_token_ms": first * 1e3 / prompt_n if prompt_n else 0.0,
            "prompt_per_second": prompt_n / first if first else 0.0,
            "predicted_n": n, "predicted_ms": rest * 1e3,
            "predicted_per_token_ms": rest * 1e3 / n if n else 0.0,
            "predicted_per_second": n / rest if rest else 0.0,
            "draft_n": stats["drafted"], "draft_n_accepted": stats["accepted"]}


# llama-cpp-python's defaults for the sampling arguments of its create_* methods.
LLAMA_SAMPLING = {"completion": {"temperature": 0.8, "top_p": 0.95, "min_p": 0.05, "top_k": 40},
                  "chat": {"temperature": 0.2, "top_p": 0.95, "min_p": 0.05, "top_k": 40}}


class CompletionMethods:
    """The Llama-shaped methods; the host class provides ``run``, ``n_ctx``,
    ``names``, ``piece`` (a token's bytes), ``defaults`` (a
    :class:`GenerationConfig`) and ``chosen`` (the names of the settings it
    was given)."""

    def _settings(self, kind: str, max_tokens: Optional[int], call: Dict[str, Any]) -> GenerationConfig:
        """One call's config: the call's arguments (None: not given) over the
        object's chosen sampling settings over llama-cpp-python's, on the
        object's defaults for the rest (k, p_min, drafter_invariant, ...)."""
        # llama-cpp-python: max_tokens None or <= 0 means "up to the context window".
        limit = self.n_ctx if max_tokens is None or max_tokens <= 0 else max_tokens
        sampling = {name: getattr(self.defaults, name) if name in self.chosen else v
                    for name, v in LLAMA_SAMPLING[kind].items()}
        given = {name: v for name, v in call.items() if v is not None}
        return GenerationConfig.from_kwargs(self.defaults, max_tokens=limit, **{**sampling, **given})

    def create_completion(self, prompt: Union[str, List[int]], max_tokens: Optional[int] = 16,
                          temperature: Optional[float] = None, top_p: Optional[float] = None,
                          min_p: Optional[float] = None, echo: bool = False,
                          stop: Union[None, str, List[str]] = None, top_k: Optional[int] = None,
                          stream: bool = False, seed: Optional[int] = None, **kwargs
                          ) -> Union[dict, Iterator[dict]]:
        """Text after ``prompt``, as ``llama_cpp.Llama.create_completion`` returns it.
        ``temperature``, ``top_p``, ``min_p``, ``top_k``: None takes the
        object's setting, else llama-cpp-python's (0.8, 0.95, 0.05, 40).
        specgguf extensions: ``k``, ``p_min``, ``drafter_invariant``."""
        ext = {k: kwargs.pop(k) for k in ("k", "p_min", "drafter_invariant") if k in kwargs}
        check_unsupported(kwargs)
        tools_of(kwargs, chat=False)
        config = self._settings("completion", max_tokens, dict(
            temperature=temperature, top_p=top_p, min_p=min_p, top_k=top_k, stop=stop, seed=seed, **ext,
            **rule_settings(kwargs, chat=False)))
        run = self.run(prompt, config=config)
        prefix = prompt if echo and isinstance(prompt, str) else ""
        shape = Shapes("cmpl", kwargs.get("model") or self.names[0], self.piece)
        if stream:
            return shape.text_chunks(run, prefix)
        return shape.text_response(_drain(run), prefix)

    def create_chat_completion(self, messages: List[dict], temperature: Optional[float] = None,
                               top_p: Optional[float] = None, top_k: Optional[int] = None,
                               min_p: Optional[float] = None, stream: bool = False,
                               stop: Union[None, str, List[str]] = None, seed: Optional[int] = None,
                               max_tokens: Optional[int] = None, **kwargs) -> Union[dict, Iterator[dict]]:
        """The assistant's reply to ``messages``, rendered by the GGUF's chat
        template, as ``llama_cpp.Llama.create_chat_completion`` returns it.
        ``temperature``, ``top_p``, ``top_k``, ``min_p``: None takes the
        object's setting, else llama-cpp-python's (0.2, 0.95, 40, 0.05).
        ``tools`` / ``tool_choice`` / ``parallel_tool_calls`` (or the legacy
        ``functions`` / ``function_call``): the answer may call them
        (:mod:`specgguf.api.tools`); streamed, a call comes whole in one
        chunk's ``delta.tool_calls``."""
        ext = {k: kwargs.pop(k) for k in ("k", "p_min", "drafter_invariant") if k in kwargs}
        check_unsupported(kwargs)
        calling, rules = tools_of(kwargs, chat=True), rule_settings(kwargs, chat=True)
        chat = prepare_chat(self, check_messages(messages), calling, rules.pop("grammar", None))
        if chat.grammar is not None:
            rules.update(grammar=chat.grammar, grammar_trigger=chat.trigger)
        config = self._settings("chat", max_tokens, dict(
            temperature=temperature, top_p=top_p, min_p=min_p, top_k=top_k, stop=stop, seed=seed, **ext, **rules))
        run = self.run(chat.ids, config=config)
        shape = Shapes("chatcmpl", kwargs.get("model") or self.names[0], self.piece, calling, chat.fmt)
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
    """Response dicts of one call (llama-cpp-python's and OpenAI's shapes): one
    id, one creation time; ``piece(token) -> bytes`` names tokens in logprobs.
    ``index`` picks the choice a result or chunk belongs to (``n`` > 1, list prompts).
    ``tools``, ``fmt``: the call's :class:`~specgguf.api.tools.ToolCalling`
    and the template's tool format: answers are read for tool calls."""

    def __init__(self, prefix: str, model: str, piece: Optional[Callable[[int], bytes]] = None,
                 tools: Optional[ToolCalling] = None, fmt: str = "generic") -> None:
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self.piece = piece
        self.tools, self.fmt = tools, fmt

    def message(self, res) -> Tuple[dict, str]:
        """A chat answer's message and finish reason: with tools, the calls
        read from its text (``tool_calls``, or the legacy ``function_call``)."""
        msg = {"role": "assistant", "content": res.text, "refusal": None}
        if self.tools is None:
            return msg, res.finish_reason
        msg["content"], calls = self.tools.parse(res.text, self.fmt)
        if not calls:
            return msg, res.finish_reason
        if self.tools.legacy:
            msg["function_call"] = calls[0]["function"]
            return msg, "function_call"
        msg["tool_calls"] = calls
        return msg, "tool_calls"

    def head(self, kind: str) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "system_fingerprint": FINGERPRINT}

    @staticmethod
    def usage(stats: Union[dict, List[dict]]) -> dict:
        """Token counts of one result's stats, or summed over several (``n`` > 1)."""
        every = stats if isinstance(stats, list) else [stats]
        p, c = sum(s["prompt_tokens"] for s in every), sum(s["completion_tokens"] for s in every)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
                "prompt_tokens_details": {"cached_tokens": sum(s.get("cached_tokens", 0) for s in every)}}

    # -- logprobs ------------------------------------------------------------------
    def _text(self, token: int) -> str:
        return self.piece(token).decode("utf-8", "replace")

    def text_logprobs(self, entries: Optional[list], offset: int = 0) -> Optional[dict]:
        """llama-cpp-python's (and OpenAI's legacy) completion logprobs."""
        if entries is None:
            return None
        tokens, offsets = [], []
        for tok, _, _ in entries:
            offsets.append(offset)
            tokens.append(self._text(tok))
            offset += len(tokens[-1])
        return {"tokens": tokens, "text_offset": offsets, "token_logprobs": [lp for _, lp, _ in entries],
                "top_logprobs": [{self._text(i): v for i, v in top} if top else None for _, _, top in entries]}

    def chat_logprobs(self, entries: Optional[list]) -> Optional[dict]:
        """OpenAI's chat logprobs: ``{"content": [{token, logprob, bytes, top_logprobs}], "refusal": None}``."""
        if entries is None:
            return None
        item = lambda tok, lp: {"token": self._text(tok), "logprob": lp, "bytes": list(self.piece(tok))}  # noqa: E731
        return {"content": [{**item(tok, lp), "top_logprobs": [item(i, v) for i, v in top]}
                            for tok, lp, top in entries], "refusal": None}

    # -- whole responses -----------------------------------------------------------
    def text_choice(self, res, index: int = 0, prefix: str = "") -> dict:
        return {"text": prefix + res.text, "index": index, "logprobs": self.text_logprobs(res.logprobs, len(prefix)),
                "finish_reason": res.finish_reason}

    def chat_choice(self, res, index: int = 0) -> dict:
        msg, finish = self.message(res)
        return {"index": index, "message": msg, "logprobs": self.chat_logprobs(res.logprobs), "finish_reason": finish}

    def response(self, results: List, chat: bool, prefix: str = "") -> dict:
        """One response with a choice per result (their order is their index)."""
        choices = [self.chat_choice(r, i) if chat else self.text_choice(r, i, prefix) for i, r in enumerate(results)]
        stats = [r.stats for r in results]
        spec = [speculation(r.stats, r.sources) for r in results]
        return {**self.head("chat.completion" if chat else "text_completion"), "choices": choices,
                "usage": self.usage(stats), "speculation": spec[0] if len(spec) == 1 else spec,
                "timings": timings(stats[0]) if len(stats) == 1 else [timings(s) for s in stats]}

    def text_response(self, res, prefix: str = "") -> dict:
        return self.response([res], False, prefix)

    def chat_response(self, res) -> dict:
        return self.response([res], True)

    # -- streams -------------------------------------------------------------------
    def chunks(self, items: Iterator[tuple], chat: bool, n_choices: int = 1, prefix: str = "") -> Iterator[dict]:
        """Stream chunks of ``(choice index, text piece or result)`` items:
        first a role chunk per choice (chat; ``content: null`` as
        llama-server sends it) or the echoed prompt (text), then one chunk
        per piece, then each choice's last chunk with its finish reason.
        With tools the answer is read whole first: its content, or its calls
        in one ``delta.tool_calls`` chunk, come just before the last chunk."""
        kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(index, text, finish, lp=None, delta=None):
            body = ({"delta": delta if delta is not None else ({"content": text} if text is not None else {})}
                    if chat else {"text": text or ""})
            return {**self.head(kind), "choices": [{"index": index, **body, "logprobs": lp, "finish_reason": finish}]}
        offsets = [len(prefix)] * n_choices
        for i in range(n_choices):
            if chat:
                yield chunk(i, None, None, delta={"role": "assistant", "content": None})
            elif prefix:
                yield chunk(i, prefix, None)
        held = chat and self.tools is not None  # the answer is read whole for its calls
        for i, item in items:
            if isinstance(item, str):
                if held:
                    continue
                entries = getattr(item, "logprobs", None)
                lp = self.chat_logprobs(entries) if chat else self.text_logprobs(entries, offsets[i])
                offsets[i] += len(item)
                yield {**chunk(i, str(item), None, lp), "speculation": {"sources": list(getattr(item, "sources", []))}}
                continue
            finish = item.finish_reason
            if held:
                msg, finish = self.message(item)
                if msg["content"]:
                    yield chunk(i, msg["content"], None)
                if "tool_calls" in msg:
                    yield chunk(i, None, None, delta={"tool_calls": [{"index": j, **c}
                                                                     for j, c in enumerate(msg["tool_calls"])]})
                elif "function_call" in msg:
                    yield chunk(i, None, None, delta={"function_call": msg["function_call"]})
            # the last chunk: this choice's stats (its tokens' sources came with their pieces)
            yield {**chunk(i, None, finish), "speculation": speculation(item.stats, []), "timings": timings(item.stats)}

    def text_chunks(self, run: Iterator, prefix: str = "") -> Iterator[dict]:
        return self.chunks(((0, item) for item in run), False, 1, prefix)

    def chat_chunks(self, run: Iterator) -> Iterator[dict]:
        return self.chunks(((0, item) for item in run), True)
