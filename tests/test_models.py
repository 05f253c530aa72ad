"""models.lock: listing any lock, pinning, tampered and interrupted fetches,
trust on first use for hub entries."""

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specgguf.llama import models
from specgguf.state import sha256_of


def test_list_handles_dotted_pair_names_and_odd_locks(tmp_path):
    lines = models.list_lines()
    assert any(line.startswith("pair qwen2.5-7b ") for line in lines)
    lock = tmp_path / "models.lock"
    lock.write_text(models.LOCK_PATH.read_text() + '''
[pair.llama3.1-8b]
target = "llama-3.1-8b-q4_k_m"
draft = "llama-3.2-1b-q4_k_m"

[pair.broken]
target = "nothing-like-it"
note = "no draft"
''')
    lines = models.list_lines(lock)  # before the fix: KeyError 'target' on the dotted name
    assert any(line.startswith("pair llama3.1-8b ") for line in lines)
    assert any("pair broken: needs a target and a draft name" in line for line in lines)
    lock.write_text("this is [not toml")
    with pytest.raises(ValueError, match="cannot read the model lock"):
        models.list_lines(lock)


def test_list_shows_how_each_entry_is_pinned():
    lines = {line.split()[0]: line for line in models.list_lines() if not line.startswith(("pair", "warning"))}
    assert " lock " in lines["smollm2-135m-f32"]
    assert "UNPINNED" in lines["qwen2.5-7b-q4_k_m"]


def test_lock_refuses_tampered_file(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECGGUF_CACHE", str(tmp_path))
    entries, _ = models.load_lock()
    e = entries["smollm2-135m-q2_k"]
    bad = tmp_path / "models" / e.file
    bad.parent.mkdir()
    shutil.copyfile(models.LOCK_PATH, bad)  # wrong content, wrong size
    with pytest.raises(ValueError, match="sha256 .* pins"):
        models.fetch("smollm2-135m-q2_k")
    assert not bad.exists()


def test_derivation_reproduces_pinned_sha(tmp_path, monkeypatch):
    src = models.fetch("smollm2-135m-q4_1")
    monkeypatch.setenv("SPECGGUF_CACHE", str(tmp_path))
    (tmp_path / "models").mkdir()
    shutil.copyfile(src, tmp_path / "models" / src.name)  # parent present: only the derivation runs
    out = models.fetch("smollm2-135m-q2_k")
    entries, _ = models.load_lock()
    assert sha256_of(out) == entries["smollm2-135m-q2_k"].sha256


def test_interrupted_fetch_leaves_no_partial_file(tmp_path):
    """Kill a fetch (a derivation, a few seconds) mid-way: nothing appears under
    the final name; the next fetch cleans up and completes."""
    src = models.fetch("smollm2-135m-q4_1")
    (tmp_path / "models").mkdir()
    shutil.copyfile(src, tmp_path / "models" / src.name)
    env = {"SPECGGUF_CACHE": str(tmp_path), "SPECGGUF_STATE": str(tmp_path / "state"),
           "PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)}
    final = tmp_path / "models" / "SmolLM2-135M-Instruct.Q2_K.gguf"
    for sig, code in ((signal.SIGINT, 130), (signal.SIGKILL, -signal.SIGKILL)):
        # Wait for this process's own partial file (the last one's may still
        # be there: a fetch interrupted at once leaves it to the next), then
        # interrupt the derivation (about a second) at once.
        before = set((tmp_path / "models").glob("*.part"))
        p = subprocess.Popen([sys.executable, "-m", "specgguf", "models", "fetch", "smollm2-135m-q2_k"],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 60
        while time.time() < deadline and p.poll() is None and not set((tmp_path / "models").glob("*.part")) - before:
            time.sleep(0.01)
        p.send_signal(sig)
        err = p.communicate(timeout=60)[1]
        assert p.returncode == code, (sig, p.returncode, err[-500:])  # the signal ended it, not the fetch
        assert not final.exists()
    r = subprocess.run([sys.executable, "-m", "specgguf", "models", "fetch", "smollm2-135m-q2_k"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert final.exists() and not list((tmp_path / "models").glob("*.part"))
    entries, _ = models.load_lock()
    assert sha256_of(final) == entries["smollm2-135m-q2_k"].sha256


class LocalHub:
    """A local stand-in for a model hub (none is reachable here): files under
    snapshots/<commit>/ as huggingface_hub's cache lays them out; "main"
    resolves to the newest commit."""

    def __init__(self, root: Path):
        self.root, self.commits = root, []

    def publish(self, content: bytes) -> str:
        commit = f"{len(self.commits) + 1:040x}"
        d = self.root / "snapshots" / commit
        d.mkdir(parents=True)
        (d / "model.gguf").write_bytes(content)
        self.commits.append(commit)
        return commit

    def download(self, repo, filename, revision):
        commit = self.commits[-1] if revision == "main" else revision
        return str(self.root / "snapshots" / commit / filename)


def test_hub_entries_are_pinned_on_first_use(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECGGUF_CACHE", str(tmp_path / "cache"))
    lock = tmp_path / "models.lock"
    lock.write_text('[[model]]\nname = "hubbed"\nfile = "model.gguf"\nsource = "huggingface"\n'
                    'repo = "someone/model"\nrevision = "main"\nsha256 = "unverified"\n')
    hub = LocalHub(tmp_path / "hub")
    first = hub.publish(b"GGUF version one")
    path = models.fetch("hubbed", lock, hub_download=hub.download)
    entry = models.load_lock(lock)[0]["hubbed"]
    record = models.trusted(entry)
    assert record["revision"] == first and record["sha256"] == sha256_of(path)
    assert models.pin(entry)[0] == "first use"
    # "main" moves on: a later fetch still gets the recorded commit.
    hub.publish(b"GGUF version two, different")
    path.unlink()
    assert models.fetch("hubbed", lock, hub_download=hub.download).read_bytes() == b"GGUF version one"
    # The recorded commit's content changes (a rewritten history): refused.
    (tmp_path / "hub" / "snapshots" / first / "model.gguf").write_bytes(b"GGUF tampered")
    path.unlink()
    with pytest.raises(ValueError, match="its first fetch recorded"):
        models.fetch("hubbed", lock, hub_download=hub.download)
    assert not path.exists()
    # `verify` checks a present file against the record too.
    path.write_bytes(b"GGUF tampered")
    assert any("MISMATCH" in line for line in models.verify_all(lock))
