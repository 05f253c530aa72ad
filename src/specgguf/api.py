"""The user-facing API: ``generate()`` and the reusable ``SpeculativeLlama``.

Data flows one way: this module builds a :class:`~specgguf.llama_adapter.LlamaPair`
and a :class:`~specgguf.SpeculativeDecoder`, runs the decoder, and turns
tokens into text (UTF-8 safe across tokens, stop strings honoured wherever
they fall, EOS never printed).
"""

from __future__ import annotations

import codecs
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

import llama_cpp

from .decoder import SpeculativeDecoder
from .llama_adapter import LlamaPair
from .models import resolve_model

ModelLike = Union[str, os.PathLike, "llama_cpp.Llama"]


@dataclass
class GenerationResult:
    """What :func:`generate` returns: text, generated token ids, why it stopped, stats."""

    text: str
    tokens: List[int]
    finish_reason: str
    stats: Dict[str, Any] = field(default_factory=dict)


def load_llama(model: ModelLike, n_ctx: int = 2048, n_threads: Optional[int] = None,
               verbose: bool = False) -> "llama_cpp.Llama":
    """A ``Llama`` from a path or models.lock name (an already-loaded one is returned as is)."""
    if isinstance(model, llama_cpp.Llama):
        return model
    path = resolve_model(os.fspath(model))
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
    return llama_cpp.Llama(str(path), n_ctx=n_ctx, n_threads=n_threads, verbose=verbose,
                           logits_all=False)


class SpeculativeLlama:
    """A loaded target/draft pair for generating many times without reloading.

    Args:
        target, draft: paths, models.lock names, or loaded ``llama_cpp.Llama``.
        n_ctx: context window for models loaded here.
        n_threads: threads for models loaded here (None: llama.cpp's default).
        verbose: let llama.cpp print its logs.
    """

    def __init__(self, target: ModelLike, draft: ModelLike, *, n_ctx: int = 2048,
                 n_threads: Optional[int] = None, verbose: bool = False) -> None:
        self.target = load_llama(target, n_ctx, n_threads, verbose)
        self.draft = load_llama(draft, n_ctx, n_threads, verbose)
        self.names = (_name(target), _name(draft))
        self.pair = LlamaPair(self.target, self.draft, target_name=self.names[0],
                              draft_name=self.names[1])  # checks the vocabularies now
        vocab = llama_cpp.llama_model_get_vocab(self.target.model)
        self.eog = {t for t in range(llama_cpp.llama_vocab_n_tokens(vocab))
                    if llama_cpp.llama_vocab_is_eog(vocab, t)}

    def tokenize(self, prompt: Union[str, Sequence[int]], chat: bool = False) -> List[int]:
        """Prompt ids: a string through the target's tokenizer, chat messages
        through the GGUF's chat template, or token ids checked and passed on."""
        if chat:
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter
            template = self.target.metadata.get("tokenizer.chat_template")
            if not template:
                raise ValueError(f"{self.names[0]} has no chat template in its GGUF metadata")
            if not isinstance(prompt, list) or not all(isinstance(m, dict) for m in prompt):
                raise TypeError("chat=True takes a list of {'role': ..., 'content': ...} messages")
            fmt = Jinja2ChatFormatter(template=template,
                                      eos_token=self.target.detokenize([self.target.token_eos()]).decode(),
                                      bos_token=self.target.detokenize([self.target.token_bos()]).decode(),
                                      add_generation_prompt=True)
            text = fmt(messages=prompt).prompt
            return self.target.tokenize(text.encode(), add_bos=False, special=True)
        if isinstance(prompt, str):
            return self.target.tokenize(prompt.encode(), add_bos=True, special=False)
        ids = [int(t) for t in prompt]
        n_vocab = self.target.n_vocab()
        bad = [t for t in ids if not 0 <= t < n_vocab]
        if bad:
            raise ValueError(f"prompt token {bad[0]} is out of range for the target's vocab of {n_vocab}")
        return ids

    def generate(self, prompt: Union[str, Sequence[int], List[dict]], *, max_tokens: int = 256,
                 temperature: float = 0.0, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 k: int = 4, seed: Optional[int] = None, stop: Union[str, Sequence[str], None] = None,
                 stream: bool = False, chat: bool = False) -> Union[GenerationResult, Iterator[str]]:
        """Generate after ``prompt``; see :func:`specgguf.generate` for the arguments."""
        run = self._run(prompt, max_tokens, temperature, top_k, top_p, min_p, k, seed, stop, chat)
        if stream:
            return (piece for piece in run if isinstance(piece, str))
        return [piece for piece in run if isinstance(piece, GenerationResult)][0]

    def _run(self, prompt, max_tokens, temperature, top_k, top_p, min_p, k, seed, stop, chat):
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        ids = self.tokenize(prompt, chat)
        if not ids:
            raise ValueError("the prompt is empty")
        pair = self.pair
        pair.reset()  # the Llama objects may have been used on their own since the last run
        pair.configure(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                       seed=None if seed is None else seed + 1)  # the draft's own stream
        room = pair.n_ctx - len(ids)
        if room <= 0:
            raise ValueError(f"the prompt has {len(ids)} tokens; the context window is {pair.n_ctx}")
        budget = min(max_tokens, room)
        dec = SpeculativeDecoder(pair.draft_step, pair.target_step, k=k, greedy=pair.greedy,
                                 generator=seed)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        text, emitted_len, tokens = "", 0, []
        finish = "length"
        hold = max((len(s) for s in stops), default=1) - 1
        t0 = time.perf_counter()
        try:
            for tok in dec.stream(ids, budget, stop_tokens=self.eog):
                if tok in self.eog:
                    finish = "stop"
                    break
                tokens.append(tok)
                text += decoder.decode(self.target.detokenize([tok], special=False))
                cut = min((text.find(s) for s in stops if s in text), default=-1)
                if cut >= 0:
                    text, finish = text[:cut], "stop"
                    break
                safe = len(text) - hold
                if safe > emitted_len:
                    yield text[emitted_len:safe]
                    emitted_len = safe
            else:
                text += decoder.decode(b"", final=True)
        finally:
            pair.reset()  # both models are clean and usable after any exit, Ctrl-C included
        if len(text) > emitted_len:
            yield text[emitted_len:]
        seconds = time.perf_counter() - t0
        stats = dec.stats.as_dict()
        stats.update(
            tokens_per_second=len(tokens) / seconds if seconds else 0.0,
            seconds=seconds,
            draft_seconds=pair.draft.seconds,
            target_seconds=pair.target.seconds,
            warp_seconds=pair.warp_seconds,
            other_seconds=seconds - pair.draft.seconds - pair.target.seconds - pair.warp_seconds,
            prompt_tokens=len(ids),
        )
        stats["finish_reason"] = finish
        yield GenerationResult(text=text, tokens=tokens, finish_reason=finish, stats=stats)


def _name(model: ModelLike) -> str:
    if isinstance(model, llama_cpp.Llama):
        return Path(model.model_path).name
    return os.fspath(model)


def generate(prompt: Union[str, Sequence[int], List[dict]], *, target: ModelLike, draft: ModelLike,
             max_tokens: int = 256, temperature: float = 0.0, top_k: int = 40, top_p: float = 0.95,
             min_p: float = 0.05, k: int = 4, seed: Optional[int] = None,
             stop: Union[str, Sequence[str], None] = None, stream: bool = False,
             chat: bool = False) -> Union[GenerationResult, Iterator[str]]:
    """Speculative generation with two GGUF models, exactly the target's output law.

    Args:
        prompt: text (tokenized by the target's tokenizer, BOS added as it
            specifies), a list of token ids, or with ``chat=True`` a list of
            ``{"role", "content"}`` messages rendered by the GGUF's chat template.
        target, draft: paths, models.lock names or loaded ``llama_cpp.Llama``.
        max_tokens: at most this many new tokens (fewer if the context fills:
            finish_reason ``"length"``).
        temperature: 0 = greedy (token-for-token the target's greedy output);
            > 0 = exact speculative sampling after identical warping.
        top_k, top_p, min_p: warping (defaults as llama-cpp-python's).
        k: draft tokens per round.
        seed: int for reproducible sampling (None: fresh entropy).
        stop: string(s) that end the text (not included).
        stream: return an iterator of text pieces instead.

    Returns:
        :class:`GenerationResult` (``.text``, ``.tokens``, ``.finish_reason``,
        ``.stats``), or an iterator of ``str`` when ``stream=True``.
    """
    return SpeculativeLlama(target, draft).generate(
        prompt, max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
        min_p=min_p, k=k, seed=seed, stop=stop, stream=stream, chat=chat)
