"""``python -m specgguf serve``: an OpenAI-compatible HTTP server with exact
speculative decoding.

Routes: ``GET /health``, ``GET /v1/models``, ``POST /v1/completions``,
``POST /v1/chat/completions`` (streaming as Server-Sent Events ending with
``data: [DONE]``). Built on Starlette and uvicorn, the ASGI stack under
llama-cpp-python's own server (FastAPI is Starlette plus pydantic models;
specgguf validates through its GenerationConfig instead, so each error names
the request field, and a board installs two small pure-Python packages).

Up to ``--parallel`` requests run at once, each in a slot of the pair's KV
caches, all verified together in one target forward per round
(:mod:`specgguf.engine.batch`); up to ``--queue`` more wait their turn, and beyond
that a request gets 503 with ``Retry-After``. Generation runs in a worker thread; the event loop only
moves bytes. A client that disconnects stops its generation within one
round. With an API key (``--api-key`` or ``$SPECGGUF_API_KEY``) every route
needs ``Authorization: Bearer KEY`` but ``GET /health``, which answers
``{"status": "ok"}`` to anyone, as llama-server's does (liveness probes
cannot send keys), and adds the model and the queue only for the key. The
server binds to 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import AsyncIterator, Iterator, Optional

import anyio

from ..completions import Shapes
from .openai_api import BadRequest, Call, error_body, parse


class Server:
    """The state behind the routes: the pair, the queue, the key, the log.

    Args:
        llm: a loaded :class:`~specgguf.SpeculativeLlama` (its ``defaults``
            are the requests' defaults).
        api_key: required as a Bearer token on every route but ``GET /health`` when set.
        queue: requests that may wait while one runs.
        model_id: the name /v1/models reports.
        verbose: log more than one line per request.
    """

    def __init__(self, llm, api_key: Optional[str] = None, queue: int = 16, model_id: Optional[str] = None,
                 verbose: bool = False) -> None:
        self.llm, self.api_key, self.queue, self.verbose = llm, api_key, queue, verbose
        self.model_id = model_id or llm.names[0]
        self.slots = llm.pair.slots  # requests that run at once
        self.pending = 0  # requests admitted: running or waiting
        self.admit = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=queue + self.slots, thread_name_prefix="specgguf-gen")
        self.stopping = threading.Event()
        self.created = int(time.time())

    # -- admission -------------------------------------------------------------
    def enter(self) -> None:
        with self.admit:
            if self.pending >= self.queue + self.slots:
                raise BadRequest(f"the server is busy ({self.pending} requests in progress or waiting); "
                                 "retry shortly", None, "overloaded", 503, "server_error")
            self.pending += 1

    def leave(self) -> None:
        with self.admit:
            self.pending -= 1

    def authorized(self, header: Optional[str]) -> bool:
        if not self.api_key:
            return True
        want = f"Bearer {self.api_key}".encode()
        return header is not None and hmac.compare_digest(header.encode(), want)

    def log(self, status: int, path: str, call: Optional[Call], result, seconds: float, note: str = "") -> None:
        line = f"specgguf: {status} {path} {seconds:.2f} s" + (f" {note}" if note else "")
        if result is not None:
            s = result.stats
            line += (f" {s['completion_tokens']} tokens {s['tokens_per_second']:.1f} tok/s acceptance "
                     f"{s['acceptance_rate']:.2f} ({s['finish_reason']})")
            if self.verbose:
                line += f" k_hist {s['k_hist']} verification {s['verification']} prompt {s['prompt_tokens']}"
        print(line, file=sys.stderr, flush=True)

    # -- generation (in a worker thread) -----------------------------------------
    def items(self, call: Call, cancel: threading.Event) -> Iterator:
        """The call's text pieces, then its GenerationResult."""
        if cancel.is_set() or self.stopping.is_set():
            return iter(())
        stop = lambda: cancel.is_set() or self.stopping.is_set()  # noqa: E731
        return self.llm.run(call.ids, config=call.config, should_stop=stop)

    def check(self, call: Call) -> None:
        """Tokenize the call's prompt (once: ``call.ids``), with the errors a
        call must get before it is admitted (a prompt too long for the context)."""
        try:
            call.ids = self.llm.tokenize(call.prompt, chat=call.kind == "chat")
        except (TypeError, ValueError) as e:
            raise BadRequest(str(e), "messages" if call.kind == "chat" else "prompt") from None
        if len(call.ids) >= self.llm.n_ctx:
            raise BadRequest(f"the prompt has {len(call.ids)} tokens; the context window is {self.llm.n_ctx}",
                             "messages" if call.kind == "chat" else "prompt", "context_length_exceeded")


def _sse(obj) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


_END = object()


async def _watch_disconnect(request, cancel: threading.Event, gone: threading.Event) -> None:
    """Sets ``gone`` and ``cancel`` when the client closes the connection (the
    server cannot rely on a failed write to notice: uvicorn drops writes to a
    closed connection silently). The body is read already: the next ASGI
    message is the disconnect."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    gone.set()
    cancel.set()


def _error(e: BadRequest):
    from starlette.responses import JSONResponse
    headers = {"Retry-After": "2"} if e.status == 503 else None
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


async def _health(request):
    from starlette.responses import JSONResponse
    server = request.app.state.server
    if not server.authorized(request.headers.get("authorization")):
        return JSONResponse({"status": "ok"})  # liveness only: nothing about the server
    return JSONResponse({"status": "ok", "model": server.model_id, "busy": server.pending})


async def _models(request):
    from starlette.responses import JSONResponse
    server = request.app.state.server
    return JSONResponse({"object": "list", "data": [{"id": server.model_id, "object": "model",
                                                     "created": server.created, "owned_by": "specgguf"}]})


async def _generate(request, kind: str):
    """A completion or chat request: parsed and checked here, then generated
    in the worker pool, streamed or whole."""
    from starlette.responses import StreamingResponse
    server, t0 = request.app.state.server, time.perf_counter()
    try:
        try:
            data = json.loads(await request.body())
        except (ValueError, UnicodeDecodeError):
            raise BadRequest("the request body is not valid JSON") from None
        call = parse(data, kind, server.llm.defaults)
        # Tokenizing is read-only and quick: not in the generation pool, whose threads may all be busy.
        await asyncio.get_running_loop().run_in_executor(None, server.check, call)
        server.enter()
    except BadRequest as e:
        server.log(e.status, request.url.path, None, None, time.perf_counter() - t0)
        return _error(e)
    shapes = Shapes("chatcmpl" if kind == "chat" else "cmpl", call.model or server.model_id)
    if call.stream:
        return StreamingResponse(_stream(server, request, call, shapes, t0), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    return await _respond(server, request, call, shapes, t0)


async def _completions(request):
    return await _generate(request, "completions")


async def _chat(request):
    return await _generate(request, "chat")


async def _on_http_error(request, exc):
    from starlette.responses import JSONResponse
    kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
    return JSONResponse(error_body(f"{request.method} {request.url.path}: {exc.detail}", kind),
                        status_code=exc.status_code)


async def _on_error(request, exc: Exception):
    from starlette.responses import JSONResponse
    print(f"specgguf: 500 {request.url.path}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    return JSONResponse(error_body(f"internal error: {type(exc).__name__}: {exc}", "server_error"), status_code=500)


def create_app(server: Server):
    """The Starlette application over ``server`` (every route but ``GET /health`` behind the API key when set)."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.routing import Route

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        server.stopping.set()  # running generations end within a round

    routes = [Route("/health", _health), Route("/v1/models", _models),
              Route("/v1/completions", _completions, methods=["POST"]),
              Route("/v1/chat/completions", _chat, methods=["POST"])]
    app = Starlette(routes=routes, exception_handlers={HTTPException: _on_http_error, Exception: _on_error},
                    lifespan=lifespan)
    app.state.server = server
    return _Auth(app, server)


class _Auth:
    """ASGI middleware: every route but ``GET /health`` needs the API key when one is set."""

    def __init__(self, app, server: Server) -> None:
        self.app, self.server = app, server

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and (scope.get("method"), scope.get("path")) != ("GET", "/health"):
            headers = dict(scope.get("headers") or [])
            auth = headers.get(b"authorization")
            if not self.server.authorized(auth.decode("latin-1") if auth else None):
                from starlette.responses import JSONResponse
                body = error_body("missing or invalid API key: send 'Authorization: Bearer KEY'",
                                  "invalid_request_error", None, "invalid_api_key")
                await JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _collect(server: Server, call: Call, cancel: threading.Event):
    result = None
    for item in server.items(call, cancel):
        if not isinstance(item, str):
            result = item
    return result


async def _respond(server: Server, request, call: Call, shapes: Shapes, t0: float):
    from starlette.responses import JSONResponse
    cancel = threading.Event()
    watcher = asyncio.create_task(_watch_disconnect(request, cancel, threading.Event()))
    work = asyncio.get_running_loop().run_in_executor(server.pool, _collect, server, call, cancel)
    try:
        with anyio.CancelScope(shield=True):  # the pair stays busy until the thread is done
            result = await work
    except (ValueError, TypeError, RuntimeError, OSError) as e:
        server.log(500, request.url.path, call, None, time.perf_counter() - t0)
        return JSONResponse(error_body(str(e), "server_error"), status_code=500)
    finally:
        cancel.set()
        watcher.cancel()
        server.leave()
    server.log(200, request.url.path, call, result, time.perf_counter() - t0)
    if result is None:  # the server is shutting down
        return JSONResponse(error_body("the server is shutting down", "server_error"), status_code=503)
    prefix = call.prompt if call.echo and isinstance(call.prompt, str) else ""
    body = shapes.chat_response(result) if call.kind == "chat" else shapes.text_response(result, prefix)
    return JSONResponse(body)


def _produce(server: Server, call: Call, shapes: Shapes, relay: "_Relay", put, cancel: threading.Event) -> None:
    """Runs in one worker thread from the first chunk to the last (the pair's
    lock belongs to one thread per generation); hands each chunk to ``put``."""
    prefix = call.prompt if call.echo and isinstance(call.prompt, str) else ""
    chunks = shapes.chat_chunks(relay) if call.kind == "chat" else shapes.text_chunks(relay, prefix)
    try:
        for chunk in chunks:
            put(chunk)
            if cancel.is_set():
                break
    except Exception as e:  # reported to the client as an error event
        put(e)
    finally:
        chunks.close()
        relay.close()  # ends the run: the models are clean for the next request
        put(_END)


async def _stream(server: Server, request, call: Call, shapes: Shapes, t0: float) -> AsyncIterator[bytes]:
    """SSE events of one streaming call. If the client goes away, closing this
    generator sets ``cancel``: the generation stops within one round, and the
    next request waits until it has."""
    loop, queue, cancel, gone = asyncio.get_running_loop(), asyncio.Queue(), threading.Event(), threading.Event()
    relay = _Relay(server.items(call, cancel))
    put = lambda item: loop.call_soon_threadsafe(queue.put_nowait, item)  # noqa: E731
    producer = loop.run_in_executor(server.pool, _produce, server, call, shapes, relay, put, cancel)
    watcher = asyncio.create_task(_watch_disconnect(request, cancel, gone))
    finished, sent, items = False, 0, [None]
    try:
        while items[-1] is not _END and not gone.is_set():
            # All a round produced at once, in one write: a wake-up and a send
            # per token would take CPU from the generation on a small board.
            items = [await queue.get()]
            while items[-1] is not _END and not queue.empty():
                items.append(queue.get_nowait())
            events = [i for i in items if i is not _END]
            failed = next((i for i in events if isinstance(i, Exception)), None)
            if failed is not None:
                yield _sse(error_body(f"{type(failed).__name__}: {failed}", "server_error"))
                break
            if events:
                yield b"".join(_sse(i) for i in events)
                sent += len(events)
        if call.include_usage and relay.result is not None:
            yield _sse({**shapes.head("chat.completion.chunk" if call.kind == "chat" else "text_completion"),
                        "choices": [], "usage": shapes.usage(relay.result.stats)})
        yield b"data: [DONE]\n\n"
        finished = not gone.is_set()
    finally:
        cancel.set()
        watcher.cancel()
        # A disconnect may have cancelled this task: wait for the generation
        # to end anyway (within a round), shielded, before the next one runs.
        with anyio.CancelScope(shield=True):
            await producer
        server.leave()  # 499: the client closed the connection first (as nginx logs it)
        server.log(200 if finished else 499, request.url.path, call, relay.result, time.perf_counter() - t0,
                   "" if finished else f"(client gone after {sent} chunks)")


class _Relay:
    """An iterator over a run that remembers its result (for the log and usage)."""

    def __init__(self, items: Iterator) -> None:
        self.items, self.result = items, None

    def __iter__(self):
        for item in self.items:
            if not isinstance(item, str):
                self.result = item
            yield item

    def close(self) -> None:
        close = getattr(self.items, "close", None)
        if close:
            close()


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
    target, draft = args.target, args.draft
    if target is None or draft is None:
        dt, dd = models.default_pair()
        target, draft = target or dt, draft or dd
    weights = sum(models.resolve_model(m).stat().st_size for m in (target, draft) if m != "ngram")
    # KV per token is under 1/2000 of the weights for the models specgguf pairs (e.g. 8B: 128 KiB of 4.9 GB).
    per_slot = weights * args.ctx / 2000
    return max(1, min(AUTO_SLOTS, int((avail - weights) * 0.8 // max(per_slot, 1))))


def main(argv) -> int:
    from ..options import Parser, add_generation_args, add_model_args, config_from_args, load_pair
    from ..llama.rpc import is_loopback
    ap = Parser(prog="python -m specgguf serve", description=__doc__.split("\n\n")[0] + "\n\n" +
                "Point any OpenAI client at http://HOST:PORT/v1 (see README: OpenAI-compatible server).")
    add_model_args(ap)
    add_generation_args(ap)
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1: this machine only)")
    ap.add_argument("--port", type=int, default=8080, help="port (8080)")
    ap.add_argument("--api-key", default=os.environ.get("SPECGGUF_API_KEY"),
                    help="require 'Authorization: Bearer KEY' on every route but GET /health, which "
                    "then says only that the server is up (default: $SPECGGUF_API_KEY)")
    ap.add_argument("--parallel", default="auto", help="requests run at once, each in a slot of --ctx "
                    "tokens, verified together in one target forward per round (default 'auto': "
                    f"up to {AUTO_SLOTS} as the memory allows, said at start)")
    ap.add_argument("--queue", type=int, default=16, help="requests that may wait while the slots are busy (16); "
                    "beyond that: 503 with Retry-After")
    ap.add_argument("--model-id", help="the model name /v1/models reports (default: the target's file name)")
    args = ap.parse_args(argv)
    if not 0 <= args.port < 65536:
        ap.error(f"--port must be in [0, 65535], got {args.port}")
    if args.queue < 0:
        ap.error(f"--queue must be >= 0, got {args.queue}")
    try:
        parallel = None if args.parallel == "auto" else int(args.parallel)
        if parallel is not None and not 1 <= parallel <= 64:
            raise ValueError
    except ValueError:
        ap.error(f"--parallel must be 'auto' or an int in [1, 64], got {args.parallel!r}")
    if not is_loopback(args.host) and not args.api_key:
        print(f"specgguf: warning: serving on {args.host} without an API key: anyone who can reach this port "
              "can use it (set --api-key or $SPECGGUF_API_KEY)", file=sys.stderr)
    if parallel is None:
        parallel = auto_slots(args)
    llm = load_pair(args, config=config_from_args(args), parallel=parallel)
    server = Server(llm, args.api_key, args.queue, args.model_id, args.verbose)
    import uvicorn
    print(f"specgguf: serving {server.model_id} on http://{args.host}:{args.port}/v1 with {server.slots} "
          f"slot{'s' if server.slots > 1 else ''} of {llm.n_ctx} tokens (--parallel, --ctx)", file=sys.stderr,
          flush=True)
    uvicorn.run(create_app(server), host=args.host, port=args.port, access_log=False,
                log_level="info" if args.verbose else "warning", timeout_graceful_shutdown=5)
    return 0
