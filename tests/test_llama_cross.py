"""A draft of another tokenizer on real models: the Gemma 3 270M target
(F32, V=262144) with the SmolLM2-135M Q4_1 draft (V=49152), from models.lock.

Greedy output is token for token the target's alone (several prompts, a
completion and a chat turn), seeded drafter-invariant sampling is plain
seeded sampling's, exact p/q sampling runs, check-pair says what the pair
gets, and what cannot work yet is refused with a clear error. The Gemma
files are fetched on demand (`python -m specgguf models fetch gemma-cross`;
.ci/run does), not by the default set-up; without them this file skips.

The F32 target, not the Q4_K_M it is derived from: llama.cpp's quantized
matrix products round differently in a batch than one token at a time, so
a quantized target's own greedy output can differ from its batched
verification near a tie (here at token 11 of a 48-token answer, logits
16.88 against 17.04): true of any speculative decoder, this pair's own
included, and not what this file tests.
"""

import os
import subprocess
import sys

import pytest

pytest.importorskip("llama_cpp")

from tests.conftest import plain_greedy  # noqa: E402
from specgguf.llama import models  # noqa: E402

TARGET = "gemma3-270m-f32"
DRAFT = "smollm2-135m-q4_1"

PROMPTS = ["The capital of France is", "def fibonacci(n):\n", "Once upon a time, in a small village,"]
# The base Gemma GGUF ships no chat template: a chat turn in Gemma's own format, as token ids.
CHAT = "<start_of_turn>user\nName three colours.<end_of_turn>\n<start_of_turn>model\n"


def _entry(name):
    entries, _ = models.load_lock()
    return models.local_path(entries[name])


@pytest.fixture(scope="module")
def gemma():
    if not _entry(TARGET).exists():
        pytest.skip(f"{TARGET} is not fetched: python -m specgguf models fetch gemma-cross")
    import llama_cpp
    return llama_cpp.Llama(str(_entry(TARGET)), n_ctx=1024, n_threads=2, n_threads_batch=2, verbose=False)


@pytest.fixture(scope="module")
def cross(gemma):
    from specgguf import SpeculativeLlama
    return SpeculativeLlama(gemma, DRAFT, n_ctx=1024)


def test_the_pair_is_cross_tokenizer(cross):
    mode = cross.pair.mode
    assert mode.mode == "cross"
    assert mode.vmap.shared > 40000  # most SmolLM2 tokens spell a Gemma token
    assert cross.pair.target.model.n_vocab == 262144 and cross.pair.draft_model.model.n_vocab == 49152


@pytest.mark.parametrize("k", [4, "auto"])
def test_greedy_is_the_target_alone(cross, gemma, k):
    for prompt in PROMPTS:
        ids = cross.tokenize(prompt)
        plain = plain_greedy(gemma, ids, 32)
        r = cross.generate(prompt, max_tokens=32, temperature=0, k=k)
        assert r.tokens == plain, prompt
        if k == 4:
            assert r.stats["accepted"] > 0 and r.stats["drafted"] > 20  # the draft really took part


def test_greedy_chat_turn_is_the_target_alone(cross, gemma):
    ids = gemma.tokenize(CHAT.encode(), add_bos=True, special=True)
    assert 105 in ids and 106 in ids  # <start_of_turn>, <end_of_turn>: the template's own tokens
    plain = plain_greedy(gemma, ids, 32)
    r = cross.generate(ids, max_tokens=32, temperature=0, k=4)
    assert r.tokens[:len(plain)] == plain[:len(r.tokens)] and r.stats["drafted"] > 0
    with pytest.raises(ValueError, match="no chat template"):
        cross.generate("Name three colours.", chat=True, max_tokens=4)


def test_invariant_sampling_is_plain_seeded_sampling(cross):
    for seed in (1, 2):
        outs = [cross.generate(PROMPTS[2], max_tokens=24, temperature=0.8, seed=seed, k=k,
                               drafter_invariant=True) for k in (0, 4)]
        assert outs[0].tokens == outs[1].tokens
        assert outs[1].stats["drafted"] > 0


def test_exact_sampling_drafts_shared_tokens(cross):
    r = cross.generate(PROMPTS[0], max_tokens=24, temperature=0.8, seed=5, k=4, drafter_invariant=False)
    assert r.stats["verification"] == "exact" and r.stats["drafted"] > 0 and len(r.tokens) == 24
    again = cross.generate(PROMPTS[0], max_tokens=24, temperature=0.8, seed=5, k=4, drafter_invariant=False)
    assert again.tokens == r.tokens  # seeded: the same text


def test_several_slots_are_refused_clearly(gemma):
    from specgguf import SpeculativeLlama
    with pytest.raises(ValueError, match="another tokenizer.*parallel=1"):
        SpeculativeLlama(str(_entry(TARGET)), DRAFT, parallel=2, n_ctx=512)


def test_check_pair_says_the_mode_and_acceptance():
    if not _entry(TARGET).exists():
        pytest.skip(f"{TARGET} is not fetched")
    out = subprocess.run([sys.executable, "-m", "specgguf", "check-pair", "--target", TARGET, "--draft", DRAFT,
                          "-n", "24", "--threads", "2"], capture_output=True, text=True, timeout=600,
                         env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    assert "mode:   cross: different tokenizers" in out.stdout
    assert "output identical to the target alone: yes" in out.stdout
    assert "acceptance, sampled at 0.8" in out.stdout
    assert "exactness: bit-identical here" in out.stdout  # Gemma 3's F32 file too
    same = subprocess.run([sys.executable, "-m", "specgguf", "check-pair", "--draft", "ngram"],
                          capture_output=True, text=True, timeout=60)
    assert same.returncode == 2 and "needs no check" in same.stderr
