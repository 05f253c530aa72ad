"""The user-facing API: ``generate()`` and the reusable ``SpeculativeLlama``.

Data flows one way: this module builds a :class:`~specgguf.llama_adapter.LlamaPair`
and a :class:`~specgguf.SpeculativeDecoder`, runs the decoder, and turns
tokens into text (UTF-8 safe across tokens, stop strings honoured wherever
they fall, EOS never printed).
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Union

import llama_cpp

from .decoder import SpeculativeDecoder
from .llama_adapter import LlamaPair
from .models import cache_dir, resolve_model
from .ngram import FallbackDraft, NgramDraft
from .policy import CostModel, DraftPolicy

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
    # llama-cpp-python defaults to half the cores; decoding on a board wants them all.
    threads = n_threads or os.cpu_count() or 1
    return llama_cpp.Llama(str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                           verbose=verbose, logits_all=False)


class SpeculativeLlama:
    """A loaded target/draft pair for generating many times without reloading.

    Args:
        target: path, models.lock name, or loaded ``llama_cpp.Llama``.
        draft: the same, or ``"ngram"`` for model-free prompt-lookup drafting.
        ngram: with a draft model, try an n-gram lookup first each round and
            fall back to the model when it finds nothing.
        n_ctx: context window for models loaded here.
        n_threads: threads for models loaded here (None: every core).
        verbose: let llama.cpp print its logs.
    """

    K_MAX = 8  # the largest draft length k="auto" considers
    CALIBRATION_VERSION = 2  # bumped when what calibrate() measures changes

    def __init__(self, target: ModelLike, draft: ModelLike, *, ngram: bool = False, n_ctx: int = 2048,
                 n_threads: Optional[int] = None, verbose: bool = False) -> None:
        self.target = load_llama(target, n_ctx, n_threads, verbose)
        model_free = isinstance(draft, str) and draft == "ngram"
        self.draft = None if model_free else load_llama(draft, n_ctx, n_threads, verbose)
        self.names = (_name(target), "ngram" if model_free else _name(draft))
        self.pair = LlamaPair(self.target, self.draft, target_name=self.names[0],
                              draft_name=self.names[1])  # checks the vocabularies now
        if model_free:
            self.draft_step = NgramDraft().draft_step
        elif ngram:
            self.draft_step = FallbackDraft(NgramDraft(n_min=3).draft_step, self.pair.draft_step).draft_step
        else:
            self.draft_step = self.pair.draft_step
        self._entry: Optional[dict] = None  # this pair's calibration, read or measured once
        self._policy: Optional[DraftPolicy] = None
        vocab = llama_cpp.llama_model_get_vocab(self.target.model)
        self.eog = {t for t in range(llama_cpp.llama_vocab_n_tokens(vocab))
                    if llama_cpp.llama_vocab_is_eog(vocab, t)}

    def _calibration_key(self) -> str:
        # The llama.cpp build's CPU features too: a rebuild with other flags
        # changes every cost.
        build = hashlib.sha256(llama_cpp.llama_print_system_info()).hexdigest()[:8]
        return "|".join(str(x) for x in (
            *(_file_id(m) for m in (self.target, self.draft)), self.names[1],
            self.target.context_params.n_threads, platform.machine(), llama_cpp.__version__, build,
            self.K_MAX, f"v{self.CALIBRATION_VERSION}"))

    def _calibration(self) -> dict:
        """This pair's entry in ``<cache>/calibration.json`` (measured if absent),
        read once per object: a run never re-measures in its middle, and keeps
        its fixed values whatever other processes write."""
        if self._entry is not None:
            return self._entry
        table = _read_json(_calibration_path())
        key = self._calibration_key()
        if "target" not in table.get(key, {}):
            costs = self.pair.calibrate(self.K_MAX)
            if self.draft is None:
                costs.draft = 1e-5 * costs.target[0]  # a dictionary lookup
                costs.draft_prefill = 0.0
            table = _update_json(_calibration_path(), key, costs.to_dict())
        if self.draft is not None and "acceptance" not in table[key]:
            table = _update_json(_calibration_path(), key, {"acceptance": self.pair.measure_acceptance()})
        self._entry = table[key]
        return self._entry

    def prior_acceptance(self, greedy: bool) -> Optional[float]:
        """The draft's acceptance measured once at calibration (greedy, or
        sampled at temperature 0.8); None for the n-gram draft."""
        measured = self._calibration().get("acceptance")
        return None if not measured else float(measured["greedy" if greedy else "sampled"])

    def costs(self) -> CostModel:
        """This machine's forward costs for the pair: measured once, then kept in
        ``<cache>/calibration.json`` so later runs (seeded ones above all) use
        the same fixed values."""
        return CostModel.from_dict(self._calibration())  # a new copy: policies refine their own

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
                 k: Union[int, str] = "auto", p_min: Union[None, float, str] = None,
                 seed: Optional[int] = None, stop: Union[str, Sequence[str], None] = None,
                 stream: bool = False, chat: bool = False) -> Union[GenerationResult, Iterator[str]]:
        """Generate after ``prompt``; see :func:`specgguf.generate` for the arguments."""
        run = self.run(prompt, max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                       min_p=min_p, k=k, p_min=p_min, seed=seed, stop=stop, chat=chat)
        if stream:
            return (piece for piece in run if isinstance(piece, str))
        return [piece for piece in run if isinstance(piece, GenerationResult)][0]

    def run(self, prompt: Union[str, Sequence[int], List[dict]], *, max_tokens: int = 256,
            temperature: float = 0.0, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
            k: Union[int, str] = "auto", p_min: Union[None, float, str] = None,
            seed: Optional[int] = None, stop: Union[str, Sequence[str], None] = None,
            chat: bool = False) -> Iterator[Union[str, GenerationResult]]:
        """Like :meth:`generate` with ``stream=True``, but after the text pieces
        it yields the :class:`GenerationResult` too (for callers that stream
        and also want the stats)."""
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        ids = self.tokenize(prompt, chat)
        if not ids:
            raise ValueError("the prompt is empty")
        # A first-time calibration runs here, before this run's settings are made.
        costs = self.costs() if k == "auto" else None
        prior = self.prior_acceptance(temperature == 0) if k == "auto" else None
        pair = self.pair
        pair.reset()  # the Llama objects may have been used on their own since the last run
        pair.configure(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                       seed=None if seed is None else seed + 1)  # the draft's own stream
        room = pair.n_ctx - len(ids)
        if room <= 0:
            raise ValueError(f"the prompt has {len(ids)} tokens; the context window is {pair.n_ctx}")
        budget = min(max_tokens, room)
        if k == "auto":
            if seed is None or pair.greedy:
                # What the policy learned carries over to the next call (a chat
                # session learns once); it refines costs from live timings.
                if self._policy is None or self._policy.p_min_setting != p_min:
                    self._policy = DraftPolicy(self.K_MAX, costs, online_costs=True, p_min=p_min,
                                               prior=prior)
                    # What earlier runs learned of this pair's acceptance
                    # adds to the calibration's, so a poor draft is not
                    # probed again in every process.
                    self._policy.load_state(self._calibration().get("learned"))
                k = self._policy
            else:
                # A seeded sampling run must reproduce: a fresh policy on the
                # stored calibration (costs and acceptance, both fixed once
                # measured), blind to the clock, every call.
                k = DraftPolicy(self.K_MAX, costs, online_costs=False, p_min=p_min, prior=prior)
        dec = SpeculativeDecoder(self.draft_step, pair.target_step, k=k, greedy=pair.greedy,
                                 generator=seed, p_min=p_min)
        out = TextStream(lambda t: self.target.detokenize([t], special=False), stops)
        tokens: List[int] = []
        finish = "length"
        t0 = time.perf_counter()
        try:
            for tok in dec.stream(ids, budget, stop_tokens=self.eog):
                if tok in self.eog:
                    finish = "stop"
                    break
                tokens.append(tok)
                piece = out.add(tok)
                if piece:
                    yield piece
                if out.stopped:
                    finish = "stop"
                    break
        finally:
            pair.reset()  # both models are clean and usable after any exit, Ctrl-C included
        rest = out.finish()
        if rest:
            yield rest
        seconds = time.perf_counter() - t0
        if dec.policy is not None and dec.policy is self._policy:
            key = self._calibration_key()
            self._entry = _update_json(_calibration_path(), key, {"learned": self._policy.state()})[key]
        text = out.text
        stats = dec.stats.as_dict()
        forwards = sum(m.seconds for m in pair.models)
        stats.update(
            tokens_per_second=len(tokens) / seconds if seconds else 0.0,
            seconds=seconds,
            forward_seconds=forwards,  # inside llama_decode, both models
            warp_seconds=pair.warp_seconds,
            overhead_seconds=seconds - forwards,  # everything outside the forwards
            prompt_tokens=len(ids),
        )
        stats["finish_reason"] = finish
        yield GenerationResult(text=text, tokens=tokens, finish_reason=finish, stats=stats)


class TextStream:
    """Generated token ids to text pieces, as a user should see them.

    UTF-8 safe: bytes of a character split across tokens are held until it
    is complete. Stop strings end the text wherever they fall, inside a
    token or across tokens: text that could still become a stop string is
    held back (at most the longest stop string less one character).
    """

    def __init__(self, detokenize: Callable[[int], bytes], stops: Sequence[str] = ()) -> None:
        self.detokenize = detokenize
        self.stops = [s for s in stops if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""
        self.shown = 0  # characters already returned
        self.stopped = False

    def add(self, token: int) -> str:
        """Add one token; return the text that is now safe to show ("" if none)."""
        self.text += self.decoder.decode(self.detokenize(token))
        cut = min((i for i in (self.text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.text, self.stopped = self.text[:cut], True
            return self._take(len(self.text))
        return self._take(len(self.text) - self.hold)

    def finish(self) -> str:
        """The held-back rest, once generation has ended."""
        if not self.stopped:
            self.text += self.decoder.decode(b"", final=True)
        return self._take(len(self.text))

    def _take(self, upto: int) -> str:
        if upto <= self.shown:
            return ""
        piece, self.shown = self.text[self.shown:upto], upto
        return piece


def _calibration_path() -> Path:
    return cache_dir() / "calibration.json"


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _update_json(path: Path, key: str, fields: dict) -> dict:
    """Merge ``fields`` into the entry ``key`` of a JSON object file
    (atomically); returns the new table."""
    table = _read_json(path)
    table[key] = {**table.get(key, {}), **fields}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(table, indent=1))
    tmp.replace(path)
    return table


def _file_id(llm: Optional["llama_cpp.Llama"]) -> str:
    if llm is None:
        return "-"
    path = Path(llm.model_path)
    return f"{path.name}:{path.stat().st_size}"


def _name(model: ModelLike) -> str:
    if isinstance(model, llama_cpp.Llama):
        return Path(model.model_path).name
    return os.fspath(model)


def generate(prompt: Union[str, Sequence[int], List[dict]], *, target: ModelLike, draft: ModelLike,
             max_tokens: int = 256, temperature: float = 0.0, top_k: int = 40, top_p: float = 0.95,
             min_p: float = 0.05, k: Union[int, str] = "auto", p_min: Union[None, float, str] = None,
             seed: Optional[int] = None, stop: Union[str, Sequence[str], None] = None,
             stream: bool = False, chat: bool = False, ngram: bool = False
             ) -> Union[GenerationResult, Iterator[str]]:
    """Speculative generation with two GGUF models, exactly the target's output law.

    Args:
        prompt: text (tokenized by the target's tokenizer, BOS added as it
            specifies), a list of token ids, or with ``chat=True`` a list of
            ``{"role", "content"}`` messages rendered by the GGUF's chat template.
        target, draft: paths, models.lock names or loaded ``llama_cpp.Llama``;
            ``draft="ngram"`` drafts by prompt lookup, with no draft model.
        max_tokens: at most this many new tokens (fewer if the context fills:
            finish_reason ``"length"``).
        temperature: 0 = greedy (token-for-token the target's greedy output);
            > 0 = exact speculative sampling after identical warping.
        top_k, top_p, min_p: warping (defaults as llama-cpp-python's).
        k: draft tokens per round, or ``"auto"``: chosen each round to
            maximize expected tokens per second from live acceptance and this
            machine's measured forward costs (0, plain target decoding, when
            the draft cannot pay).
        p_min: stop drafting a round when the draft's confidence in its next
            token is below this (None: off; ``"auto"``: learned).
        seed: int for reproducible sampling (None: fresh entropy).
        stop: string(s) that end the text (not included).
        stream: return an iterator of text pieces instead.
        ngram: try a prompt lookup before the draft model each round.

    Returns:
        :class:`GenerationResult` (``.text``, ``.tokens``, ``.finish_reason``,
        ``.stats``), or an iterator of ``str`` when ``stream=True``.
    """
    return SpeculativeLlama(target, draft, ngram=ngram).generate(
        prompt, max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
        min_p=min_p, k=k, p_min=p_min, seed=seed, stop=stop, stream=stream, chat=chat)
