"""Every setting plain decoding takes, exactly: logit_bias, penalties, grammar
(JSON schema), logprobs.

Laws at fixed seeds: speculative sampling with the rules follows the law of
plain sampling with the same rules, computed here independently (llama.cpp's
penalty loop transcribed; the grammar's language as a regular expression).
Greedy: the real pair's text equals llama-cpp-python's ``Llama`` with the same
settings, token for token.
"""

import json
import re

import numpy as np
import pytest

import specgguf
from specgguf.config import GenerationConfig, response_format_grammar
from specgguf.ops.drafter import Draft
from specgguf.llama.grammar import Grammar
from specgguf.ops.logits import Cut, LogitRules, Penalties
from specgguf.ops.sampling import Sampler
from tests.conftest import ALPHA, chi2_pvalue, msgs

llama_cpp = pytest.importorskip("llama_cpp")


# ---- a synthetic pair over a small vocabulary: penalties and bias -----------------

V = 6
TARGET = np.random.default_rng(3).normal(0, 1.2, (V, V)).astype(np.float32)
DRAFT = (TARGET + np.random.default_rng(4).normal(0, 1.0, (V, V))).astype(np.float32)
BIAS = {2: 1.0, 5: -2.0}
PEN = Penalties(repeat=1.5, frequency=0.4, presence=0.3, last_n=3)


def reference_row(logits, generated):
    """llama-cpp-python's chain before the warp, transcribed: bias, then
    llama.cpp's penalty loop over the last ``last_n`` generated tokens."""
    row = logits.astype(np.float32).copy()
    for t, b in BIAS.items():
        row[t] += np.float32(b)
    window = list(generated[-PEN.last_n:])
    for t in set(window):
        c = window.count(t)
        row[t] = row[t] * np.float32(PEN.repeat) if row[t] <= 0 else row[t] / np.float32(PEN.repeat)
        row[t] -= np.float32(c * PEN.frequency + PEN.presence)
    return row


class MatrixDrafter:
    """A draft model over the synthetic vocabulary that picks through the sampler (rules and all)."""

    def __init__(self, sampler, table):
        self.sampler, self.table = sampler, table

    def lag(self, context):
        return 0

    def propose(self, context, k, p_min=None):
        seq, toks, probs = list(context), [], []
        for _ in range(k):
            tok, _, q = self.sampler.pick(self.table[seq[-1]], seq)
            toks.append(tok)
            probs.append(q)
            seq.append(tok)
        return Draft(toks, np.stack(probs) if probs and probs[0] is not None else None)


def synthetic_decoder(rule, k, seed, table=TARGET):
    rules = LogitRules(BIAS, PEN)
    sampler = Sampler(rule, (1.0, 0, 1.0, 0.0), generator=seed, draft_generator=seed + 1, seed=seed,
                      origin=1, rules=rules)

    def target_step(prefix, proposed):
        ctx = prefix + proposed
        return sampler.target_rows(table[ctx[len(prefix) - 1:]], ctx)
    return specgguf.SpeculativeDecoder(MatrixDrafter(sampler, DRAFT), target_step, k=k, sampler=sampler)


def test_penalties_and_bias_law():
    """Exact p/q with bias and penalties (the window of 3 makes them depend
    on the draft tokens before each row): 3-token sequences follow plain
    sampling's law with the same rules, and not the law without them."""
    n_runs, length = 6000, 3
    dec = synthetic_decoder("exact", 2, 11)
    counts = np.zeros(V ** length)
    for _ in range(n_runs):
        out = dec.generate([0], max_new=length)
        counts[int(np.ravel_multi_index(out, (V,) * length))] += 1

    def law(transform):
        p = np.zeros(V ** length)
        for code in range(V ** length):
            seq = list(np.unravel_index(code, (V,) * length))
            prob, ctx = 1.0, [0]
            for t in seq:
                row = transform(TARGET[ctx[-1]], ctx[1:]).astype(np.float64)
                e = np.exp(row - row.max())
                prob *= e[t] / e.sum()
                ctx.append(int(t))
            p[code] = prob
        return p
    assert chi2_pvalue(counts, law(reference_row)) > ALPHA
    assert chi2_pvalue(counts, law(lambda row, gen: row)) < ALPHA  # power: the rules matter


def test_invariant_seeds_with_rules_equal_plain():
    """Drafter-invariant verification with bias and penalties: every seed's
    text equals plain (k=0) seeded sampling's with the same rules."""
    for seed in range(40):
        spec = synthetic_decoder("invariant", 3, seed).generate([0], max_new=8)
        plain = synthetic_decoder("invariant", 0, seed).generate([0], max_new=8)
        assert spec == plain, seed


# ---- a small grammar over the real vocabulary --------------------------------------

LANGUAGE = re.compile(r"a(ba)*b?")  # the prefixes of the grammar's sentences a(ba)*
GBNF = 'root ::= "a" ("b" "a")*'
# A lazy grammar, as a tool call's: the text is free until "ab" appears; from
# there on it is "ab" then c's and 1's (so "a" + "bb" or "a" + "ba" is refused).
LAZY_GBNF, TRIGGER = 'root ::= "ab" [c1]*', "ab"


def lazy_prefix(text):
    at = text.find(TRIGGER)
    return at < 0 or re.fullmatch(r"ab[c1]*", text[at:]) is not None


def language(lazy):
    return lazy_prefix if lazy else (lambda text: LANGUAGE.fullmatch(text) is not None)


@pytest.fixture(scope="module")
def vocab_llm():
    from specgguf.llama import models
    return llama_cpp.Llama(str(models.fetch("smollm2-135m-f32")), vocab_only=True, verbose=False)


def _piece(llm, t):
    return llm.detokenize([t], special=False).decode("utf-8", "replace")


def test_grammar_mask_equals_the_full_mask(vocab_llm):
    """The chunked check (best candidates first) gives the same argmax and
    the same top-k set as masking every token, at many states."""
    from specgguf.config import schema_grammar
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "legs": {"type": "integer"}},
              "required": ["name", "legs"]}
    vocab, n = vocab_llm._model.vocab, vocab_llm.n_vocab()
    g = Grammar(vocab, n, schema_grammar(schema))
    text = vocab_llm.tokenize(b'{"name":"Felix","legs":4}', add_bos=False)
    rng = np.random.default_rng(0)
    for m in range(len(text)):
        h = g.state(text[:m])
        base = rng.standard_normal(n).astype(np.float32) * 4
        full = base.copy()
        allowed = g.check(h, np.arange(n), full)
        full[~allowed] = -np.inf
        for need in (1, 5, 40):
            row = base.copy()
            g.mask(row, h, Cut(need))
            want = np.lexsort((np.arange(n), -full))[:min(need, allowed.sum())]
            got = np.lexsort((np.arange(n), -row))[:len(want)]
            assert list(got) == list(want), (m, need)
            for _ in range(2):  # a full pass is kept for the state, and the kept set masks alike
                row = base.copy()
                g.mask(row, h, Cut(need), g.key(text[:m]))
                assert list(np.lexsort((np.arange(n), -row))[:len(want)]) == list(want), (m, need)
        assert text[m] in np.flatnonzero(allowed)  # the text is in the language
    assert g.allowed  # restrictive states were scanned in full once, and kept
    g.close()


def test_a_row_the_grammar_allows_nothing_of_is_a_clear_error_every_time(vocab_llm):
    """A state that allows none of a row's finite tokens (the rules before
    the grammar, a logit_bias of -inf say, removed every token it allows)
    raises a clear ValueError at every cut and on every ask of the same
    state, never a row masked to all -inf."""
    vocab, n = vocab_llm._model.vocab, vocab_llm.n_vocab()
    g = Grammar(vocab, n, 'root ::= "yes"')
    h = g.state([])
    base = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    base[g.check(h, np.arange(n), base)] = -np.inf  # every allowed token gone
    for _ in range(2):
        for need in (0, 1, 40):
            with pytest.raises(ValueError, match="no token is allowed"):
                g.mask(base.copy(), h, Cut(need), g.key([]))
    g.close()


def test_grammar_mask_warps_as_the_full_mask(vocab_llm):
    """Stopped early by min-p and top-p, the masked row warps to exactly (bit
    for bit) what the fully masked row warps to, for several truncations and
    temperatures, at every state of a JSON text and for rows as a model
    gives them (a few strong candidates over a spread tail): the shortcut
    changes the cost, never the distribution. It must also be taken (a
    state allowing a handful of tokens is not scanned in full)."""
    from specgguf.config import schema_grammar
    from specgguf.ops.sampling import warp
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "legs": {"type": "integer"}},
              "required": ["name", "legs"]}
    vocab, n = vocab_llm._model.vocab, vocab_llm.n_vocab()
    g = Grammar(vocab, n, schema_grammar(schema))
    text = vocab_llm.tokenize(b'{"name":"Felix","legs":4}', add_bos=False)
    checked = []
    real_check = g.check
    g.check = lambda h, ids, logits: (checked.append(len(ids)), real_check(h, ids, logits))[1]
    rng = np.random.default_rng(1)
    cuts = [Cut(40, 0.95, 0.05), Cut(40, 1.0, 0.05), Cut(40, 0.9, 0.0), Cut(0, 0.95, 0.05), Cut(8, 0.5, 0.1)]
    shortcuts = 0
    for m in range(len(text)):
        h = g.state(text[:m])
        allowed = real_check(h, np.arange(n), np.zeros(n, np.float32))
        for trial in range(3):
            base = (rng.standard_normal(n) * (1.0 + trial)).astype(np.float32)
            base[rng.choice(np.flatnonzero(allowed), min(3, allowed.sum()), replace=False)] += 6.0 * trial
            base[rng.integers(0, n, 4)] += 8.0  # strong candidates the grammar may forbid
            full = np.where(allowed, base, -np.inf).astype(np.float32)
            for cut in cuts:
                row = base.copy()
                checked.clear()
                g.mask(row, h, cut)
                shortcuts += sum(checked) < allowed.size and np.isneginf(row[~allowed]).all()
                for temp in (0.7, 1.3):
                    want = warp(full[None, :], temp, cut.top_k, cut.top_p, cut.min_p)
                    got = warp(row[None, :], temp, cut.top_k, cut.top_p, cut.min_p)
                    assert np.array_equal(got, want), (m, trial, cut, temp)
    assert shortcuts > 20, shortcuts
    g.close()


def compiled(vocab_llm, lazy):
    """The test's grammar for the real vocabulary: GBNF, or LAZY_GBNF from its trigger on."""
    from specgguf.llama.grammar import LazyStart, pieces
    vocab, n = vocab_llm._model.vocab, vocab_llm.n_vocab()
    if not lazy:
        return Grammar(vocab, n, GBNF)
    if id(vocab_llm) not in _STARTS:
        _STARTS[id(vocab_llm)] = LazyStart(pieces(vocab, range(n)), TRIGGER)
    return Grammar(vocab, n, LAZY_GBNF, lazy=_STARTS[id(vocab_llm)])


_STARTS = {}


def grammar_setup(vocab_llm, rule, seed, top_k=3, lazy=False):
    """Synthetic logits over the real vocabulary: 8 candidate tokens carry
    the mass, their logits depending on the last token; the rest form a
    strictly decreasing tail far below."""
    n = vocab_llm.n_vocab()
    cands = [vocab_llm.tokenize(s.encode(), add_bos=False) for s in ("a", "b", "ab", "ba", "c", "1", "aa", "bb")]
    cands = [c[0] for c in cands if len(c) == 1]
    tail = (-30.0 - np.arange(n) * 1e-4).astype(np.float32)
    rng = np.random.default_rng(7)
    t_tab = {c: rng.normal(0, 1.0, len(cands)).astype(np.float32) for c in cands + [0]}
    d_tab = {c: (t_tab[c] + rng.normal(0, 0.8, len(cands))).astype(np.float32) for c in t_tab}

    def logits(table, last):
        row = tail.copy()
        row[cands] = table.get(last, table[0])
        return row
    sampler = Sampler(rule, (1.0, top_k, 1.0, 0.0), generator=seed, draft_generator=seed + 1, seed=seed, origin=1,
                      rules=LogitRules(grammar=compiled(vocab_llm, lazy)))

    class Drafter(MatrixDrafter):
        def propose(self, context, k, p_min=None):
            seq, toks, probs = list(context), [], []
            for _ in range(k):
                tok, _, q = sampler.pick(logits(d_tab, seq[-1]), seq)
                toks.append(tok)
                probs.append(q)
                seq.append(tok)
            return Draft(toks, np.stack(probs) if probs and probs[0] is not None else None)

    def target_step(prefix, proposed):
        ctx = prefix + proposed
        rows = np.stack([logits(t_tab, t) for t in ctx[len(prefix) - 1:]])
        return sampler.target_rows(rows, ctx)
    return cands, t_tab, logits, specgguf.SpeculativeDecoder(Drafter(sampler, None), target_step, k=2,
                                                                sampler=sampler)


@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("rule, top_k", [("exact", 3), ("invariant", 0)])
def test_grammar_law(vocab_llm, rule, top_k, lazy):
    """Under a grammar, 2-token outputs follow the law of plain sampling from
    the tokens the language allows (checked by a regular expression, not by
    llama.cpp): exact p/q over the top 3; and the race over every token (no
    top-k), which checks race winners instead of masking whole rows. Also
    for a grammar that starts at a trigger, as a tool call's does."""
    allowed_text = language(lazy)
    cands, t_tab, logits, dec = grammar_setup(vocab_llm, rule, 5, top_k, lazy)
    text = {c: _piece(vocab_llm, c) for c in cands}
    n_runs = 3000
    outs = []
    for run in range(n_runs):
        if rule == "invariant":
            dec.sampler.seed = 1000 + run  # a fresh race each run
        outs.append(tuple(dec.generate([0], max_new=2)))
    assert all(o[0] in cands and o[1] in cands for o in outs)
    pairs = [(a, b) for a in cands for b in cands]
    counts = np.array([sum(o == p for o in outs) for p in pairs], dtype=float)

    def step(done, last):
        row = logits(t_tab, last)[cands].astype(np.float64)
        ok = np.array([allowed_text(done + text[c]) for c in cands])
        row[~ok] = -np.inf
        keep = np.argsort(-row, kind="stable")[:top_k or len(cands)]
        p = np.zeros(len(cands))
        e = np.exp(row[keep] - row[keep].max())
        p[keep] = e / e.sum()
        return p
    law = []
    for a, b in pairs:
        pa = step("", 0)[cands.index(a)]
        law.append(pa * step(text[a], a)[cands.index(b)] if pa > 0 else 0.0)
    assert chi2_pvalue(counts, np.array(law)) > ALPHA
    if rule == "invariant":  # and it did not mask whole rows
        assert dec.sampler.race_grammar


@pytest.mark.parametrize("gbnf", ['root ::= [0-9]+', 'root ::= [a-z]+', 'root ::= "{" [a-z ]* "}"'])
def test_race_under_a_grammar_names_the_first_allowed_token_in_race_order(vocab_llm, gbnf):
    """race_mask's winner, found by checking race winners and then a bounded
    slice of the race order, is the brute-force one: the smallest key
    -log(U)/p over every token the grammar allows (checked one by one over
    the whole vocabulary), on flat and peaked rows over the real vocabulary."""
    from specgguf.ops.verify import race_uniforms
    n = vocab_llm.n_vocab()
    grammar = Grammar(vocab_llm._model.vocab, n, gbnf)
    rules = LogitRules(grammar=grammar)
    state = grammar.state([])
    ids = np.arange(n)
    allowed = grammar.check(state, ids, np.zeros(n, np.float32))
    rng = np.random.default_rng(3)
    misses = 0
    for case in range(60):
        logits = rng.normal(0.0, (0.5, 3.0, 8.0)[case % 3], n)
        p = np.exp(logits - logits.max()).astype(np.float32)
        p /= p.sum()
        seed = 7000 + case
        keys = -np.log(race_uniforms(seed, 0, ids)) / p.astype(np.float64)
        want = int(ids[allowed][np.argmin(keys[allowed])])
        row = p.copy()[None, :]
        got = rules.race_mask(row, [0], 1, seed)[0]
        assert got == want, (case, got, want)
        misses += not allowed[int(np.argmin(keys))]
    assert misses > 10  # the race's own winner was forbidden often: the slow path ran
    grammar.close()


@pytest.mark.parametrize("lazy", [False, True])
def test_grammar_invariant_seeds_equal_plain(vocab_llm, lazy):
    for seed in range(15):
        spec = grammar_setup(vocab_llm, "invariant", seed, lazy=lazy)[3].generate([0], max_new=4)
        plain_dec = grammar_setup(vocab_llm, "invariant", seed, lazy=lazy)[3]
        plain_dec.k = 0
        assert spec == plain_dec.generate([0], max_new=4), seed


def test_a_lazy_grammar_allows_exactly_what_its_language_does(vocab_llm):
    """A grammar started by a trigger (as a Hermes tool call's), over the
    real vocabulary: at each state, before and after the trigger, the
    tokens allowed are exactly those whose bytes keep the text in the
    language (free text without the trigger, or the trigger then what the
    grammar holds), checked token by token against a regular expression.
    Before the trigger only the tokens that would complete it with text the
    grammar refuses are masked; the rest of the row is untouched."""
    from specgguf.llama.grammar import Free, LazyStart, pieces
    vocab, n = vocab_llm._model.vocab, vocab_llm.n_vocab()
    every = pieces(vocab, range(n))
    g = Grammar(vocab, n, 'root ::= "<tool_call>\n" [a-z]*', lazy=LazyStart(every, "<tool_call>"))
    eog = {t for t in range(n) if llama_cpp.llama_vocab_is_eog(vocab, t)}

    def in_language(text):
        at = text.find(b"<tool_call>")
        return at < 0 or re.fullmatch(rb"<tool_call>(\n[a-z]*)?", text[at:]) is not None
    refused = 0
    for before in ("", "Sure, ", "Let me call <", "x <tool_cal", "<<tool_call", "<tool_call", "a <tool_call>\nab"):
        tokens = vocab_llm.tokenize(before.encode(), add_bos=False, special=False)
        text = b"".join(every[t] for t in tokens)
        state = g.state(tokens)
        assert isinstance(state, Free) == (b"<tool_call>" not in text), before
        allowed = g.check(state, np.arange(n), np.zeros(n, np.float32))
        want = np.array([in_language(text + every[t]) for t in range(n)])
        if not isinstance(state, Free):  # llama.cpp's engine: no empty pieces, the end only where the grammar may end
            checked = np.array([bool(every[t]) and t not in eog for t in range(n)])
            assert np.array_equal(allowed[checked], want[checked]), before
        else:
            assert np.array_equal(allowed, want), (before, np.flatnonzero(allowed != want)[:5])
            row = np.zeros(n, np.float32)
            g.mask(row, state, Cut(0, 1.0, 0.0))
            assert np.array_equal(np.isfinite(row), want)
        refused += int((~want).sum())
    assert refused > 0  # some token did complete the trigger wrongly: the mask was tried
    g.restart()
    g.commit(vocab_llm.tokenize(b"ok <tool_call>\nabc", add_bos=False))
    assert not isinstance(g.base, Free)
    g.close()


# ---- the real pair against llama-cpp-python's Llama -------------------------------

@pytest.fixture(scope="module")
def spec(target, draft):
    return specgguf.SpeculativeLlama(target, draft)


PROMPT = "List the days of the week, then the months of the year:"


@pytest.mark.parametrize("settings", [
    dict(repeat_penalty=1.3),
    dict(presence_penalty=0.8, frequency_penalty=0.6),
    dict(logit_bias={"first": -100.0, 13: 3.0}),
    dict(repeat_penalty=1.2, frequency_penalty=0.3, logit_bias={11: 2.0}),
])
def test_greedy_with_penalties_and_bias_equals_llama(spec, target, settings):
    target.reset()
    plain = target.create_completion(PROMPT, max_tokens=48, temperature=0)["choices"][0]["text"]
    bias = settings.get("logit_bias", {})
    if "first" in bias:  # forbid plain greedy's first token
        bias[target.tokenize(plain.encode(), add_bos=False)[0]] = bias.pop("first")
    target.reset()
    want = target.create_completion(PROMPT, max_tokens=48, temperature=0, **settings)["choices"][0]["text"]
    assert want != plain  # the setting changes the text: the comparison can fail
    for k in (0, 4, "auto"):
        got = spec.create_completion(PROMPT, max_tokens=48, temperature=0, k=k, **settings)
        assert got["choices"][0]["text"] == want, k


SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "city": {"type": "string"}}, "required": ["name", "age", "city"]}
JSON_PROMPTS = ["Describe a person called Ann who is 31 and lives in Paris, as JSON.",
                "Give me a JSON record for Bob, 45, from Oslo.",
                "Invent a character and give their name, age and city as JSON."]


@pytest.mark.parametrize("prompt", JSON_PROMPTS)
def test_json_schema_greedy_equals_llama_and_validates(spec, target, prompt):
    fmt = {"type": "json_object", "schema": SCHEMA}
    target.reset()
    want = target.create_chat_completion(msgs(prompt), temperature=0, max_tokens=80,
                                         response_format=fmt)["choices"][0]["message"]["content"]
    for k in (4, "auto"):
        got = spec.create_chat_completion(msgs(prompt), temperature=0, max_tokens=80, response_format=fmt, k=k)
        assert got["choices"][0]["message"]["content"] == want, k
    value = json.loads(want)
    assert set(value) == {"name", "age", "city"}
    assert isinstance(value["age"], int) and isinstance(value["name"], str) and isinstance(value["city"], str)


def test_json_object_mode_and_grammar_sampling_are_valid(spec):
    """Sampled JSON (any JSON value, json_object mode) parses, each seed's
    text equals plain seeded sampling's with the same grammar."""
    fmt = {"type": "json_object", "schema": {"type": "array", "minItems": 3, "maxItems": 3,
                                             "items": {"type": "string", "maxLength": 12}}}
    for seed in range(3):
        run = lambda k: spec.create_chat_completion(  # noqa: E731
            msgs("Give a JSON list of three fruits."), temperature=0.8, seed=seed, max_tokens=240, k=k,
            response_format=fmt)["choices"][0]
        got, plain = run(4), run(0)
        assert got["message"]["content"] == plain["message"]["content"]
        assert got["finish_reason"] == "stop", got  # the schema bounds the list: it closes within budget
        fruits = json.loads(got["message"]["content"])
        assert isinstance(fruits, list) and len(fruits) == 3


def test_logprobs_are_the_targets(spec):
    """Completion logprobs under speculation equal plain decoding's bit for bit, and llama-cpp-python's
    own (which needs a model loaded with logits_all, without flash attention: to its rounding)."""
    from specgguf.llama import models
    target = llama_cpp.Llama(str(models.fetch("smollm2-135m-f32")), n_ctx=512, n_threads=2, logits_all=True,
                             verbose=False)
    want = target.create_completion(PROMPT, max_tokens=12, temperature=0, logprobs=3)["choices"][0]["logprobs"]
    runs = {}
    for k in (0, 4):
        got = runs[k] = spec.create_completion(PROMPT, max_tokens=12, temperature=0, logprobs=3,
                                               k=k)["choices"][0]["logprobs"]
        assert got["tokens"] == want["tokens"]
        np.testing.assert_allclose(got["token_logprobs"], want["token_logprobs"], atol=2e-2)
        for g, w in zip(got["top_logprobs"], want["top_logprobs"]):
            assert list(g)[:1] == list(w)[:1]
    assert runs[4] == runs[0]  # verified in batches, the same bits as one token at a time
    chat = spec.create_chat_completion(msgs("Say hi."), max_tokens=6, temperature=0, logprobs=True, top_logprobs=2)
    content = chat["choices"][0]["logprobs"]["content"]
    assert "".join(c["token"] for c in content) == chat["choices"][0]["message"]["content"]
    assert all(len(c["top_logprobs"]) == 2 and c["logprob"] <= 0 for c in content)
    chunks = list(spec.create_chat_completion(msgs("Say hi."), max_tokens=6, temperature=0, logprobs=True,
                                              top_logprobs=2, stream=True))
    streamed = [c for ch in chunks if ch["choices"][0]["logprobs"] for c in ch["choices"][0]["logprobs"]["content"]]
    assert [c["token"] for c in streamed] == [c["token"] for c in content]


@pytest.mark.parametrize("bad, match", [
    (dict(grammar="root ::= undefined-rule"), "grammar"),
    (dict(response_format={"type": "xml"}), "response_format"),
    (dict(logit_bias={"x": 1.0}), "logit_bias"),
    (dict(logprobs=True, top_logprobs=21), "logprobs"),
    (dict(frequency_penalty=3.0), "frequency_penalty"),
    (dict(tools=[{"type": "function", "function": {"name": "f"}}] * 50), "tools"),
    (dict(tool_choice="required"), "tool_choice"),
    (dict(mirostat_mode=2), "mirostat_mode"),
    (dict(typical_p=0.5), "typical_p"),
    (dict(grammar='root ::= "a"', response_format={"type": "json_object"}), "response_format and grammar"),
    (dict(top_logprobs=2), "top_logprobs needs logprobs"),
    (dict(frobnicate=1), "frobnicate"),
])
def test_bad_settings_are_named_and_the_pair_stays_usable(spec, bad, match):
    with pytest.raises((TypeError, ValueError), match=match) as e:
        spec.create_chat_completion(msgs("hi"), max_tokens=4, **bad)
    assert len(str(e.value)) < 300  # the tools list is not repeated
    assert spec.create_chat_completion(msgs("hi"), max_tokens=4, temperature=0)["choices"][0]["message"]["content"]


def test_config_regime_separates_rule_settings():
    assert GenerationConfig().regime == "greedy"
    assert GenerationConfig(grammar=response_format_grammar({"type": "json_object"})).regime.startswith("greedy-r")
    assert GenerationConfig(repeat_penalty=1.1).regime != GenerationConfig(repeat_penalty=1.2).regime
