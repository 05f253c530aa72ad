"""Soak: many clients, many requests of every kind, against one `specgguf serve`.

C clients (default 8) each send R requests (default 100) one after another to
a server with --parallel slots (default 4), all clients at once: random
max_tokens (1-96), temperature (0, 0.7 or 1.0, seeded or not), chat or
completion, streamed or whole, and one request in ten dropped by its client
after the first chunks (a disconnect). Reports errors (any status but 200,
any malformed body), the server's RSS after the first tenth of the requests
(warm-up) and at the end, and the aggregate tokens/s. The server's state
folder is a fresh temporary one.

Regime: load and lifetime, not speed (see bench/vs_llama_server.py for speed).

    .venv/bin/python bench/soak.py [--clients 8] [--requests 100] [--parallel 4]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import httpx
from common import PROMPTS, free_port  # bench/common.py


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def one_request(client: httpx.Client, url: str, rng: random.Random) -> tuple:
    """(status, completion tokens or 0, what went wrong or '')."""
    chat = rng.random() < 0.7
    body = {"model": "m", "max_tokens": rng.randint(1, 96), "temperature": rng.choice([0.0, 0.7, 1.0]),
            "stream": rng.random() < 0.5}
    if rng.random() < 0.5:
        body["seed"] = rng.randrange(2**31)
    prompt = rng.choice(PROMPTS)
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    path = "/v1/chat/completions" if chat else "/v1/completions"
    drop = rng.random() < 0.1
    if body["stream"] or drop:
        body["stream"] = True
        with client.stream("POST", url + path, json=body) as r:
            if r.status_code != 200:
                return r.status_code, 0, r.read().decode(errors="replace")[:200]
            n = 0
            for line in r.iter_lines():
                if drop and n >= 2:
                    return 200, 0, ""  # the client goes away mid-stream
                if line.startswith("data: ") and line != "data: [DONE]":
                    event = json.loads(line[6:])
                    if "error" in event:
                        return 200, 0, f"error event: {event['error']}"
                    n += 1
            return 200, n, ""
    r = client.post(url + path, json=body)
    if r.status_code != 200:
        return r.status_code, 0, r.text[:200]
    return 200, r.json()["usage"]["completion_tokens"], ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=100, help="requests per client (100)")
    ap.add_argument("--parallel", type=int, default=4, help="the server's slots (4)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    state = tempfile.mkdtemp(prefix="specgguf-soak-")
    log = open(os.path.join(state, "server.log"), "w+")
    proc = subprocess.Popen([sys.executable, "-m", "specgguf", "serve", "--port", str(port), "--parallel",
                             str(args.parallel), "--queue", str(args.clients)], stdout=log, stderr=log,
                            env=dict(os.environ, SPECGGUF_STATE=state))
    done, errors, rss = [0], [], {}
    lock = threading.Lock()
    total = args.clients * args.requests
    try:
        with httpx.Client(timeout=600) as c:
            while True:
                try:
                    if c.get(url + "/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    assert proc.poll() is None, "the server exited"
                    time.sleep(0.3)

        def client(i: int) -> int:
            rng, tokens = random.Random(args.seed * 1000 + i), 0
            with httpx.Client(timeout=600) as h:
                for _ in range(args.requests):
                    status, n, what = one_request(h, url, rng)
                    tokens += n
                    with lock:
                        done[0] += 1
                        if status != 200 or what:
                            errors.append((status, what))
                        if done[0] == total // 10:
                            rss["warm"] = rss_mib(proc.pid)
                        if done[0] % max(1, total // 20) == 0:
                            print(f"  {done[0]}/{total} requests, {len(errors)} errors, RSS "
                                  f"{rss_mib(proc.pid):.0f} MiB", flush=True)
            return tokens

        t0 = time.perf_counter()
        with cf.ThreadPoolExecutor(args.clients) as pool:
            tokens = sum(pool.map(client, range(args.clients)))
        wall = time.perf_counter() - t0
        rss["end"] = rss_mib(proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)
        log.seek(0)
        server_errors = [line for line in log.read().splitlines() if " 500 " in line or "Traceback" in line]
        shutil.rmtree(state, ignore_errors=True)
    print(f"\n{total} requests from {args.clients} clients, --parallel {args.parallel}: {len(errors)} errors, "
          f"{len(server_errors)} server errors logged; {tokens / wall:.1f} tok/s received over {wall:.0f} s")
    print(f"RSS after warm-up {rss['warm']:.0f} MiB, at the end {rss['end']:.0f} MiB "
          f"({(rss['end'] / rss['warm'] - 1) * 100:+.1f}%)")
    for e in errors[:5] + server_errors[:5]:
        print("  ", e)


if __name__ == "__main__":
    main()
