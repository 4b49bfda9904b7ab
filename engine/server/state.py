"""What every request handler of the server shares: the engine runner, metrics, tracer, fault injection, and the
model's names and version. Built once by main.build_app and kept in `app.state.sits`."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from starlette.requests import Request

from sits.engine.server.metrics import EngineMetrics
from sits.engine.server.body_parser import BodyParser
from sits.engine.core.runner import Runner
from sits.engine.server.tracing import RequestTracer


@dataclass(slots=True)
class Faults:
    """Fault injection (all off by default): see `sits-engine serve --help`."""

    latency_s: float = 0.0
    token_latency_s: float = 0.0
    error_rate: float = 0.0
    seed: int = 0
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        if self.latency_s < 0 or self.token_latency_s < 0:
            raise ValueError("fault latencies must be >= 0")
        if not 0.0 <= self.error_rate <= 1.0:
            raise ValueError(f"fault error rate must be in [0, 1], got {self.error_rate}")
        self.rng = random.Random(self.seed)


@dataclass(slots=True)
class ServerState:
    runner: Runner
    metrics: EngineMetrics
    tracer: RequestTracer
    faults: Faults
    model_names: set[str]
    version: dict[str, str]
    system_fingerprint: str
    body_parser: BodyParser = field(default_factory=BodyParser)   # large bodies are parsed off the event loop


def server_state(request: Request) -> ServerState:
    """The ServerState of the app serving `request`."""
    return request.app.state.sits
