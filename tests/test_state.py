"""The state store: where it lives, damaged files, identity by content, and
concurrent processes."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from specgguf import state
from specgguf.state import PairState, Store, cache_root, state_dir


def test_locations_follow_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECGGUF_STATE")
    monkeypatch.setenv("SPECGGUF_CACHE", str(tmp_path / "root"))
    assert cache_root() == tmp_path / "root" and state_dir() == tmp_path / "root" / "state"
    monkeypatch.setenv("SPECGGUF_STATE", str(tmp_path / "elsewhere"))
    assert state_dir() == tmp_path / "elsewhere" and Store().root == tmp_path / "elsewhere"
    # Without SPECGGUF_CACHE, XDG_CACHE_HOME places it (as scripts/setup.sh places its builds);
    # a relative XDG_CACHE_HOME is ignored, as the XDG spec says.
    monkeypatch.delenv("SPECGGUF_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "specgguf"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    assert cache_root() == Path.home() / ".cache" / "specgguf"


def test_the_suite_redirects_state(private_state):
    assert Store().root == private_state
    assert not str(private_state).startswith(os.path.expanduser("~/.cache"))


def test_corrupt_or_foreign_files_are_ignored_with_one_warning_and_rebuilt(tmp_path):
    store = Store(tmp_path)
    store.write("evidence", "k", {"draft": 1.0})
    path = store.path("evidence", "k")
    for damage in (b"{not json", b"", b'{"key": "other", "value": {}}', b"[1, 2]", b"\x00\xff"):
        Store._warned.discard(path)
        path.write_bytes(damage)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert store.read("evidence", "k") is None
            assert store.read("evidence", "k") is None  # once per file, not per read
        assert len(caught) == 1 and "ignoring unreadable state file" in str(caught[0].message)
        store.update("evidence", "k", lambda old: {"draft": 2.0} if old is None else old)
        assert store.read("evidence", "k") == {"draft": 2.0}


def test_only_a_trust_pin_waits_for_the_disk(tmp_path, monkeypatch):
    """Evidence is stored after every drafting call (a prior, rebuilt if a
    crash loses it): an fsync there cost 42 ms a call here. A trust-on-first-use
    pin is flushed before it replaces the old one. Either way a reader sees a
    whole record, never a part."""
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    store = Store(tmp_path)
    for kind in ("acceptance", "evidence", "files"):
        store.write(kind, "k", {"n": 1})
        assert store.read(kind, "k") == {"n": 1}
    assert synced == []
    store.write("trusted", "k", {"sha256": "ab"})
    assert len(synced) == 1 and store.read("trusted", "k") == {"sha256": "ab"}
    assert sorted(p.name for p in (tmp_path / "evidence").iterdir() if p.suffix != ".lock") == \
        [store.path("evidence", "k").name]  # no temporary file left behind


def test_files_are_identified_by_content(tmp_path):
    store = Store(tmp_path / "state")
    a = tmp_path / "a.gguf"
    a.write_bytes(b"GGUF one")
    digest = store.file_id(a)
    b = tmp_path / "renamed.gguf"
    shutil.copyfile(a, b)
    assert store.file_id(b) == digest  # same content, other name: the same identity
    a.write_bytes(b"GGUF two, replaced on disk")  # replaced after its state was stored
    os.utime(a, ns=(1, 1))
    assert store.file_id(a) != digest
    assert Store(tmp_path / "state").file_id(b) == digest  # a later process reads the record


def test_a_large_file_is_identified_by_its_head_and_sampled_blocks(tmp_path, monkeypatch):
    """A change in the header or in a sampled block changes the identity;
    reading it costs about 10 MiB whatever the size (a 64 MiB file here)."""
    size = 64 << 20
    path = tmp_path / "big.gguf"
    with open(path, "wb") as f:
        f.truncate(size)
    base = state.content_id(path)
    assert base.startswith(f"{size}:")
    touched = [100, state.ID_HEAD + (size - state.ID_HEAD - state.ID_BLOCK) // state.ID_BLOCKS, size - 1]
    for offset in touched:
        with open(path, "r+b") as f:
            f.seek(offset)
            f.write(b"\x01")
        assert state.content_id(path) != base, offset
        with open(path, "r+b") as f:
            f.seek(offset)
            f.write(b"\x00")
    assert state.content_id(path) == base
    files = []

    class Counting:  # the file content_id opens, counting the bytes it reads
        def __init__(self, *args):
            self.f, self.n = open(*args), 0
            files.append(self)

        def read(self, size=-1):
            data = self.f.read(size)
            self.n += len(data)
            return data

        def seek(self, offset):
            return self.f.seek(offset)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(state, "open", Counting, raising=False)
    state.content_id(path)
    assert sum(f.n for f in files) == state.ID_HEAD + state.ID_BLOCKS * state.ID_BLOCK


WORKER = textwrap.dedent("""
    import sys
    from specgguf.state import Store
    store = Store(sys.argv[1])
    for _ in range(int(sys.argv[2])):
        store.update("evidence", "shared", lambda old: {"n": (old or {"n": 0})["n"] + 1})
""")


def test_eight_processes_lose_no_update(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path), "60"]) for _ in range(8)]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    assert Store(tmp_path).read("evidence", "shared") == {"n": 480}
    assert not list(tmp_path.rglob("*.tmp"))


PAIR_WORKER = textwrap.dedent("""
    import json, sys, warnings
    warnings.simplefilter("error")  # an unreadable state file would be a warning
    import specgguf
    llm = specgguf.SpeculativeLlama("smollm2-135m-f32", "smollm2-135m-q4_1", n_ctx=256, n_threads=1)
    r = llm.generate("The printing press", max_tokens=int(sys.argv[1]), k="auto")
    print(json.dumps({"tokens": r.tokens}))
""")


def test_eight_processes_meet_a_new_pair_at_once(private_state):
    """Eight processes load the same never-seen pair and store what they learn
    at once: every one finishes, agrees on the greedy text, and leaves only
    readable records."""
    pytest.importorskip("llama_cpp")
    procs = [subprocess.Popen([sys.executable, "-c", PAIR_WORKER, "12"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for _ in range(8)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-600:] for _, e in outs]
    texts = {tuple(json.loads(o)["tokens"]) for o, _ in outs}
    assert len(texts) == 1
    records = [f for f in private_state.rglob("*.json")]
    assert records and not list(private_state.rglob("*.tmp"))
    for f in records:
        data = json.loads(f.read_text())
        assert set(data) == {"key", "value"}
    kinds = {f.parent.name for f in records}
    assert {"files", "evidence"} <= kinds
    for f in private_state.glob("costs/*.json"):  # prices only as ratios to a target token, never seconds
        value = json.loads(f.read_text())["value"]
        assert "target" in value and set(value) <= {"target", "draft", "uses"}
        assert all(0 < r < 100 for shape in ("target", "draft") for r in value.get(shape, {}).values())


def test_pair_state_keeps_kinds_and_pairs_apart(tmp_path):
    s = PairState(Store(tmp_path), "t+d")
    s.save_acceptance({"greedy": 0.9, "sampled": 0.8})
    s.save_evidence("greedy", {"total": [1.0, 2.0]})
    s.save_evidence("t0.80-k40-p0.95-m0.05-exact", {"total": [5.0, 5.0]})
    s.save_costs({"draft": {"1": 0.4}, "uses": 0})
    s.save_costs({"target": {"1": 1.0}})  # a lookup's: the target's shape merged, the draft's kept
    s.save_costs({"target": {"9": 3.0}}, {"target": {"9": 2.0}, "draft": {"1": 0.4}, "uses": 0})  # in order
    s.save_costs()  # nothing timed: nothing written
    assert PairState(Store(tmp_path), "t+d").acceptance() == {"greedy": 0.9, "sampled": 0.8}
    assert s.costs() == {"target": {"1": 1.0, "9": 2.0}, "draft": {"1": 0.4}, "uses": 0}
    assert PairState(Store(tmp_path), "t+x").costs() is None
    assert s.evidence("greedy") == {"total": [1.0, 2.0]}
    assert s.evidence("t0.80-k40-p0.95-m0.05-exact") == {"total": [5.0, 5.0]}
    other = PairState(Store(tmp_path), "t+e")
    assert other.acceptance() is None and other.evidence("greedy") is None


