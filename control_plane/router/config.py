"""The weighted router's settings (proxy.py), validated when made: a bad value is a RouterError before any socket is
opened."""
from __future__ import annotations

from dataclasses import dataclass, field

from sits.control_plane.router import RouterError
from sits.control_plane.router import forwarding as rh
from sits.wire.http_limits import BODY_TIMEOUT_S, HEADER_TIMEOUT_S, MAX_BODY_BYTES

MIN_PIN_TOKEN_CHARS = 16


@dataclass(slots=True)
class RouterConfig:
    service: str
    host: str = "127.0.0.1"
    port: int = 0
    connect_timeout: float = 5.0
    read_timeout: float = 600.0
    max_connections: int = 1000
    shutdown_timeout: float = 5.0
    pin_token: str | None = field(default=None, repr=False)   # a secret: X-SITS-Pin-Token must equal it to pin
    pin_sources: tuple[str, ...] = ()       # networks whose requests may pin without the token (e.g. "127.0.0.1/32")
    trusted_proxies: tuple[str, ...] = ()   # networks whose X-Forwarded-For chain is kept (and extended)
    max_body_bytes: int = MAX_BODY_BYTES    # the engine's limit: larger request bodies are a 413 here already
    header_timeout_s: float = HEADER_TIMEOUT_S
    body_timeout_s: float = BODY_TIMEOUT_S
    # path prefixes forwarded for any client (the OpenAI API); trusted callers (pin token or pin source) reach every
    # path, the variants' /metrics, /version and probes included, and the router's own /_sits/metrics and weights
    public_paths: tuple[str, ...] = ("/v1/",)

    def __post_init__(self) -> None:
        if not self.service:
            raise RouterError("router needs a service name")
        self.public_paths = tuple(self.public_paths)
        if not all(isinstance(p, str) and p.startswith("/") for p in self.public_paths):
            raise RouterError(f"router public_paths must be path prefixes starting with '/', got {self.public_paths!r}")
        if not 0 <= self.port <= 65535:
            raise RouterError(f"router port {self.port} out of range")
        if self.connect_timeout <= 0 or self.read_timeout <= 0 or self.max_connections < 1:
            raise RouterError("router timeouts and max_connections must be positive")
        if self.header_timeout_s <= 0 or self.body_timeout_s <= 0 or self.max_body_bytes < 1:
            raise RouterError("router header/body timeouts and max_body_bytes must be positive")
        if self.pin_token is not None and len(self.pin_token) < MIN_PIN_TOKEN_CHARS:
            raise RouterError(f"the router's pin token must be at least {MIN_PIN_TOKEN_CHARS} characters")
        try:
            self.pin_sources = tuple(self.pin_sources)
            self.trusted_proxies = tuple(self.trusted_proxies)
            rh.parse_networks(self.pin_sources + self.trusted_proxies)
        except ValueError as e:
            raise RouterError(f"router pin_sources / trusted_proxies: {e}") from None
