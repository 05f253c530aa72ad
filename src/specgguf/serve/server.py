"""``python -m specgguf serve``: an OpenAI-compatible HTTP server with exact
speculative decoding.

Routes: ``GET /`` (a chat page: :file:`chat.html`), ``GET /health``, ``GET /v1/models``, ``GET /v1/models/{id}``,
``POST /v1/completions``, ``POST /v1/chat/completions`` (streaming as
Server-Sent Events ending with ``data: [DONE]``), each also without ``/v1``
as llama-server serves them; CORS only for ``--cors-origins``. The command
line (options, sockets) is :mod:`specgguf.cli.serve`. Built on Starlette and uvicorn, the ASGI stack under
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
cannot send keys), and adds the model and the queue only for the key, and
``GET /``, the chat page: a browser cannot send a key with a page load,
and the page holds no data (not even the model's name), only the code that
asks for the key and sends it with every call. The server binds to
127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import AsyncIterator, Iterator, Optional, Sequence

import anyio

from ..api.speculative import merge
from ..api.completions import Shapes
from ..api.request_fields import FieldError
from ..api.tools import prepare_chat
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
        # With one slot the request's own worker decodes, so there is one worker: every forward
        # of the process on one long-lived thread (a second thread's OpenMP team would slow
        # both: see specgguf.api.merge), requests waiting their turn in its queue. With
        # several, the engine's thread decodes and each request's worker only relays.
        workers = 1 if self.slots == 1 else queue + self.slots
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="specgguf-gen")
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

    def dead(self) -> Optional[str]:
        """Why the pair can no longer generate (an RPC worker died), or None."""
        return self.llm.pair.dead

    def failure_status(self) -> int:
        """500 for a failed request, 503 when the pair itself is down."""
        return 503 if self.dead() else 500

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
                line += (f" k_hist {s['k_hist']} verification {s['verification']} prompt {s['prompt_tokens']}"
                         f" time: first round {s['first_target_seconds']:.3f} s, target {s['target_seconds']:.3f} s,"
                         f" draft {s['draft_seconds']:.3f} s, whole {s['seconds']:.3f} s")
        print(line, file=sys.stderr, flush=True)

    # -- generation (in a worker thread) -----------------------------------------
    def items(self, call: Call, cancel: threading.Event) -> Iterator:
        """``(choice index, text piece or GenerationResult)`` of every choice
        the call asks for (``n`` per prompt), run together as the slots allow."""
        if cancel.is_set() or self.stopping.is_set():
            return iter(())
        stop = lambda: cancel.is_set() or self.stopping.is_set()  # noqa: E731
        ids = [i for i in call.ids for _ in range(call.n)]
        runs = [self.llm.run(i, config=c, should_stop=stop) for i, c in zip(ids, call.configs())]
        return merge(runs, max(1, self.slots))

    def check(self, call: Call) -> None:
        """Tokenize the call's prompts (once: ``call.ids``) and compile its
        grammar, with the errors a call must get before it is admitted (a
        prompt too long for the context, a grammar llama.cpp cannot parse)."""
        param = "messages" if call.kind == "chat" else "prompt"
        try:
            if call.kind == "chat":  # one conversation: its template, tools and tool grammar
                chat = prepare_chat(self.llm, call.prompt, call.tools, call.config.grammar)
                call.ids, call.fmt = [chat.ids], chat.fmt
                call.config = replace(call.config, grammar=chat.grammar, grammar_trigger=chat.trigger)
            else:
                call.ids = [self.llm.tokenize(p) for p in call.prompts]
        except FieldError as e:
            raise BadRequest(str(e), e.field) from None
        except (TypeError, ValueError) as e:
            raise BadRequest(str(e), param) from None
        for ids in call.ids:
            if len(ids) >= self.llm.n_ctx:
                raise BadRequest(f"the prompt has {len(ids)} tokens; the context window is {self.llm.n_ctx}",
                                 param, "context_length_exceeded")
        if call.config.grammar is not None:
            try:
                self.llm.check_grammar(call.config.grammar, call.config.grammar_trigger)
            except ValueError as e:
                raise BadRequest(str(e), "tools" if call.tools else "grammar") from None


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
    dead = server.dead()
    if dead:  # a worker died: the server cannot answer requests (no details without the key)
        body = {"status": "error"}
        if server.authorized(request.headers.get("authorization")):
            body["error"] = dead
        return JSONResponse(body, status_code=503)
    if not server.authorized(request.headers.get("authorization")):
        return JSONResponse({"status": "ok"})  # liveness only: nothing about the server
    return JSONResponse({"status": "ok", "model": server.model_id, "busy": server.pending})


_PAGE_HEADERS = {  # the page's own code and styles only; it talks to this server and nowhere else
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                               "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
                               "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache", "Referrer-Policy": "no-referrer"}


async def _page(request):
    from importlib.resources import files
    from starlette.responses import HTMLResponse
    page = request.app.state.page
    if page is None:
        page = request.app.state.page = files(__package__).joinpath("chat.html").read_text(encoding="utf-8")
    return HTMLResponse(page, headers=_PAGE_HEADERS)


def _model_card(server: Server) -> dict:
    return {"id": server.model_id, "object": "model", "created": server.created, "owned_by": "specgguf"}


async def _models(request):
    from starlette.responses import JSONResponse
    return JSONResponse({"object": "list", "data": [_model_card(request.app.state.server)]})


async def _model(request):
    from starlette.responses import JSONResponse
    server, name = request.app.state.server, request.path_params["name"]
    if name != server.model_id:
        return JSONResponse(error_body(f"the model {name!r} does not exist (this server has {server.model_id!r})",
                                       "invalid_request_error", "model", "model_not_found"), status_code=404)
    return JSONResponse(_model_card(server))


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
    shapes = Shapes("chatcmpl" if kind == "chat" else "cmpl", call.model or server.model_id, server.llm.piece,
                    call.tools, call.fmt)
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


async def _favicon(request):
    """No icon: 204, so a browser opening the chat page logs no 404 (nor a 401 with a key)."""
    from starlette.responses import Response
    return Response(status_code=204)


async def _on_error(request, exc: Exception):
    from starlette.responses import JSONResponse
    print(f"specgguf: 500 {request.url.path}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    return JSONResponse(error_body(f"internal error: {type(exc).__name__}: {exc}", "server_error"), status_code=500)


def create_app(server: Server, cors_origins: Sequence[str] = ()):
    """The Starlette application over ``server``: every route but ``GET
    /health`` and the chat page behind the API key when set; the OpenAI routes under ``/v1``
    and, as llama-server serves them, without it; CORS for ``cors_origins``
    only (none by default: a web page elsewhere cannot call the server)."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.routing import Route

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        server.stopping.set()  # running generations end within a round

    routes = [Route("/", _page), Route("/health", _health), Route("/favicon.ico", _favicon)]
    for base in ("/v1", ""):
        routes += [Route(f"{base}/models", _models), Route(base + "/models/{name:path}", _model),
                   Route(f"{base}/completions", _completions, methods=["POST"]),
                   Route(f"{base}/chat/completions", _chat, methods=["POST"])]
    app = Starlette(routes=routes, exception_handlers={HTTPException: _on_http_error, Exception: _on_error},
                    lifespan=lifespan)
    app.state.server = server
    app.state.page = None  # read from the package on the first GET /
    guarded = _Auth(app, server)
    if not cors_origins:
        return guarded
    from starlette.middleware.cors import CORSMiddleware  # outside the key check: a preflight carries no key
    return CORSMiddleware(guarded, allow_origins=list(cors_origins), allow_methods=["GET", "POST", "OPTIONS"],
                          allow_headers=["Authorization", "Content-Type"], max_age=600)


class _Auth:
    """ASGI middleware: every route but ``GET /health`` and the page needs
    the API key when one is set (see the module docstring)."""

    OPEN = {("GET", "/health"), ("GET", "/"), ("GET", "/favicon.ico")}  # a browser asks for the icon without the key

    def __init__(self, app, server: Server) -> None:
        self.app, self.server = app, server

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and (scope.get("method"), scope.get("path")) not in self.OPEN:
            headers = dict(scope.get("headers") or [])
            auth = headers.get(b"authorization")
            if not self.server.authorized(auth.decode("latin-1") if auth else None):
                from starlette.responses import JSONResponse
                body = error_body("missing or invalid API key: send 'Authorization: Bearer KEY'",
                                  "invalid_request_error", None, "invalid_api_key")
                await JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _collect(server: Server, call: Call, cancel: threading.Event) -> Optional[list]:
    """Every choice's GenerationResult in index order; None if any was cut short by shutdown."""
    results = [None] * (len(call.prompts) * call.n)
    for i, item in server.items(call, cancel):
        if not isinstance(item, str):
            results[i] = item
    return None if any(r is None for r in results) else results


async def _respond(server: Server, request, call: Call, shapes: Shapes, t0: float):
    from starlette.responses import JSONResponse
    cancel = threading.Event()
    watcher = asyncio.create_task(_watch_disconnect(request, cancel, threading.Event()))
    work = asyncio.get_running_loop().run_in_executor(server.pool, _collect, server, call, cancel)
    try:
        with anyio.CancelScope(shield=True):  # the pair stays busy until the thread is done
            results = await work
    except (ValueError, TypeError, RuntimeError, OSError) as e:
        server.log(500, request.url.path, call, None, time.perf_counter() - t0)
        return JSONResponse(error_body(str(e), "server_error"), status_code=server.failure_status())
    finally:
        cancel.set()
        watcher.cancel()
        server.leave()
    server.log(200, request.url.path, call, results[0] if results else None, time.perf_counter() - t0)
    if results is None:  # the server is shutting down
        return JSONResponse(error_body("the server is shutting down", "server_error"), status_code=503)
    if call.kind == "chat":
        return JSONResponse(shapes.response(results, True))
    if len(call.prompts) == 1:
        prefix = call.prompt if call.echo and isinstance(call.prompt, str) else ""
        return JSONResponse(shapes.response(results, False, prefix))
    body = shapes.response(results, False)
    if call.echo:  # each choice echoes its own prompt
        for c in body["choices"]:
            p = call.prompts[c["index"] // call.n]
            c["text"] = (p if isinstance(p, str) else "") + c["text"]
    return JSONResponse(body)


def _produce(server: Server, call: Call, shapes: Shapes, relay: "_Relay", put, cancel: threading.Event) -> None:
    """Runs in one worker thread from the first chunk to the last (the pair's
    lock belongs to one thread per generation); hands each chunk to ``put``."""
    prefix = call.prompt if call.echo and isinstance(call.prompt, str) and len(call.prompts) == 1 else ""
    chunks = shapes.chunks(relay, call.kind == "chat", len(call.prompts) * call.n, prefix)
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
        if call.include_usage and relay.results:
            yield _sse({**shapes.head("chat.completion.chunk" if call.kind == "chat" else "text_completion"),
                        "choices": [], "usage": shapes.usage([r.stats for r in relay.results])})
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
    """An iterator over a call's ``(index, item)`` that remembers the results (for the log and usage)."""

    def __init__(self, items: Iterator) -> None:
        self.items, self.results = items, []

    @property
    def result(self):
        return self.results[0] if self.results else None

    def __iter__(self):
        for index, item in self.items:
            if not isinstance(item, str):
                self.results.append(item)
            yield index, item

    def close(self) -> None:
        close = getattr(self.items, "close", None)
        if close:
            close()
