"""End to end on the real SmolLM2 pair from models.lock (fetched by scripts/setup.sh)."""

import inspect
import textwrap
import threading

import numpy as np
import pytest
from scipy import stats

llama_cpp = pytest.importorskip("llama_cpp")

import specgguf  # noqa: E402
from specgguf.api import SpeculativeLlama  # noqa: E402
from specgguf.engine.calibration import measure_acceptance  # noqa: E402
from specgguf.llama.adapter import LlamaTarget, ModelDrafter, SlotDrafter, text_agreement, text_rows  # noqa: E402
from specgguf.llama.model import LlamaModel  # noqa: E402
from specgguf.engine.costs import Measured  # noqa: E402
from specgguf.engine.policy import Policy, SlotView  # noqa: E402
from specgguf.engine.rounds import Request, Rounds  # noqa: E402
from specgguf.ops.drafter import prompt_rows  # noqa: E402
from specgguf.ops.sampling import Sampler  # noqa: E402
from tests.conftest import PROMPTS, load_model, msgs, plain_greedy  # noqa: E402


@pytest.fixture(scope="module")
def spec(target, poor_draft):
    # The poor draft rejects often, which exercises the KV cut-backs.
    return SpeculativeLlama(target, poor_draft)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_identical_to_target_alone(spec, target, prompt):
    ids = spec.tokenize(msgs(prompt), chat=True)
    res = spec.generate(ids, max_tokens=80, k=4)
    assert len(res.tokens) >= 64
    assert res.tokens == plain_greedy(target, ids, len(res.tokens))
    assert res.stats["drafted"] > 0


def test_kv_bookkeeping_matches_fresh_evaluation(target, poor_draft):
    t, d = LlamaModel(target), LlamaModel(poor_draft)
    ids = SpeculativeLlama(target, poor_draft).tokenize(msgs(PROMPTS[1]), chat=True)
    dec = specgguf.SpeculativeDecoder(ModelDrafter(d), LlamaTarget(t), k=4)
    out = dec.generate(ids, max_new=60)
    assert dec.stats.accepted < dec.stats.drafted  # there were rejections
    seq = ids + out
    cached = t.eval(seq, 1)  # reuses the cache: only the last token is new
    assert len(t.tokens) == len(seq) and t.lag(seq + [5]) == 1
    t.reset()
    fresh = t.eval(seq, 1)
    # Batch shapes differ (one token vs the whole sequence), so the matmuls
    # round differently: equal within float tolerance, same argmax.
    np.testing.assert_allclose(cached, fresh, rtol=1e-3, atol=2e-2)
    assert cached.argmax() == fresh.argmax()
    t.reset()
    d.reset()


def test_seeded_sampling_equals_plain_seeded_sampling(spec):
    """Drafter-invariant verification (the default with a seed): the text is
    token for token plain (K = 0) sampling's with the same seed, whatever K,
    at any temperature."""
    m = msgs(PROMPTS[0])
    for temp, top_k, ks in ((0.8, 40, (2, 6, "auto")), (1.5, 0, (3,))):
        plain = spec.generate(m, max_tokens=32, temperature=temp, top_k=top_k, seed=123, k=0)
        for k in ks:
            res = spec.generate(m, max_tokens=32, temperature=temp, top_k=top_k, seed=123, k=k)
            assert res.tokens == plain.tokens and res.text == plain.text
            assert res.stats["verification"] == "invariant" and (k == "auto" or res.stats["drafted"] > 0)
        assert spec.generate(m, max_tokens=32, temperature=temp, top_k=top_k, seed=124, k=0).tokens != plain.tokens


def test_exact_pq_seeded_run_reproduces(spec):
    m = msgs(PROMPTS[0])
    a = spec.generate(m, max_tokens=40, temperature=0.8, seed=9, k="auto", p_min="auto", drafter_invariant=False)
    b = spec.generate(m, max_tokens=40, temperature=0.8, seed=9, k="auto", p_min="auto", drafter_invariant=False)
    assert a.tokens == b.tokens and a.stats["verification"] == "exact"
    assert a.stats["k_hist"] == b.stats["k_hist"]  # the same choices, so the same draws
    pair = spec.pair  # each run had its sampler passed: none stays behind in the pair's adapters
    assert pair.target.sampler.rule == pair.draft_model.sampler.rule == "greedy"
    assert a.stats["warp_seconds"] > 0  # the rounds warp the target's rows by the run's sampler, timed


def test_emitted_token_follows_target_distribution(target, draft):
    """Real warped distributions at a real prefix: the first emitted token of a
    round follows the target's warped p (chi-square), not the draft's q."""
    config = specgguf.GenerationConfig(temperature=1.5, top_k=20, top_p=1.0, min_p=0.0, seed=0,
                                       drafter_invariant=False)
    sampler = Sampler.from_config(config)
    t, d = LlamaTarget(LlamaModel(target)), ModelDrafter(LlamaModel(draft))
    t.sampler = d.sampler = sampler
    ids = SpeculativeLlama(target, draft).tokenize(msgs("Name a colour."), chat=True)
    q = d.propose(ids, 1).probs
    p = t(ids, [0])
    t.model.reset()
    d.model.reset()
    rng = np.random.default_rng(0)
    cq = np.cumsum(q[0], dtype=np.float64)
    counts = np.zeros(p.shape[1])
    n = 20000
    for _ in range(n):
        tok = int(min(np.searchsorted(cq, rng.random() * cq[-1], side="right"), len(cq) - 1))
        acc, nxt = specgguf.accept(p, q, [tok], rng)
        counts[tok if acc else nxt] += 1
    p0 = p[0] / p[0].sum()
    support = p0 > 0
    assert counts[~support].sum() == 0
    expected = p0[support].astype(np.float64)
    expected *= n / expected.sum()
    assert stats.chisquare(counts[support], expected).pvalue > 1e-3
    qn = q[0].astype(np.float64)[support] / q[0].astype(np.float64)[support].sum() * n
    if np.all(qn > 0):
        assert stats.chisquare(counts[support], qn * (n / qn.sum())).pvalue < 1e-3  # power


def test_stop_string_inside_accepted_block(spec):
    full = spec.generate(msgs(PROMPTS[2]), chat=True, max_tokens=48)
    stop = full.text[len(full.text) // 2: len(full.text) // 2 + 5]
    cut = spec.generate(msgs(PROMPTS[2]), chat=True, max_tokens=48, stop=stop)
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[: full.text.find(stop)]


def test_stop_newline_tokens_agree_with_text(spec, target):
    """stop=["\\n"]: the newline token is not in `tokens`, and the tokens'
    text is the returned text (it was included before)."""
    res = spec.generate("Here is a list of three fruits:\n1.", max_tokens=40, stop=["\n"])
    assert res.finish_reason == "stop" and "\n" not in res.text
    assert target.detokenize(res.tokens).decode() == res.text
    assert res.stats["completion_tokens"] == len(res.tokens)


def test_stream_equals_text_and_errors_raise_at_the_call(spec):
    pieces = list(spec.generate(msgs(PROMPTS[0]), chat=True, max_tokens=30, stream=True))
    assert "".join(pieces) == spec.generate(msgs(PROMPTS[0]), chat=True, max_tokens=30).text
    with pytest.raises(ValueError, match="temperature"):
        spec.generate("hi", stream=True, temperature=-1)  # not at the first next()
    with pytest.raises(TypeError, match="unknown generation setting"):
        spec.generate("hi", stream=True, temprature=0.5)


def test_messages_without_chat_flag_use_the_template(spec):
    m = msgs(PROMPTS[1])
    assert spec.generate(m, max_tokens=12).tokens == spec.generate(m, chat=True, max_tokens=12).tokens
    with pytest.raises(ValueError, match="role must be one of"):
        spec.generate([{"role": "wizard", "content": "hi"}], max_tokens=4)


def test_full_context_window():
    small_t, small_d = load_model("smollm2-135m-f32", n_ctx=256), load_model("smollm2-135m-q4_1", n_ctx=256)
    s = SpeculativeLlama(small_t, small_d)
    ids = s.tokenize(msgs(PROMPTS[0]), chat=True)
    res = s.generate(ids, max_tokens=500)
    assert res.finish_reason in ("length", "stop")
    assert len(ids) + len(res.tokens) <= llama_cpp.llama_n_ctx(small_t.ctx)
    assert res.stats["context_full"] == (res.finish_reason == "length")
    assert not s.generate(ids, max_tokens=5).stats["context_full"]
    with pytest.raises(ValueError, match="context window"):
        s.generate(ids * (s.n_ctx // len(ids) + 1), max_tokens=5)


def test_sources_give_each_tokens_provenance(target, draft):
    """``sources``: "draft" for an accepted draft token, "target" for the
    target's own, one per token; a stream's pieces carry their tokens'
    sources, together the result's; k="auto" says why it drafts as it does."""
    s = SpeculativeLlama(target, draft)
    ids = s.tokenize(msgs(PROMPTS[0]), chat=True)
    items = list(s.run(ids, max_tokens=48, k=4))
    res, pieces = items[-1], items[:-1]
    assert res.finish_reason == "length" and len(res.sources) == len(res.tokens) == 48
    assert res.sources[0] == "target"  # the first round is plain: the first token comes at once
    assert res.sources.count("draft") == res.stats["accepted"] > 0
    assert res.sources.count("target") == res.stats["rounds"]
    assert [x for p in pieces for x in p.sources] == res.sources
    assert "".join(pieces) == res.text
    assert res.stats["why"] is None  # a fixed K has nothing to explain
    auto = s.generate(ids, max_tokens=24, k="auto")
    assert "plain decoding" in auto.stats["why"] and auto.sources.count("draft") <= auto.stats["accepted"]
    assert 0 < auto.stats["decode_tokens_per_second"]


def test_models_usable_after_an_exception(spec):
    m = msgs(PROMPTS[1])
    ref = spec.generate(m, chat=True, max_tokens=20).tokens
    assert len(ref) == 20
    it = spec.run(m, max_tokens=40, k=4, chat=True)
    next(it)
    with pytest.raises(KeyboardInterrupt):
        it.throw(KeyboardInterrupt)  # as a Ctrl-C arriving mid-generation
    assert spec.generate(m, chat=True, max_tokens=20).tokens == ref
    with pytest.raises(ValueError, match="out of range"):
        spec.generate([1, 10**9], max_tokens=5)
    assert spec.generate(m, chat=True, max_tokens=20).tokens == ref


def test_an_unfinished_stream_in_the_same_thread_is_a_clear_error(spec):
    m = msgs(PROMPTS[1])
    it = spec.generate(m, max_tokens=30, stream=True)
    next(it)
    with pytest.raises(RuntimeError, match="in use by an unfinished generation"):
        spec.generate(m, max_tokens=5)
    it.close()
    assert len(spec.generate(m, max_tokens=5).tokens) == 5


def test_owned_models_reuse_the_prompt_between_calls():
    """Models specgguf loaded keep their KV cache: a chat's next turn, which
    extends the last prompt, evaluates only the new tokens - and greedy
    output is unchanged by it."""
    s = SpeculativeLlama("smollm2-135m-f32", "smollm2-135m-q4_1", n_ctx=1024, n_threads=2)
    turn = msgs(PROMPTS[1])
    first = s.generate(turn, max_tokens=16, k=0)
    kept = len(s.pair.target.model.tokens)
    assert kept >= len(s.tokenize(turn)) + 15  # the prompt and the answer stay cached
    turn2 = turn + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "Shorter?"}]
    ids2 = s.tokenize(turn2)
    assert s.pair.target.model.lag(ids2) < len(ids2) - len(s.tokenize(turn)) + 8
    again = s.generate(turn2, max_tokens=16, k=0)
    fresh = SpeculativeLlama("smollm2-135m-f32", "smollm2-135m-q4_1", n_ctx=1024, n_threads=2)
    assert fresh.generate(turn2, max_tokens=16, k=0).tokens == again.tokens


def test_the_callers_llama_objects_keep_the_prompt_until_they_run_on_their_own(target, draft):
    """``generate`` on the caller's ``Llama`` objects keeps their caches after a
    clean call: the next prompt reads only what it adds (a chat's system turn
    is shared), the draft's catch-up too. The caller's own use of a ``Llama``
    in between (llama-cpp-python's loop, a reset, both) is seen, and output
    stays the target's own, token for token."""
    def run(p):
        return specgguf.generate(msgs(p), target=target, draft=draft, chat=True, max_tokens=12, k=4)

    def ids(p):
        return SpeculativeLlama(target, draft).tokenize(msgs(p), chat=True)

    run(PROMPTS[0])
    second = run(PROMPTS[1])
    shared = next(i for i, (a, b) in enumerate(zip(ids(PROMPTS[0]), ids(PROMPTS[1]))) if a != b)
    assert second.stats["cached_tokens"] == shared >= 10
    assert second.tokens == plain_greedy(target, ids(PROMPTS[1]), 12)  # the Llama on its own
    again = run(PROMPTS[1])
    assert again.stats["cached_tokens"] == 0 and again.tokens == second.tokens
    ref = plain_greedy(target, ids(PROMPTS[2]), 12)
    target.reset()  # back to 0 tokens, its cache holding its own text
    third = run(PROMPTS[2])
    assert third.stats["cached_tokens"] == 0 and third.tokens == ref
    fourth = run(PROMPTS[2])  # nothing ran between: kept
    assert fourth.stats["cached_tokens"] > 0 and fourth.tokens == ref


def test_bad_model_files(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        SpeculativeLlama(str(tmp_path / "missing.gguf"), "smollm2-135m-q4_1")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model at all, but long enough")
    with pytest.raises(ValueError, match="is not a GGUF file"):
        SpeculativeLlama(str(junk), "smollm2-135m-q4_1")


def test_a_vocab_differing_in_one_token_drafts_across_tokenizers(tmp_path, target):
    """One token's text changed in the draft's vocabulary: no longer one
    tokenizer, so the pair drafts across tokenizers (by text), exactly."""
    import re
    import shutil

    import gguf
    from specgguf.llama import models
    changed = tmp_path / "changed-vocab.gguf"
    shutil.copyfile(models.fetch("smollm2-135m-q2_k"), changed)
    reader = gguf.GGUFReader(str(changed), "r+")
    field = reader.fields["tokenizer.ggml.tokens"]
    text = field.parts[field.data[1000]]
    text[0] = ord("Z") if text[0] != ord("Z") else ord("Y")  # same length, other text
    reader.data.flush()
    del reader
    llm = SpeculativeLlama(target, str(changed))
    assert llm.pair.mode.mode == "cross"
    assert re.search(r"token 1000 is .* in the draft but .* in the target", llm.pair.mode.detail)
    ids = llm.tokenize(msgs(PROMPTS[0]), chat=True)
    res = llm.generate(ids, max_tokens=24, temperature=0, k=4)
    assert res.tokens == plain_greedy(target, ids, len(res.tokens)) and res.stats["accepted"] > 0


def test_auto_k_greedy_is_still_exact(spec, target):
    ids = spec.tokenize(msgs(PROMPTS[1]), chat=True)
    res = spec.generate(ids, max_tokens=48, k="auto")
    assert res.tokens == plain_greedy(target, ids, len(res.tokens))


def test_draft_confidence_cutoff(target, draft):
    d = ModelDrafter(LlamaModel(draft))
    ids = SpeculativeLlama(target, draft).tokenize(msgs(PROMPTS[0]), chat=True)
    out = d.propose(ids, 4, p_min=1.0)  # nothing is that certain
    assert out.tokens == [] and out.stop == "cutoff"
    out = d.propose(ids, 4, p_min=0.0)
    assert len(out.tokens) == 4 and out.stop == "max"
    assert all(0.0 < c <= 1.0 for c in out.confidence)
    assert d.lag(ids + out.tokens) == 1  # it evaluated all but its last proposal
    d.model.reset()


COPY_PROMPT = ("Repeat the following text exactly, word for word: The quick brown fox jumps over the "
               "lazy dog. Speculative decoding lets a small draft model propose several tokens that a "
               "large target model verifies in a single batched forward pass.")


def test_ngram_draft_end_to_end(target):
    s = SpeculativeLlama(target, "ngram")
    ids = s.tokenize(msgs(COPY_PROMPT), chat=True)
    res = s.generate(ids, max_tokens=40, k=4)
    assert res.stats["drafted"] > 0 and res.stats["accepted"] > 0
    assert res.tokens == plain_greedy(target, ids, len(res.tokens))
    sampled = s.generate(ids, max_tokens=40, k=4, temperature=0.8, seed=3)
    assert sampled.tokens == s.generate(ids, max_tokens=40, k=0, temperature=0.8, seed=3).tokens


def test_a_lookup_in_front_of_the_draft_is_the_default_and_is_exact(target, draft):
    """By default a lookup (the context and earlier texts) drafts where the
    text repeats, the model elsewhere, each with its own policy (their
    separation is tested in test_ngram). Output is plain decoding's; its
    tokens are counted apart; lookup=False (and its former name ngram=False)
    turns it off."""
    s = SpeculativeLlama(target, draft)
    assert s.pair.lookup is not None
    assert SpeculativeLlama(target, draft, lookup=False).pair.lookup is None
    assert SpeculativeLlama(target, draft, ngram=False).pair.lookup is None
    edit = f"```python\n{inspect.getsource(textwrap.indent)}```\n\nAdd a docstring to this function. Reply with the whole function."
    ids = s.tokenize(msgs(edit), chat=True)  # the answer reprints the code: a copy the lookup drafts
    res = s.generate(ids, max_tokens=64, k="auto")
    assert res.tokens == plain_greedy(target, ids, len(res.tokens))
    by = res.stats["tokens_by_source"]
    assert by["lookup"] > 0 and by["lookup"] == res.sources.count("lookup") and sum(by.values()) == res.stats["emitted"]
    proposals, propose = [], s.pair.lookup.propose
    s.pair.lookup.propose = lambda context, k, p_min=None: proposals.append(propose(context, k, p_min)) or proposals[-1]
    for k in ("auto", 3):  # a fixed K: the lookup drafts wherever it finds a match
        res = s.generate(ids, max_tokens=48, k=k)
        assert res.tokens == plain_greedy(target, ids, len(res.tokens))
    assert any(len(p.tokens) > 1 for p in proposals)  # the lookup drafted
    assert s.learning.lookup is not s.learning.online  # the model's own policy, the only one stored
    sampled = s.generate(ids, max_tokens=40, k="auto", temperature=0.8, seed=3)
    assert sampled.tokens == s.generate(ids, max_tokens=40, k=0, temperature=0.8, seed=3).tokens



def test_an_ngram_draft_is_probed_again_soon_after_an_early_miss(target):
    """An n-gram lookup costs no catch-up and next to nothing per token:
    after a first miss, k="auto" drafts again within 4 rounds (measured on
    the copy-heavy prompt: waiting 16 plain rounds cost the first call a
    third of its speed-up)."""
    policy = SpeculativeLlama(target, "ngram").learning.length(specgguf.GenerationConfig(k="auto"))
    view = SlotView("greedy", 8, draft_lag=0, remaining=100)
    policy.round_done([view], [0], Measured(1, 0.02))  # a plain round, timed
    k = policy.choose([view])[0]
    policy.observe("greedy", k, 0)  # whatever it drafted, nothing was accepted
    policy.round_done([view], [k], Measured(k + 1, 0.022, (), k + 1))
    ks = []
    for _ in range(4):
        ks.append(policy.choose([view])[0])
        policy.round_done([view], [0], Measured(1, 0.02))
    assert k > 0 and any(k > 0 for k in ks), (k, ks)


def test_text_stream_utf8_and_stop_strings(target):
    """Multi-byte characters split across byte-level tokens come out whole;
    a stop string spanning tokens cuts the text exactly before it."""
    from specgguf.llama.text import TextStream
    text = "Rocket 🚀 café, 日本語 and naïve façade."
    ids = target.tokenize(text.encode(), add_bos=False, special=False)
    detok = lambda t: target.detokenize([t], special=False)  # noqa: E731
    assert any(len(detok(t).decode("utf-8", "ignore")) == 0 for t in ids)  # some tokens split a character
    ts = TextStream(detok)
    pieces = [ts.add(t) for t in ids] + [ts.finish()]
    assert "".join(pieces) == ts.text == text and "\ufffd" not in "".join(pieces)
    ts = TextStream(detok, stops=["語 and na"])
    pieces = []
    for t in ids:
        pieces.append(ts.add(t))
        if ts.stopped:
            break
    pieces.append(ts.finish())
    assert "".join(pieces) == text[: text.index("語 and na")] and ts.stopped
    kept = target.detokenize(ids[: ts.n_tokens()]).decode()
    assert ts.text.startswith(kept) and len(ts.text) - len(kept) < 4  # tokens end where the text does


def test_calibration_measures_the_drafts_acceptance(target, draft, poor_draft):
    t, good, poor = LlamaModel(target), LlamaModel(draft), LlamaModel(poor_draft)
    g = measure_acceptance(t, good)
    assert g == measure_acceptance(t, good)  # a fixed value
    p = measure_acceptance(t, poor)
    for m in (g, p):
        assert 0.0 <= m["greedy"] <= 1.0 and 0.0 <= m["sampled"] <= 1.0
    # The Q4_1 draft agrees with the F32 target far more often than the Q2_K one.
    assert g["greedy"] > p["greedy"] + 0.1 and g["sampled"] > p["sampled"]


def test_auto_k_skips_a_draft_that_could_not_repay_its_prompt_prefill(target, draft):
    """A long prompt and a 6-token answer, at this pair's measured costs: the
    draft's catch-up on the prompt costs more than drafting could save on 6
    tokens, so k="auto" never runs the draft (the lookup, which costs
    nothing, may draft the repeated text) - and the output is still the
    target's greedy output."""
    s = SpeculativeLlama(target, draft)
    costs = s.calibrate(progress=lambda msg: None)["costs"]
    # A round's first draft forward is timed apart from the warm ones after it.
    assert costs["draft_first"] > 0 and costs["draft"] > 0 and costs["draft_prefill"] > 0
    long_prompt = " ".join(["The printing press changed how books were made."] * 40)
    ids = s.tokenize(long_prompt)
    assert len(ids) > 300
    seconds = s.pair.draft_model.model.seconds
    res = s.generate(ids, max_tokens=6, k="auto")
    assert res.stats["tokens_by_source"]["draft"] == 0
    assert s.pair.draft_model.model.seconds == seconds  # not one draft forward
    assert res.tokens == plain_greedy(target, ids, len(res.tokens))


def test_a_long_prompts_catch_up_is_priced_on_the_drafts_timed_batches(target, draft):
    """A new process's first long prompt (a code edit, 300+ tokens, n_ctx 1024):
    the draft is not measured on it at a guessed price; once the target's rounds
    are timed, two draft forwards are timed on the prompt's head (kept in the
    draft's cache) before its catch-up is priced; the text is plain greedy's."""
    from specgguf.cli.workloads import items
    s = SpeculativeLlama(target, draft)
    ids = s.tokenize(items("code-edit", 1)[0][0], chat=True)
    assert len(ids) > 300
    res = s.generate(ids, max_tokens=48, k="auto")
    timed = s.learning.online.costs.draft.s
    assert 31 in timed and 1 in timed and len(ids) not in timed and len(ids) - 1 not in timed  # no measurement
    assert res.tokens == plain_greedy(target, ids, len(res.tokens))


def test_a_seed_gives_the_same_text_by_name_by_path_and_at_any_thread_count():
    """The same files named by models.lock name or by path, with another
    thread count: one pair (identified by content), and the same seeded text
    (drafter-invariant sampling does not depend on K or timings)."""
    from specgguf.llama import models
    t, d = "smollm2-135m-f32", "smollm2-135m-q4_1"
    runs = [SpeculativeLlama(t, d, n_ctx=256, n_threads=2),
            SpeculativeLlama(str(models.fetch(t)), str(models.fetch(d)), n_ctx=256, n_threads=1)]
    assert runs[0].learning.state.pair == runs[1].learning.state.pair
    texts = {r.generate(msgs(PROMPTS[0]), max_tokens=24, temperature=0.9, seed=77).text for r in runs}
    assert len(texts) == 1


def test_sampled_evidence_and_priors_stay_in_their_regime(target, draft):
    """Greedy and sampled acceptance never mix, and a prior measured at
    temperature 0.8 applies only there."""
    s = SpeculativeLlama(target, draft)
    s.learning.calibrated({"greedy": 0.9, "sampled": 0.6, "temperature": 0.8})
    cfg = specgguf.GenerationConfig
    assert s.learning.prior(cfg()) == 0.9
    assert s.learning.prior(cfg(temperature=0.8, drafter_invariant=False)) == 0.6
    assert s.learning.prior(cfg(temperature=1.2, drafter_invariant=False)) is None
    assert s.learning.prior(cfg(temperature=0.8, top_k=5, drafter_invariant=False)) is None
    s.generate(msgs(PROMPTS[1]), max_tokens=64, k=4)  # fixed K: no policy, nothing learned
    assert s.learning.state.evidence("greedy") is None
    s.generate(msgs(PROMPTS[1]), max_tokens=64, k="auto")
    assert s.learning.state.evidence("greedy") is not None
    assert s.learning.state.evidence(cfg(temperature=0.8).regime) is None  # greedy runs write greedy evidence only
    policy = s.learning.length(cfg())  # one policy for the pair, the regimes' acceptance apart in it
    assert policy is s.learning.length(cfg(temperature=0.8))
    assert policy.regime("greedy") is not policy.regime(cfg(temperature=0.8).regime)


def test_a_process_measures_its_draft_once_and_clock_blind_runs_store_nothing(target, poor_draft):
    """A process's first k="auto" run in a regime measures the draft on its
    prompt, whatever was stored (a record is a prior), and stores what it
    learned; its later runs do not measure again. A seeded p/q run is
    clock-blind: it measures for itself, writes nothing, and gives the same
    text each time. A short answer after a long prompt measures nothing:
    drafting could not repay the draft's catch-up."""
    cfg = specgguf.GenerationConfig
    seeded = dict(temperature=0.8, seed=3, k="auto", drafter_invariant=False)
    s = SpeculativeLlama(target, poor_draft)
    regime = cfg(**seeded).regime
    a = s.generate(msgs(PROMPTS[0]), max_tokens=16, **seeded)
    assert s.learning.state.evidence(regime) is None
    assert s.generate(msgs(PROMPTS[0]), max_tokens=16, **seeded).tokens == a.tokens
    # Another prompt (the caller's models keep the last one cached, and a cached prompt is not scored
    # again), with more than EVIDENCE positions of text after the part cached.
    first = s.generate(msgs(PROMPTS[1] + " " + PROMPTS[2]), max_tokens=32, temperature=0.8, k="auto",
                       drafter_invariant=False)
    assert s.learning.online.regime(regime).known and s.learning.state.evidence(regime) is not None
    assert first.stats["measure_seconds"] > 0  # what learning the draft cost, apart from drafting
    later = s.generate(msgs(PROMPTS[2] + " " + PROMPTS[0]), max_tokens=8, temperature=0.8, k="auto", drafter_invariant=False)
    assert later.stats["measure_seconds"] == 0.0
    view = SlotView(regime, 8, target_lag=40, draft_lag=40, remaining=200)
    sampled = cfg(temperature=0.8, k="auto", drafter_invariant=False)
    assert not s.learning.length(sampled).worth_measuring(view)  # this process knows the draft now
    policy = SpeculativeLlama(target, poor_draft).learning.length(sampled)  # what a new process would find
    assert policy.worth_measuring(view) and policy.regime(regime).total[1] > 0  # again, from the stored prior
    short = SlotView("greedy", 8, target_lag=400, draft_lag=400, remaining=6)
    assert not SpeculativeLlama(target, poor_draft).learning.length(cfg(k="auto")).worth_measuring(short)


def test_generate_keeps_the_loaded_pair_between_calls():
    """generate() loads a pair once per process: a second call with the same
    models reuses it (no reload, no second scan of the vocabulary)."""
    from specgguf.api import speculative as api
    kw = dict(target="smollm2-135m-f32", draft="smollm2-135m-q4_1", n_ctx=256, n_threads=2, max_tokens=4)
    a = specgguf.generate("The sea", **kw)
    first = next(iter(api._cached.values()))
    b = specgguf.generate("The sea", **kw)
    assert next(iter(api._cached.values())) is first and a.tokens == b.tokens
    specgguf.generate("The sea", **dict(kw, n_ctx=512))  # other load settings: another pair
    assert next(iter(api._cached.values())) is not first
    with pytest.raises(ValueError, match="temperature"):
        specgguf.generate("x", target="does-not-matter", draft="x", temperature=-2)  # checked before loading


@pytest.mark.parametrize("rule", ["greedy", "invariant"])
def test_a_catch_up_reads_back_the_drafts_agreement_on_the_tokens_it_skipped(target, poor_draft, rule):
    """A draft catching up on emitted tokens scores the last CHECK_ROWS of
    them in the same forward; the agreement is the verifier's verdict at each
    (argmax, or the race pick with the position's noise, equal to the token)."""
    t, d = LlamaModel(target), LlamaModel(poor_draft)
    ids = SpeculativeLlama(target, poor_draft).tokenize(msgs(PROMPTS[0]), chat=True)
    sampler = Sampler(rule, (0.8, 40, 0.95, 0.05), seed=5, origin=len(ids))
    seq = list(ids)
    for _ in range(40):  # plain decoding by the rule: what the draft skipped
        row = t.eval(seq, 1)[0]
        seq.append(int(np.argmax(row)) if rule == "greedy" else
                   int(specgguf.ops.verify.race_pick(sampler.warp(row[None]), 5, len(seq) - len(ids))[0]))
    drafter = ModelDrafter(d)
    drafter.sampler = sampler
    d.eval(seq[:len(ids) + 5], 1)  # the draft last saw 5 of the 40
    draft = drafter.propose(seq, 2)
    total, n = draft.catchup
    assert n == ModelDrafter.CHECK_ROWS == 32
    # The same forward again (same batch: the same floats), its rows scored by hand.
    d.reset()
    d.eval(seq[:len(ids) + 5], 1)
    rows = d.eval(seq, 33)
    assert draft.tokens[0] == sampler.pick(rows[-1], seq)[0]  # the last row proposes
    rows = rows[:-1]
    if rule == "greedy":
        picks = np.argmax(rows, axis=1)
    else:
        picks = specgguf.ops.verify.race_pick(sampler.warp(rows), 5, len(seq) - 32 - len(ids))
    agree = int(np.count_nonzero(picks == np.array(seq[-32:])))
    assert total == agree and 0 < agree < 32  # the poor draft disagrees somewhere
    # After an ordinary round the draft lags by 1 or 2: nothing to read back.
    assert drafter.propose(seq + [draft.tokens[0], 7], 1).catchup is None
    # Only emitted tokens count, never the prompt.
    d.reset()
    assert drafter.propose(seq[:len(ids) + 3], 1).catchup[1] == 3
    t.reset()
    d.reset()


def test_generation_settings_given_at_construction_are_the_objects_defaults(target, draft):
    """SpeculativeLlama(t, d, k=0) once raised ModelPair's TypeError about 'k'."""
    llm = specgguf.SpeculativeLlama(target, draft, k=0, max_tokens=12)
    assert llm.defaults.k == 0 and llm.defaults.max_tokens == 12
    r = llm.generate(msgs(PROMPTS[0]))
    assert r.stats["drafted"] == 0 and 0 < r.stats["completion_tokens"] <= 12
    # create_* once rebuilt every call's settings from scratch: k=0 drafted at k="auto".
    r = llm.create_chat_completion(msgs(PROMPTS[0]), max_tokens=12)
    assert r["speculation"]["drafted"] == 0
    ks = llm.create_chat_completion(msgs(PROMPTS[0]), max_tokens=12, k=2, temperature=0)["speculation"]["k_chosen"]
    assert max(int(k) for k in ks) == 2  # the call's k wins (K=1 where fewer tokens are left)
    with pytest.raises(TypeError, match="unknown argument.*n_ctxx.*load options.*n_ctx"):
        specgguf.SpeculativeLlama(target, draft, n_ctxx=512)


def test_create_methods_take_the_objects_sampling_settings_then_llama_cpp_pythons(target, draft):
    """A sampling argument a call leaves out takes the object's setting, else
    llama-cpp-python's default; a call's own argument wins over both."""
    cfg = specgguf.GenerationConfig(temperature=0.0, top_k=7)
    llm = specgguf.SpeculativeLlama(target, draft, config=cfg, k=0, seed=3)
    assert {"temperature", "k"} <= llm.chosen  # a whole config counts as given
    assert llm.defaults.temperature == 0.0 and llm.defaults.k == 0
    chat = llm._settings("chat", None, {"top_p": None})
    assert (chat.temperature, chat.top_k, chat.seed, chat.k) == (0.0, 7, 3, 0)
    assert (chat.top_p, chat.min_p) == (cfg.top_p, cfg.min_p)
    some = specgguf.SpeculativeLlama(target, draft, k=0, top_k=7)
    chat = some._settings("chat", None, {})
    assert (chat.temperature, chat.top_k, chat.top_p, chat.min_p, chat.k) == (0.2, 7, 0.95, 0.05, 0)
    assert chat.max_tokens == llm.n_ctx
    call = llm._settings("completion", 16, {"temperature": 0.5, "top_k": 40, "seed": 9})
    assert (call.temperature, call.top_k, call.seed, call.max_tokens) == (0.5, 40, 9, 16)
    plain = specgguf.SpeculativeLlama(target, draft)
    assert plain._settings("chat", 5, {}).temperature == 0.2
    assert plain._settings("completion", 5, {}).temperature == 0.8
    # The object's greedy default reaches a real call: greedy verification, the target's own text.
    r = llm.create_chat_completion(msgs(PROMPTS[1]), max_tokens=16, top_k=None)
    assert r["speculation"]["verification"] == "greedy"


def measured_in_round(t: LlamaModel, d: LlamaModel, ids, sampler):
    """``(acceptance, positions)`` the prompt's round of a run that knows
    nothing of the draft measures on ``ids`` (None: nothing measured)."""
    policy, got = Policy(), []
    policy.measured = lambda regime, acceptance, positions: got.append((acceptance, positions))
    Rounds(t, SlotDrafter(d)).play([Request(ids, 16, frozenset(), sampler, "greedy", policy)])
    return got[0] if got else None


def test_the_prompt_is_measured_only_where_the_target_reads_it_anyway(target, draft):
    """A first run measures its draft on the prompt positions the target has
    to evaluate anyway; a prompt the target holds already is not scored
    again (it cost a first call on a cached prompt 0.46 s)."""
    t, d = LlamaModel(target), LlamaModel(draft)
    t.reset()
    d.reset()
    ids = target.tokenize(PROMPTS[0].encode() * 3, add_bos=True)
    greedy = Sampler("greedy")
    rate, n = measured_in_round(t, d, ids, greedy)
    assert n == 32 and 0.0 <= rate <= 1.0
    # The target read the whole prompt, as plain decoding reads it, and kept the row after it: a
    # first round evaluates only its draft (re-reading the last token in a smaller forward would
    # compute it differently from plain decoding).
    assert t.lag(ids) == 0 and t.lag(ids + [5, 6], n_logits=3) == 2
    assert np.array_equal(t.eval(ids, 1)[0], t.last[0])  # the kept row, nothing evaluated
    assert measured_in_round(t, d, ids, greedy) is None  # held already: nothing to measure
    longer = ids + target.tokenize(b" And then some more words to read.", add_bos=False)
    again = measured_in_round(t, d, longer, greedy)
    assert again is not None and again[1] == min(32, len(longer) - len(ids) - 1)


def test_a_chat_templates_tokens_are_not_measured(target, draft):
    """Any two models agree on a chat template's tokens (the end of a turn,
    a role's name, the newline after it): a poor draft measured 0.68 on its
    prompts with them and accepts 0.5 of its answers. Only rows of text count."""
    t, d = LlamaModel(target), LlamaModel(draft)
    t.reset()
    d.reset()
    text = f"<|im_start|>user\n{PROMPTS[1]}<|im_end|>\n<|im_start|>assistant\n"
    ids = target.tokenize(text.encode(), special=True, add_bos=False)
    n = prompt_rows(ids, len(ids))
    keep = text_rows(t, ids, n)
    predicted = ids[len(ids) - n:]
    header = [i for i, tok in enumerate(ids) if llama_cpp.llama_vocab_is_control(t.vocab, tok)]
    for i, tok in enumerate(predicted):
        pos = len(ids) - n + i  # the position of the token row i predicts
        near = any(pos - 3 <= h <= pos for h in header)
        assert keep[i] == (not near), (i, target.detokenize([tok]))
    assert 4 <= keep.sum() < n
    rate, positions = measured_in_round(t, d, ids, Sampler("greedy"))
    assert positions == keep.sum() and 0.0 <= rate <= 1.0
    # Rows a draft gets wrong in the template's tokens do not count; one of text does.
    t_rows = np.zeros((n, 8), dtype=np.float32)
    d_rows = t_rows.copy()
    d_rows[~keep, 3] = 1.0
    assert text_agreement(t, ids, Sampler("greedy"), t_rows, d_rows) == (1.0, keep.sum())
    d_rows[np.flatnonzero(keep)[0], 5] = 1.0
    assert text_agreement(t, ids, Sampler("greedy"), t_rows, d_rows) == (1.0 - 1.0 / keep.sum(), keep.sum())


def test_every_forward_runs_in_the_callers_thread(spec, monkeypatch):
    """A one-slot pair decodes in the caller's thread, several prompts too:
    a forward on a thread made for the call would start a second OpenMP
    team, and libgomp then sleeps at barriers (see specgguf.api.merge)."""
    import llama_cpp
    real, threads = llama_cpp.llama_decode, set()

    def decode(ctx, batch):  # the real forward, noting the thread it runs in
        threads.add(threading.get_ident())
        return real(ctx, batch)

    monkeypatch.setattr(llama_cpp, "llama_decode", decode)
    results = spec.generate_many([msgs(PROMPTS[0]), msgs(PROMPTS[1])], max_tokens=6, k=2)
    assert [r.stats["completion_tokens"] for r in results] == [6, 6]
    pieces = list(spec.generate_many(["Once upon a time", "The sea"], max_tokens=4, stream=True))
    assert {i for i, _ in pieces} == {0, 1}
    assert threads == {threading.get_ident()}
