"""Notifications (webhooks) on rollout events: started, step, paused, resumed, promoting, promoted, rolling_back,
rolled_back, failed.

`WebhookNotifier.notify()` only enqueues: one background thread per webhook POSTs in order, retrying transport errors,
5xx and 429 with exponential backoff; a 4xx, exhausted retries or a full queue are logged and dropped. Nothing here
ever blocks or fails the rollout. Bodies: Slack-compatible (`{"text": ...}`, incoming-webhook format) or a generic
JSON document with every field.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

import requests

log = logging.getLogger(__name__)

EVENTS = ("started", "step", "paused", "resumed", "promoting", "promoted", "rolling_back", "rolled_back", "failed")
FORMATS = ("slack", "json")
_ICON = {"started": ":rocket:", "step": ":arrow_up:", "paused": ":double_vertical_bar:", "resumed": ":arrow_forward:",
         "promoting": ":white_check_mark:", "promoted": ":tada:", "rolling_back": ":rewind:",
         "rolled_back": ":leftwards_arrow_with_hook:", "failed": ":rotating_light:"}


@dataclass(slots=True, frozen=True)
class Notification:
    event: str
    service: str
    rollout_id: str
    message: str
    phase: str = ""
    at: float = field(default_factory=time.time)
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["details"] = dict(self.details)
        return d


@runtime_checkable
class Notifier(Protocol):
    def notify(self, n: Notification) -> None: ...     # never blocks, never raises

    def close(self, timeout: float = 5.0) -> None: ...


@dataclass(slots=True)
class WebhookConfig:
    url: str
    format: str = "json"                   # "slack" | "json"
    events: tuple[str, ...] = EVENTS       # which events to send
    timeout_s: float = 5.0
    retries: int = 4                       # attempts after the first one
    backoff_s: float = 0.5                 # doubled after each failed attempt, capped by max_backoff_s
    max_backoff_s: float = 30.0
    queue_size: int = 1000
    headers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url.startswith(("http://", "https://")):
            raise ValueError(f"webhook url must start with http:// or https://, got {self.url!r}")
        if self.format not in FORMATS:
            raise ValueError(f"webhook format must be one of {', '.join(FORMATS)}, got {self.format!r}")
        self.events = tuple(self.events)
        bad = [e for e in self.events if e not in EVENTS]
        if bad:
            raise ValueError(f"unknown webhook event(s) {bad}; events are {', '.join(EVENTS)}")
        if not self.timeout_s > 0 or self.backoff_s < 0 or self.max_backoff_s < self.backoff_s:
            raise ValueError("webhook timeout_s must be > 0 and 0 <= backoff_s <= max_backoff_s")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError("webhook retries must be an integer >= 0")
        if self.queue_size < 1:
            raise ValueError("webhook queue_size must be >= 1")


def slack_body(n: Notification) -> dict:
    rid = n.rollout_id[:12]
    return {"text": f"{_ICON.get(n.event, '')} *{n.service}* rollout `{rid}`: *{n.event.replace('_', ' ')}* "
                    f"- {n.message}".strip()}


def json_body(n: Notification) -> dict:
    return {"source": "sits", **n.to_dict()}


class WebhookNotifier:
    def __init__(self, config: WebhookConfig) -> None:
        self.config = config
        self.sent = self.failed = self.dropped = 0
        self._queue: queue.Queue[Notification | None] = queue.Queue(config.queue_size)
        self._stop = threading.Event()
        self._session = requests.Session()
        self._session.trust_env = False
        self._thread = threading.Thread(target=self._run, name="sits-webhook", daemon=True)
        self._thread.start()

    def notify(self, n: Notification) -> None:
        if n.event not in self.config.events or self._stop.is_set():
            return
        try:
            self._queue.put_nowait(n)
        except queue.Full:
            self.dropped += 1
            log.error("webhook %s: queue full (%d); dropped %s notification for %s", self.config.url,
                      self.config.queue_size, n.event, n.service)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything queued so far was delivered or given up; False on timeout."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self._queue.unfinished_tasks

    def close(self, timeout: float = 5.0) -> None:
        self.flush(timeout)
        self._stop.set()
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass
        self._thread.join(timeout)
        self._session.close()

    def _run(self) -> None:
        while True:
            n = self._queue.get()
            try:
                if n is None:
                    return
                self._deliver(n)
            except Exception:  # never let one notification kill the sender
                log.exception("webhook %s: unexpected error", self.config.url)
            finally:
                self._queue.task_done()

    def _deliver(self, n: Notification) -> None:
        c = self.config
        body = slack_body(n) if c.format == "slack" else json_body(n)
        last = ""
        for attempt in range(c.retries + 1):
            if attempt and self._stop.wait(min(c.max_backoff_s, c.backoff_s * 2 ** (attempt - 1))):
                break
            try:
                r = self._session.post(c.url, json=body, timeout=c.timeout_s, headers=dict(c.headers))
            except requests.RequestException as e:
                last = f"{type(e).__name__}: {e}"
                continue
            if r.status_code < 300:
                self.sent += 1
                return
            last = f"HTTP {r.status_code}: {r.text[:200]}"
            if r.status_code < 500 and r.status_code != 429:
                break  # the receiver rejected the body: retrying will not help
        self.failed += 1
        log.error("webhook %s: %s notification for %s not delivered: %s", c.url, n.event, n.service, last)


class MultiNotifier:
    """Fan-out to several notifiers (each webhook has its own thread, so a slow one delays no other)."""

    def __init__(self, notifiers: Sequence[Notifier] = ()) -> None:
        self.notifiers = list(notifiers)

    def notify(self, n: Notification) -> None:
        for x in self.notifiers:
            try:
                x.notify(n)
            except Exception:
                log.exception("notifier %r failed", x)

    def flush(self, timeout: float = 10.0) -> bool:
        return all(getattr(x, "flush", lambda t: True)(timeout) for x in self.notifiers)

    def close(self, timeout: float = 5.0) -> None:
        for x in self.notifiers:
            x.close(timeout)
