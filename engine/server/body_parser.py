"""Request bodies too large to parse on the event loop are parsed in a child process, a bounded number at a time.

json.loads of a 16 MB body holds the GIL for about half a second: in a thread it still stops the event loop once per
loop iteration that waits for the GIL, so /healthz and /readyz (and every token stream) answered seconds late while
a few such bodies were parsed, and one slow readiness probe could roll a canary back. In a child process the loop
only hands the bytes over and gets a `GenerationRequest` back; the body's dict never exists in the server.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from sits.engine.server.errors import APIError
from sits.engine.server.protocol import GenerationRequest, parse_chat, parse_completion, parse_json_body

ON_LOOP_BYTES = 64 * 1024    # smaller bodies parse on the loop in well under a millisecond
MAX_WAITING = 8              # large bodies queued for the child at once; beyond this, 429 (each holds <= 16 MB)


def parse_request(raw: bytes, kind: str) -> GenerationRequest:
    body = parse_json_body(raw)
    return parse_chat(body) if kind == "chat" else parse_completion(body)


def _parse_in_child(raw: bytes, kind: str) -> GenerationRequest | tuple[int, str, str | None]:
    try:
        return parse_request(raw, kind)
    except APIError as e:   # sent back as plain data: APIError's keyword-only arguments do not survive pickling
        return e.status, e.message, e.param


class BodyParser:
    """`await parse(raw, kind)`: the request's `GenerationRequest`, or the APIError its body earns. The child process
    starts at the first large body; `shutdown()` stops it."""

    def __init__(self, on_loop_bytes: int = ON_LOOP_BYTES, max_waiting: int = MAX_WAITING) -> None:
        self.on_loop_bytes = on_loop_bytes
        self.max_waiting = max_waiting
        self._pool: ProcessPoolExecutor | None = None
        self._waiting = 0

    async def parse(self, raw: bytes, kind: str) -> GenerationRequest:
        if len(raw) <= self.on_loop_bytes:
            return parse_request(raw, kind)
        if self._waiting >= self.max_waiting:
            raise APIError(429, f"{self._waiting} large request bodies are already waiting to be parsed; retry "
                           "later or send a smaller body", code="too_many_large_bodies", headers={"Retry-After": "1"})
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        pool = self._pool
        self._waiting += 1
        try:
            outcome = await asyncio.get_running_loop().run_in_executor(pool, _parse_in_child, raw, kind)
        except BrokenProcessPool:   # the child died (out of memory, killed): the next large body starts a new one
            if self._pool is pool:
                self._pool = None
            raise APIError(503, "the request body parser exited; retry", headers={"Retry-After": "1"}) from None
        finally:
            self._waiting -= 1
        if isinstance(outcome, tuple):
            status, message, param = outcome
            raise APIError(status, message, param=param)
        return outcome

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
