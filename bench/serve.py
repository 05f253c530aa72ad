"""The OpenAI-compatible server against the same generation in-process, and
against llama-cpp-python's own server, in one run.

1. `python -m specgguf serve` (default pair, greedy, streaming): per request,
   time to first token and tokens/s through HTTP; the same prompts generated
   in-process by a SpeculativeLlama with the same settings. HTTP overhead =
   1 - HTTP tok/s / in-process tok/s (each request paired with an in-process
   run of the same prompt right before it).
2. `python -m llama_cpp.server` on the same target file, without a draft and
   with its prompt-lookup draft, same prompts, same streaming client
   (needs `pip install 'llama-cpp-python[server]'`; skipped if missing).
3. The specgguf server's RSS after 20 and after 200 requests.

Regime: the default 135M pair on this machine (see BENCHMARKS.md).

    .venv/bin/python bench/serve.py [--tokens 64] [--requests 200] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import httpx
import numpy as np
from common import PROMPTS as ALL_PROMPTS, free_port  # bench/common.py

PROMPTS = ALL_PROMPTS[:3]

# One client for every request: a new httpx client per request spends tens of
# milliseconds building its TLS context, which is the client's cost, not the server's.
CLIENT = httpx.Client(timeout=300)


def start(cmd, url, env=None):
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    for _ in range(600):
        try:
            if CLIENT.get(url + "/v1/models", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd[:4]} exited with {proc.returncode}")
    raise RuntimeError("the server did not start")


def stream(url, prompt, tokens):
    """(time to first token, tokens/s after it, completion tokens) of one streamed chat request."""
    body = {"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first, n, pieces = None, None, 0
    with CLIENT.stream("POST", url + "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                n = chunk["usage"]["completion_tokens"]
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                pieces += 1
                first = first or time.perf_counter()
    end = time.perf_counter()
    n = n or pieces
    return first - t0, n / (end - t0), n


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    env = dict(os.environ, SPECGGUF_STATE=tempfile.mkdtemp(prefix="specgguf-serve-"))
    os.environ["SPECGGUF_STATE"] = env["SPECGGUF_STATE"]
    import specgguf
    from specgguf.llama import models
    tname, dname = models.default_pair()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    srv = start([sys.executable, "-m", "specgguf", "serve", "--port", str(port), "--threads", str(args.threads)],
                url, env)
    local = specgguf.SpeculativeLlama(tname, dname, n_threads=args.threads)
    print(f"1. specgguf serve vs in-process, greedy, {args.tokens} tokens, streamed; default pair, "
          f"{args.threads} threads (server and in-process take turns: never both at once)")
    rows = []
    for rep in range(3):
        for p in PROMPTS:
            t0, first, res = time.perf_counter(), None, None  # both keep their KV cache between requests
            for item in local.run([{"role": "user", "content": p}], max_tokens=args.tokens):
                if isinstance(item, str):
                    first = first or time.perf_counter()
                else:
                    res = item
            in_tps = res.stats["completion_tokens"] / (time.perf_counter() - t0)
            ttft, http_tps, n = stream(url, p, args.tokens)
            rows.append((first - t0, in_tps, ttft, http_tps))
            print(f"  prompt {PROMPTS.index(p) + 1} rep {rep + 1}: in-process TTFT {1e3 * (first - t0):.0f} ms "
                  f"{in_tps:.1f} tok/s; HTTP TTFT {1e3 * ttft:.0f} ms {http_tps:.1f} tok/s", flush=True)
    r = np.array(rows)
    print(f"  median: in-process {np.median(r[:, 1]):.1f} tok/s, HTTP {np.median(r[:, 3]):.1f} tok/s; HTTP overhead "
          f"{100 * (1 - np.median(r[:, 3] / r[:, 1])):.1f}% of tokens/s (median of pairs); TTFT "
          f"{1e3 * np.median(r[:, 0]):.0f} vs {1e3 * np.median(r[:, 2]):.0f} ms")

    print(f"\n3. specgguf serve RSS over {args.requests} requests ({args.tokens // 2} tokens each)")
    rss = {}
    for i in range(1, args.requests + 1):
        stream(url, PROMPTS[i % 3] + f" (request {i})", args.tokens // 2)
        if i in (20, args.requests):
            rss[i] = rss_mib(srv.pid)
            print(f"  after {i} requests: {rss[i]:.0f} MiB", flush=True)
    print(f"  change from 20 to {args.requests}: {100 * (rss[args.requests] / rss[20] - 1):+.1f}%")
    srv.terminate()
    srv.wait()

    print("\n2. llama-cpp-python's server on the same target, same prompts, greedy, streamed")
    try:
        import llama_cpp.server  # noqa: F401
    except ImportError as e:
        print(f"  skipped: {e} (pip install 'llama-cpp-python[server]')")
        return
    for label, extra in (("no draft", []), ("prompt-lookup draft", ["--draft_model", "prompt-lookup-decoding"])):
        port = free_port()
        url2 = f"http://127.0.0.1:{port}"
        proc = start([sys.executable, "-m", "llama_cpp.server", "--model", str(models.fetch(tname)), "--port",
                      str(port), "--n_threads", str(args.threads), "--n_threads_batch", str(args.threads),
                      "--n_ctx", "2048", *extra], url2)
        got = [stream(url2, p, args.tokens) for p in PROMPTS for _ in range(2)]
        print(f"  llama_cpp.server, {label}: median TTFT {1e3 * np.median([g[0] for g in got]):.0f} ms, "
              f"{np.median([g[1] for g in got]):.1f} tok/s", flush=True)
        proc.terminate()
        proc.wait()
    srv = start([sys.executable, "-m", "specgguf", "serve", "--port", str(port + 1), "--threads", str(args.threads)],
                f"http://127.0.0.1:{port + 1}", env)
    got = [stream(f"http://127.0.0.1:{port + 1}", p, args.tokens) for p in PROMPTS for _ in range(2)]
    print(f"  specgguf serve (same client, same run): median TTFT {1e3 * np.median([g[0] for g in got]):.0f} ms, "
          f"{np.median([g[1] for g in got]):.1f} tok/s")
    srv.terminate()
    srv.wait()


if __name__ == "__main__":
    main()
