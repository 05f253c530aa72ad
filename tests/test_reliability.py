"""Threads on one object, hostile and damaged files, and a soak of many
calls with random settings, on the real pair."""

import random
import shutil
import struct
import threading
import warnings

import pytest

llama_cpp = pytest.importorskip("llama_cpp")

import specgguf  # noqa: E402
from specgguf.llama import models  # noqa: E402
from specgguf.api import SpeculativeLlama  # noqa: E402
from tests.conftest import PROMPTS, msgs  # noqa: E402


@pytest.fixture(scope="module")
def spec(target, draft):
    return SpeculativeLlama(target, draft)


@pytest.mark.parametrize("n_threads", [2, 8])
def test_concurrent_calls_on_one_object_wait_their_turn(spec, n_threads):
    """Threads share one SpeculativeLlama: each call waits for the one running
    (the documented lock); every thread gets exactly what it gets alone."""
    prompts = [msgs(PROMPTS[i % 3]) for i in range(n_threads)]
    alone = {i: spec.generate(prompts[i], max_tokens=12).tokens for i in range(min(3, n_threads))}
    got, errors = {}, []

    def work(i):
        try:
            if i % 2:  # half of them stream
                pieces = list(spec.generate(prompts[i], max_tokens=12, stream=True))
                got[i] = ("".join(pieces), None)
            else:
                r = spec.generate(prompts[i], max_tokens=12)
                got[i] = (r.text, r.tokens)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    [t.start() for t in threads]
    [t.join(timeout=600) for t in threads]
    assert not errors, errors
    texts = {i % 3: spec.generate(prompts[i], max_tokens=12).text for i in range(min(3, n_threads))}
    for i, (text, tokens) in got.items():
        assert text == texts[i % 3]
        if tokens is not None:
            assert tokens == alone[i % 3]


def gguf_header(n_tensors=0, n_kv=0, extra=b""):
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + extra


@pytest.mark.parametrize("content,msg", [
    (gguf_header(n_tensors=2**60), "declares"),
    (gguf_header(n_kv=1, extra=struct.pack("<Q", 2**62) + b"key"), r"runs past the end"),
    (gguf_header(n_kv=1, extra=struct.pack("<Q", 3) + b"key" + struct.pack("<I", 8) + struct.pack("<Q", 2**50)),
     r"runs past the end"),
    (gguf_header(n_kv=1, extra=struct.pack("<Q", 3) + b"key" + struct.pack("<IIQ", 9, 8, 2**55)), "declares"),
    (gguf_header(n_kv=1, extra=struct.pack("<Q", 3) + b"key" + struct.pack("<I", 77)), "unknown value type"),
    (b"GGUF" + struct.pack("<I", 99) + bytes(40), "unsupported GGUF version"),
    (b"GGUF\x03\x00", "truncated"),
    (b"PK\x03\x04 a zip file renamed .gguf, long enough", "is not a GGUF file"),
])
def test_hostile_headers_are_refused_before_llama_cpp_sees_them(tmp_path, content, msg):
    f = tmp_path / "hostile.gguf"
    f.write_bytes(content)
    with pytest.raises(ValueError, match=msg):
        SpeculativeLlama(str(f), "smollm2-135m-q4_1", n_ctx=256)


def test_a_truncated_model_is_a_clear_error(tmp_path):
    src = models.fetch("smollm2-135m-q4_1")
    for keep in (1 << 20, src.stat().st_size - 4096):  # inside the header; inside the tensor data
        f = tmp_path / f"truncated-{keep}.gguf"
        with open(src, "rb") as a, open(f, "wb") as b:
            b.write(a.read(keep))
        with pytest.raises(ValueError, match="damaged|could not load"):
            specgguf.DraftModel(str(f), n_ctx=256)


def test_a_model_replaced_on_disk_gets_its_own_state(tmp_path, private_state):
    """State is keyed by content: after the file at a path changes, a new
    object sees a new pair (nothing learned of the old file is used), and a
    damaged state file is ignored with a warning, then rebuilt."""
    path = tmp_path / "draft.gguf"
    shutil.copyfile(models.fetch("smollm2-135m-q4_1"), path)
    first = SpeculativeLlama("smollm2-135m-f32", str(path), n_ctx=256, n_threads=2)
    first.generate("The sea", max_tokens=8, k="auto")
    assert first.learning.state.evidence("greedy") is not None
    shutil.copyfile(models.fetch("smollm2-135m-q2_k"), path)
    second = SpeculativeLlama("smollm2-135m-f32", str(path), n_ctx=256, n_threads=2)
    assert second.learning.state.pair != first.learning.state.pair
    assert second.learning.state.evidence("greedy") is None
    for f in private_state.rglob("*.json"):
        f.write_bytes(b"\x00garbage{")
    again = tmp_path / "again.gguf"  # the first file's content under another name: the first pair
    shutil.copyfile(models.fetch("smollm2-135m-q4_1"), again)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        third = SpeculativeLlama("smollm2-135m-f32", str(again), n_ctx=256, n_threads=2)
        r = third.generate("The sea", max_tokens=8, k="auto")
    assert third.learning.state.pair == first.learning.state.pair
    assert len(r.tokens) == 8
    assert any("ignoring unreadable state file" in str(w.message) for w in caught)
    assert third.learning.state.evidence("greedy") is not None  # rebuilt


def test_soak_300_calls_with_random_settings(spec):
    """300 calls on one object: random temperature, top-k, top-p, min-p, k,
    p_min, seeds and stop strings, half of them streamed and some abandoned
    early. Every output is well formed; RSS after the last call stays within
    5% of RSS after the 30th."""
    import os
    rng = random.Random(0)
    rss = {}

    def rss_mib():
        with open(f"/proc/{os.getpid()}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024

    for i in range(1, 301):
        auto = rng.random() < 0.5
        kw = dict(max_tokens=rng.randint(0, 10), temperature=rng.choice([0.0, 0.0, 0.3, 0.8, 1.5]),
                  top_k=rng.choice([0, 1, 5, 40]), top_p=rng.choice([0.5, 0.9, 1.0]),
                  min_p=rng.choice([0.0, 0.05, 0.3]), k="auto" if auto else rng.randint(0, 6),
                  p_min=rng.choice([None, 0.2, "auto"]) if auto else rng.choice([None, 0.2]),
                  seed=rng.choice([None, rng.randrange(2**32)]), stop=rng.choice([None, "\n", [".", "the"]]))
        prompt = rng.choice([PROMPTS[i % 3], msgs(PROMPTS[(i + 1) % 3]), [1, 504, 3458]])
        if rng.random() < 0.5:
            it = spec.generate(prompt, stream=True, **kw)
            taken = [p for _, p in zip(range(rng.randint(0, 12)), it)]
            it.close()  # an early break leaves the object usable
            assert all(isinstance(p, str) and p for p in taken)
        else:
            r = spec.generate(prompt, **kw)
            assert r.finish_reason in ("stop", "length") and len(r.tokens) <= kw["max_tokens"]
            assert r.stats["completion_tokens"] == len(r.tokens)
            assert not any(s in r.text for s in ([kw["stop"]] if isinstance(kw["stop"], str) else kw["stop"] or []))
        if i in (30, 300):
            rss[i] = rss_mib()
    print(f"soak RSS: after 30 calls {rss[30]:.0f} MiB, after 300 {rss[300]:.0f} MiB")
    assert rss[300] <= 1.05 * rss[30]
