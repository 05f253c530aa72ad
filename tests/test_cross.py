"""Speculation across tokenizers (specgguf.ops.cross).

On small synthetic vocabulary pairs whose models are tables of logits (so
the law of the output is known exactly): sampling with the shared-token
rule follows the target's law (chi-square), the drafter-invariant race
gives plain seeded sampling's output whatever the draft, and greedy by text
is plain greedy. Then the drafter's bookkeeping: the draft's tokens always
spell the accepted text.
"""

import itertools

import numpy as np
import pytest

from tests.conftest import ALPHA, chi2_pvalue
from specgguf import SpeculativeDecoder
from specgguf.ops.cross import CrossDrafter, Vocab, VocabMap
from specgguf.ops.sampling import Sampler


def longest_match(pieces):
    """A real (if simple) tokenizer over ``pieces``: longest match first."""
    by_len = sorted(((p, t) for t, p in enumerate(pieces) if p), key=lambda x: -len(x[0]))

    def tokenize(text: bytes):
        out, i = [], 0
        while i < len(text):
            p, t = next((p, t) for p, t in by_len if text.startswith(p, i))
            out.append(t)
            i += len(p)
        return out
    return tokenize


def vocab(pieces, bos=None):
    pieces = [p.encode() for p in pieces]
    return Vocab(pieces, longest_match(pieces), bos)


# The target spells "ab" and "bc" in one token, the draft "ca" and "bca"; both
# spell a, b, c alone. Shared: a, b, c.
TARGET = vocab(["a", "b", "c", "ab", "bc"])
DRAFT = vocab(["", "a", "b", "c", "ca", "bca"], bos=0)


class TableModel:
    """A language model as a table: logits of the next token given the last
    token (row ``table[last]``; the first row after a BOS or an empty
    sequence is ``table[-1]``). It holds no cache: every call is a full one."""

    def __init__(self, table, bos=None):
        self.table, self.bos = np.asarray(table, dtype=np.float32), bos
        self.calls = 0

    def eval(self, seq, n):
        self.calls += 1
        rows = [self.table[-1] if (i == 0 or seq[i - 1] == self.bos) else self.table[seq[i - 1]]
                for i in range(len(seq) - n + 1, len(seq) + 1)]
        return np.stack(rows)

    def lag(self, seq):
        return 0


def target_step(table, sampler):
    model = TableModel(table)

    def step(prefix, proposed):
        context = list(prefix) + list(proposed)
        return sampler.target_rows(model.eval(context, len(proposed) + 1), context)
    return step


def softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def tables(seed):
    rng = np.random.default_rng(seed)
    return rng.normal(0, 1.2, (len(TARGET) + 1, len(TARGET))), rng.normal(0, 1.2, (len(DRAFT) + 1, len(DRAFT)))


def test_shared_tokens_map_both_ways():
    vm = VocabMap(TARGET, DRAFT)
    assert vm.shared == 3
    assert [int(vm.d2t[d]) for d in range(len(DRAFT))] == [-1, 0, 1, 2, -1, -1]
    assert [int(vm.t2d[t]) for t in range(len(TARGET))] == [1, 2, 3, -1, -1]
    rows = np.arange(12, dtype=np.float32).reshape(2, 6)
    out = vm.to_target(rows)
    assert out.shape == (2, 5) and out.dtype == np.float32
    assert out[1, :3].tolist() == [7, 8, 9] and np.all(np.isneginf(out[:, 3:]))


def test_twin_pieces_map_to_what_the_tokenizer_gives():
    # Two ids spell "a" (as a byte-fallback twin would): the one tokenize("a") gives is the one shared.
    twin = Vocab([b"a", b"b", b"a"], lambda text: [2 if c == ord("a") else 1 for c in text])
    vm = VocabMap(twin, DRAFT)
    assert int(vm.d2t[1]) == 2 and int(vm.t2d[0]) == -1


@pytest.mark.parametrize("seed,k", [(0, 2), (1, 3)])
def test_exact_sampling_follows_the_target_law(seed, k):
    """The first two tokens' joint law, over 5 x 5 cells, is the target's
    whatever the draft proposes (shared tokens only, drawn from q)."""
    t_table, d_table = tables(seed)
    n = 6000
    counts = np.zeros(len(TARGET) ** 2)
    drafted = 0
    for i in range(n):
        sampler = Sampler("exact", (1.0, 0, 1.0, 0.0), generator=10_000 * seed + i,
                          draft_generator=777_777 + 10_000 * seed + i, origin=1)
        drafter = CrossDrafter(TableModel(d_table, DRAFT.bos), TARGET, DRAFT)
        drafter.sampler = sampler
        dec = SpeculativeDecoder(drafter, target_step(t_table, sampler), k=k, sampler=sampler)
        out = dec.generate([0], 3)  # a round of up to 2 drafts, then what is left
        counts[out[0] * len(TARGET) + out[1]] += 1
        drafted += dec.stats.drafted
    p1 = softmax(t_table[0])  # after the prompt token 0 ("a")
    law = np.array([p1[x] * softmax(t_table[x])[y] for x, y in itertools.product(range(5), range(5))])
    assert drafted > 1.5 * n  # the draft really proposed
    assert chi2_pvalue(counts, law) > ALPHA


@pytest.mark.parametrize("temperature,top_k", [(1.0, 0), (0.7, 3)])
def test_drafter_invariant_sampling_is_plain_seeded_sampling(temperature, top_k):
    t_table, d_table = tables(7)
    for seed in range(40):
        outs = []
        for k in (0, 3):
            sampler = Sampler("invariant", (temperature, top_k, 1.0, 0.0), seed=seed, origin=1)
            drafter = CrossDrafter(TableModel(d_table, DRAFT.bos), TARGET, DRAFT)
            drafter.sampler = sampler
            outs.append(SpeculativeDecoder(drafter, target_step(t_table, sampler), k=k, sampler=sampler)
                        .generate([0], 12))
        assert outs[0] == outs[1], seed


def test_greedy_by_text_is_plain_greedy():
    for seed in range(30):
        t_table, d_table = tables(100 + seed)
        outs = []
        for k in (0, 1, 4):
            sampler = Sampler("greedy")
            drafter = CrossDrafter(TableModel(d_table, DRAFT.bos), TARGET, DRAFT)
            drafter.sampler = sampler
            dec = SpeculativeDecoder(drafter, target_step(t_table, sampler), k=k, sampler=sampler)
            outs.append(dec.generate([0, 3], 16))
        assert outs[0] == outs[1] == outs[2], seed


def test_a_draft_that_writes_the_target_text_is_accepted_whole():
    """The draft writes "ca" "b" "ca" ... , which the target tokenizes as "c" "ab" "c" "ab":
    proposals by text, not by token, so a target that writes the same text accepts them all."""
    d_table = np.full((len(DRAFT) + 1, len(DRAFT)), -9.0)
    for last, nxt in ((-1, 4), (0, 4), (1, 2), (2, 4), (3, 1), (4, 2), (5, 2)):
        d_table[last, nxt] = 5.0      # ..."ca" "b" "ca" "b"..., however a catch-up tokenized the text
    t_table = np.full((len(TARGET) + 1, len(TARGET)), -9.0)
    t_table[:, 2] = 5.0               # after anything, "c" ...
    t_table[2, :] = -9.0
    t_table[2, 3] = 5.0               # ... then "ab"
    sampler = Sampler("greedy")
    drafter = CrossDrafter(TableModel(d_table, DRAFT.bos), TARGET, DRAFT)
    drafter.sampler = sampler
    dec = SpeculativeDecoder(drafter, target_step(t_table, sampler), k=4, sampler=sampler)
    out = dec.generate([3], 17)
    assert out == [2, 3] * 8 + [2]
    assert dec.stats.drafted > 8 and dec.stats.accepted == dec.stats.drafted


def test_the_draft_spells_the_accepted_text():
    """After each round, the draft's tokens spell a prefix of the accepted
    text and, once synced, all of it (the catch-up tokenizes the rest)."""
    t_table, d_table = tables(3)
    sampler = Sampler("greedy")
    drafter = CrossDrafter(TableModel(d_table, DRAFT.bos), TARGET, DRAFT)
    drafter.sampler = sampler
    context = [0]
    for _ in range(12):
        draft = drafter.propose(context, 3)
        rows = target_step(t_table, sampler)(context, draft.tokens)
        n, nxt = sampler.verify(rows, draft, len(context) - 1)
        context += list(draft.tokens[:n]) + [nxt]
        seq = drafter._sync(context)
        text = b"".join(TARGET.pieces[t] for t in context)
        assert seq[0] == DRAFT.bos and b"".join(DRAFT.pieces[t] for t in seq) == text
    # A context that goes back (another prompt) is followed too.
    seq = drafter._sync([1, 2])
    assert b"".join(DRAFT.pieces[t] for t in seq) == b"bc"


def test_a_word_cut_in_two_is_tokenized_whole():
    words = vocab(["", " every", "thing", " everything", "one", " everyone", " "], bos=0)
    drafter = CrossDrafter(TableModel(np.zeros((8, 7)), 0), TARGET, words)
    drafter.d_ids, drafter.d_ends, drafter.d_text = [0, 1], [0, 6], bytearray(b" every")
    drafter.target = vocab([" every", "one", "thing", " "])
    assert drafter._sync([0, 1]) == [0, 5]  # " every" + "one": " everyone", as the draft would write it


def test_vocabularies_with_almost_nothing_in_common_are_refused():
    from specgguf.llama.vocab import MIN_SHARED, cross_mode
    with pytest.raises(ValueError, match=r"draft d.gguf and target t.gguf share only 3 token strings"):
        cross_mode(TARGET, DRAFT, "different tokenizer types", "t.gguf", "d.gguf")
    # Enough shared strings: cross-tokenizer drafting, said in a line.
    words = [f"w{i}" for i in range(MIN_SHARED)]
    mode = cross_mode(vocab(words + ["x"]), vocab([""] + words), "different sizes", "t", "d")
    assert mode.mode == "cross" and mode.vmap.shared == MIN_SHARED
    assert f"{MIN_SHARED} of the draft's {MIN_SHARED + 1} tokens spell one of the target's {MIN_SHARED + 1}" \
        in mode.detail
