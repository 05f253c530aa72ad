"""Text in and out: prompts to token ids, generated ids to what the user sees.

:class:`PromptEncoder` turns a string, token ids, or role/content messages
(through the GGUF's own chat template) into prompt ids. :class:`TextStream`
is the one place that decides where a generation's output ends: at an
end-of-generation token (never shown), at a stop string (cut exactly before
it, wherever it falls), or at the length limit.
"""

from __future__ import annotations

import codecs
import json
from typing import Callable, Collection, List, Optional, Sequence, Union

Prompt = Union[str, Sequence[int], List[dict]]

ROLES = ("system", "user", "assistant", "tool", "developer")


def is_messages(prompt: object) -> bool:
    """A non-empty list of dicts: chat messages."""
    return isinstance(prompt, (list, tuple)) and bool(prompt) and all(isinstance(m, dict) for m in prompt)


def check_messages(messages: object) -> List[dict]:
    """Chat messages as ``[{"role": ..., "content": str}, ...]``, or a clear
    error. An assistant message may carry OpenAI ``tool_calls`` (its content
    then may be null; each call's ``arguments`` kept as a JSON string), a
    tool result its ``tool_call_id`` and ``name``."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise TypeError(f"messages[{i}] must be a dict with 'role' and 'content', got {type(m).__name__}")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise ValueError(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}")
        if isinstance(content, list):  # OpenAI content parts: text only
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise ValueError(f"messages[{i}].content: only text parts are supported")
            content = "".join(str(p.get("text", "")) for p in content)
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise TypeError(f"messages[{i}].content must be a string, got {type(content).__name__}")
        msg = {"role": role, "content": content}
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = _tool_calls(m["tool_calls"], f"messages[{i}].tool_calls")
        for key in ("tool_call_id", "name"):
            if role == "tool" and isinstance(m.get(key), str):
                msg[key] = m[key]
        out.append(msg)
    return out


def _tool_calls(calls: object, where: str) -> List[dict]:
    """Earlier calls as OpenAI writes them, arguments as JSON text."""
    if not isinstance(calls, (list, tuple)):
        raise ValueError(f"{where} must be a list")
    out = []
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ValueError(f'{where}[{j}] must be {{"type": "function", "function": {{"name": ..., "arguments": ...}}}}')
        args = fn.get("arguments")
        args = json.dumps(args, ensure_ascii=False) if isinstance(args, dict) else (args or "{}")
        if not isinstance(args, str):
            raise ValueError(f"{where}[{j}].function.arguments must be a JSON string")
        out.append({"id": str(c.get("id") or f"call_{j}"), "type": "function",
                    "function": {"name": fn["name"], "arguments": args}})
    return out


class PromptEncoder:
    """Prompt ids from text, ids or messages, with the target's tokenizer.

    Args:
        llm: the target ``llama_cpp.Llama`` (its tokenizer and chat template).
        name: how errors name the model.
    """

    def __init__(self, llm, name: str, template: Optional[str] = None) -> None:
        self.llm, self.name, self.template = llm, name, template
        self.n_vocab = llm.n_vocab()
        self._formatter = None

    def template_text(self) -> Optional[str]:
        """The chat template: the one given (``--chat-template-file``) or the GGUF's; None if neither."""
        return self.template or self.llm.metadata.get("tokenizer.chat_template") or None

    def chat_template(self):
        if self._formatter is None:
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter
            template = self.template_text()
            if not template:
                raise ValueError(f"{self.name} has no chat template in its GGUF metadata (a base model?): "
                                 "give it text to continue, not chat messages or --chat")
            piece = lambda t: self.llm.detokenize([t], special=True).decode("utf-8", "replace")  # noqa: E731
            self._formatter = Jinja2ChatFormatter(template=template, eos_token=piece(self.llm.token_eos()),
                                                  bos_token=piece(self.llm.token_bos()),
                                                  add_generation_prompt=True)
        return self._formatter

    def encode(self, prompt: Prompt, chat: bool = False, tools: Optional[List[dict]] = None) -> List[int]:
        """Text (BOS added as the model specifies), token ids (checked), or with
        ``chat=True`` (or given messages) role/content messages rendered by the
        chat template (``tools``: OpenAI tool declarations the template
        renders); a string with ``chat=True`` is one user message, as the
        CLI's ``--chat`` makes it. An empty result is an error."""
        if chat and isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        if chat or is_messages(prompt):
            if chat and not is_messages(prompt) and not isinstance(prompt, (list, tuple)):
                raise TypeError("chat=True takes a string (one user message) or a list of "
                                "{'role': ..., 'content': ...} messages")
            try:
                text = self.chat_template()(messages=check_messages(prompt), tools=tools or None).prompt
            except ValueError:
                raise
            except Exception as e:  # jinja2's errors: the template cannot render these messages
                raise ValueError(f"the chat template cannot render these messages: {type(e).__name__}: {e}") from None
            ids = self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        elif isinstance(prompt, str):
            ids = self.llm.tokenize(prompt.encode("utf-8", "replace"), add_bos=True, special=False)
        elif isinstance(prompt, (bytes, bytearray)):
            raise TypeError("prompt must be a str, a list of token ids or chat messages, not bytes")
        else:
            ids = self._check_ids(prompt)
        if not ids:
            raise ValueError("the prompt is empty")
        return ids

    def _check_ids(self, prompt: object) -> List[int]:
        try:
            ids = [int(t) for t in prompt]  # type: ignore[union-attr]
        except (TypeError, ValueError):
            raise TypeError("prompt must be a str, a list of token ids or chat messages") from None
        bad = [t for t in ids if not 0 <= t < self.n_vocab]
        if bad:
            raise ValueError(f"prompt token {bad[0]} is out of range for the target's vocab of {self.n_vocab}")
        return ids


class TextStream:
    """Generated token ids to text pieces, as a user should see them.

    UTF-8 safe: bytes of a character split across tokens are held until it is
    complete. Stop strings end the text wherever they fall, inside a token or
    across tokens: text that could still become a stop string is held back
    (at most the longest stop string less one character). End-of-generation
    tokens end the output and are never shown.

    Rule for ``tokens`` (what :attr:`kept` counts): the generated tokens whose
    text lies entirely in ``text``. A token that straddles a stop string is
    left out (its text before the stop string stays in ``text``), so the
    detokenized tokens are always a prefix of ``text``, equal to it unless a
    token straddles the stop string.
    """

    def __init__(self, detokenize: Callable[[int], bytes], stops: Sequence[str] = (),
                 eog: Collection[int] = ()) -> None:
        self.detokenize = detokenize
        self.stops = [s for s in stops if s]
        self.eog = eog
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""
        self.shown = 0          # characters already returned
        self.ends: List[int] = []  # text length after each token
        self.stopped = False    # an end-of-generation token or a stop string was met
        self.kept: Optional[int] = None  # tokens kept when a stop string cut them

    @property
    def finish_reason(self) -> str:
        return "stop" if self.stopped else "length"

    def n_tokens(self) -> int:
        """How many of the tokens added belong to the output (see the class docstring)."""
        return len(self.ends) if self.kept is None else self.kept

    def add(self, token: int) -> str:
        """Add one token; return the text that is now safe to show ("" if none)."""
        if self.stopped:
            return ""
        if token in self.eog:
            self.stopped = True
            return ""
        before = len(self.text)
        self.text += self.decoder.decode(self.detokenize(token))
        self.ends.append(len(self.text))
        start = max(0, before - max((len(s) for s in self.stops), default=0) + 1)
        cut = min((i for i in (self.text.find(s, start) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.text, self.stopped = self.text[:cut], True
            self.kept = self._tokens_within(cut)
            return self._take(len(self.text))
        return self._take(len(self.text) - self.hold)

    def _tokens_within(self, cut: int) -> int:
        n = 0
        while n < len(self.ends) and self.ends[n] <= cut:
            n += 1
        while n > 0 and self.ends[n - 1] == (self.ends[n - 2] if n > 1 else 0):
            n -= 1  # bytes of a character the cut left incomplete
        return n

    def finish(self) -> str:
        """The held-back rest, once generation has ended."""
        if self.kept is None:
            self.text += self.decoder.decode(b"", final=True)
        return self._take(len(self.text))

    def _take(self, upto: int) -> str:
        if upto <= self.shown:
            return ""
        piece, self.shown = self.text[self.shown:upto], upto
        return piece
