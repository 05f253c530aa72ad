"""specgguf.DraftModel inside llama-cpp-python's own Llama (real models)."""

import threading

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

import specgguf  # noqa: E402
from specgguf.llama import models  # noqa: E402
from tests.conftest import PROMPTS, msgs  # noqa: E402


def target_llama(**kw):
    return llama_cpp.Llama(str(models.fetch("smollm2-135m-f32")), n_ctx=1024, n_threads=2, n_threads_batch=2,
                           verbose=False, **kw)


@pytest.fixture(scope="module")
def pair(session_state):
    draft = specgguf.DraftModel("smollm2-135m-q4_1", n_threads=2, n_ctx=1024)
    return target_llama(), target_llama(draft_model=draft), draft


def text(r):
    c = r["choices"][0]
    return c["message"]["content"] if "message" in c else c["text"]


def streamed(chunks):
    out = []
    for c in chunks:
        ch = c["choices"][0]
        out.append(ch.get("text") or ch.get("delta", {}).get("content") or "")
    return "".join(out)


def test_greedy_output_is_the_llama_without_a_draft(pair):
    plain, drafted, draft = pair
    draft.reset()
    for prompt in PROMPTS:
        a = plain.create_chat_completion(msgs(prompt), max_tokens=48, temperature=0)
        b = drafted.create_chat_completion(msgs(prompt), max_tokens=48, temperature=0)
        assert text(a) == text(b), (text(a), text(b))
    a = plain.create_completion("The history of the printing press", max_tokens=40, temperature=0)
    b = drafted.create_completion("The history of the printing press", max_tokens=40, temperature=0)
    assert text(a) == text(b), (text(a), text(b))
    s = draft.stats
    assert s["calls"] > 0 and s["drafted"] > 0 and s["accepted"] > 0  # it really drafted
    assert 0 < s["acceptance_rate"] <= 1 and sum(s["k_chosen"].values()) == s["calls"]
    assert (s["why"] is None) == (draft.k != "auto") and (s["why"] is None or "plain decoding" in s["why"])


def test_streaming_and_reuse_across_prompts(pair):
    plain, drafted, draft = pair
    for prompt in (PROMPTS[1], PROMPTS[0], PROMPTS[1]):  # back and forth: the cache is cut and refilled
        want = text(plain.create_chat_completion(msgs(prompt), max_tokens=32, temperature=0))
        got = streamed(drafted.create_chat_completion(msgs(prompt), max_tokens=32, temperature=0, stream=True))
        assert got == want, (want, got)
    want = text(plain.create_completion("Once upon a time", max_tokens=24, temperature=0))
    assert streamed(drafted.create_completion("Once upon a time", max_tokens=24, temperature=0, stream=True)) == want


def test_fixed_k_and_reset(pair):
    plain, _, _ = pair
    d = specgguf.DraftModel(pair[2].llm, k=3)
    llm = target_llama(draft_model=d)
    want = text(plain.create_chat_completion(msgs(PROMPTS[2]), max_tokens=30, temperature=0))
    assert text(llm.create_chat_completion(msgs(PROMPTS[2]), max_tokens=30, temperature=0)) == want
    assert set(d.stats["k_chosen"]) == {3}
    d.reset()
    assert d.stats["calls"] == 0 and d.model.tokens == []


COPY = ("Repeat this exactly, word for word: The quick brown fox jumps over the lazy dog. A small draft "
        "model proposes several tokens that a large target model verifies in one batched forward pass.")


def test_a_lookup_in_front_of_the_draft_keeps_llamas_output(pair):
    """DraftModel(ngram=True): a prompt lookup drafts where the text repeats,
    with its own K; the model elsewhere. Llama's output is unchanged."""
    plain, _, draft = pair
    d = specgguf.DraftModel(draft.llm, ngram=True)
    llm = target_llama(draft_model=d)
    for prompt in (COPY, PROMPTS[0]):
        want = text(plain.create_chat_completion(msgs(prompt), max_tokens=48, temperature=0))
        assert text(llm.create_chat_completion(msgs(prompt), max_tokens=48, temperature=0)) == want
    assert d.stats["accepted"] > 0
    assert d.lookup.length.regimes["greedy"].seen > 0, "the lookup never drafted on a copy prompt"


def test_the_next_call_tells_how_many_were_accepted():
    d = specgguf.DraftModel("smollm2-135m-q4_1", k=4, n_threads=2, n_ctx=512)
    ids = np.array(llama_cpp.Llama(str(models.fetch("smollm2-135m-q4_1")), vocab_only=True, verbose=False)
                   .tokenize(b"The quick brown fox"), dtype=np.intc)
    first = d(ids)
    assert first.dtype == np.intc and len(first) == 4
    d(np.concatenate([ids, first[:2], [first[2] + 1]]).astype(np.intc))  # two kept, then a correction
    assert d.stats["accepted"] == 2 and d.stats["drafted"] == 8
    assert d.model.lag(list(ids) + list(first[:2])) <= 1  # its cache was cut back, not refilled


def test_vocabulary_mismatch_is_a_clear_error(tmp_path, pair):
    import shutil

    import gguf
    d = specgguf.DraftModel("smollm2-135m-q4_1", k=2, n_threads=2, n_ctx=512)
    with pytest.raises(ValueError, match="out of range for the draft's vocabulary"):
        d(np.array([1, 2, 10**6], dtype=np.intc))  # ids of a larger vocabulary
    changed = tmp_path / "changed.gguf"
    shutil.copyfile(models.fetch("smollm2-135m-q2_k"), changed)
    reader = gguf.GGUFReader(str(changed), "r+")
    field = reader.fields["tokenizer.ggml.tokens"]
    part = field.parts[field.data[500]]
    part[0] = ord("Z") if part[0] != ord("Z") else ord("Y")
    reader.data.flush()
    del reader
    with pytest.raises(ValueError, match="token 500 is"):
        specgguf.DraftModel(str(changed), n_ctx=512).check(pair[0])
    d.check(pair[0])  # the real pair passes


def test_two_threads_share_one_draft_model_safely(pair):
    d = specgguf.DraftModel(pair[2].llm, k=3)
    ids = [np.array([1, 504, 3458, 281] + [100 + i] * (5 + i), dtype=np.intc) for i in range(2)]
    alone = [d(x).tolist() for x in ids]
    out, errors = {}, []

    def work(i):
        try:
            out[i] = [d(ids[i]).tolist() for _ in range(10)]
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert not errors and all(r == alone[i] for i in range(2) for r in out[i])


def test_a_bad_k_is_refused_before_the_model_loads():
    """The same check as GenerationConfig's (config.check_k), named, before any file is read."""
    for k, err in ((33, ValueError), (-1, ValueError), ("fast", ValueError), (2.5, TypeError), (True, TypeError)):
        with pytest.raises(err, match="k must be"):
            specgguf.DraftModel("/nonexistent/draft.gguf", k=k)
