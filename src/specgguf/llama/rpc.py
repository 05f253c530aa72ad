"""The target on llama.cpp's RPC backend: its layers on ``rpc-server``
workers on other machines, the draft local, speculation amortizing the
network (K+1 tokens per round trip instead of one).

* :class:`Workers` parses ``host:port,host:port`` and checks each worker
  before anything loads: a TCP connection and llama.cpp's RPC HELLO within a
  bounded time, so an unreachable worker or one running another llama.cpp
  build gives a clear error naming it.
* :class:`RemoteModel` runs the target in a child process and serves the
  :class:`~specgguf.llama.model.LlamaModel` interface to the adapter. Why a
  child: llama.cpp's RPC client aborts the whole process when a worker dies
  (``GGML_ABORT("Remote RPC server crashed ...")``); in a child, that abort
  becomes a clear error naming the worker, every forward has a deadline, and
  the caller's process stays usable and can load again. Logits come back
  ``[n, V]`` float32 over a socket pair, O(K x V) per round.
* :func:`server_binary` finds llama.cpp's own ``rpc-server`` (built by
  scripts/setup.sh from the same pinned source as the Python bindings), which
  ``python -m specgguf rpc-server`` runs.

Security: the RPC protocol has no authentication and no encryption. Anyone
who can reach a worker's port can run computations on it and read what it
holds. Workers bind to 127.0.0.1 unless told otherwise; use them only on a
network you trust.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import pickle
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

from ..ops.drafter import common_prefix

DEFAULT_PORT = 50052
PROTO_MAJOR, PROTO_MINOR = 7, 0   # ggml-rpc.h of the pinned llama.cpp
_HELLO, _CAPS = 14, 24            # RPC_CMD_HELLO, RPC_CONN_CAPS_SIZE


class RpcError(ConnectionError):
    """A worker cannot be reached, speaks another protocol, or died."""


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def hello(ep: Endpoint, timeout: float) -> Tuple[int, int, int]:
    """llama.cpp's RPC HELLO: the worker's protocol version (major, minor, patch)."""
    try:
        with socket.create_connection((ep.host, ep.port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(bytes([_HELLO]) + struct.pack("<Q", _CAPS) + bytes(_CAPS))
            head = _recv(s, 8)
            size = struct.unpack("<Q", head)[0]
            if size < 3 or size > 4096:
                raise RpcError(f"rpc worker {ep} answered HELLO with {size} bytes: not a llama.cpp "
                               f"rpc-server of protocol {PROTO_MAJOR}.x")
            major, minor, patch = _recv(s, size)[:3]
            return major, minor, patch
    except socket.timeout:
        raise RpcError(f"rpc worker {ep} did not answer within {timeout:g} s") from None
    except ConnectionRefusedError:
        raise RpcError(f"rpc worker {ep} is unreachable: connection refused (is its rpc-server running?)") from None
    except (EOFError, ConnectionError) as e:
        raise RpcError(f"rpc worker {ep} closed the connection during HELLO ({e}): another llama.cpp "
                       f"build? This one speaks protocol {PROTO_MAJOR}.{PROTO_MINOR}") from None
    except OSError as e:
        raise RpcError(f"rpc worker {ep} is unreachable: {e.strerror or e}") from None


def _recv(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        part = s.recv(n - len(out))
        if not part:
            raise EOFError("connection closed")
        out += part
    return out


class Workers:
    """The rpc-server workers a model's layers go to.

    Args:
        endpoints: ``host:port`` each.
        timeout: seconds to wait for each worker's HELLO, and for one forward.
    """

    def __init__(self, endpoints: Sequence[Endpoint], timeout: float = 120.0) -> None:
        if not endpoints:
            raise ValueError("rpc: no worker given")
        self.endpoints = tuple(endpoints)
        self.timeout = timeout

    @classmethod
    def parse(cls, spec: Union[None, str, Sequence[str]], timeout: float = 120.0) -> Optional["Workers"]:
        """``"host:port,host:port"`` (or a list of ``host:port``); None or "" is no RPC."""
        if not spec:
            return None
        items = spec.split(",") if isinstance(spec, str) else list(spec)
        eps = []
        for item in (str(i).strip() for i in items):
            host, sep, port = item.rpartition(":")
            host = host.strip("[]")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"rpc: {item!r} is not host:port (for example 192.168.1.20:{DEFAULT_PORT})")
            eps.append(Endpoint(host, int(port)))
        if len(set(eps)) != len(eps):
            raise ValueError("rpc: a worker is named twice")
        return cls(eps, timeout)

    def key(self) -> str:
        return "rpc " + ",".join(map(str, self.endpoints))

    def check(self, timeout: float = 5.0) -> None:
        """Every worker answers HELLO with this build's protocol, within ``timeout`` each."""
        for ep in self.endpoints:
            major, minor, patch = hello(ep, timeout)
            if major != PROTO_MAJOR or minor > PROTO_MINOR:
                raise RpcError(f"rpc worker {ep} runs llama.cpp RPC protocol {major}.{minor}.{patch}; this "
                               f"build speaks {PROTO_MAJOR}.{PROTO_MINOR}: run the same specgguf (and "
                               f"llama.cpp) version on every machine")

    def first_unreachable(self, timeout: float = 3.0) -> Optional[str]:
        """A description of the first worker that does not answer now, or None."""
        for ep in self.endpoints:
            try:
                hello(ep, timeout)
            except RpcError as e:
                return str(e)
        return None


class RemoteModel:
    """A model on the workers, served by a child process (see the module docstring).

    Args:
        path: the GGUF file (read by the child; weights go to the workers).
        workers: the checked :class:`Workers`.
        vocab_llm: a vocab-only ``llama_cpp.Llama`` of the same file, for the
            tokenizer and the vocabulary check in this process.
        n_ctx, n_threads: the context window and the local threads.
        n_vocab: width of the logit rows returned (>= the model's own vocab).
        tensor_split: share of layers per worker (None: by free memory).
        verbose: let llama.cpp log in the child (else its errors only).
    """

    def __init__(self, path: Path, workers: Workers, vocab_llm, n_ctx: int, n_threads: int,
                 n_vocab: Optional[int] = None, tensor_split: Optional[Sequence[float]] = None,
                 verbose: bool = False) -> None:
        import llama_cpp
        self.llm, self.workers = vocab_llm, workers
        self.vocab = llama_cpp.llama_model_get_vocab(vocab_llm.model)
        self.model_vocab = int(llama_cpp.llama_vocab_n_tokens(self.vocab))
        self.n_vocab = n_vocab or self.model_vocab
        self.tokens: List[int] = []
        self.seconds = 0.0
        self.dead: Optional[str] = None
        self._start(dict(path=str(path), endpoints=[str(e) for e in workers.endpoints], n_ctx=n_ctx,
                         n_threads=n_threads, n_vocab=self.n_vocab, tensor_split=list(tensor_split or []),
                         verbose=verbose))

    def _start(self, spec: dict) -> None:
        parent, child = socket.socketpair()
        self._log = tempfile.TemporaryFile()
        env = dict(os.environ, GGML_NO_BACKTRACE="1")  # abort at once, no debugger attach
        self._proc = subprocess.Popen([sys.executable, "-m", "specgguf.llama.rpc", str(child.fileno())],
                                      pass_fds=[child.fileno()], stdout=self._log, stderr=self._log, env=env)
        child.close()
        self._conn = Connection(parent.detach())
        self.n_ctx = int(self._call(("load", spec), timeout=None)["n_ctx"])  # sends the weights: no deadline

    def _call(self, message: tuple, timeout: Optional[float]):
        if self.dead:
            raise RpcError(f"{self.dead}; load the model again")
        try:
            self._conn.send_bytes(pickle.dumps(message))
            deadline = None if timeout is None else time.monotonic() + timeout
            while not self._conn.poll(1.0):
                if self._proc.poll() is not None:
                    raise EOFError
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError
            status, payload = pickle.loads(self._conn.recv_bytes())
        except (EOFError, OSError, TimeoutError) as e:
            self._fail(e)
        if status != "ok":
            raise RpcError(payload)
        return payload

    def _fail(self, why: BaseException) -> None:
        self._proc.kill()
        self._proc.wait()
        who = self.workers.first_unreachable()
        if who:
            self.dead = f"{who} (it stopped answering while the model ran)"
        elif isinstance(why, TimeoutError):
            self.dead = f"the rpc workers {self.workers.key()[4:]} did not finish a forward within {self.workers.timeout:g} s"
        else:
            self._log.seek(0)
            tail = self._log.read().decode("utf-8", "replace").strip().splitlines()[-3:]
            self.dead = "the RPC target process ended: " + (" | ".join(tail) or f"exit code {self._proc.returncode}")
        raise RpcError(self.dead) from None

    def lag(self, seq: Sequence[int], slot: int = 0, n_logits: int = 1) -> int:
        """Tokens :meth:`eval` of ``seq`` with ``n_logits`` rows would evaluate:
        those the workers' cache lacks, and at least ``n_logits``."""
        return len(seq) - common_prefix(self.tokens, seq, max(0, len(seq) - n_logits))

    def eval_many(self, work: Sequence[tuple]) -> List[np.ndarray]:
        """:meth:`eval` for ``(slot, seq, n_logits[, proposed])`` items, the
        rounds' protocol; a model on the workers holds one sequence (slot 0)."""
        if any(item[0] != 0 for item in work):
            raise ValueError("a model on rpc workers holds one sequence (slot 0): use parallel=1 with rpc")
        return [self.eval(*item[1:]) for item in work]

    def eval(self, seq: Sequence[int], n_logits: int, proposed: int = 0) -> np.ndarray:
        """As :meth:`~specgguf.llama.model.LlamaModel.eval`, on the workers."""
        t0 = time.perf_counter()
        try:
            data = self._call(("eval", (list(seq), n_logits, proposed)), timeout=self.workers.timeout)
        except BaseException:
            self.tokens = []
            raise
        finally:
            self.seconds += time.perf_counter() - t0
        self.tokens = list(seq)
        return np.frombuffer(data, dtype=np.float32).reshape(n_logits, self.n_vocab).copy()

    def reset(self) -> None:
        self.tokens = []
        if not self.dead:
            self._call(("reset", None), timeout=self.workers.timeout)

    def close(self) -> None:
        if getattr(self, "_proc", None) is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    __del__ = close


# ---- the child process --------------------------------------------------------

class _Handle:
    """What LlamaModel needs of a Llama: the model and context pointers."""

    def __init__(self, model, ctx) -> None:
        self.model, self.ctx, self.n_tokens = model, ctx, 0


def _load_on_workers(path: str, endpoints: List[str], n_ctx: int, n_threads: int, tensor_split: List[float]):
    import llama_cpp
    lib = Path(llama_cpp.__file__).parent / "lib"
    rpc, base = ctypes.CDLL(str(lib / "libggml-rpc.so")), ctypes.CDLL(str(lib / "libggml-base.so"))
    rpc.ggml_backend_rpc_add_server.restype = ctypes.c_void_p
    rpc.ggml_backend_rpc_add_server.argtypes = [ctypes.c_char_p]
    base.ggml_backend_reg_dev_count.restype = ctypes.c_size_t
    base.ggml_backend_reg_dev_count.argtypes = [ctypes.c_void_p]
    base.ggml_backend_reg_dev_get.restype = ctypes.c_void_p
    base.ggml_backend_reg_dev_get.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    devices = []
    for ep in endpoints:
        reg = rpc.ggml_backend_rpc_add_server(ep.encode())
        if not reg:
            raise RpcError(f"rpc worker {ep} reports no device")
        devices += [base.ggml_backend_reg_dev_get(reg, i) for i in range(base.ggml_backend_reg_dev_count(reg))]
    keep = (ctypes.c_void_p * (len(devices) + 1))(*devices, None)
    mp = llama_cpp.llama_model_default_params()
    mp.devices = ctypes.cast(keep, ctypes.c_void_p).value
    mp.n_gpu_layers = 999  # every layer on the workers
    if tensor_split:
        split = (ctypes.c_float * llama_cpp.llama_max_devices())(*tensor_split)
        mp.tensor_split = split
    model = llama_cpp.llama_model_load_from_file(path.encode(), mp)
    if not model:
        raise RpcError(f"llama.cpp could not load {path} onto the rpc workers")
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx, cp.n_threads, cp.n_threads_batch = n_ctx, n_threads, n_threads
    ctx = llama_cpp.llama_init_from_model(model, cp)
    if not ctx:
        raise RpcError("llama.cpp could not make a context for the model on the rpc workers")
    return _Handle(model, ctx), keep


def _child_main(fd: int) -> None:
    from .model import LlamaModel, set_llama_logs
    conn = Connection(fd)
    model = None
    while True:
        try:
            kind, arg = pickle.loads(conn.recv_bytes())
        except EOFError:
            return
        try:
            if kind == "load":
                set_llama_logs(arg.get("verbose", False))
                handle, _keep = _load_on_workers(arg["path"], arg["endpoints"], arg["n_ctx"], arg["n_threads"],
                                                 arg["tensor_split"])
                model = LlamaModel(handle, arg["n_vocab"])
                reply = {"n_ctx": model.n_ctx}
            elif kind == "eval":
                reply = model.eval(*arg).tobytes()
            else:
                model.reset()
                reply = None
            conn.send_bytes(pickle.dumps(("ok", reply)))
        except Exception as e:  # a clear message back; the parent raises it
            conn.send_bytes(pickle.dumps(("error", str(e))))


# ---- the worker ------------------------------------------------------------------

def server_binary() -> Path:
    """llama.cpp's rpc-server as scripts/setup.sh built it (or $SPECGGUF_RPC_SERVER)."""
    env = os.environ.get("SPECGGUF_RPC_SERVER")
    for p in [Path(env)] if env else [Path(sys.prefix) / "bin" / "ggml-rpc-server",
                                      Path(sys.executable).parent / "ggml-rpc-server"]:
        if p.is_file() and os.access(p, os.X_OK):
            return p
    found = shutil.which("ggml-rpc-server")
    if found:
        return Path(found)
    raise FileNotFoundError("llama.cpp's rpc-server is not built: run scripts/setup.sh (it builds it into the "
                            "venv from the same llama.cpp source), or set SPECGGUF_RPC_SERVER to its path")


WARNING = ("specgguf: WARNING: this worker listens on {where}. llama.cpp's RPC protocol has no "
           "authentication and no encryption: anyone who can reach this port can run computations "
           "on this machine and read what it holds. Use it only on a network you trust.")


if __name__ == "__main__":
    _child_main(int(sys.argv[1]))
