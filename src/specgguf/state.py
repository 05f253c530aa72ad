"""What specgguf remembers between runs, in one store.

Two kinds of record about a pair, kept apart because they change at
different rates (no forward cost is stored: identical processes here differ
by 20% in speed, so every run times its own rounds):

* ``acceptance``: the pair's acceptance measured by ``calibrate()`` on a fixed
  text (greedy, and sampled at temperature 0.8 with the default warps); a
  prior, never changed by runs.
* ``evidence``: what runs learned of the acceptance, per pair and per
  sampling regime (greedy, or the rounded warp settings), as decayed counts
  per draft position; a later run takes it as a prior worth a few
  observations (:meth:`~specgguf.engine.acceptance.Regime.add_record`).

Layout: one JSON file per record, ``<state>/<kind>/<hash of key>.json``,
written atomically (temporary file, then rename; flushed to the disk
first only where losing it matters: :data:`DURABLE`) under an advisory lock
(``fcntl.flock``) for read-modify-write, so concurrent processes neither
lose nor corrupt each other's updates. A file that cannot be read is
ignored with one warning and rewritten on the next update.

Where: ``$SPECGGUF_STATE``, else ``$SPECGGUF_CACHE/state``, else
``~/.cache/specgguf/state``. Models live beside it in ``models/``, a pure
download cache. Model files are identified by content (their size, header,
metadata and sampled blocks: :func:`content_id`), cached by (path, size,
mtime) so each file is read once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Callable, Dict, Iterator, Optional

try:
    import fcntl
except ImportError:  # not POSIX: atomic replace only
    fcntl = None

KINDS = ("acceptance", "costs", "evidence", "files", "trusted")
# Kinds whose records are flushed to the disk before they replace the old
# one. The others are priors and caches, rebuilt if a crash loses them, and
# a run that drafts stores its evidence after every call: an fsync there
# took 42 ms a call on this machine's disk (2% of a 96-token generation,
# paid in every server request's latency), and more on a board's SD card.
DURABLE = ("trusted",)  # a trust-on-first-use pin: losing it would trust the next download anew


def cache_root() -> Path:
    """``$SPECGGUF_CACHE``, else ``$XDG_CACHE_HOME/specgguf``, else
    ``~/.cache/specgguf`` (as scripts/setup.sh puts its builds): models and
    state live under it."""
    env = os.environ.get("SPECGGUF_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache") / "specgguf"


def state_dir() -> Path:
    """``$SPECGGUF_STATE``, else ``<cache root>/state``."""
    env = os.environ.get("SPECGGUF_STATE")
    return Path(env) if env else cache_root() / "state"


class Store:
    """Records by (kind, key), one JSON file each.

    Args:
        root: the folder (default :func:`state_dir`, read when the store is made).
    """

    _warned: set = set()  # files already reported unreadable, once per process

    def __init__(self, root: Optional[os.PathLike] = None) -> None:
        self.root = Path(root) if root is not None else state_dir()

    def path(self, kind: str, key: str) -> Path:
        if kind not in KINDS:
            raise ValueError(f"unknown state kind {kind!r}")
        return self.root / kind / (hashlib.sha256(key.encode()).hexdigest()[:24] + ".json")

    def read(self, kind: str, key: str) -> Optional[dict]:
        """The record, or None if absent or unreadable (warned once)."""
        path = self.path(kind, key)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            self._warn(path, e)
            return None
        if not isinstance(data, dict) or data.get("key") != key or not isinstance(data.get("value"), dict):
            self._warn(path, "not a specgguf state record")
            return None
        return data["value"]

    def update(self, kind: str, key: str, change: Callable[[Optional[dict]], dict]) -> dict:
        """Replace the record by ``change(current record or None)``, under the
        record's lock: concurrent updates are applied one after the other."""
        path = self.path(kind, key)
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._locked(path):
            value = change(self.read(kind, key))
            self._write(path, {"key": key, "value": value}, kind in DURABLE)
        return value

    def write(self, kind: str, key: str, value: dict) -> None:
        self.update(kind, key, lambda _old: value)

    @staticmethod
    def _write(path: Path, data: dict, durable: bool) -> None:
        """Replace ``path`` atomically: readers see the old record or the new
        one whole; ``durable``: on the disk before it replaces the old."""
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f)
                f.flush()
                if durable:
                    os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    @staticmethod
    @contextlib.contextmanager
    def _locked(path: Path) -> Iterator[None]:
        if fcntl is None:
            yield
            return
        with open(path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _warn(self, path: Path, why: object) -> None:
        if path not in self._warned:
            self._warned.add(path)
            warnings.warn(f"specgguf: ignoring unreadable state file {path} ({why}); it will be rebuilt",
                          RuntimeWarning, stacklevel=3)

    # -- model files, by content ---------------------------------------------
    _memo: Dict[tuple, str] = {}  # in-process: (path, size, mtime_ns) -> identity

    def file_id(self, path: os.PathLike) -> str:
        """A model file's identity for the records: :func:`content_id`,
        computed once per (path, size, mtime) and remembered here, so a
        renamed copy shares its records and a file replaced on disk does not."""
        p = Path(path).resolve()
        st = p.stat()
        ident = (str(p), st.st_size, st.st_mtime_ns)
        if ident in self._memo:
            return self._memo[ident]
        key = "|".join(map(str, ident))
        record = self.read("files", key) or {}
        digest = record.get("id") or content_id(p)
        if record.get("id") != digest:
            self.write("files", key, {"id": digest})
        self._memo[ident] = digest
        return digest


ID_HEAD = 8 << 20    # the GGUF header and metadata (architecture, tokenizer, types) fit in this
ID_BLOCK = 64 << 10  # one sampled block
ID_BLOCKS = 32       # sampled blocks through the rest of the file


def content_id(path: Path) -> str:
    """``"<size>:<sha256>"`` of a file's first ``ID_HEAD`` bytes and of
    ``ID_BLOCKS`` blocks of ``ID_BLOCK`` bytes spread evenly through the rest
    (the last block included): about 10 MiB read whatever the file's size.

    A full sha256 took half a second for the 514 MiB default target here and
    10-30 s for a 4 GB model on a board, all on a model's first call. This
    identity keys learned costs and acceptance, which are priors, never
    correctness: two files that differ only between the sampled blocks would
    share them. The full sha256 stays where correctness rests on it
    (``models fetch`` and ``models verify``, :func:`sha256_of`)."""
    size = path.stat().st_size
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(ID_HEAD))
        rest = size - ID_HEAD
        if rest > 0:
            for i in range(ID_BLOCKS):
                f.seek(ID_HEAD + max(0, rest - ID_BLOCK) * (i + 1) // ID_BLOCKS)
                h.update(f.read(ID_BLOCK))
    return f"{size}:{h.hexdigest()}"


def sha256_of(path: Path, quiet: bool = False) -> str:
    """The sha256 of a file, with a line on stderr when it takes a while
    (unless ``quiet``: ``models verify``, whose whole job it is)."""
    path = Path(path)
    size = path.stat().st_size
    if size > 256 << 20 and not quiet:  # a second or more: say why there is a pause
        print(f"specgguf: checking the sha256 of {path.name} ({size >> 20} MiB)", file=sys.stderr, flush=True)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


class PairState:
    """The records of one model pair on this machine, as one object.

    Args:
        store: where they live.
        pair: the pair's content id (the target's :func:`content_id`, then the draft's or "ngram").
    """

    def __init__(self, store: Store, pair: str) -> None:
        self.store, self.pair = store, pair

    def acceptance(self) -> Optional[dict]:
        """``{"greedy": a, "sampled": a}`` measured by calibrate(), or None."""
        return self.store.read("acceptance", self.pair)

    def save_acceptance(self, measured: dict) -> None:
        self.store.write("acceptance", self.pair, measured)

    def costs(self) -> Optional[dict]:
        """The draft's forwards against a target token as a process last timed them (a price only
        until a new process times its own: :class:`~specgguf.engine.costs.Costs`), or None."""
        return self.store.read("costs", self.pair)

    def save_costs(self, *records: dict) -> None:
        """Merge ``records`` into the stored one, in order, in one update: the target's counts each
        timed replace theirs, and its draft shape (with its age) the stored one where it has one."""
        def merge(old: Optional[dict]) -> dict:
            out = old if isinstance(old, dict) else {}
            for record in records:
                target = out.get("target") if isinstance(out.get("target"), dict) else {}
                out = {**out, **record, "target": {**target, **record.get("target", {})}}
            return out
        if records:
            self.store.update("costs", self.pair, merge)

    def evidence(self, regime: str) -> Optional[dict]:
        return self.store.read("evidence", f"{self.pair}|{regime}")

    def save_evidence(self, regime: str, record: dict) -> None:
        self.store.write("evidence", f"{self.pair}|{regime}", record)
