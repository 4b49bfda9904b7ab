"""Fixtures: `server` (one tiny-model server per module) and `serve(**ServerConfig overrides)` (per test)."""

from dataclasses import replace

import pytest

from tests.engine.server.harness import BASE, RunningServer


@pytest.fixture
def serve():
    servers: list[RunningServer] = []

    def start(**overrides) -> RunningServer:
        s = RunningServer(replace(BASE, **overrides))
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
