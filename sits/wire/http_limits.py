"""Limits every HTTP server of SITS applies to its clients (the control plane's router and the engine server).

`MAX_BODY_BYTES` bounds a request body. `timeout_protocol(...)` is uvicorn's h11 protocol with two deadlines uvicorn
lacks: a request head must arrive completely within `header_timeout_s` of its first byte (or of the connection's
start), and a request body within `body_timeout_s` of its head. A connection that misses one is answered 408 and
closed, so a client that trickles bytes (slowloris) cannot hold a connection, a task and its buffers forever.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.h11_impl import H11Protocol

MAX_BODY_BYTES = 16 * 1024 * 1024
HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 60.0

TIMED_OUT = "sits.timed_out"   # scope key the protocol sets ("head" or "body") on a request it answered 408: the app
                               # records that status (engine/server/app.py), not the 400 its cut-off body would earn
_408_BODY = b'{"error": {"message": "request not received in time", "type": "invalid_request_error"}}'
_408 = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(_408_BODY), _408_BODY))


class _DeadlineH11Protocol(H11Protocol):
    header_timeout_s = HEADER_TIMEOUT_S
    body_timeout_s = BODY_TIMEOUT_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._deadline: asyncio.TimerHandle | None = None
        self._deadline_for: str | None = None
        super().connection_made(transport)
        self._arm("head", self.header_timeout_s)

    def data_received(self, data: bytes) -> None:
        if self._awaiting_head():
            self._arm("head", self.header_timeout_s)   # a keep-alive connection starts its next request head
        super().data_received(data)
        self._update()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._update()

    # ---- deadlines ----
    def _awaiting_head(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _update(self) -> None:
        if self.transport is None or self.transport.is_closing():
            return self._disarm()
        if self._awaiting_head():
            if not self.conn.trailing_data[0] and self.timeout_keep_alive_task is not None:
                self._disarm()   # idle between requests: uvicorn's keep-alive timeout applies
            return
        if self.cycle.more_body and not self.cycle.disconnected:
            self._arm("body", self.body_timeout_s)
        else:
            self._disarm()

    def _arm(self, what: str, seconds: float) -> None:
        if self._deadline_for == what:
            return   # a deadline, not an idle timeout: trickling bytes does not extend it
        self._disarm()
        self._deadline_for = what
        self._deadline = self.loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self._deadline_for = None

    def _expired(self) -> None:
        what, self._deadline, self._deadline_for = self._deadline_for, None, None
        if self.transport.is_closing():
            return
        self.logger.info("closing connection from %s: request %s not received in time",
                         "%s:%d" % self.client if self.client else "?", what)
        if self.cycle is None or not self.cycle.response_started:
            if self.cycle is not None:
                self.cycle.scope[TIMED_OUT] = what
            self.transport.write(_408)
        self.transport.close()   # the app's receive() now sees http.disconnect


def timeout_protocol(header_timeout_s: float = HEADER_TIMEOUT_S,
                     body_timeout_s: float = BODY_TIMEOUT_S) -> type[H11Protocol]:
    """A uvicorn `http=` protocol class with these deadlines (seconds, > 0)."""
    if not (header_timeout_s > 0 and body_timeout_s > 0):
        raise ValueError("header and body timeouts must be > 0")
    return type("DeadlineH11Protocol", (_DeadlineH11Protocol,),
                {"header_timeout_s": float(header_timeout_s), "body_timeout_s": float(body_timeout_s)})
