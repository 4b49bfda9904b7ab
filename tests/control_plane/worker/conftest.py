import asyncio

import httpx
import pytest

from sits.control_plane.adapters.deploy.local import process
from tests.tiny_engine import start_tiny_engine
from tests.waiting import wait_http_ok

SERVICE = "chat"
BODY = {"model": "tiny", "prompt": "hello", "max_tokens": 2, "temperature": 0}


def start_engine(workdir, role: str, *extra: str):
    proc, addr = start_tiny_engine(workdir, role, SERVICE, *extra)
    return proc, f"http://{addr}"


@pytest.fixture(scope="session")
def engines(tmp_path_factory):
    """Two real `sits-engine serve` processes (tiny model, torch kernels) labelled env=baseline / env=canary,
    service=chat; the canary answers 10 % of requests with 500 (--fault-error-rate)."""
    d = tmp_path_factory.mktemp("engines")
    procs = {"baseline": start_engine(d, "baseline"), "canary": start_engine(d, "canary", "--fault-error-rate", "0.1")}
    try:
        for proc, url in procs.values():
            wait_http_ok(url + "/readyz", 240, proc)
        yield {role: url for role, (_, url) in procs.items()}
    finally:
        for proc, _ in procs.values():
            process.stop(proc, 10)


def send(url: str, n: int, concurrency: int = 4, body=None) -> list[int]:
    """n completions against url; returns the status codes."""
    async def run():
        sem = asyncio.Semaphore(concurrency)
        async with httpx.AsyncClient(timeout=60) as c:
            async def one():
                async with sem:
                    return (await c.post(url + "/v1/completions", json=body or BODY)).status_code
            return await asyncio.gather(*[one() for _ in range(n)])
    return asyncio.run(run())
