"""A bounded walk over a GGUF file's header, before llama.cpp parses it.

Every count and length the header declares (metadata entries, strings,
arrays, tensor infos) must fit in the bytes that follow it; a file that
declares more (damaged, truncated, or hostile: "2**60 tensors") is refused
with a clear error instead of reaching a parser that would try to allocate
it. Nothing is allocated from a declared size: the walk only moves an offset
through the memory-mapped file. Format: github.com/ggml-org/ggml/blob/master/docs/gguf.md
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

# Sizes of the fixed-size GGUF value types; 8 = string, 9 = array.
_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_MAX_DIMS = 8  # GGML_MAX_DIMS is 4; anything above 8 is damage


class _Walk:
    def __init__(self, buf, path: Path) -> None:
        self.buf, self.off, self.path, self.size = buf, 0, path, len(buf)

    def fail(self, what: str) -> None:
        raise ValueError(f"{self.path} is a damaged GGUF file: {what} at byte {self.off}")

    def take(self, n: int, what: str) -> int:
        if n < 0 or n > self.size - self.off:
            self.fail(f"{what} ({n} bytes) runs past the end of the file ({self.size} bytes)")
        start = self.off
        self.off += n
        return start

    def u32(self, what: str) -> int:
        return struct.unpack_from("<I", self.buf, self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack_from("<Q", self.buf, self.take(8, what))[0]

    def string(self, what: str) -> None:
        self.take(self.u64(f"{what} length"), what)

    def value(self, vtype: int, what: str) -> None:
        if vtype == _STRING:
            self.string(what)
        elif vtype == _ARRAY:
            etype, count = self.u32(f"{what} element type"), self.u64(f"{what} count")
            if etype == _STRING:
                if count > (self.size - self.off) // 8:
                    self.fail(f"{what} declares {count} strings")
                for _ in range(count):
                    self.string(what)
            elif etype in _SIZES:
                self.take(count * _SIZES[etype], f"{what} of {count} values")
            else:
                self.fail(f"{what} has unknown element type {etype}")
        elif vtype in _SIZES:
            self.take(_SIZES[vtype], what)
        else:
            self.fail(f"{what} has unknown value type {vtype}")


def check_header(path: Path) -> None:
    """Raise ValueError if the header of GGUF ``path`` declares more than the file holds."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size < 24:
            raise ValueError(f"{path} is a truncated GGUF file ({size} bytes)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            w = _Walk(buf, path)
            w.take(4, "magic")
            version = w.u32("version")
            if version not in (2, 3):
                w.fail(f"unsupported GGUF version {version}")
            n_tensors, n_kv = w.u64("tensor count"), w.u64("metadata count")
            # Each metadata entry and tensor info takes at least 8 + 4 bytes.
            if n_kv > size // 12 or n_tensors > size // 12:
                w.fail(f"it declares {n_tensors} tensors and {n_kv} metadata entries")
            for i in range(n_kv):
                w.string(f"metadata key {i}")
                w.value(w.u32(f"metadata {i} type"), f"metadata value {i}")
            for i in range(n_tensors):
                w.string(f"tensor {i} name")
                n_dims = w.u32(f"tensor {i} dimensions")
                if n_dims > _MAX_DIMS:
                    w.fail(f"tensor {i} declares {n_dims} dimensions")
                w.take(8 * n_dims + 4 + 8, f"tensor {i} shape, type and offset")
