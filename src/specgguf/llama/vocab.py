"""How a draft can serve a target, read from their GGUF vocabularies.

Four answers (:func:`pair_mode`), checked at load and by ``python -m
specgguf check-pair``:

* ``same``: one tokenizer; the draft's rows are verified as they are.
* ``padded``: one tokenizer, one model with up to ``MAX_VOCAB_DIFF`` extra
  (unused) rows, as llama.cpp allows (Qwen2.5 0.5B vs 7B); the shorter rows
  are padded with ``-inf``.
* ``cross``: different tokenizers that share token strings; the draft
  proposes text (:mod:`specgguf.ops.cross`).
* refused (ValueError naming the model): a recurrent or hybrid model (its
  state cannot be cut back to a rejected draft), or vocabularies that share
  almost no token strings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import llama_cpp

from ..ops.cross import Vocab, VocabMap
from .grammar import pieces as token_pieces

MAX_VOCAB_DIFF = 128  # padding rows, as llama.cpp allows (e.g. Qwen2.5 0.5B vs 7B)
MIN_SHARED = 256      # fewer shared token strings than this: nothing but bytes in common


def _vocab(llm: "llama_cpp.Llama"):
    return llama_cpp.llama_model_get_vocab(llm.model)


def _text(llm: "llama_cpp.Llama", t: int) -> bytes:
    return llama_cpp.llama_vocab_get_text(_vocab(llm), t) or b""


def vocab_difference(target: "llama_cpp.Llama", draft: "llama_cpp.Llama") -> Optional[str]:
    """Why two models do not share a tokenizer (None: they do): the type,
    BOS and EOS, sizes within MAX_VOCAB_DIFF, and the same text per token."""
    tv, dv = _vocab(target), _vocab(draft)
    if llama_cpp.llama_vocab_type(tv) != llama_cpp.llama_vocab_type(dv):
        return "different tokenizer types"
    for what, f in (("BOS", llama_cpp.llama_vocab_bos), ("EOS", llama_cpp.llama_vocab_eos)):
        if f(tv) != f(dv):
            return f"{what} token {f(dv)} vs {f(tv)}"
    nt, nd = int(llama_cpp.llama_vocab_n_tokens(tv)), int(llama_cpp.llama_vocab_n_tokens(dv))
    if abs(nt - nd) > MAX_VOCAB_DIFF:
        return f"vocab sizes {nd} vs {nt} differ by more than {MAX_VOCAB_DIFF}"
    for t in range(min(nt, nd)):
        a, b = _text(draft, t), _text(target, t)
        if a != b:
            return f"token {t} is {a!r} in the draft but {b!r} in the target"
    return None


def check_vocab(target: "llama_cpp.Llama", draft: "llama_cpp.Llama", target_name: str, draft_name: str) -> None:
    """Raise ValueError unless both models share a tokenizer (what a draft
    passed token ids, as llama-cpp-python's ``draft_model``, needs)."""
    why = vocab_difference(target, draft)
    if why:
        raise ValueError(f"draft {draft_name} and target {target_name} do not share a tokenizer: {why}")


def vocab_of(llm: "llama_cpp.Llama") -> Vocab:
    """A model's tokenizer as a :class:`~specgguf.ops.cross.Vocab`: each
    token's bytes (about half a second for 262k tokens), its tokenizer, and
    its BOS if it adds one."""
    vocab = _vocab(llm)
    n = int(llama_cpp.llama_vocab_n_tokens(vocab))
    text = token_pieces(vocab, range(n), special=False)
    bos = int(llama_cpp.llama_vocab_bos(vocab)) if llama_cpp.llama_vocab_get_add_bos(vocab) else None
    blank = [t for t in range(n) if not text[t] and t != bos]
    shown = dict(zip(blank, token_pieces(vocab, blank)))
    return Vocab(text, lambda s: llm.tokenize(s, add_bos=False, special=False), bos, shown)


@dataclass
class PairMode:
    """How a draft serves a target: ``mode`` (``same``, ``padded``,
    ``cross``), a line for users, and for ``cross`` the two vocabularies
    and their shared tokens."""

    mode: str
    detail: str
    target: Optional[Vocab] = None
    draft: Optional[Vocab] = None
    vmap: Optional[VocabMap] = None


def _check_architecture(llm: "llama_cpp.Llama", role: str, name: str) -> None:
    if llama_cpp.llama_model_is_recurrent(llm.model) or llama_cpp.llama_model_is_hybrid(llm.model):
        raise ValueError(f"the {role} {name} is a recurrent or hybrid model: its state cannot be cut back to "
                         "a rejected draft, so it cannot take part in speculative decoding (use a transformer)")


def pair_mode(target: "llama_cpp.Llama", draft: "llama_cpp.Llama", target_name: str, draft_name: str) -> PairMode:
    """How ``draft`` can serve ``target`` (module docstring); ValueError,
    naming the model, for a pair that cannot work."""
    _check_architecture(target, "target", target_name)
    _check_architecture(draft, "draft", draft_name)
    why = vocab_difference(target, draft)
    nt, nd = int(target.n_vocab()), int(draft.n_vocab())
    if why is None:
        if nt == nd:
            return PairMode("same", f"same vocabulary ({nt} tokens)")
        return PairMode("padded", f"same tokenizer, vocabularies padded to {max(nt, nd)} ({nd} draft, {nt} target)")
    return cross_mode(vocab_of(target), vocab_of(draft), why, target_name, draft_name)


def cross_mode(target: Vocab, draft: Vocab, why: str, target_name: str, draft_name: str) -> PairMode:
    """The ``cross`` mode of two vocabularies that are not one tokenizer
    (``why``: how they differ); ValueError, naming both models, when they
    share fewer than MIN_SHARED token strings."""
    vmap = VocabMap(target, draft)
    if vmap.shared < MIN_SHARED:
        raise ValueError(f"draft {draft_name} and target {target_name} share only {vmap.shared} token strings "
                         f"({why}): the draft cannot propose text the target would write; use a draft from "
                         "the target's family")
    return PairMode("cross", f"different tokenizers ({why}); cross-tokenizer drafting: {vmap.shared} of the "
                             f"draft's {len(draft)} tokens spell one of the target's {len(target)}",
                    target, draft, vmap)
