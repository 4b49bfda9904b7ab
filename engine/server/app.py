"""The starlette application: routes, HTTP metrics middleware, error handlers and the engine-thread lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sits.wire.http_limits import TIMED_OUT
from sits.engine.server.metrics import CONTENT_TYPE, EngineMetrics
from sits.engine.server import handlers
from sits.engine.server.errors import APIError, api_error_response, error_response
from sits.engine.core.runner import Runner
from sits.engine.server.state import ServerState
from sits.wire.headers import PROBE_HEADER, REPLAY_HEADER, marked_raw

log = logging.getLogger("sits.engine.server")
INFERENCE_ROUTES = ("/v1/completions", "/v1/chat/completions")


class HTTPMetricsMiddleware:
    """Observes http_request_duration_seconds{route,status} from the complete request to the last byte sent.

    The clock starts when the last byte of the request body has been received (at the head for a request without a
    body, or one answered before its body was read): how fast a client uploads is the client's doing, and timing from
    the head would let any client make a variant look slow by trickling its body (docs/security.md)."""

    def __init__(self, app: ASGIApp, routes: set[str], metrics: EngineMetrics) -> None:
        self.app = app
        self.routes = routes
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status, stream, completed = 500, False, False

        async def receive_wrapper() -> Message:
            nonlocal start
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                start = time.perf_counter()   # the request is complete: from here on the time is the server's
            return message

        async def send_wrapper(message: Message) -> None:
            nonlocal status, stream, completed
            if message["type"] == "http.response.start":
                status = message["status"]
                stream = any(k == b"content-type" and v.startswith(b"text/event-stream")
                             for k, v in message.get("headers", ()))
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                completed = True
            await send(message)

        failed = False
        try:
            await self.app(scope, receive_wrapper, send_wrapper)
        except BaseException:
            failed = True
            raise
        finally:
            if TIMED_OUT in scope:   # answered 408 by the protocol: whatever the app made of the cut-off body
                status = 408
            elif not completed and status < 400:
                # the response began but never ended: the client left mid-stream (499, as nginx records it), or the
                # app failed after the status line went out -- neither is a 200
                status = 500 if failed else 499
            path = scope.get("path", "")
            route = path if path in self.routes else "other"  # bounded label cardinality
            metrics = self.metrics
            headers = scope.get("headers", ())
            if marked_raw(headers, PROBE_HEADER):
                metrics.count_probe(status)   # a correctness probe: never part of the latency the canary is judged on
            else:
                metrics.observe_http(route, status, time.perf_counter() - start)
                if route in INFERENCE_ROUTES:   # replayed (low-traffic mode) or live, streamed or not
                    metrics.count_inference(route, marked_raw(headers, REPLAY_HEADER), stream)
                if status >= 400 and path.startswith("/v1/"):
                    metrics.count_error(status)


async def _models(request: Request) -> Response:
    state: ServerState = request.app.state.sits
    created = int(time.time())   # as vLLM: the process start would tell a client which variant answered
    data = [{"id": name, "object": "model", "created": created, "owned_by": "sits"}
            for name in sorted(state.model_names)]
    return JSONResponse({"object": "list", "data": data})


async def _healthz(request: Request) -> Response:
    # liveness: OK while loading and serving; 503 once the engine failed to load or its loop crashed (a restart
    # is the only way out, and an orchestrator's liveness probe does exactly that)
    runner: Runner = request.app.state.sits.runner
    if runner.load_error:
        return JSONResponse({"status": "failed", "error": runner.load_error}, status_code=503)
    return JSONResponse({"status": "ok"})


async def _readyz(request: Request) -> Response:
    runner: Runner = request.app.state.sits.runner
    if runner.ready.is_set():
        return JSONResponse({"status": "ready"})
    if runner.load_error:
        return JSONResponse({"status": "failed", "error": runner.load_error}, status_code=503)
    return JSONResponse({"status": "loading"}, status_code=503)


async def _version(request: Request) -> Response:
    state: ServerState = request.app.state.sits
    body = dict(state.version)
    if state.runner.ready.is_set():   # the compute dtype ("auto" resolved), known once the model is loaded
        body["dtype"] = str(state.runner.engine.dtype).removeprefix("torch.")
    return JSONResponse(body)


async def _conformance(request: Request) -> Response:
    # warm-up's op-level conformance report (engine/execution/conformance.py): measured, not judged -- the correctness
    # gate judges it with its policy (control_plane/analysis/conformance.py)
    runner: Runner = request.app.state.sits.runner
    if not runner.ready.is_set():
        return JSONResponse({"status": "loading"}, status_code=503)
    report = getattr(runner.engine, "conformance", None)
    if report is None:
        return JSONResponse({"error": {"message": "conformance was not measured (--no-conformance or no warm-up)",
                                       "type": "not_found"}}, status_code=404)
    return JSONResponse(report)


async def _metrics(request: Request) -> Response:
    # Rendering ~140 buckets x several histograms takes tens of ms under load: do it off the event loop so a scrape
    # does not stall token streaming (which would add exactly the tail noise the canary analysis measures).
    body = await run_in_threadpool(request.app.state.sits.metrics.render)
    return Response(body, media_type=CONTENT_TYPE)


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    _log_rejected(request, exc.status, exc.message)
    return api_error_response(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    _log_rejected(request, exc.status_code, str(exc.detail))
    return error_response(exc.status_code, str(exc.detail), headers=exc.headers)


def _log_rejected(request: Request, status: int, message: str) -> None:
    # one line per rejected request, never a traceback; the message is ours (it quotes at most a short, repr()'d
    # piece of the input), the path is cut short, headers are never logged
    if status < 500:
        log.info("rejected %s %s: %d %s", request.method, request.url.path[:100], status,
                 " ".join(message[:300].split()))


async def _unexpected(request: Request, exc: Exception) -> Response:
    # logged with the path only: headers (Authorization, cookies) never reach the log
    log.error("internal error on %s %s: %s", request.method, request.url.path, exc, exc_info=exc)
    return error_response(500, "internal server error", code="internal_error")


ROUTES = {"/v1/completions", "/v1/chat/completions", "/v1/models", "/healthz", "/readyz", "/version", "/conformance",
          "/metrics"}


def create_app(state: ServerState) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        state.metrics.track_thread("http", threading.get_native_id())
        state.runner.start(asyncio.get_running_loop())
        try:
            yield
        finally:
            await asyncio.to_thread(state.runner.shutdown)
            state.body_parser.shutdown()
            state.tracer.shutdown()

    routes = [
        Route("/v1/completions", handlers.completions, methods=["POST"]),
        Route("/v1/chat/completions", handlers.chat_completions, methods=["POST"]),
        Route("/v1/models", _models, methods=["GET"]),
        Route("/healthz", _healthz, methods=["GET"]),
        Route("/readyz", _readyz, methods=["GET"]),
        Route("/version", _version, methods=["GET"]),
        Route("/conformance", _conformance, methods=["GET"]),
        Route("/metrics", _metrics, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={APIError: _api_error, HTTPException: _http_error, Exception: _unexpected})
    app.router.redirect_slashes = False   # a 307 to a Location built from the client's Host header: just 404
    app.state.sits = state
    app.add_middleware(HTTPMetricsMiddleware, routes=ROUTES, metrics=state.metrics)
    return app
