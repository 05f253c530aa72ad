"""Plain against speculative decoding with the target on two rpc-server
workers, at several network round-trip times.

The workers run on this machine (127.0.0.1). Network delay is added by a
small user-space TCP relay in front of each worker that holds every chunk
for half the round-trip time in each direction (order and bandwidth kept).
On a kernel with sch_netem, `tc qdisc add dev lo root netem delay Xms` in a
network namespace does the same (this machine's kernel has no netem).

Expectation: each target forward pays at least one round trip per layer
split (the graph crosses the workers), so plain decoding pays it per token
and speculation once per K+1 tokens: the speedup grows with the delay.
Regime: the default 135M pair, the target's layers over two loopback
workers, 1 thread each; the draft local.

    .venv/bin/python bench/rpc.py [--tokens 64] [--delays 0,0.5,2,5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
from common import PROMPTS as ALL_PROMPTS, free_port  # bench/common.py

PROMPTS = ALL_PROMPTS[:2]


class DelayRelay:
    """127.0.0.1:port -> 127.0.0.1:target, each chunk held ``one_way`` seconds per direction."""

    def __init__(self, target: int, one_way: float) -> None:
        self.port, self.target, self.one_way = free_port(), target, one_way
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(self._serve(), self.loop).result()

    async def _serve(self):
        self.server = await asyncio.start_server(self._client, "127.0.0.1", self.port)

    async def _pipe(self, reader, writer):
        queue: asyncio.Queue = asyncio.Queue()

        async def send():
            while (item := await queue.get()) is not None:
                due, data = item
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                writer.write(data)
                await writer.drain()
            writer.close()

        task = asyncio.create_task(send())
        while data := await reader.read(1 << 20):
            queue.put_nowait((time.monotonic() + self.one_way, data))
        queue.put_nowait(None)
        await task

    async def _client(self, reader, writer):
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target)
        for s in (writer, up_w):
            s.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(self._pipe(reader, up_w), self._pipe(up_r, writer), return_exceptions=True)

    def close(self):
        self.loop.call_soon_threadsafe(self.server.close)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--delays", default="0,0.5,2,5", help="round-trip times to add, in ms")
    ap.add_argument("--threads", type=int, default=2, help="local threads (the draft)")
    args = ap.parse_args()
    os.environ["SPECGGUF_STATE"] = tempfile.mkdtemp(prefix="specgguf-rpc-")
    from specgguf.api import SpeculativeLlama
    ports = [free_port() for _ in range(2)]
    workers = [subprocess.Popen([sys.executable, "-m", "specgguf", "rpc-server", "--port", str(p), "--threads", "1"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for p in ports]
    time.sleep(1.5)
    print(f"default pair; target over 2 loopback rpc-server workers (1 thread each), draft local; greedy; "
          f"2 prompts x {args.tokens} tokens x 2")
    print(f"{'RTT added':>9} {'plain tok/s':>11} {'spec k=auto':>11} {'speedup':>8} {'spec k=4':>9} {'speedup':>8}")
    try:
        for rtt in (float(x) for x in args.delays.split(",")):
            relays = [DelayRelay(p, rtt / 2000) for p in ports]
            llm = SpeculativeLlama("smollm2-135m-f32", "smollm2-135m-q4_1", n_ctx=512, n_threads=args.threads,
                                   rpc=",".join(f"127.0.0.1:{r.port}" for r in relays))
            got = {}
            for k in (0, "auto", 4):
                tps = []
                for _ in range(2):
                    for p in PROMPTS:
                        llm.reset()
                        tps.append(llm.generate([{"role": "user", "content": p}], max_tokens=args.tokens,
                                                k=k).stats["tokens_per_second"])
                got[k] = float(np.median(tps))
            print(f"{rtt:>7.1f}ms {got[0]:>11.1f} {got['auto']:>11.1f} {got['auto'] / got[0]:>7.2f}x "
                  f"{got[4]:>9.1f} {got[4] / got[0]:>7.2f}x", flush=True)
            llm.pair.target.model.close()
            for r in relays:
                r.close()
    finally:
        for w in workers:
            w.kill()


if __name__ == "__main__":
    main()
