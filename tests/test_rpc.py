"""The target on llama.cpp's RPC backend, with two real rpc-server workers on
127.0.0.1 (built by scripts/setup.sh from the pinned llama.cpp source)."""

import os
import signal
import socket
import socketserver
import struct
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("llama_cpp")

from specgguf.api import SpeculativeLlama  # noqa: E402
from specgguf.llama.rpc import RpcError, Workers, server_binary  # noqa: E402
from tests.conftest import PROMPTS, msgs  # noqa: E402

try:
    server_binary()
except FileNotFoundError:
    pytest.skip("rpc-server is not built (scripts/setup.sh builds it)", allow_module_level=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Worker:
    def __init__(self, tmp, *extra):
        self.port = free_port()
        env = dict(os.environ, LLAMA_CACHE=str(tmp / f"llama-cache-{self.port}"))  # --cache stays in tmp
        self.proc = subprocess.Popen([sys.executable, "-m", "specgguf", "rpc-server", "--port", str(self.port),
                                      "--threads", "1", *extra], env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.1)
        raise AssertionError("the worker did not start")

    @property
    def endpoint(self):
        return f"127.0.0.1:{self.port}"

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rpc")
    ws = [Worker(tmp), Worker(tmp, "--cache")]
    yield ws
    for w in ws:
        w.kill()


@pytest.fixture(scope="module")
def over_rpc(workers, session_state):
    return SpeculativeLlama("smollm2-135m-f32", "smollm2-135m-q4_1", n_ctx=512, n_threads=2,
                            rpc=",".join(w.endpoint for w in workers))


def test_greedy_over_rpc_with_speculation_equals_without(over_rpc):
    # The rounds' protocol on the workers: one sequence, slot 0; another is refused, and nothing is lost.
    with pytest.raises(ValueError, match="one sequence \\(slot 0\\)"):
        over_rpc.pair.target.model.eval_many([(1, [1, 2, 3], 1)])
    for prompt in PROMPTS[:2]:
        plain = over_rpc.generate(msgs(prompt), max_tokens=40, k=0)
        spec = over_rpc.generate(msgs(prompt), max_tokens=40, k=4)
        assert spec.tokens == plain.tokens and spec.stats["drafted"] > 0


def test_greedy_over_rpc_equals_local(over_rpc):
    """The split runs the same CPU kernels on the workers as locally (the
    workers are this machine's own llama.cpp build), so the logits agree to
    rounding and greedy text is the same here."""
    local = SpeculativeLlama("smollm2-135m-f32", "smollm2-135m-q4_1", n_ctx=512, n_threads=2)
    for prompt in PROMPTS:
        assert over_rpc.generate(msgs(prompt), max_tokens=32, k=0).text == \
            local.generate(msgs(prompt), max_tokens=32, k=0).text


def test_unreachable_and_foreign_endpoints_are_named_quickly():
    t0 = time.time()
    dead = f"127.0.0.1:{free_port()}"
    with pytest.raises(RpcError, match=f"rpc worker {dead} is unreachable"):
        SpeculativeLlama("smollm2-135m-f32", "smollm2-135m-q4_1", rpc=dead, n_ctx=512)
    assert time.time() - t0 < 10
    for bad in ("nohost", "host:0", "a:1,a:1", "h:99999"):
        with pytest.raises(ValueError, match="rpc"):
            Workers.parse(bad)


class _Peer(socketserver.BaseRequestHandler):
    """A worker of another build: answers HELLO with protocol 6.1.0, or hangs up."""
    version = b"\x06\x01\x00\x00"

    def handle(self):
        self.request.recv(1 + 8 + 24)
        if self.server.speak:
            self.request.sendall(struct.pack("<Q", 4 + 24) + self.version + bytes(24))


@pytest.mark.parametrize("speak,msg", [(True, "runs llama.cpp RPC protocol 6.1.0"),
                                       (False, "closed the connection during HELLO")])
def test_a_worker_of_another_build_is_refused(speak, msg):
    srv = socketserver.TCPServer(("127.0.0.1", 0), _Peer)
    srv.speak = speak
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with pytest.raises(RpcError, match=msg):
            Workers.parse(f"127.0.0.1:{srv.server_address[1]}").check()
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_worker_that_dies_mid_generation(tmp_path):
    ws = [Worker(tmp_path), Worker(tmp_path)]
    try:
        llm = SpeculativeLlama("smollm2-135m-f32", "smollm2-135m-q4_1", n_ctx=512, n_threads=2,
                               rpc=",".join(w.endpoint for w in ws))
        it = llm.generate(msgs("Write a very long story."), max_tokens=400, k=0, stream=True)
        next(it)
        ws[1].kill()
        t0 = time.time()
        with pytest.raises(RpcError, match=f"rpc worker {ws[1].endpoint}"):
            for _ in it:
                pass
        assert time.time() - t0 < 60  # bounded: no hang
        with pytest.raises(RpcError, match="load the model again"):
            llm.generate("hi", max_tokens=2, k=0)
        ws[1] = Worker(tmp_path)  # the worker is back: this process loads again
        again = SpeculativeLlama("smollm2-135m-f32", "smollm2-135m-q4_1", n_ctx=512, n_threads=2,
                                 rpc=",".join(w.endpoint for w in ws))
        assert len(again.generate("The sea", max_tokens=4, k=0).tokens) == 4
    finally:
        for w in ws:
            if w.proc.poll() is None:
                w.kill()


def test_the_worker_command_binds_loopback_unless_told():
    r = subprocess.run([sys.executable, "-m", "specgguf", "rpc-server", "--host", "0.0.0.0", "--port",
                        str(free_port())], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--allow-remote" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "specgguf", "rpc-server", "--host", "0.0.0.0", "--port",
                          str(port), "--allow-remote", "--threads", "1"], stderr=subprocess.PIPE, text=True)
    try:
        assert "no authentication and no encryption" in p.stderr.readline()
    finally:
        p.kill()
        p.wait()


def test_the_server_says_a_worker_died(tmp_path, session_state):
    """A request after the worker died gets 503 naming it, and /health turns 503 too."""
    import httpx
    w = Worker(tmp_path)
    port = free_port()
    log = open(tmp_path / "serve.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "specgguf", "serve", "--port", str(port), "--threads", "2",
                             "--ctx", "512", "--rpc", w.endpoint, "-k", "0"], stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline and proc.poll() is None, (tmp_path / "serve.log").read_text()
            time.sleep(0.3)
        body = {"messages": msgs("Hi"), "max_tokens": 4}
        assert httpx.post(url + "/v1/chat/completions", json=body, timeout=60).status_code == 200
        w.kill()
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 503 and w.endpoint in r.json()["error"]["message"], r.text
        h = httpx.get(url + "/health", timeout=10)
        assert h.status_code == 503 and w.endpoint in h.json()["error"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if w.proc.poll() is None:
            w.kill()
