"""The engine's shared rounds driven by models that are not llama.cpp's.

The engine talks to its models through a small protocol (what
:class:`~specgguf.llama.model.LlamaModel` offers it): ``slots``,
``unified``, ``cache`` (the tokens each slot's KV holds), ``lag(seq, slot,
n_logits)``, ``eval_many(work)`` and ``reset()``. :class:`TableModel` keeps
that protocol over a next-token table, so the rounds, the policy and the
verification are checked here without loading a model: every text equals
the table's greedy walk, whatever K, drafts or company it had.
"""

import numpy as np
import pytest

pytest.importorskip("llama_cpp")  # engine.batch imports the llama adapter beside the protocol

from specgguf.engine.batch import Engine  # noqa: E402
from specgguf.engine.policy import Policy  # noqa: E402
from specgguf.ops.drafter import common_prefix  # noqa: E402
from specgguf.ops.sampling import Sampler  # noqa: E402

V = 16


class TableModel:
    """A model whose logits depend on the last token only (``table[t]``: the row
    after token t), with LlamaModel's cache bookkeeping: a call evaluates what
    the slot's cache lacks, at least ``n_logits`` tokens."""

    unified = False

    def __init__(self, table: np.ndarray, slots: int) -> None:
        self.table, self.slots = table, slots
        self.cache = [[] for _ in range(slots)]
        self.evaluated = 0  # tokens run through forwards, over every slot

    def reset(self) -> None:
        self.cache = [[] for _ in range(self.slots)]

    def lag(self, seq, slot: int = 0, n_logits: int = 1) -> int:
        return len(seq) - common_prefix(self.cache[slot], seq, len(seq) - n_logits)

    def eval_many(self, work):
        outs = []
        for slot, seq, n_logits, *_ in work:
            self.evaluated += self.lag(seq, slot, n_logits)
            self.cache[slot] = list(seq)
            outs.append(np.stack([self.table[t] for t in seq[len(seq) - n_logits:]]).astype(np.float32))
        return outs


def table(rng: np.random.Generator, agree_with=None, agreement: float = 1.0) -> np.ndarray:
    """A next-token table; with ``agree_with``, one whose argmax follows that
    table's for a share ``agreement`` of the tokens (a draft)."""
    t = rng.normal(size=(V, V))
    if agree_with is not None:
        for row in range(V):
            if rng.random() < agreement:
                t[row, int(np.argmax(agree_with[row]))] = t[row].max() + 1.0
    return t


def greedy_walk(t: np.ndarray, ids, n: int):
    out, last = [], ids[-1]
    for _ in range(n):
        last = int(np.argmax(t[last]))
        out.append(last)
    return out


@pytest.mark.parametrize("agreement", [1.0, 0.6, 0.0])
def test_shared_rounds_over_a_protocol_model_give_each_request_its_greedy_walk(agreement):
    rng = np.random.default_rng(7)
    target_t = table(rng)
    target, draft = TableModel(target_t, 3), TableModel(table(rng, target_t, agreement), 3)
    policy = Policy()
    policy.measured("greedy", agreement, 64)  # known: no prompt measurement (it reads a real vocabulary)
    engine = Engine(target, draft, policy=policy)
    prompts = [[1, 2, 3], [4, 5, 6, 7], [8, 9], [10, 11, 12, 13, 14]]  # four requests, three slots: one waits
    tickets = [engine.submit(p, 40, frozenset(), Sampler(), "greedy", k=k)
               for p, k in zip(prompts, ["auto", 3, "auto", 8])]
    for p, t in zip(prompts, tickets):
        assert list(t) == greedy_walk(target_t, p, 40)
        assert t.stats.finish_reason == "length" and t.stats.emitted == 40
    drafted = sum(t.stats.drafted for t in tickets)
    accepted = sum(t.stats.accepted for t in tickets)
    assert drafted > 0  # the fixed-K requests draft whatever the policy thinks
    if agreement == 1.0:
        assert accepted == drafted  # a draft that is the target is never rejected
    if agreement == 0.0:
        assert accepted <= drafted // 4  # a draft that never agrees is rarely right (a table's ties)


def test_a_stop_token_ends_a_request_and_frees_its_slot_for_the_next():
    rng = np.random.default_rng(3)
    target_t = table(rng)
    walk = greedy_walk(target_t, [1], 30)
    stop = walk[5]
    target, draft = TableModel(target_t, 1), TableModel(target_t, 1)
    engine = Engine(target, draft, policy=Policy())
    first = engine.submit([1], 30, frozenset([stop]), Sampler(), "greedy", k=4)
    second = engine.submit([2], 10, frozenset(), Sampler(), "greedy", k=4)  # waits for the one slot
    out = list(first)
    assert out == walk[:walk.index(stop) + 1] and first.stats.finish_reason == "stop"
    assert list(second) == greedy_walk(target_t, [2], 10)
