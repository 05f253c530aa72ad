"""The user-facing API: ``generate()`` and the reusable ``SpeculativeLlama``.

Data flows one way: a call becomes a :class:`~specgguf.config.GenerationConfig`
and prompt ids (checked at the call), and a
:class:`~specgguf.ops.sampling.Sampler` for the config; a
:class:`~specgguf.api.run.Runner` then runs it (alone through the decoder, or
in the engine's shared rounds) and turns its tokens into text.
"""

from __future__ import annotations

import inspect
import os
import sys
import threading
from dataclasses import fields
from typing import Dict, Iterator, List, Optional, Sequence, Union

import llama_cpp

from .completions import CompletionMethods
from ..config import GenerationConfig
from ..engine.calibration import calibrate, measure_acceptance
from ..config import AUTO_K_MAX
from ..llama.grammar import Grammar, LazyStart, pieces
from ..llama.model import ModelLike
from ..llama.pair import ModelPair
from ..llama.text import Prompt
from ..ops.sampling import Sampler
from .output import GenerationResult
from .run import Runner
from .tools import tool_format


_SETTINGS = frozenset(f.name for f in fields(GenerationConfig))
_LOAD_OPTIONS = frozenset(p for p in inspect.signature(ModelPair.__init__).parameters if p not in ("self", "target", "draft"))


class SpeculativeLlama(CompletionMethods):
    """A loaded target/draft pair for generating many times without reloading.

    Args:
        target: path, models.lock name, or loaded ``llama_cpp.Llama``.
        draft: the same, or ``"ngram"`` for model-free prompt-lookup drafting.
        lookup: with a draft model, look the context's end up first each round
            in the context and in earlier texts (:class:`~specgguf.ops.suffix.SuffixDrafter`:
            it costs nothing and drafts long copies), the model drafting where
            it finds nothing, each with its own K (with slots, a lookup per
            slot). Default: on; ``False`` turns it off. (``ngram=`` is its former name.)
        lookup_memory: tokens of earlier prompts and outputs the lookup keeps
            (in memory only, about 600 bytes a token; default 16384).
        n_ctx: context window for models loaded here (>= 256).
        n_threads: threads for models loaded here (None: every core).
        verbose: let llama.cpp print its logs.
        flash_attn: llama.cpp's flash attention for models loaded here (on,
            as llama-server's default on a CPU: about 5% faster per token;
            see :func:`~specgguf.llama.model.load_llama`).
        rpc: ``"host:port,host:port"`` (or a list) of llama.cpp ``rpc-server``
            workers to put the target's layers on (see the README).
        draft_rpc: put the draft on the workers too (default: local).
        tensor_split: the share of layers per worker (default: by free memory).
        config: default :class:`GenerationConfig` for this object's calls.
        store: where learned state lives (default: :func:`specgguf.state.state_dir`).
        parallel: slots, generations that run together in shared rounds
            (:meth:`generate_many`, the server); 1: one at a time.
        cache_ram: MiB of host memory for the caches of slots a new request
            took (with ``parallel`` > 1): a conversation coming back to a
            server busy with others reads only its new turn
            (:mod:`specgguf.llama.stash`). None: 1024, at most a quarter of
            the memory available at load; 0: none kept.
        chat_template: a Jinja chat template's text to use instead of the
            GGUF's (``serve --chat-template-file``); its tool format is the
            one tool calls are written and read in (:mod:`specgguf.api.tools`).
        **settings: generation settings (``max_tokens``, ``temperature``,
            ``k``, ... as :class:`GenerationConfig`) that become this object's
            defaults, e.g. ``SpeculativeLlama(t, d, k=0)``.

    One generation runs at a time: a call from another thread waits for the
    running one (see :class:`InUse`). Models loaded here keep their KV cache
    between calls, so a prompt that extends the last one (a chat) is not
    evaluated again. ``llama_cpp.Llama`` objects passed in keep theirs too,
    until they are run on their own (their own next call starts from
    scratch; the next call here then reads its prompt again: see
    :meth:`~specgguf.llama.model.LlamaModel.held`); an error empties them.
    """

    def __init__(self, target: ModelLike, draft: ModelLike, *, config: Optional[GenerationConfig] = None,
                 **kwargs) -> None:
        settings = {name: kwargs.pop(name) for name in list(kwargs) if name in _SETTINGS}
        if "ngram" in kwargs:  # the lookup's former name
            kwargs.setdefault("lookup", kwargs.pop("ngram"))
        unknown = sorted(set(kwargs) - _LOAD_OPTIONS)
        if unknown:
            raise TypeError(f"SpeculativeLlama got unknown argument(s) {', '.join(unknown)}; load options: "
                            f"{', '.join(sorted(_LOAD_OPTIONS))}; generation settings: {', '.join(sorted(_SETTINGS))}")
        self.defaults = GenerationConfig.from_kwargs(config, **settings)
        # The settings the user set (a whole config counts as set): create_*
        # take these from self.defaults, the rest of its sampling from llama-cpp-python's.
        self.chosen = frozenset(_SETTINGS if config is not None else settings)
        self.pair = ModelPair(target, draft, **kwargs)
        self.names = self.pair.names
        self.runner = Runner(self.pair)
        self.learning, self.engine, self.guard = self.runner.learning, self.runner.engine, self.runner.guard
        self._lazy: Dict[str, LazyStart] = {}  # by trigger: built once, shared by every request's grammar

    @property
    def n_ctx(self) -> int:
        return self.pair.n_ctx

    def tokenize(self, prompt: Prompt, chat: bool = False, tools: Optional[List[dict]] = None) -> List[int]:
        """Prompt ids: a string through the target's tokenizer, chat messages
        through the chat template (``tools``: declarations it renders), or
        token ids checked and passed on."""
        return self.pair.text.encode(prompt, chat, tools)

    @property
    def tool_format(self) -> str:
        """How this pair's chat template writes tool calls (:func:`specgguf.api.tools.tool_format`)."""
        return tool_format(self.pair.text.template_text())

    def piece(self, token: int) -> bytes:
        """A token's bytes, special tokens spelled out (for logprobs)."""
        return self.pair.target_llm.detokenize([int(token)], special=True)

    def check_grammar(self, grammar: str, trigger: Optional[str] = None) -> None:
        """ValueError if llama.cpp cannot compile ``grammar`` (GBNF) for this target."""
        self.grammar(grammar, trigger).close()

    def grammar(self, text: str, trigger: Optional[str] = None) -> Grammar:
        """``text`` (GBNF) compiled for the target, held from the start or,
        with ``trigger``, from where that string appears in the text."""
        lazy = None
        if trigger is not None:
            if trigger not in self._lazy:
                vocab, n = self.pair.vocab
                self._lazy[trigger] = LazyStart(pieces(vocab, range(n)), trigger)
            lazy = self._lazy[trigger]
        return Grammar(*self.pair.vocab, text, lazy=lazy)

    def reset(self) -> None:
        """Empty both KV caches."""
        self.pair.reset()

    def generate(self, prompt: Prompt, *, stream: bool = False, chat: bool = False,
                 config: Optional[GenerationConfig] = None, **settings) -> Union[GenerationResult, Iterator[str]]:
        """Generate after ``prompt``; see :func:`specgguf.generate` for the
        arguments. Errors in them raise here, also with ``stream=True``."""
        run = self.run(prompt, chat=chat, config=config, **settings)
        if stream:
            return (piece for piece in run if isinstance(piece, str))
        for item in run:
            if isinstance(item, GenerationResult):
                return item
        raise RuntimeError("the generation ended without a result")  # unreachable

    def generate_many(self, prompts: Sequence[Prompt], *, stream: bool = False, chat: bool = False,
                      config: Optional[GenerationConfig] = None, **settings):
        """:meth:`generate` for several prompts at once, with the same settings.

        Loaded with ``parallel=N`` (N > 1), up to N run together in shared
        rounds: one target forward per round verifies every request's draft,
        and each output is what that prompt gets alone, greedy and seeded,
        token for token (see :mod:`specgguf.engine.batch`).
        With ``parallel=1``
        they run one after another. Every prompt and setting is checked
        before any runs.

        Returns:
            a list of :class:`GenerationResult` in the prompts' order; with
            ``stream=True`` an iterator of ``(index, text piece)`` as pieces
            come, in whatever order the requests produce them.
        """
        runs = [self.run(p, chat=chat, config=config, **settings) for p in prompts]
        merged = merge(runs, max(1, self.pair.slots))
        if stream:
            return ((i, item) for i, item in merged if isinstance(item, str))
        results: List[Optional[GenerationResult]] = [None] * len(runs)
        for i, item in merged:
            if isinstance(item, GenerationResult):
                results[i] = item
        return results

    def run(self, prompt: Prompt, *, chat: bool = False, config: Optional[GenerationConfig] = None,
            should_stop=None, **settings) -> Iterator[Union[str, GenerationResult]]:
        """Stream text pieces, then the :class:`GenerationResult` (with stats).

        Settings (``max_tokens``, ``temperature``, ... as
        :class:`GenerationConfig`) override ``config``, which overrides the
        object's defaults. ``should_stop``: a function checked after each
        token; when it returns True the generation ends there (finish_reason "stop").
        The prompt and settings are checked here, before anything runs.
        """
        config = GenerationConfig.from_kwargs(config or self.defaults, **settings)
        ids = self.tokenize(prompt, chat)
        if len(ids) >= self.n_ctx:
            raise ValueError(f"the prompt has {len(ids)} tokens; the context window is {self.n_ctx}")
        grammar = self.grammar(config.grammar, config.grammar_trigger) if config.grammar is not None else None
        sampler = Sampler.from_config(config, origin=len(ids), grammar=grammar)
        return self.runner(ids, config, sampler, should_stop)

    def calibrate(self, progress=None) -> dict:
        """Time this machine's forwards for the pair and measure the draft's
        acceptance on a fixed text. The acceptance is stored: later runs (in
        any process) start from it instead of the conservative prior. The
        costs are returned, not stored (every run times its own rounds:
        identical processes here differ by 20%). Takes a few seconds for a
        small pair; ``progress(message)`` is told what runs (default: a line
        on stderr). Returns ``{"costs": ..., "acceptance": ...}``."""
        if self.engine is not None:
            raise RuntimeError("calibrate() times one sequence: run it on a pair loaded with parallel=1")
        say = progress or (lambda msg: print(f"specgguf: {msg}", file=sys.stderr, flush=True))
        with self.guard:
            say(f"timing the forwards of {self.names[0]} and {self.names[1]} ...")
            target, draft = self.pair.target.model, self.pair.draft_model
            costs = calibrate(target, draft.model if draft else None, AUTO_K_MAX)
            acceptance = None
            if draft is not None and self.pair.mode.mode != "cross":  # rows across tokenizers do not compare
                say("measuring the draft's acceptance on a fixed text ...")
                acceptance = measure_acceptance(target, draft.model)
            self.learning.calibrated(acceptance)
        say("acceptance stored" if acceptance else "forwards timed")
        return {"costs": costs.to_dict(), "acceptance": acceptance}


def merge(runs: Sequence[Iterator], workers: int) -> Iterator[tuple]:
    """``(index, item)`` from every run; the first error is raised here and
    the other runs are closed.

    With one worker (a one-slot pair: the runs decode in the thread that
    drains them) the runs are drained in turn in the caller's thread. A
    forward on a thread made for the call costs up to half the speed here:
    llama.cpp's CPU backend runs each forward in an OpenMP team, libgomp
    keeps a team of workers per thread that ever ran one, and once the
    threads it manages outnumber the cores it stops spin-waiting and sleeps
    in the kernel at every barrier (measured on 2 cores with the default
    target: 21.7 ms per token in the thread that decoded first, 42.7 ms in
    a second one, 22.5 back in the first). With several slots the engine's
    one thread decodes and ``workers`` threads only move the items.
    """
    if workers <= 1 or len(runs) <= 1:
        return _in_turn(runs)
    return _threaded(runs, workers)


def _in_turn(runs: Sequence[Iterator]) -> Iterator[tuple]:
    try:
        for i, run in enumerate(runs):
            for item in run:
                yield i, item
    finally:
        for run in runs:
            run.close()


def _threaded(runs: Sequence[Iterator], workers: int) -> Iterator[tuple]:
    """:func:`merge` with each run drained by one of ``workers`` threads."""
    import queue
    from concurrent.futures import ThreadPoolExecutor
    out: "queue.SimpleQueue" = queue.SimpleQueue()
    stop = threading.Event()

    def drain(i: int) -> None:
        try:
            for item in runs[i]:
                if stop.is_set():
                    break
                out.put((i, item))
        except BaseException as e:  # handed to the caller's thread
            out.put((i, e))
        finally:
            runs[i].close()
            out.put((i, _DONE))

    pool = ThreadPoolExecutor(max_workers=min(workers, len(runs)), thread_name_prefix="specgguf-many")
    try:
        for i in range(len(runs)):
            pool.submit(drain, i)
        left = len(runs)
        while left:
            i, item = out.get()
            if item is _DONE:
                left -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)


_DONE = object()
_cache_lock = threading.Lock()
_cached: Dict[tuple, SpeculativeLlama] = {}


def cached_pair(target: ModelLike, draft: ModelLike, **load) -> SpeculativeLlama:
    """A SpeculativeLlama for these arguments, loaded once per process (the
    last one is kept: a second pair replaces it)."""
    key = (id(target) if isinstance(target, llama_cpp.Llama) else os.fspath(target),
           id(draft) if isinstance(draft, llama_cpp.Llama) else os.fspath(draft),
           tuple(sorted((k, str(v)) for k, v in load.items())))
    with _cache_lock:
        if key not in _cached:
            _cached.clear()
            _cached[key] = SpeculativeLlama(target, draft, **load)
        return _cached[key]


def generate(prompt: Prompt, *, target: ModelLike, draft: ModelLike, stream: bool = False, chat: bool = False,
             lookup: Optional[bool] = None, ngram: Optional[bool] = None, lookup_memory: int = 16384,
             n_ctx: int = 2048, n_threads: Optional[int] = None,
             rpc: Union[None, str, Sequence[str]] = None, config: Optional[GenerationConfig] = None,
             **settings) -> Union[GenerationResult, Iterator[str]]:
    """Speculative generation with two GGUF models, exactly the target's output law.

    Args:
        prompt: text (tokenized by the target's tokenizer, BOS added as it
            specifies), a list of token ids, or role/content messages rendered
            by the GGUF's chat template (``chat=True``, or implied by messages).
        target, draft: paths, models.lock names or loaded ``llama_cpp.Llama``;
            ``draft="ngram"`` drafts by prompt lookup, with no draft model.
        stream: return an iterator of text pieces instead.
        lookup: look the text up before the draft model each round (default:
            on; see SpeculativeLlama); ``ngram``: its former name.
        lookup_memory, n_ctx, n_threads, rpc: how the pair is loaded (see
            SpeculativeLlama); the lookup's memory of earlier calls lives
            with the loaded pair.
        config: a :class:`GenerationConfig`; ``settings`` override it:
            max_tokens, temperature, top_k, top_p, min_p, k, p_min, seed, stop,
            drafter_invariant (see :class:`GenerationConfig`).

    The models are loaded once per process and reused by later calls with the
    same arguments.

    Returns:
        :class:`GenerationResult` (``.text``, ``.tokens``, ``.finish_reason``,
        ``.stats``), or an iterator of ``str`` when ``stream=True``.
    """
    config = GenerationConfig.from_kwargs(config, **settings)  # errors before any loading
    lookup = ngram if lookup is None else lookup
    llm = cached_pair(target, draft, lookup=lookup, lookup_memory=lookup_memory, n_ctx=n_ctx, n_threads=n_threads,
                      rpc=rpc)
    return llm.generate(prompt, stream=stream, chat=chat, config=config)
