"""Two models loaded as one generation needs them.

:class:`ModelPair` resolves names (models.lock) and paths, loads the models
(locally, or the target on llama.cpp RPC workers), checks that they share a
tokenizer (else drafts across tokenizers, :mod:`specgguf.llama.vocab`), and
assembles what a run uses: the target (one batched forward
per round), the drafter, the prompt encoder, the end-of-generation tokens,
and the pair's identity for the state store (the files' content and this
machine).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import List, Optional, Sequence, Union

import llama_cpp

from .adapter import LlamaTarget, ModelDrafter, SlotDrafter
from ..checks import check_int
from .model import MIN_CTX, LlamaModel, ModelLike, available_memory, check_slot_memory, eog_tokens, load_llama
from .models import resolve_model
from ..ops.cross import CrossDrafter
from ..ops.drafter import EachDrafter
from ..ops.ngram import NgramDrafter
from ..ops.suffix import SuffixDrafter
from .rpc import RemoteModel, Workers
from .stash import Stash, stash_limit
from ..ops.sampling import Sampler
from ..state import PairState, Store
from .text import PromptEncoder
from .vocab import PairMode, pair_mode


def _name(model: object) -> str:
    return Path(model.model_path).name if isinstance(model, llama_cpp.Llama) else os.fspath(model)


class _Loader:
    """How this pair's models are loaded: context, threads, logs, workers."""

    def __init__(self, n_ctx: int, n_threads: Optional[int], verbose: bool, workers: Optional[Workers],
                 tensor_split: Optional[Sequence[float]], flash_attn: bool, slots: int) -> None:
        self.n_ctx, self.verbose, self.workers, self.split = n_ctx, verbose, workers, tensor_split
        self.flash_attn, self.slots = flash_attn, slots
        self.n_threads = n_threads or os.cpu_count() or 1

    def llama(self, model: ModelLike, remote: bool):
        """(a Llama for the model's tokenizer, and its forwards unless remote; its file)."""
        if isinstance(model, llama_cpp.Llama):
            return model, Path(model.model_path)
        path = resolve_model(os.fspath(model))
        if remote and self.workers:  # the weights go to the workers; here, the vocabulary only
            return load_llama(path, self.n_ctx, 1, self.verbose, vocab_only=True), path
        # With slots, each model gets a context of its own: the Llama's stays small and unused.
        n_ctx = MIN_CTX if self.slots > 1 else self.n_ctx
        return load_llama(path, n_ctx, self.n_threads, self.verbose, self.flash_attn), path

    def model(self, llm, path: Path, width: int, remote: bool, unified: bool = True):
        """The model's forwards; with slots, ``unified``: one KV cache for all (see
        :func:`~specgguf.llama.model.slot_context`)."""
        if remote and self.workers:
            return RemoteModel(path, self.workers, llm, self.n_ctx, self.n_threads, width, self.split, self.verbose)
        return LlamaModel(llm, width, self.slots, self.n_ctx, unified)


def check_split(split: Optional[Sequence[float]], workers) -> None:
    """ValueError unless ``split`` gives each rpc worker a share (at most one
    per worker, none negative, not all zero)."""
    if split is None:
        return
    shares = [float(x) for x in split]
    if not workers:
        raise ValueError("tensor_split (--tensor-split) shares the target's layers among rpc workers: give rpc too")
    n = len(workers.endpoints)
    if len(shares) > n:
        raise ValueError(f"tensor_split has {len(shares)} shares for {n} rpc worker{'s' if n > 1 else ''}: "
                         "give at most one per worker")
    if any(not x >= 0 for x in shares) or not any(shares):
        raise ValueError(f"tensor_split shares must be >= 0 and not all 0, got {shares}")


class ModelPair:
    """A target and a draft (a model, or ``"ngram"``), ready to generate.

    Args: as :class:`~specgguf.SpeculativeLlama`'s.
    """

    def __init__(self, target: ModelLike, draft: ModelLike, *, lookup: Optional[bool] = None,
                 lookup_memory: int = 16384, n_ctx: int = 2048,
                 n_threads: Optional[int] = None, verbose: bool = False,
                 rpc: Union[None, str, Sequence[str]] = None, draft_rpc: bool = False,
                 tensor_split: Optional[Sequence[float]] = None, store: Optional[Store] = None,
                 flash_attn: bool = True, parallel: int = 1, chat_template: Optional[str] = None,
                 cache_ram: Optional[int] = None) -> None:
        if chat_template is not None and (not isinstance(chat_template, str) or not chat_template.strip()):
            raise ValueError("chat_template must be the text of a Jinja chat template")
        model_free = isinstance(draft, str) and draft == "ngram"
        if lookup and model_free:
            raise ValueError("lookup=True adds a lookup in front of a draft model; draft='ngram' already is one")
        check_int("lookup_memory", lookup_memory, 0)
        if cache_ram is not None:
            check_int("cache_ram", cache_ram, 0)
        # evicted slots' caches kept in host memory (llama.stash): bytes, decided before loading
        self.stash_bytes = stash_limit(cache_ram, available_memory())
        self.slots = check_int("parallel", parallel, 1, 64)
        workers = Workers.parse(rpc)
        if workers and self.slots > 1:
            raise ValueError("parallel > 1 (serve --parallel) does not work with rpc workers yet: "
                             "use parallel=1 with rpc")
        check_split(tensor_split, workers)
        if workers:
            workers.check()  # an unreachable or mismatched worker, named, before anything loads
        load = _Loader(n_ctx, n_threads, verbose, workers, tensor_split, flash_attn, self.slots)
        self.names = (_name(target), "ngram" if model_free else _name(draft))
        self.owns = not isinstance(target, llama_cpp.Llama)  # models loaded here keep their KV cache
        self.target_llm, tpath = load.llama(target, remote=True)
        self.draft_llm, dpath = load.llama(draft, draft_rpc) if not model_free else (None, None)
        self.mode = PairMode("ngram", "n-gram lookup: no draft model") if model_free else \
            pair_mode(self.target_llm, self.draft_llm, *self.names)
        if self.mode.mode == "cross" and self.slots > 1:
            raise ValueError("parallel > 1 (serve --parallel) does not work with a draft of another tokenizer "
                             f"yet ({self.mode.detail}): use parallel=1")
        width = max(int(m.n_vocab()) for m in (self.target_llm, self.draft_llm) if m is not None)
        if self.slots > 1:
            check_slot_memory([m for m in (self.target_llm, self.draft_llm) if m is not None], self.slots, n_ctx)
        cross = self.mode.mode == "cross"  # each model keeps its own width; the drafter maps between them
        # With slots, the target keeps a KV stream per slot: its attention then reads
        # a slot's own cells, not every earlier request's kept text (1.05-1.09x for
        # one user on 8 slots, 1.07x at 4 busy ones), and the engine's policy prices
        # the ubatches a round is cut into. The draft keeps one cache: its rounds
        # draft for a changing subset of slots, each a pass if split.
        self.target = LlamaTarget(load.model(self.target_llm, tpath, None if cross else width, remote=True,
                                             unified=False))
        self.draft_model = None
        # A lookup of the context and earlier texts tried before the draft model, with its own K
        # (engine.lookup_first; with slots, one per slot, each with its share of the memory). It takes
        # a round on a match of lookup_first.STRONG tokens or more; on a shorter one only where the
        # model would not draft (short ones, common phrases, took rounds the model drafts better).
        on = lookup if lookup is not None else not model_free
        self.lookup = SuffixDrafter(lookup_memory) if on and self.slots == 1 else None
        self.lookups = [SuffixDrafter(lookup_memory // self.slots) for _ in range(self.slots)] \
            if on and self.slots > 1 else None
        if model_free:  # one sequence's rounds: the lookup with a memory; shared rounds: the context's alone
            self.drafter = SuffixDrafter(lookup_memory) if self.slots == 1 else NgramDrafter()
        else:
            dmodel = load.model(self.draft_llm, dpath, None if cross else width, remote=draft_rpc)
            self.draft_model = (CrossDrafter(dmodel, self.mode.target, self.mode.draft, self.mode.vmap) if cross
                                else ModelDrafter(dmodel))
            self.drafter = self.draft_model
        self.text = PromptEncoder(self.target_llm, self.names[0], chat_template)
        self.eog = eog_tokens(self.target_llm)
        self.state = self._state(store or Store(), [tpath] + ([dpath] if dpath else []), model_free)

    @staticmethod
    def _state(store: Store, paths: List[Path], model_free: bool) -> PairState:
        ids = [store.file_id(p) for p in paths] + (["ngram"] if model_free else [])
        return PairState(store, "+".join(ids))

    @property
    def models(self) -> list:
        return [self.target.model] + ([self.draft_model.model] if self.draft_model else [])

    @property
    def dead(self) -> Optional[str]:
        """Why a model can no longer run (its RPC worker died), or None."""
        return next((m.dead for m in self.models if getattr(m, "dead", None)), None)

    @property
    def vocab(self) -> tuple:
        """``(llama_vocab pointer, n_vocab)`` of the target: what a grammar compiles against."""
        return self.target_llm._model.vocab, int(self.target_llm.n_vocab())

    @property
    def n_ctx(self) -> int:
        return min(m.n_ctx for m in self.models)

    def reset(self, unless_held: bool = False) -> None:
        """Empty both KV caches; ``unless_held``: only a cache that no longer
        holds what specgguf left in it (the caller's ``Llama`` ran on its
        own since: :meth:`~specgguf.llama.model.LlamaModel.held`), so that a
        next call on the caller's models reads only what its prompt adds."""
        for m in self.models:
            if not (unless_held and getattr(m, "held", lambda: False)()):
                m.reset()

    def rounds_drafter(self, sampler: Sampler, fresh_lookup: bool = False):
        """The drafter of one run's rounds (:class:`~specgguf.engine.rounds.Rounds`):
        the draft model's, each request's sampler picking its tokens (it also
        measures the draft on a prompt, in the prompt's round); a draft of
        another tokenizer, a copy bound to ``sampler`` (sharing its model and
        cache), so that no run's sampler stays behind in the pair; the lookup
        alone (``fresh_lookup``: an empty one, remembering no earlier call)."""
        if isinstance(self.draft_model, ModelDrafter):
            return SlotDrafter(self.draft_model.model, stock=True)  # every target forward is ours
        if self.draft_model is not None:
            drafter = copy.copy(self.draft_model)
            drafter.sampler = sampler
            return EachDrafter(drafter)
        fresh = fresh_lookup and isinstance(self.drafter, SuffixDrafter)
        return EachDrafter(SuffixDrafter(0) if fresh else self.drafter)

    def stash(self) -> Optional[Stash]:
        """A :class:`~specgguf.llama.stash.Stash` of the slots' caches (every
        model's) up to ``cache_ram``; None with one slot or ``cache_ram=0``."""
        return Stash(self.models, self.stash_bytes) if self.slots > 1 and self.stash_bytes else None

    def timers(self) -> tuple:
        """Seconds spent so far in each model's forwards."""
        return tuple(m.seconds for m in self.models)
