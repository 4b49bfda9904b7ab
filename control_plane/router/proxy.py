"""A weighted, streaming-safe reverse proxy in front of the local variants of one service.

Each request goes to production / baseline / canary by the current weights (smooth weighted round-robin, so the split
over N requests is exact to within one request per variant: table.py), or to the variant named in the `X-SITS-Variant`
request header when the caller may pin (the pin token or an allow-listed source: forwarding.py). Request and response
bodies stream through chunk by chunk (SSE works; a request body over `max_body_bytes` is a 413, as on the engine);
end-to-end headers, `traceparent` included, are forwarded. Only origin-form targets are accepted. Weights and backends
are swapped atomically: requests already in flight finish on the backend they started on. Admin paths under /_sits/:
metrics (Prometheus text; requests per variant), weights, healthz.

No client can tell which variant answered it (else it could aim slow or bad requests at one and steer the verdict):
only trusted callers (the pin token or an allow-listed source: the control plane's own probes and load) get the
`X-SITS-Variant` response header, /_sits/metrics and /_sits/weights, and paths outside `public_paths` (the variants'
/metrics, /version, /readyz); anyone else gets the OpenAI API under /v1/ and /_sits/healthz.
"""
from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from typing import Mapping

import httpx
import uvicorn
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from sits.control_plane.rollout import ROLES
from sits.control_plane.router import RouterError
from sits.control_plane.router import forwarding as rh
from sits.control_plane.router.config import RouterConfig
from sits.control_plane.router.table import RouteTable
from sits.wire.http_limits import timeout_protocol

log = logging.getLogger(__name__)
PIN_HEADER = "x-sits-variant"
PIN_TOKEN_HEADER = "x-sits-pin-token"


class WeightedRouter:
    """ASGI app + its own uvicorn thread. Thread-safe setters; selection runs on the router's event loop."""

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.table = RouteTable()
        self._pin_token = config.pin_token.encode() if config.pin_token else None
        self._pin_sources = rh.parse_networks(config.pin_sources)
        self._trusted_proxies = rh.parse_networks(config.trusted_proxies)
        self.registry = CollectorRegistry(auto_describe=True)
        self._requests = Counter("sits_router_requests", "Requests proxied, by variant, routing and status code",
                                 ["service", "variant", "routing", "code"], registry=self.registry)
        self._errors = Counter("sits_router_upstream_errors", "Requests that failed to reach or read a variant",
                               ["service", "variant", "reason"], registry=self.registry)
        self._inflight_g = Gauge("sits_router_in_flight", "Requests in flight per variant",
                                 ["service", "variant"], registry=self.registry)
        self._weight_g = Gauge("sits_router_weight_percent", "Configured traffic weight per variant",
                               ["service", "variant"], registry=self.registry)
        for r in ROLES:
            self._weight_g.labels(config.service, r).set(0)
            self._inflight_g.labels(config.service, r).set(0)
        self._client: httpx.AsyncClient | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.url: str | None = None

    # ---- configuration (any thread) ----
    def set_weights(self, weights: Mapping[str, int]) -> None:
        for r, v in self.table.set_weights(weights).items():
            self._weight_g.labels(self.config.service, r).set(v)

    def weights(self) -> dict[str, int]:
        return self.table.weights()

    def set_backends(self, role: str, urls: list[str] | tuple[str, ...] | None) -> None:
        self.table.set_backends(role, urls)

    def in_flight(self, role: str) -> int:
        return self.table.in_flight(role)

    # ---- ASGI ----
    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            return await self._lifespan(receive, send)
        if scope["type"] != "http":
            return
        path = scope["path"]
        raw = scope["headers"]
        client = (scope.get("client") or (None, 0))[0]
        trusted = rh.pin_allowed(raw, client, self._pin_token, self._pin_sources)
        raw_path = scope.get("raw_path") or path.encode()
        if raw_path.startswith(b"/_sits/"):
            return await self._admin(scope, path, send, trusted)
        if path.startswith("/_sits/"):   # /%5fsits/...: an admin path in disguise, neither served nor forwarded
            return await self._reject(scope, send, 404, "router admin paths are matched literally (/_sits/...); "
                                      "a percent-encoded one is not served")
        if not trusted and not path.startswith(self.config.public_paths):
            return await self._reject(scope, send, 404, f"the router serves {', '.join(self.config.public_paths)} "
                                      "to clients (the variants' other paths are for the control plane)")
        pin = next((v.decode("latin-1").strip() for k, v in raw if k.lower() == rh.PIN_HEADER), None)
        if pin is not None and not trusted:
            return await self._reject(scope, send, 403, f"{PIN_HEADER} is honoured only with a valid "
                                      f"{PIN_TOKEN_HEADER} or from an allow-listed source")
        if pin is not None and pin not in ROLES:
            return await self._reject(scope, send, 400, f"{PIN_HEADER} must be one of {', '.join(ROLES)}, "
                                      f"got {pin[:40]!r}")
        target = scope.get("raw_path") or path.encode(), scope["query_string"]
        try:
            rh.check_target(*target)
        except rh.BadTarget as e:
            return await self._reject(scope, send, 400, str(e))
        if rh.ambiguous_framing(raw):
            return await self._reject(scope, send, 400, "a request must not carry both Content-Length and "
                                      "Transfer-Encoding")
        declared = rh.declared_length(raw)
        if declared is not None and declared > self.config.max_body_bytes:
            return await self._reject(scope, send, 413, f"request body of {declared} bytes exceeds the limit of "
                                      f"{self.config.max_body_bytes} bytes")
        picked = self.table.pick(pin)
        routing = "pinned" if pin is not None else "weighted"
        if picked is None:
            self._requests.labels(self.config.service, pin or "none", routing, "503").inc()
            why = f"variant {pin!r} is not deployed" if pin else "no variant has traffic weight and a backend"
            return await _json(send, 503, {"error": f"service {self.config.service}: {why}"})
        role, base = picked
        self._inflight_g.labels(self.config.service, role).inc()
        try:
            try:
                url = rh.upstream_url(base, *target)
            except rh.BadTarget as e:
                self._requests.labels(self.config.service, role, routing, "400").inc()
                return await self._reject(scope, send, 400, str(e))
            headers = rh.request_headers(raw, client, self._trusted_proxies, trusted)
            await self._forward(scope, receive, send, role, routing, url, headers, show=trusted)
        finally:
            self.table.done(role)
            self._inflight_g.labels(self.config.service, role).dec()

    async def _reject(self, scope, send, status: int, message: str) -> None:
        log.info("router %s: rejected %s %r: %d %s", self.config.service, scope["method"],
                 (scope.get("raw_path") or b"")[:100], status, message)
        await _json(send, status, {"error": message})

    async def _body(self, receive, gone: asyncio.Event):
        """The request body as it arrives, at most max_body_bytes; the client leaving ends the upstream request."""
        size, limit = 0, self.config.max_body_bytes
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                gone.set()
                raise _ClientGone()
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _BodyTooLarge()
            if chunk:
                yield chunk
            if not msg.get("more_body"):
                return

    async def _forward(self, scope, receive, send, role, routing, url: httpx.URL, headers, show: bool) -> None:
        """Proxy one request to `role` at `url`; `show`: the caller may learn the variant (X-SITS-Variant)."""
        client = self._get_client()
        gone = asyncio.Event()
        if rh.has_body(scope["headers"]):
            content = self._body(receive, gone)
            length = rh.declared_length(scope["headers"])
            if length is not None:   # keep Content-Length framing upstream (httpx then sends no chunked encoding)
                headers = headers + [(b"content-length", str(length).encode())]
        else:
            content = b""
        req = client.build_request(scope["method"], url, headers=headers, content=content)
        try:
            resp = await client.send(req, stream=True)
        except _BodyTooLarge:
            self._requests.labels(self.config.service, role, routing, "413").inc()
            return await self._reject(scope, send, 413, f"request body exceeds the limit of "
                                      f"{self.config.max_body_bytes} bytes")
        except _ClientGone:
            self._requests.labels(self.config.service, role, routing, "499").inc()
            return
        except httpx.HTTPError as e:
            if gone.is_set():
                self._requests.labels(self.config.service, role, routing, "499").inc()
                return
            self._errors.labels(self.config.service, role, "connect").inc()
            self._requests.labels(self.config.service, role, routing, "502").inc()
            log.warning("router %s: variant %s at %s://%s unreachable: %s", self.config.service, role, url.scheme,
                        url.netloc.decode(), type(e).__name__)
            if not show:
                return await _json(send, 502, {"error": f"service {self.config.service}: the backend that took "
                                                        f"the request is unreachable; retry"})
            return await _json(send, 502, {"error": f"variant {role} at {url.scheme}://{url.netloc.decode()} "
                                                    f"unreachable: {type(e).__name__}"}, role)
        code = str(resp.status_code)
        try:
            out = rh.response_headers(resp.headers.raw)
            if show:
                out.append((b"x-sits-variant", role.encode()))
            await send({"type": "http.response.start", "status": resp.status_code, "headers": out})
            pump = asyncio.ensure_future(self._pump(resp, send))
            watch = asyncio.ensure_future(_wait_disconnect(receive))
            try:
                await asyncio.wait({pump, watch}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                watch.cancel()
                if not pump.done():  # the client went away: stop reading so the variant can abort the request
                    pump.cancel()
                    code = "499"
                    self._errors.labels(self.config.service, role, "client_disconnect").inc()
                try:
                    await pump
                except asyncio.CancelledError:
                    pass
                except httpx.HTTPError:
                    code = "502"
                    self._errors.labels(self.config.service, role, "read").inc()
        finally:
            await resp.aclose()
            self._requests.labels(self.config.service, role, routing, code).inc()

    @staticmethod
    async def _pump(resp: httpx.Response, send) -> None:
        async for chunk in resp.aiter_raw():
            if chunk:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        # only a complete upstream body is completed downstream: if reading fails, the response is left unfinished
        # and the server drops the connection, so the client sees the truncation instead of a short "success"
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _admin(self, scope, path: str, send, trusted: bool) -> None:
        if path == "/_sits/healthz":
            return await _json(send, 200, {"status": "ok"})
        if not trusted:   # which variant takes each request (in flight, weights) is for the control plane only
            return await self._reject(scope, send, 403, f"{path} needs {PIN_TOKEN_HEADER} or an allow-listed source")
        if path == "/_sits/metrics":
            return await _send(send, 200, generate_latest(self.registry), CONTENT_TYPE_LATEST)
        if path == "/_sits/weights":
            return await _json(send, 200, {"service": self.config.service, **self.table.snapshot()})
        return await _json(send, 404, {"error": f"unknown admin path {path}"})

    async def _lifespan(self, receive, send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                if self._client is not None:
                    await self._client.aclose()
                    self._client = None
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _get_client(self) -> httpx.AsyncClient:
        if self._client is None:
            c = self.config
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(c.read_timeout, connect=c.connect_timeout),
                limits=httpx.Limits(max_connections=c.max_connections, max_keepalive_connections=100),
                follow_redirects=False, trust_env=False)
        return self._client

    # ---- lifecycle ----
    def start(self, timeout: float = 10.0) -> str:
        """Serve on config.host:config.port (0 = free port) in a daemon thread; returns the base URL."""
        if self._thread is not None:
            return self.url
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:   # SO_REUSEADDR: a restarted control plane binds its router's old port despite TIME_WAIT connections
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.config.host, self.config.port))
        except OSError:
            sock.close()
            raise
        host, port = sock.getsockname()[:2]
        c = self.config
        # proxy_headers off: the client address is the peer's, never what its X-Forwarded-For claims
        cfg = uvicorn.Config(self, lifespan="on", log_level="warning", access_log=False, proxy_headers=False,
                             timeout_graceful_shutdown=c.shutdown_timeout, timeout_keep_alive=30,
                             http=timeout_protocol(c.header_timeout_s, c.body_timeout_s))
        self._server = uvicorn.Server(cfg)
        self._thread = threading.Thread(target=lambda: asyncio.run(self._server.serve(sockets=[sock])),
                                        name=f"sits-router-{self.config.service}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RouterError(f"router for {self.config.service} did not start within {timeout}s")
            time.sleep(0.01)
        self.url = f"http://{host}:{port}"
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(self.config.shutdown_timeout + 5)
        self._thread = self._server = None


class _BodyTooLarge(Exception):
    pass


class _ClientGone(Exception):
    pass


async def _wait_disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _send(send, status: int, body: bytes, content_type: str, role: str | None = None) -> None:
    headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]
    if role:
        headers.append((b"x-sits-variant", role.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _json(send, status: int, data: dict, role: str | None = None) -> None:
    await _send(send, status, json.dumps(data).encode(), "application/json", role)
