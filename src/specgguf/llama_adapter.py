"""Two ``llama_cpp.Llama`` models as ``draft_step`` / ``target_step`` callbacks.

Bookkeeping (as in llama.cpp's speculative examples): each model remembers
which tokens its KV cache holds. A call evaluates only what the cache lacks,
after cutting the cache back to the longest common prefix with
``llama_memory_seq_rm`` - so no token is ever evaluated twice. The target
scores ``[last emitted token, d_1 .. d_K]`` in ONE ``llama_decode`` with
logits flagged at those K+1 positions, read row by row with
``llama_get_logits_ith``: memory stays at the models + KV caches + O(K x V),
never an ``n_ctx x V`` buffer.
"""

from __future__ import annotations

import time
from typing import List, Optional, Sequence, Tuple

import llama_cpp
import numpy as np

from .policy import CostModel
from .sampling import warp

MAX_VOCAB_DIFF = 128  # padding rows, as llama.cpp allows (e.g. Qwen2.5 0.5B vs 7B)


class LlamaModel:
    """One model's KV-cache bookkeeping over the llama.cpp C API.

    Args:
        llm: a loaded ``llama_cpp.Llama`` (its settings are kept).
        n_vocab: width of the logit rows returned (>= the model's own vocab;
            columns past it are -inf, i.e. zero mass).
    """

    def __init__(self, llm: "llama_cpp.Llama", n_vocab: Optional[int] = None) -> None:
        self.llm = llm
        self.ctx = llm.ctx
        self.vocab = llama_cpp.llama_model_get_vocab(llm.model)
        self.model_vocab = int(llama_cpp.llama_vocab_n_tokens(self.vocab))
        self.n_vocab = n_vocab or self.model_vocab
        self.n_ctx = int(llama_cpp.llama_n_ctx(self.ctx))
        self.n_batch = max(1, int(llama_cpp.llama_n_batch(self.ctx)))
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        self.tokens: List[int] = []  # what the KV cache holds, in order
        self.seconds = 0.0  # time spent in llama_decode and reading logits
        self.reset()

    def __del__(self) -> None:
        batch = getattr(self, "batch", None)
        if batch is not None:
            llama_cpp.llama_batch_free(batch)
            self.batch = None

    def reset(self) -> None:
        """Empty the KV cache; the ``Llama`` object re-evaluates from scratch next time."""
        llama_cpp.llama_memory_clear(self.mem, True)
        self.tokens = []
        self.llm.n_tokens = 0  # keep Llama's own prefix cache honest

    def eval(self, seq: Sequence[int], n_logits: int) -> np.ndarray:
        """Make the KV cache hold ``seq``; return logits ``[n_logits, n_vocab]``
        float32 for its last ``n_logits`` positions (row i predicts the token
        after ``seq[:len(seq) - n_logits + i + 1]``)."""
        n = len(seq)
        if n > self.n_ctx:
            raise ValueError(f"sequence of {n} tokens does not fit the context window of {self.n_ctx}")
        common = 0
        limit = min(len(self.tokens), n - n_logits)
        while common < limit and self.tokens[common] == seq[common]:
            common += 1
        if common < len(self.tokens):
            if not llama_cpp.llama_memory_seq_rm(self.mem, 0, common, -1):
                raise ValueError("this model cannot drop part of its KV cache (recurrent or hybrid "
                                 "architecture); specgguf needs a transformer model")
            del self.tokens[common:]
        out = np.full((n_logits, self.n_vocab), -np.inf, dtype=np.float32)
        first_logit = n - n_logits
        t0 = time.perf_counter()
        try:
            for start in range(common, n, self.n_batch):
                end = min(n, start + self.n_batch)
                b = self.batch
                b.n_tokens = end - start
                for j, pos in enumerate(range(start, end)):
                    b.token[j] = seq[pos]
                    b.pos[j] = pos
                    b.n_seq_id[j] = 1
                    b.seq_id[j][0] = 0
                    b.logits[j] = pos >= first_logit
                rc = llama_cpp.llama_decode(self.ctx, b)
                if rc != 0:
                    raise RuntimeError(f"llama_decode failed with code {rc}")
                self.tokens.extend(seq[start:end])
                for j, pos in enumerate(range(max(start, first_logit), end)):
                    ptr = llama_cpp.llama_get_logits_ith(self.ctx, pos - start)
                    out[pos - first_logit, : self.model_vocab] = np.ctypeslib.as_array(
                        ptr, shape=(self.model_vocab,))
        except BaseException:
            # Unknown KV state after a failure or Ctrl-C: start clean next time.
            self.reset()
            raise
        finally:
            self.seconds += time.perf_counter() - t0
        return out

    def token_text(self, token: int) -> bytes:
        return llama_cpp.llama_vocab_get_text(self.vocab, token) or b""


def check_vocab(target: LlamaModel, draft: LlamaModel, target_name: str, draft_name: str) -> None:
    """Raise ValueError unless both models share a tokenizer (see the issue's rules)."""
    def fail(why: str) -> None:
        raise ValueError(f"draft {draft_name} and target {target_name} do not share a tokenizer: {why}")

    tv, dv = target.vocab, draft.vocab
    if llama_cpp.llama_vocab_type(tv) != llama_cpp.llama_vocab_type(dv):
        fail("different tokenizer types")
    for what, f in (("BOS", llama_cpp.llama_vocab_bos), ("EOS", llama_cpp.llama_vocab_eos)):
        if f(tv) != f(dv):
            fail(f"{what} token {f(dv)} vs {f(tv)}")
    if abs(target.model_vocab - draft.model_vocab) > MAX_VOCAB_DIFF:
        fail(f"vocab sizes {draft.model_vocab} vs {target.model_vocab} differ by more than {MAX_VOCAB_DIFF}")
    for t in range(min(target.model_vocab, draft.model_vocab)):
        a, b = draft.token_text(t), target.token_text(t)
        if a != b:
            fail(f"token {t} is {a!r} in the draft but {b!r} in the target")


class LlamaPair:
    """``draft_step`` / ``target_step`` for :class:`~specgguf.SpeculativeDecoder`.

    Args:
        target, draft: loaded ``llama_cpp.Llama`` objects sharing a tokenizer.
        temperature: 0 = greedy (rows are raw logits); > 0 = both models'
            logits are warped by :func:`specgguf.sampling.warp` with the same
            settings.
        top_k, top_p, min_p: warping settings (ignored when greedy).
        seed: seeds the draft's own token sampling.
    """

    def __init__(self, target: "llama_cpp.Llama", draft: Optional["llama_cpp.Llama"], *, temperature: float = 0.0,
                 top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, seed: Optional[int] = None,
                 target_name: str = "target", draft_name: str = "draft") -> None:
        t_vocab = int(llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(target.model)))
        v = t_vocab
        if draft is not None:
            d_vocab = int(llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(draft.model)))
            v = max(t_vocab, d_vocab)
        self.target = LlamaModel(target, v)
        self.draft = LlamaModel(draft, v) if draft is not None else None
        if self.draft is not None:
            check_vocab(self.target, self.draft, target_name, draft_name)
        self.n_vocab = v
        self.configure(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)

    def configure(self, *, temperature: float = 0.0, top_k: int = 40, top_p: float = 0.95,
                  min_p: float = 0.05, seed: Optional[int] = None) -> None:
        """Set the warping and the draft's seed for the next generation; zero the timers."""
        self.temperature = float(temperature)
        self.warp_args = dict(top_k=int(top_k), top_p=float(top_p), min_p=float(min_p))
        self.rng = np.random.default_rng(seed)
        self.warp_seconds = 0.0
        for m in self.models:
            m.seconds = 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def n_ctx(self) -> int:
        return min(m.n_ctx for m in self.models)

    @property
    def models(self) -> List[LlamaModel]:
        return [self.target] + ([self.draft] if self.draft is not None else [])

    def reset(self) -> None:
        """Empty both KV caches (start of a generation, or after an error)."""
        for m in self.models:
            m.reset()

    def _warp(self, logits: np.ndarray) -> np.ndarray:
        t0 = time.perf_counter()
        p = warp(logits, self.temperature, **self.warp_args)
        self.warp_seconds += time.perf_counter() - t0
        return p

    def draft_step(self, prefix: List[int], k: int, p_min: Optional[float] = None
                   ) -> Tuple[List[int], Optional[np.ndarray], dict]:
        """Propose up to k tokens after ``prefix``.

        Returns ``(tokens [n], probs [n, V] or None when greedy, info)``;
        ``info["confidence"]`` is the draft's probability of each token over
        its full distribution (warped; softmax of the logits when greedy),
        and drafting stops early (``info["stop"] = "cutoff"``) before a token
        whose confidence is below ``p_min``.
        """
        if self.draft is None:
            raise ValueError("this pair has no draft model")
        seq = list(prefix)
        tokens: List[int] = []
        probs, conf = [], []
        stop = "max"
        for i in range(k):
            logits = self.draft.eval(seq, 1)[0]
            if self.greedy:
                tok = int(np.argmax(logits))
                c = float(1.0 / np.exp(logits - logits[tok]).sum())
            else:
                q = self._warp(logits[None, :])[0]
                cum = np.cumsum(q, dtype=np.float64)
                tok = int(min(np.searchsorted(cum, self.rng.random() * cum[-1], side="right"), len(q) - 1))
                c = float(q[tok])
            if p_min is not None and c < p_min:
                stop = "cutoff"
                break
            if not self.greedy:
                probs.append(q)
            tokens.append(tok)
            conf.append(c)
            seq.append(tok)
        out_probs = None if self.greedy or not tokens else np.stack(probs)
        return tokens, out_probs, {"confidence": conf, "stop": stop}

    def calibrate(self, k_max: int, reps: int = 7) -> "CostModel":
        """Time the forwards this machine runs per round: a draft token (as
        part of a greedy 4-token drafting round), the draft catching up on
        skipped tokens, and target batches of 1..k_max+1 tokens (medians of
        ``reps``). About two seconds for a small pair; cached by the caller.
        Resets the sampling settings (:meth:`configure` with defaults)."""
        self.configure()
        # A context of typical length (a chat prompt and some answer), since
        # attention makes a forward's cost grow with it.
        ctx = [int(llama_cpp.llama_vocab_bos(self.target.vocab))] + [100 + i % 500 for i in range(159)]
        ctx = [t if 0 <= t < self.target.model_vocab else 0 for t in ctx]

        def timed(model: LlamaModel, b: int) -> float:
            # Cuts the last b tokens back and scores them again: one forward of b.
            t0 = time.perf_counter()
            model.eval(ctx + [7] * b, b)
            return time.perf_counter() - t0

        self.reset()
        models = [self.target] + ([self.draft] if self.draft is not None else [])
        for m in models:
            m.eval(ctx, 1)
        # Interleaved rounds, not one block per measurement: the policy
        # compares these costs with each other, and on a shared machine the
        # load drifts during a calibration.
        target: List[List[float]] = [[] for _ in range(k_max + 1)]
        draft: List[float] = []
        prefill: List[float] = []
        for _ in range(reps):
            for b in range(1, k_max + 2):
                target[b - 1].append(timed(self.target, b))
            if self.draft is not None:
                # Catching up on 32 skipped tokens (other than last time's: the
                # cache is cut back to ctx first).
                fill = [8 + len(prefill) % 2] * 32
                t0 = time.perf_counter()
                self.draft.eval(ctx + fill, 1)
                prefill.append((time.perf_counter() - t0) / 32)
                # A drafting round as it runs live after all K were accepted:
                # the draft first evaluates its last token and the bonus (a
                # batch of 2), then K - 1 more, with its Python around them.
                # A bare 1-token forward underrated a live draft token by 15%+.
                t0 = time.perf_counter()
                self.draft_step(ctx + fill + [9, 10], 4)
                draft.append((time.perf_counter() - t0) / 4)
        self.reset()
        med = lambda xs: float(np.median(xs)) if xs else 0.0
        return CostModel(draft=med(draft), target=[med(t) for t in target], seconds=True,
                         draft_prefill=med(prefill))

    CALIBRATION_TEXT = "Write a short essay about the history of the printing press.\n\n"

    def measure_acceptance(self, n: int = 48) -> dict:
        """The draft's per-token acceptance on a fixed text: the target's own
        greedy continuation (``n`` tokens) of CALIBRATION_TEXT, scored by both
        models in one batch each.

        Returns ``{"greedy": agreement of the two argmaxes, "sampled": mean
        sum(min(p, q)) at temperature 0.8 with the default warps}`` - the
        acceptance exact verification has at those settings. Deterministic for
        given files and build; a one-off like :meth:`calibrate`.
        """
        if self.draft is None:
            raise ValueError("this pair has no draft model")
        seq = self.target.llm.tokenize(self.CALIBRATION_TEXT.encode(), add_bos=True, special=False)
        self.reset()
        try:
            for _ in range(n):
                seq.append(int(np.argmax(self.target.eval(seq, 1)[0])))
            # Row i of each predicts generated token i (the last token itself
            # is never an input).
            t_logits = self.target.eval(seq[:-1], n)
            d_logits = self.draft.eval(seq[:-1], n)
        finally:
            self.reset()
        greedy = float(np.mean(np.argmax(t_logits, axis=1) == np.argmax(d_logits, axis=1)))
        p, q = warp(t_logits, 0.8), warp(d_logits, 0.8)
        sampled = float(np.mean(np.minimum(p, q).sum(axis=1)))
        return {"greedy": greedy, "sampled": sampled}

    def target_step(self, prefix: List[int], proposed: List[int]) -> np.ndarray:
        """Score ``proposed`` in one batch: ``[len(proposed)+1, V]`` float32
        (logits when greedy, warped probabilities otherwise)."""
        logits = self.target.eval(list(prefix) + list(proposed), len(proposed) + 1)
        return logits if self.greedy else self._warp(logits)
