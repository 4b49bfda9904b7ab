"""Server-sent events with explicit client-disconnect handling.

The event stream and a listener for `http.disconnect` run side by side; whichever ends first cancels the other, and
`on_close` runs in every case (the handler uses it to abort an unfinished request so its KV blocks are freed).
Works the same for ASGI spec 2.3 and 2.4 servers (a failed send counts as a disconnect too).
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Callable

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


async def wait_for_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class SSEResponse(Response):
    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes], on_close: Callable[[], None]) -> None:
        self.events = events
        self.on_close = on_close
        self.status_code = 200
        self.background = None
        self.init_headers(SSE_HEADERS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def pump() -> None:
            try:
                await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
                async for chunk in self.events:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            except OSError:  # ASGI 2.4: send raises once the client is gone
                pass
            finally:
                await self.events.aclose()

        pump_task = asyncio.ensure_future(pump())
        listen_task = asyncio.ensure_future(wait_for_disconnect(receive))
        try:
            await asyncio.wait({pump_task, listen_task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (pump_task, listen_task):
                if not task.done():
                    task.cancel()
            await asyncio.gather(pump_task, listen_task, return_exceptions=True)
            self.on_close()


def sse_event(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
