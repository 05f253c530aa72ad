"""The lookup drafter (ops/suffix.py) on real text: the standard library's own
source, as words mapped to ids (no model: what it proposes is a function of
the tokens alone)."""

import inspect
import textwrap

import pytest

from specgguf.ops.suffix import SEPARATOR, SuffixDrafter


def words(text, vocab):
    return [vocab.setdefault(w, len(vocab)) for w in text.split()]


@pytest.fixture
def source():
    vocab = {}
    return vocab, words(inspect.getsource(textwrap.TextWrapper), vocab)


def test_an_edit_that_reprints_the_code_is_drafted_from_the_prompt(source):
    """A prompt holding a function, then the answer reprinting it: once the
    answer's last few words match, the lookup proposes what followed them."""
    vocab, code = source
    d = SuffixDrafter()
    prompt = code + words("Add type hints to this class. Answer:", vocab)
    answer = code[:40]
    got = d.propose(prompt + answer, 16)
    assert got.tokens == code[40:56] and got.stop == "max" and got.onehot
    assert got.confidence == [1.0] * 16 and got.forwards == []
    whole = d.propose(prompt + answer, 4000).tokens  # the rest of the copy, then what followed it, to the end
    assert whole[:len(code) - 40] == code[40:] and len(whole) == len(prompt + answer) - 40


def test_earlier_texts_are_looked_up_and_memory_zero_keeps_none(source):
    vocab, code = source
    first, second = code[:300], words("Explain this:", vocab) + code[100:120]
    kept, forgetful = SuffixDrafter(memory=10_000), SuffixDrafter(memory=0)
    for d in (kept, forgetful):
        d.propose(first, 4)
    assert kept.propose(second, 8).tokens == code[120:128]  # from the earlier request
    assert forgetful.propose(second, 8).tokens == []
    assert kept.stream.count(SEPARATOR) == 1  # a context that does not extend the last starts a new text


def test_the_most_frequent_continuation_wins_and_p_min_cuts():
    d = SuffixDrafter()
    ctx = [1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3, 7, 5, 1, 2, 3]
    got = d.propose(ctx, 3)
    assert got.tokens[0] == 7 and got.confidence[0] == pytest.approx(2 / 3)
    cut = d.propose(ctx, 3, p_min=0.9)
    assert cut.tokens == [] and cut.stop == "cutoff"


def test_nothing_is_proposed_across_a_text_boundary_or_past_the_end():
    d = SuffixDrafter()
    d.propose([4, 5, 6], 2)
    got = d.propose([1, 4, 5, 6], 5)  # a new text: the earlier one ends after 6
    assert got.tokens == [] and got.stop == "end"
    assert SEPARATOR not in d.propose([1, 4, 5, 6, 8, 4, 5], 5).tokens


def test_the_memory_bound_holds_over_many_texts(source):
    vocab, code = source
    d = SuffixDrafter(memory=500)
    for i in range(40):
        d.propose([10_000 + i] + code[(i * 37) % 200:(i * 37) % 200 + 150], 4)
        assert d.start <= 2 * 500 + 1  # earlier texts past twice the bound were dropped
    assert d.propose([99_999] + code[:60], 8).tokens == code[60:68]  # what is kept still drafts
    with pytest.raises(ValueError, match="memory"):
        SuffixDrafter(memory=-1)
    with pytest.raises(ValueError, match="n_min"):
        SuffixDrafter(n_min=5)


def test_a_growing_context_is_indexed_once(source):
    """Each round adds only the new tokens: the stream is the context, not a copy per round."""
    _, code = source
    d = SuffixDrafter()
    for n in range(50, len(code), 7):
        d.propose(code[:n], 4)
    assert d.stream == code[:n] and d.start == 0


def test_a_short_match_drafts_only_where_the_model_would_not():
    """In front of a draft model, the lookup takes a round on a match of STRONG
    tokens or more; on a shorter one (a common phrase) only where the model's
    K is 0 (a first code edit, whose catch-up the model sits out); the short
    matches' acceptance is kept apart in the lookup's policy."""
    from specgguf.engine.draft_length import FixedK
    from specgguf.engine.costs import Measured
    from specgguf.engine.lookup_first import STRONG, LookupFirst, next_turn
    from specgguf.engine.policy import Policy, SlotView
    weak = [1, 2, 3, 50, 60, 1, 2]         # [1, 2] seen before: a 2-token match, proposing [3, 50, 60, ...]
    strong = [1, 2, 3, 4, 9, 8, 1, 2, 3, 4]  # a STRONG match (4 tokens)
    assert STRONG == 4
    view, model = SlotView("greedy", 8, remaining=100), object()
    lookup = LookupFirst(SuffixDrafter(0), FixedK(8))
    assert lookup.available(weak, view) == (4, False) and lookup.available(strong, view) == (6, True)
    assert next_turn(weak, view, model, FixedK(0), lookup).drafter is lookup.lookup  # the model would not draft
    turn = next_turn(weak, view, model, FixedK(3), lookup)
    assert turn.drafter is model and turn.k == 3
    assert next_turn(strong, view, model, FixedK(3), lookup).drafter is lookup.lookup
    policy = Policy(32, free_draft=True)
    policy.round_done([view], [0], Measured(1, 0.02))  # a round timed: it may draft
    auto = LookupFirst(SuffixDrafter(0), policy)
    assert next_turn(weak, view, model, FixedK(0), auto).view.regime == "greedy short"


def test_a_match_drafts_at_most_reach_times_its_length():
    """A 4-token match (a common phrase on chat) offered its whole 32-token continuation, and a
    fresh CLI call bet a 33-token verification on it (45 ms where plain decoding took 12, one token
    kept); a match of n tokens now drafts at most REACH * n, and a reprinted line's 16-token match
    its whole continuation (in the simulator: second turns 2.01x -> 2.06x, no workload slower)."""
    from specgguf.engine.draft_length import FixedK
    from specgguf.engine.lookup_first import REACH, LookupFirst
    from specgguf.engine.policy import SlotView
    view, tail = SlotView("greedy", 32, remaining=100), list(range(100, 140))
    lookup = LookupFirst(SuffixDrafter(0), FixedK(32))
    phrase = [7, 8, 9, 10] + tail + [1, 2, 7, 8, 9, 10]  # the 4 tokens seen before: a 4-token match
    assert lookup.available(phrase, view) == (REACH * 4, True)
    line = list(range(16)) + tail + [1] + list(range(16))  # a 16-token match
    assert lookup.available(line, view) == (32, True)

