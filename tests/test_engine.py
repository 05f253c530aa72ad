"""Several sequences at once: the multi-slot KV bookkeeping, the engine's
shared rounds, its policy, and ``SpeculativeLlama.generate_many``, on the
real SmolLM2 pair."""

import threading

import numpy as np
import pytest

pytest.importorskip("llama_cpp")

from specgguf.engine.policy import Policy, SlotView, Tuning  # noqa: E402
from specgguf.llama.model import ubatches  # noqa: E402
from tests.conftest import PROMPTS  # noqa: E402

MORE = PROMPTS + ["List the planets of the solar system with one fact each."]


def chat(p):
    return [{"role": "user", "content": p}]


@pytest.fixture(scope="module")
def pairs(session_state):
    from specgguf import SpeculativeLlama
    from specgguf.llama.models import default_pair
    t, d = default_pair()
    many = SpeculativeLlama(t, d, parallel=3, n_ctx=512, n_threads=2)
    one = SpeculativeLlama(t, d, n_ctx=512, n_threads=2)
    return many, one


# ---- the KV cache with slots ----------------------------------------------------------

def _same(x, y):
    """Bit for bit: llama.cpp computes each row of a forward under 64 tokens
    as a one-token forward does, whatever else shares the batch."""
    return x.shape == y.shape and np.array_equal(x, y)


def test_a_batch_of_slots_gives_each_the_logits_it_gets_alone(pairs):
    many, one = pairs
    m, single = many.pair.target.model, one.pair.target.model
    a, b = many.tokenize(PROMPTS[0]), many.tokenize(PROMPTS[1])
    single.reset()
    alone_a = single.eval(a + [5, 6, 7], 4)
    single.reset()
    alone_b = single.eval(b, 1)
    m.reset()
    got = m.eval_many([(0, b, 1), (2, a + [5, 6, 7], 4), (1, a, 2)])
    assert _same(got[1], alone_a) and _same(got[0], alone_b)
    assert m.cache[2] == a + [5, 6, 7] and m.cache[0] == b
    # A slot cut back to a shorter prefix re-evaluates only what it lacks, apart from the others.
    again = m.eval_many([(2, a + [8], 1)])[0]
    single.reset()
    assert _same(again, single.eval(a + [8], 1)) and m.cache[0] == b
    m.reset()


def test_slot_memory_is_estimated_and_a_slot_count_that_cannot_fit_is_refused(pairs):
    from specgguf.llama.model import check_slot_memory, kv_bytes_per_token
    many, _ = pairs
    llm = many.pair.target_llm
    per = kv_bytes_per_token(llm)
    assert 1000 < per < 10**6  # SmolLM2-135M: 30 layers x 2 x 192 x 2 bytes
    assert check_slot_memory([llm], 2, 512) == 2 * 512 * per
    with pytest.raises(ValueError, match="--parallel 64"):
        check_slot_memory([llm], 64, 10**7)


def test_parallel_is_checked_where_it_is_given(session_state):
    from specgguf import SpeculativeLlama
    from specgguf.llama.models import default_pair
    t, d = default_pair()
    for bad, err in ((0, ValueError), (65, ValueError), ("4", TypeError), (2.0, TypeError)):
        with pytest.raises(err, match="parallel"):
            SpeculativeLlama(t, d, parallel=bad)
    with pytest.raises(ValueError, match="rpc"):
        SpeculativeLlama(t, d, parallel=2, rpc="127.0.0.1:50052")


# ---- every request gets what it gets alone ------------------------------------------

@pytest.mark.parametrize("settings", [dict(temperature=0), dict(temperature=0.8, seed=11)],
                         ids=["greedy", "seeded-invariant"])
def test_requests_together_equal_each_alone(pairs, settings):
    many, one = pairs
    prompts = [chat(p) for p in MORE]
    kw = dict(max_tokens=32, **settings)
    alone = [one.generate(p, **kw) for p in prompts]
    together = many.generate_many(prompts, **kw)  # 4 prompts over 3 slots: one waits for a free slot
    fixed = many.generate_many(prompts, k=2, **kw)  # and at a fixed K
    assert all(set(r.stats["k_hist"]) <= {0, 1, 2} for r in fixed)
    # Token for token (greedy and seeded alike): llama.cpp computes each row of a batch under 64
    # tokens as a one-token forward does (tests/test_exactness.py), so slots cannot perturb each other.
    for runs in (together, fixed):
        assert [r.tokens for r in runs] == [a.tokens for a in alone], [(a.text, g.text) for a, g in zip(alone, runs)]
    if settings.get("seed"):
        assert {r.stats["verification"] for r in together} == {"invariant"}
        # The comparison fails a slot that raced with another seed.
        assert one.generate(prompts[0], **dict(kw, seed=12)).tokens != alone[0].tokens


def test_each_slot_looks_its_text_up_and_stays_exact(pairs):
    """In shared rounds each slot has its own lookup: requests whose answers
    reprint pasted code draft from it, and every text is still what the
    request gets alone (greedy, token for token)."""
    import inspect
    import textwrap
    many, one = pairs
    asks = [f"```python\n{inspect.getsource(f)}```\n\nAdd a docstring to this function. Reply with the whole function."
            for f in (textwrap.indent, textwrap.dedent)]
    prompts = [chat(a) for a in asks] + [chat(MORE[0])]
    together = many.generate_many(prompts, max_tokens=48, temperature=0)
    assert [r.tokens for r in together] == [one.generate(p, max_tokens=48, temperature=0).tokens for p in prompts]
    assert sum(r.stats["tokens_by_source"]["lookup"] for r in together) > 0
    assert all(r.sources.count("lookup") == r.stats["tokens_by_source"]["lookup"] for r in together)


def test_streams_interleave_and_join_into_each_text(pairs):
    """Each request's streamed pieces join into that same request's text and
    sources (equality with each prompt alone is the test above's)."""
    from specgguf.api import GenerationResult, merge
    many, _ = pairs
    prompts = [chat(p) for p in PROMPTS]
    runs = [many.run(p, max_tokens=40) for p in prompts]
    pieces, sources, results, order = {}, {}, {}, []
    for i, item in merge(runs, many.pair.slots):
        if isinstance(item, GenerationResult):
            results[i] = item
            continue
        pieces[i] = pieces.get(i, "") + item
        sources.setdefault(i, []).extend(item.sources)
        order.append(i)
    assert sorted(results) == list(range(len(prompts)))
    for i, r in results.items():
        assert pieces.get(i, "") == r.text and sources.get(i, []) == r.sources
    # They ran together, not one after another: another request's first piece
    # came before request 0's last (a round hands out a slot's K+1 tokens at
    # once, so the first few pieces may all be one request's).
    last0 = len(order) - 1 - order[::-1].index(0)
    assert min(order.index(i) for i in range(1, len(prompts))) < last0


def test_a_stream_closed_early_frees_its_slot_and_disturbs_no_one(pairs):
    many, one = pairs
    expect = one.generate(chat(PROMPTS[1]), max_tokens=40)
    long = many.generate(chat("Write a very long story about the sea."), max_tokens=400, stream=True)
    got = {}

    def other():
        got["r"] = many.generate(chat(PROMPTS[1]), max_tokens=40)

    first = next(long)
    t = threading.Thread(target=other)
    t.start()
    for _ in range(3):
        next(long)
    long.close()  # the caller walked away
    t.join(120)
    assert first and got["r"].tokens == expect.tokens
    assert many.engine.busy == 0
    # Every slot is free and usable: as many requests as slots, at once, all right.
    res = many.generate_many([chat(PROMPTS[1])] * 3, max_tokens=40)
    assert all(r.tokens == expect.tokens for r in res)


def test_one_requests_rule_error_mid_round_leaves_the_others_whole(pairs):
    """A request whose own rules leave no token after a few (a grammar
    "Hello yes" with every token holding a "y" banned) fails alone, with a
    clear error, in a round it shares with two others: theirs are what they
    get alone, token for token, and the engine serves on."""
    many, one = pairs
    llm = many.pair.target_llm
    banned = {t: float("-inf") for t in range(llm.n_vocab())
              if b"y" in llm.detokenize([t], special=True).lower()}
    stuck = dict(grammar='root ::= "Hello" " " "yes"', logit_bias=banned)
    others = [chat(PROMPTS[0]), chat(PROMPTS[2])]
    expect = [one.generate(p, max_tokens=40, temperature=0).tokens for p in others]
    got, errors = {}, {}

    def run(name, prompt, **kw):
        try:
            got[name] = many.generate(prompt, max_tokens=40, temperature=0, **kw)
        except ValueError as e:
            errors[name] = e
    threads = [threading.Thread(target=run, args=(i, p)) for i, p in enumerate(others)]
    threads.append(threading.Thread(target=run, args=("stuck", chat("Say hello."), ), kwargs=stuck))
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert set(errors) == {"stuck"} and "no token is allowed" in str(errors["stuck"])
    assert [got[0].tokens, got[1].tokens] == expect
    assert many.engine.busy == 0
    assert many.generate(others[0], max_tokens=40, temperature=0).tokens == expect[0]


def test_bad_input_among_good_is_refused_before_anything_runs(pairs):
    many, _ = pairs
    with pytest.raises(ValueError, match="context window"):
        many.generate_many([chat(PROMPTS[0]), "word " * 600], max_tokens=8)
    with pytest.raises(ValueError, match="token"):
        many.generate_many([[1, 2, 3], [1, 10**7]], max_tokens=8)
    assert many.engine.busy == 0
    assert many.generate_many([chat(PROMPTS[0])], max_tokens=4)[0].stats["completion_tokens"] == 4


def test_calibrate_needs_one_slot(pairs):
    many, _ = pairs
    with pytest.raises(RuntimeError, match="parallel=1"):
        many.calibrate()


# ---- the policy over several slots -----------------------------------------------------

def _policy(target, draft, acceptance, split=False):
    p = Policy(8, passes=ubatches if split else None)
    for n in (1, 2, 4, 8, 16, 32):
        p.costs.target.observe(n, target(n))
        p.costs.draft.observe(n, draft(n))
    p.measured("greedy", acceptance, 1000)  # well known: 1000 positions
    return p


def test_the_policy_drafts_where_it_pays_and_less_under_load():
    # A board: a target forward costs nearly the same for 1 or 9 tokens, the draft a twentieth.
    board = _policy(lambda n: 0.100 + 0.001 * n, lambda n: 0.005 + 0.0005 * n, 0.85)
    view = lambda n: [SlotView("greedy", 8, False, 1, 1, 100)] * n  # noqa: E731
    ks = [max(board.choose(view(n))) for n in (1, 2, 4, 8)]
    assert ks[0] >= 4 and ks == sorted(ks, reverse=True)
    # This machine at 4 slots: the draft costs as much per token as the target's marginal token.
    cpu = _policy(lambda n: 0.022 + 0.005 * n, lambda n: 0.001 + 0.009 * n, 0.85)
    assert cpu.choose(view(4)) == [0, 0, 0, 0]
    # A poor draft never drafts; a fixed K is kept; a slot at its budget's end drafts nothing.
    poor = _policy(lambda n: 0.100 + 0.001 * n, lambda n: 0.005 + 0.0005 * n, 0.05)
    assert poor.choose(view(2)) == [0, 0]
    fixed = [SlotView("greedy", 3, True, 1, 1, 100), SlotView("greedy", 0, False, 1, 1, 1)]
    assert board.choose(fixed) == [3, 0]


def test_the_model_draft_is_priced_over_the_whole_round_when_lookups_draft_for_some():
    """A lookup drafting for three of four slots leaves them in the round's
    batch: the model's policy must price the fourth's K against all four (as
    a full batch, where the draft does not pay here), not as a lone sequence
    (where it does). Shown only the fourth, the engine drafted at a loss and
    read 0.67x its own plain decoding at four clients."""
    from specgguf.engine.draft_length import FixedK
    from specgguf.engine.lookup_first import LookupFirst, choose_turns
    from specgguf.ops.suffix import SuffixDrafter
    cpu = _policy(lambda n: 0.022 + 0.005 * n, lambda n: 0.001 + 0.009 * n, 0.85)
    views = [SlotView("greedy", 8, False, 1, 1, 100, slot=i) for i in range(4)]
    assert cpu.choose(views[:1])[0] > 0 and cpu.choose(views) == [0, 0, 0, 0]  # pays alone, not in a batch of 4
    repeats, fresh = [5, 6, 7, 8, 9, 5, 6, 7, 8], [1, 2, 3, 4]
    contexts = [repeats, repeats, repeats, fresh]
    lookups = [LookupFirst(SuffixDrafter(0, n_min=4), FixedK(4)) for _ in range(4)]
    model = object()  # the model drafter: choose_turns only hands it out
    turns = choose_turns(contexts, views, model, [cpu] * 4, lookups)
    assert [t.drafter is model for t in turns] == [False, False, False, True]
    assert [t.k for t in turns] == [4, 4, 4, 0]


def test_a_lookup_is_priced_in_the_whole_round_where_a_longer_draft_costs_a_pass():
    """With a KV stream per slot, one slot's lookup draft makes the round's
    counts unequal: another pass over the weights. Shown its one sequence,
    the lookup's policy saw a free draft; shown the round, it sees the pass."""
    from specgguf.engine.lookup_first import LookupFirst, choose_turns
    from specgguf.ops.suffix import SuffixDrafter
    lookup = Policy(16, passes=ubatches, free_draft=True)
    for n in (1, 2, 4, 8, 16, 32):
        lookup.costs.target.observe(n, 0.020 + 0.0005 * n)  # a pass 20 ms, whatever its tokens
    lookup.measured("greedy", 0.3, 1000)  # the lookup's drafts seldom hold here
    views = [SlotView("greedy", 8, False, 1, 1, 100, slot=i) for i in range(4)]
    assert lookup.choose(views[:1])[0] > 0  # alone it is free
    contexts = [[5, 6, 7, 8, 9, 5, 6, 7, 8]] + [[1, 2, 3, i] for i in range(3)]
    look = [LookupFirst(SuffixDrafter(0, n_min=4), lookup) for _ in range(4)]
    turns = choose_turns(contexts, views, object(), [Policy(8)] * 4, look)
    assert turns[0].drafter is not look[0].lookup and turns[0].k == 0  # another pass: not worth 0.3


def test_with_a_stream_per_slot_the_policy_prices_every_pass():
    """The target's KV cache keeps a stream per slot; llama.cpp then cuts a
    round into ubatches of equal counts over consecutive slots, a pass over
    the weights each (measured here: 22 ms for 4 slots of one token, 36 with
    a slot left out, 63 for counts 4, 1, 4). The policy prices each pass."""
    assert ubatches([(0, 1), (1, 1), (2, 1), (3, 1)]) == 1
    assert ubatches([(0, 1), (2, 1), (3, 1)]) == 2  # a free slot between busy ones
    assert ubatches([(0, 1), (1, 4)]) == 2 and ubatches([(0, 4), (1, 4)]) == 1
    assert ubatches([(0, 4), (1, 1), (2, 4)]) == 3 and ubatches([]) == 0
    # A board (a pass costs 0.1 s whatever its tokens): two drafting slots draft
    # the same K, since different ones would cost a second pass.
    board = lambda split: _policy(lambda n: 0.100 + 0.001 * n, lambda n: 0.005 + 0.0005 * n, 0.85, split)  # noqa
    views = [SlotView("greedy", 8, False, 1, 1, 100, after_miss=True, slot=0),
             SlotView("greedy", 3, False, 1, 1, 100, slot=1)]
    ks = board(True).choose(views)
    assert ks[0] == ks[1] > 0, ks
    assert board(False).choose(views)[0] > ks[0]  # one cache: the longer K where it pays
    costs = board(True).costs
    assert costs.seconds(views, [4, 2]) - costs.seconds(views, [2, 2]) > 0.09  # another pass


def test_a_request_whose_draft_lags_its_prompt_drafts_when_the_catch_up_repays():
    """Costs as this machine's engine measured them (a draft token a third of
    a target token, a catch-up 7 ms a token) and a draft accepting 0.95: a
    new request 20 tokens ahead of its draft drafts at once (the catch-up,
    0.27 s, against 0.6 s saved over 127 tokens). When a
    catch-up was spread over the rounds left instead of the tokens, it had
    to repay itself E(K) times over, and such a request ran 128 plain rounds
    (its lag, and so its catch-up, growing with each); re-exploring at
    K=3 only could not pay here either."""
    p = Policy(8)
    for n in range(1, 10):
        p.costs.target.observe(n, 0.0354 + 0.0087 * n + 0.0002 * n)
    for n in (1, 2, 3, 20):
        p.costs.draft.observe(n, 0.0049 + 0.0151 * n if n < 20 else 0.138 + 0.0083 * n)
    p.measured("greedy", 0.95, 20)
    assert p.choose([SlotView("greedy", 8, False, 1, 20, 127)])[0] >= 3
    assert p.choose([SlotView("greedy", 1, False, 1, 20, 2)]) == [0]  # two tokens left (K <= 1): not worth it
    p.regimes["greedy"].idle = Tuning.retry  # a lone slot long without drafting retries
    assert p.choose([SlotView("greedy", 8, False, 1, 20, 127)])[0] >= 3


def test_a_new_request_fills_a_gap_and_a_next_turn_goes_back_to_its_slot(pairs):
    """With a stream per slot, each run of consecutive busy slots is a pass
    every round: a request sharing only a few tokens with a slot's cache
    fills the gap next to the busy slots; one sharing more than RUN_TOKENS
    (a conversation's next turn) goes back to its slot."""
    from specgguf.engine.batch import Slots, Ticket
    from specgguf.engine.draft_length import FixedK
    from specgguf.ops.sampling import Sampler
    many, _ = pairs
    m = many.pair.target.model
    assert not m.unified and m.slots == 3
    m.reset()
    long_text = many.tokenize(" ".join(MORE) * 8)[:Slots.RUN_TOKENS + 60]
    assert len(long_text) == Slots.RUN_TOKENS + 60
    m.eval_many([(0, many.tokenize(PROMPTS[0]), 1), (2, long_text, 1)])
    slots = Slots(m)
    ticket = lambda ids: Ticket(ids, 4, frozenset(), Sampler(), "greedy", FixedK(4), lambda: None)  # noqa: E731
    slots.running[0] = ticket(many.tokenize(PROMPTS[0]))  # slot 0 busy; 1 and 2 free
    few = long_text[:20] + many.tokenize(" something else")
    assert slots._place(ticket(few), [1, 2]) == 1  # 20 tokens kept are not worth a second pass
    assert slots._place(ticket(long_text + many.tokenize(" more")), [1, 2]) == 2  # a next turn
    m.reset()


def test_a_next_turn_reports_the_prompt_tokens_its_slot_held(pairs):
    """usage.prompt_tokens_details.cached_tokens on the engine's path: a
    conversation's next turn finds its earlier prompt in a slot."""
    many, _ = pairs
    first = chat("Name a colour.")
    r1 = many.generate(first, max_tokens=6, k=0, chat=True)
    follow = first + [{"role": "assistant", "content": r1.text}, {"role": "user", "content": "And another?"}]
    r2 = many.generate(follow, max_tokens=4, k=0, chat=True)
    n_first = r1.stats["prompt_tokens"]
    assert n_first - 1 <= r2.stats["cached_tokens"] < r2.stats["prompt_tokens"], (r1.stats, r2.stats)
    completion = many.create_chat_completion(follow, max_tokens=4, temperature=0)
    assert completion["usage"]["prompt_tokens_details"]["cached_tokens"] >= n_first - 1


def test_what_the_engine_learns_of_the_draft_is_stored_for_later_processes(pairs):
    """The engine read stored acceptance evidence but never wrote any: every
    serve process started blind, probing its draft again. Each request now
    hands what its rounds verified to the state store."""
    many, _ = pairs
    regime = many.defaults.regime
    before = many.pair.state.evidence(regime)
    n0 = before["total"][1] if before else 0.0
    r = many.generate(chat("Name three rivers in Africa and describe one of them."), max_tokens=32, k=3, chat=True)
    assert r.stats["drafted"] > 0
    after = many.pair.state.evidence(regime)
    assert after is not None and after["total"][1] > 0 and after["total"][1] != n0


def test_what_the_engine_times_is_stored_for_later_processes_as_ratios(pairs):
    """A serve process priced its draft and its long batches on guesses however many
    had run before it: k="auto" requests in the engine now store the forwards their
    rounds timed, as ratios to plain decoding's token, as one-sequence runs do."""
    many, _ = pairs
    for i in range(3):
        many.generate(chat(PROMPTS[i]), max_tokens=48, k="auto", chat=True, temperature=0)
    costs = many.pair.state.costs()
    assert costs is not None and costs["target"]["1"] == pytest.approx(1.0)
    assert all(0 < r < 100 for r in costs["target"].values())


# ---- slots taken by new requests: their caches kept in host memory ------------------------

def test_a_slots_cache_saved_and_loaded_into_another_slot_gives_the_same_rows(pairs):
    """LlamaModel.save / load: a copy loaded into another slot's KV stream
    holds what evaluation would have put there, bit for bit, and its kept
    logits row comes back with it."""
    many, one = pairs
    m, single = many.pair.target.model, one.pair.target.model
    a, b = many.tokenize(PROMPTS[0]), many.tokenize(PROMPTS[1])
    m.reset()
    row = m.eval_many([(0, a, 1)])[0]
    saved = m.save(0)
    m.eval_many([(0, b, 1)])  # the slot is taken by another text
    m.load(1, saved)
    assert m.cache[1] == a and m.cache[0] == b
    assert m.lag(a, 1) == 0 and _same(m.eval_many([(1, a, 1)])[0], row)  # the kept row, no forward
    got = m.eval_many([(1, a + [5, 6, 7], 4, 3)])[0]
    single.reset()
    assert _same(got, single.eval(a + [5, 6, 7], 4))
    m.reset()


def test_the_stash_keeps_a_taken_slots_cache_within_its_bound_and_gives_it_back(pairs):
    from specgguf.llama.stash import KEEP_MIN, Stash
    many, _ = pairs
    models = many.pair.models
    a, b = many.tokenize(" ".join(MORE)), many.tokenize(PROMPTS[1] + " " + PROMPTS[2])
    assert len(a) > KEEP_MIN and b[:2] != a[:2]
    for m in models:
        m.reset()
        m.eval_many([(0, a, 1)])
    stash = Stash(models, 1 << 30)
    stash.before_taking(0, b)  # b takes slot 0: a's caches are copied first
    assert len(stash) == 1 and stash.used > 0 and stash.loaded == 0
    for m in models:
        m.eval_many([(0, b, 1)])
    stash.before_taking(1, a + [5])  # a's next turn: loaded into slot 1, nothing to copy there
    assert stash.loaded == 1 and len(stash) == 0 and stash.used == 0
    assert all(m.cache[1] == a for m in models)
    small = Stash(models, 1000)  # smaller than any copy: nothing kept
    small.before_taking(0, a)
    assert len(small) == 0 and small.used == 0
    with pytest.raises(ValueError, match="cache_ram"):
        from specgguf.llama.stash import stash_limit
        stash_limit(-1, None)
    for m in models:
        m.reset()


def test_a_conversation_back_after_its_slot_was_taken_reads_only_its_new_turn_and_stays_exact(pairs):
    """Four conversations over three slots: the one whose slot another took
    finds its caches in the stash, reports its first turn cached, and its
    answer is plain greedy decoding's."""
    many, one = pairs
    for m in many.pair.models:
        m.reset()
    firsts = [chat(p + " Answer in two sentences, with care and detail.") for p in MORE[:4]]
    answers = [many.generate(f, max_tokens=8, temperature=0, chat=True) for f in firsts]
    stash = many.engine.slots.stash
    assert stash is not None and len(stash) >= 1
    held = many.pair.target.model.cache
    gone = [i for i, f in enumerate(firsts)
            if not any(h[:len(many.tokenize(f, chat=True))] == many.tokenize(f, chat=True) for h in held)]
    assert gone, "a fourth conversation over three slots takes one of the first three's"
    i = gone[0]
    follow = firsts[i] + [{"role": "assistant", "content": answers[i].text}, {"role": "user", "content": "Why?"}]
    loaded = stash.loaded
    got = many.generate(follow, max_tokens=16, temperature=0, chat=True)
    assert stash.loaded == loaded + 1
    assert got.stats["cached_tokens"] >= answers[i].stats["prompt_tokens"] - 1, got.stats
    one.reset()
    plain = one.generate(follow, max_tokens=16, temperature=0, chat=True, k=0)
    assert got.tokens == plain.tokens
