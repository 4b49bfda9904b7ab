"""Fixtures: `server` (one tiny-model server per module) and `serve(**ServerConfig overrides)` (per test;
`engine_factory=` builds the LLMEngine, e.g. with an injected clock)."""

from dataclasses import replace

import pytest

from tests.engine.server.harness import BASE, RunningServer


@pytest.fixture
def serve():
    servers: list[RunningServer] = []

    def start(*, engine_factory=None, **overrides) -> RunningServer:
        s = RunningServer(replace(BASE, **overrides), engine_factory=engine_factory)
        servers.append(s)
        return s.wait_ready()

    yield start
    for s in servers:
        s.stop()


@pytest.fixture(scope="module")
def server():
    s = RunningServer(BASE).wait_ready()
    yield s
    s.stop()
