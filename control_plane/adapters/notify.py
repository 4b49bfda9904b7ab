"""Notifications (webhooks) on rollout events: started, step, paused, resumed, promoting, promoted, rolling_back,
rolled_back, failed.

`WebhookNotifier.notify()` only enqueues: one background thread per webhook POSTs in order, retrying transport errors,
5xx and 429 with exponential backoff; a 4xx, exhausted retries or a full queue are logged and dropped. Nothing here
ever blocks or fails the rollout. Bodies: Slack-compatible (`{"text": ...}`, incoming-webhook format) or a generic
JSON document with every field.

With `journal=store.deliveries` (the control plane's Store; `sits-control worker` passes its own) the queue is the store's
delivery journal (store.deliveries: record ...; read back with deliveries.of_rollout(rollout_id)), so a notification outlives
a crash or restart of the worker: a new notifier for the same webhook delivers what the old one left pending. Each
notification has an idempotency `key` (the worker's is "<rollout id>:<outbox action id>"); the journal holds a key
once per webhook, so the worker re-running a Notify action after a crash queues nothing twice. Delivery is at least
once: a crash between the receiver's answer and the row's update sends it again, and the JSON body carries `key` for
the receiver to drop the repeat. Webhooks are identified in the journal by a hash of their URL (Slack URLs embed a
secret).
"""
from __future__ import annotations

import hashlib
import logging
import queue
import threading
import time
import uuid
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
    key: str = ""   # idempotency key: a journal holds one delivery per key and webhook; "" = a fresh one each time

    def to_dict(self) -> dict:
        d = asdict(self)
        d["details"] = dict(self.details)
        return d


@runtime_checkable
class Notifier(Protocol):
    def notify(self, n: Notification) -> None: ...     # never blocks, never raises

    def flush(self, timeout: float = 10.0) -> bool: ...   # wait until what was queued is delivered or given up

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


class DeliveryJournal(Protocol):
    """Where journaled notifications wait: the store's delivery journal (Store.deliveries, store/queues.py)."""

    def record(self, target: str, key: str, rollout_id: str, body: Mapping[str, Any], *,
                        limit: int) -> bool | None: ...

    def next(self, target: str) -> tuple[int, dict] | None: ...

    def finish(self, delivery_id: int, status: str, attempts: int, error: str | None) -> None: ...

    def pending(self, target: str) -> int: ...


class _Journal:
    """One webhook's durable queue in a DeliveryJournal, oldest first. Webhooks are told apart by a hash of their
    URL (Slack URLs embed a secret)."""

    def __init__(self, journal: DeliveryJournal, url: str) -> None:
        self.journal = journal
        self.target = hashlib.sha256(url.encode()).hexdigest()[:16]

    def add(self, n: Notification, limit: int) -> bool | None:
        """Queue n; None if its key is already queued or done (a replay), False if `limit` are pending."""
        return self.journal.record(self.target, n.key or uuid.uuid4().hex, n.rollout_id, n.to_dict(),
                                            limit=limit)

    def next(self) -> tuple[int, Notification] | None:
        item = self.journal.next(self.target)
        return (item[0], Notification(**item[1])) if item else None

    def finish(self, row_id: int, status: str, attempts: int, error: str | None) -> None:
        self.journal.finish(row_id, status, attempts, error)

    def pending(self) -> int:
        return self.journal.pending(self.target)


class WebhookNotifier:
    """One webhook. `journal`: the store, for a queue that survives restarts (see the module docstring)."""

    def __init__(self, config: WebhookConfig, *, journal: DeliveryJournal | None = None) -> None:
        self.config = config
        self.sent = self.failed = self.dropped = 0
        self._queue: queue.Queue[Notification | None] = queue.Queue(config.queue_size)
        self._journal = _Journal(journal, config.url) if journal is not None else None
        self._wake = threading.Event()
        self._busy = False
        self._stop = threading.Event()
        self._session = requests.Session()
        self._session.trust_env = False
        self._thread = threading.Thread(target=self._run_journal if self._journal else self._run,
                                        name="sits-webhook", daemon=True)
        self._thread.start()

    def notify(self, n: Notification) -> None:
        if n.event not in self.config.events or self._stop.is_set():
            return
        if self._journal is not None:
            try:
                added = self._journal.add(n, self.config.queue_size)
            except Exception as e:   # the store is unwritable (disk full, locked past its timeout, closed)
                added = False
                log.error("webhook %s: journal write failed (%s)", _redact(self.config.url), e)
            if added is False:
                self.dropped += 1
                log.error("webhook %s: queue full (%d) or journal unwritable; dropped %s notification for %s",
                          _redact(self.config.url), self.config.queue_size, n.event, n.service)
            self._wake.set()
            return
        try:
            self._queue.put_nowait(n)
        except queue.Full:
            self.dropped += 1
            log.error("webhook %s: queue full (%d); dropped %s notification for %s", _redact(self.config.url),
                      self.config.queue_size, n.event, n.service)

    def _idle(self) -> bool:
        if self._journal is not None:
            return not self._busy and self._journal.pending() == 0
        return not self._queue.unfinished_tasks

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything queued so far was delivered or given up; False on timeout."""
        deadline = time.monotonic() + timeout
        while not self._idle() and time.monotonic() < deadline:
            time.sleep(0.01)
        return self._idle()

    def close(self, timeout: float = 5.0) -> None:
        """Deliver what is queued (up to `timeout`), then stop. A journal keeps what is left for the next notifier
        (the store stays open: it is the caller's)."""
        self.flush(timeout)
        self._stop.set()
        self._wake.set()
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
                log.exception("webhook %s: unexpected error", _redact(self.config.url))
            finally:
                self._queue.task_done()

    def _run_journal(self) -> None:
        while not self._stop.is_set():
            try:
                self._busy = True
                item = self._journal.next()
                if item is None:
                    self._busy = False
                    self._wake.wait(1.0)
                    self._wake.clear()
                    continue
                row_id, n = item
                status, attempts, error = self._deliver(n)
                if status != "stopped":   # stopped mid-retry: stays pending for the next notifier
                    self._journal.finish(row_id, status, attempts, error)
            except Exception:  # a broken row or database: log, back off, go on
                log.exception("webhook %s: unexpected error", _redact(self.config.url))
                self._stop.wait(1.0)
            finally:
                self._busy = False

    def _deliver(self, n: Notification) -> tuple[str, int, str | None]:
        """POST n with retries: ("sent" | "failed" | "stopped", attempts made, last error)."""
        c = self.config
        body = slack_body(n) if c.format == "slack" else json_body(n)
        last = ""
        attempt = 0
        for attempt in range(c.retries + 1):
            if attempt and self._stop.wait(min(c.max_backoff_s, c.backoff_s * 2 ** (attempt - 1))):
                return "stopped", attempt, last
            try:
                r = self._session.post(c.url, json=body, timeout=c.timeout_s, headers=dict(c.headers))
            except requests.RequestException as e:
                last = f"{type(e).__name__}: {_redact_in(str(e), c.url)}"
                continue
            if r.status_code < 300:
                self.sent += 1
                return "sent", attempt + 1, None
            last = f"HTTP {r.status_code}: {r.text[:200]}"
            if r.status_code < 500 and r.status_code != 429:
                break  # the receiver rejected the body: retrying will not help
        self.failed += 1
        log.error("webhook %s: %s notification for %s not delivered: %s", _redact(c.url), n.event, n.service, last)
        return "failed", attempt + 1, last


def _redact(url: str) -> str:
    """scheme://host/… : webhook paths often are the secret (Slack), so logs show the host only."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0].rsplit('@', 1)[-1]}/…"


def _redact_in(text: str, url: str) -> str:
    """`text` (e.g. a requests error, which quotes the URL's path) without the URL's path or query."""
    text = text.replace(url, _redact(url))
    path = url.partition("://")[2].partition("/")[2]
    return text.replace("/" + path, "/…") if path else text


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
        return all([x.flush(timeout) for x in self.notifiers])   # a list: every notifier gets its flush

    def close(self, timeout: float = 5.0) -> None:
        for x in self.notifiers:
            x.close(timeout)
