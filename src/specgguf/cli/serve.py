"""``python -m specgguf serve``'s command line: options, slots, sockets, then uvicorn.

The addresses are bound here, before any model loads, so a busy port or an
unknown host is one line and exit 1; the sockets are handed to uvicorn, which
lets one server listen on several addresses (``--host 127.0.0.1,::1``).
"""

from __future__ import annotations

import os
import sys
from typing import List, Sequence

from ..serve.server import Server, create_app


AUTO_SLOTS = 4  # as llama-server's default; fewer when the memory is short


def auto_slots(args) -> int:
    """``--parallel auto``: AUTO_SLOTS slots, fewer if their KV caches
    would not fit in the memory available (estimated from the files'
    sizes: a slot of --ctx tokens costs far less than the weights); 1 with
    --rpc (slots need local models)."""
    from ..llama.model import available_memory
    if args.rpc:
        return 1
    avail = available_memory()
    if avail is None:
        return AUTO_SLOTS
    from ..llama import models
    from .options import pair_names
    weights = sum(models.resolve_model(m).stat().st_size for m in pair_names(args) if m != "ngram")
    # KV per token is under 1/2000 of the weights for the models specgguf pairs (e.g. 8B: 128 KiB of 4.9 GB).
    per_slot = weights * args.ctx / 2000
    return max(1, min(AUTO_SLOTS, int((avail - weights) * 0.8 // max(per_slot, 1))))


def listen(hosts: Sequence[str], port: int) -> list:
    """Listening sockets for ``port`` on every address of ``hosts``; OSError
    with one clear line (a busy port, an address not on this machine, a
    name that does not resolve) before anything is served."""
    import socket
    socks: List[socket.socket] = []
    try:
        for host in hosts:
            try:
                infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            except socket.gaierror as e:
                raise OSError(f"cannot listen on {host!r}: the name does not resolve ({e.strerror})") from None
            family, _, _, _, addr = infos[0]
            sock = socket.socket(family, socket.SOCK_STREAM)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(addr)
            except OSError as e:
                why = "the port is in use (another server?)" if e.errno == 98 else e.strerror
                raise OSError(f"cannot listen on {_url(host, port)}: {why}") from None
            sock.listen(128)
            sock.set_inheritable(True)
    except OSError:
        for sock in socks:
            sock.close()
        raise
    return socks


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def build_parser():
    """The serve command's options: the model and generation options, then the server's own."""
    from .options import Parser, add_generation_args, add_model_args
    from ..serve import server as module
    ap = Parser(prog="python -m specgguf serve", description=module.__doc__.split("\n\n")[0] + "\n\n" +
                "Point any OpenAI client at http://HOST:PORT/v1 (see README: OpenAI-compatible server).")
    add_model_args(ap)
    add_generation_args(ap)
    ap.add_argument("--host", default="127.0.0.1", help="address(es) to listen on, comma-separated, e.g. "
                    "'127.0.0.1,::1' (default 127.0.0.1: this machine only)")
    ap.add_argument("--port", type=int, default=8080, help="port (8080)")
    ap.add_argument("--api-key", default=os.environ.get("SPECGGUF_API_KEY"),
                    help="require 'Authorization: Bearer KEY' on every route but GET /health, which "
                    "then says only that the server is up (default: $SPECGGUF_API_KEY)")
    ap.add_argument("--parallel", default="auto", help="requests run at once, each in a slot of --ctx "
                    "tokens, verified together in one target forward per round (default 'auto': "
                    f"up to {AUTO_SLOTS} as the memory allows, said at start)")
    ap.add_argument("--cache-ram", type=int, default=None, metavar="MiB",
                    help="host memory for the KV caches of slots a new request took, so that a "
                    "conversation coming back reads only its new turn (as llama-server's --cache-ram); "
                    "default 1024, at most a quarter of the memory available at start; 0: none kept")
    ap.add_argument("--queue", type=int, default=16, help="requests that may wait while the slots are busy (16); "
                    "beyond that: 503 with Retry-After")
    ap.add_argument("--model-id", help="the model name /v1/models reports (default: the target's file name)")
    ap.add_argument("--cors-origins", default="", help="web origins allowed to call the server from a browser, "
                    "comma-separated (e.g. 'http://localhost:3000', or '*' for any); default none")
    return ap


def _checked(ap, args) -> tuple:
    """``(hosts, parallel)`` from the options (``parallel`` None for 'auto'),
    or the usage error naming the option."""
    hosts = [h.strip() for h in args.host.split(",") if h.strip()]
    if not hosts:
        ap.error("--host needs at least one address")
    if not 0 <= args.port < 65536:
        ap.error(f"--port must be in [0, 65535], got {args.port}")
    if args.queue < 0:
        ap.error(f"--queue must be >= 0, got {args.queue}")
    if args.cache_ram is not None and args.cache_ram < 0:
        ap.error(f"--cache-ram must be >= 0 MiB (0: keep none), got {args.cache_ram}")
    try:
        parallel = None if args.parallel == "auto" else int(args.parallel)
        if parallel is not None and not 1 <= parallel <= 64:
            raise ValueError
    except ValueError:
        ap.error(f"--parallel must be 'auto' or an int in [1, 64], got {args.parallel!r}")
    return hosts, parallel


def main(argv) -> int:
    from .options import config_from_args, load_pair
    from ..llama.rpc import is_loopback
    ap = build_parser()
    args = ap.parse_args(argv)
    hosts, parallel = _checked(ap, args)
    try:
        socks = listen(hosts, args.port)  # before loading: a busy port is said at once
    except OSError as e:
        print(f"specgguf: error: {e}", file=sys.stderr)
        return 1
    for host in hosts:
        if not is_loopback(host) and not args.api_key:
            print(f"specgguf: warning: serving on {host} without an API key: anyone who can reach this port "
                  "can use it (set --api-key or $SPECGGUF_API_KEY)", file=sys.stderr)
    if parallel is None:
        parallel = auto_slots(args)
    llm = load_pair(args, config=config_from_args(args), parallel=parallel, cache_ram=args.cache_ram)
    server = Server(llm, args.api_key, args.queue, args.model_id, args.verbose)
    import uvicorn
    origins = [o.strip() for o in args.cors_origins.split(",") if o.strip()]
    port = socks[0].getsockname()[1] if args.port == 0 else args.port
    where = ", ".join(_url(h, port) + "/v1" for h in hosts)
    print(f"specgguf: serving {server.model_id} on {where} with {server.slots} "
          f"slot{'s' if server.slots > 1 else ''} of {llm.n_ctx} tokens (--parallel, --ctx); a chat page at "
          f"{_url(hosts[0], port)}/", file=sys.stderr, flush=True)
    config = uvicorn.Config(create_app(server, origins), access_log=False, timeout_graceful_shutdown=5,
                            log_level="info" if args.verbose else "warning")
    uvicorn.Server(config).run(sockets=socks)
    return 0
