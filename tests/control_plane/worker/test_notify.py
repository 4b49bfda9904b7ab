"""Webhook notifier against a real local HTTP receiver: bodies, retries with backoff, never blocking."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sits.control_plane.adapters.notify import (MultiNotifier, Notification, WebhookConfig, WebhookNotifier, json_body,
                                           slack_body)
from sits.control_plane.store.db import Store
from tests.waiting import wait_for


class Receiver:
    """A real HTTP server; `script` is the list of status codes to answer in turn (then 200); `delay` seconds;
    `gate`: an Event every answer waits for (a receiver that hangs until the test lets it go)."""

    def __init__(self, script=(), delay=0.0, gate=None):
        self.script, self.delay, self.gate, self.hits, self.bodies = list(script), delay, gate, [], []
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.hits.append((time.monotonic(), dict(self.headers)))
                if outer.gate is not None:
                    outer.gate.wait(30)
                time.sleep(outer.delay)
                code = outer.script.pop(0) if outer.script else 200
                if code == 200:
                    outer.bodies.append(json.loads(body))
                self.send_response(code)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    made = []

    def make(*a, **kw):
        made.append(Receiver(*a, **kw))
        return made[-1]
    yield make
    for r in made:
        r.close()


N = Notification("rolled_back", "chat", "chat-20261130-abc123", "production torch restored (p99 +40 %)",
                 "rolled_back", details={"weight": 10})


def test_bodies_slack_and_generic_json(receiver):
    rx = receiver()
    slack = WebhookNotifier(WebhookConfig(rx.url, format="slack", headers={"X-Token": "t1"}))
    generic = WebhookNotifier(WebhookConfig(rx.url, format="json"))
    MultiNotifier([slack, generic]).notify(N)
    assert slack.flush(5) and generic.flush(5)
    assert len(rx.bodies) == 2
    s = next(b for b in rx.bodies if "text" in b)
    g = next(b for b in rx.bodies if "event" in b)
    assert s == slack_body(N) and set(s) == {"text"} and "*chat*" in s["text"] and "rolled back" in s["text"]
    assert g == json_body(N) and g["event"] == "rolled_back" and g["details"] == {"weight": 10}
    assert g["rollout_id"] == N.rollout_id and g["source"] == "sits"
    assert any(h.get("X-Token") == "t1" for _, h in rx.hits)
    slack.close()
    generic.close()


def test_retries_5xx_and_429_with_backoff_then_delivers(receiver):
    rx = receiver(script=[500, 503, 429])
    n = WebhookNotifier(WebhookConfig(rx.url, retries=4, backoff_s=0.1))
    n.notify(N)
    assert n.flush(10)
    assert n.sent == 1 and n.failed == 0 and len(rx.hits) == 4 and len(rx.bodies) == 1
    gaps = [b[0] - a[0] for a, b in zip(rx.hits, rx.hits[1:])]
    assert gaps[0] >= 0.09 and gaps[1] >= 0.19 and gaps[2] >= 0.39      # exponential backoff
    n.close()


def test_gives_up_after_retries_and_on_4xx_without_retrying(receiver, caplog):
    rx = receiver(script=[500] * 10)
    n = WebhookNotifier(WebhookConfig(rx.url, retries=2, backoff_s=0.01))
    n.notify(N)
    assert n.flush(5) and n.failed == 1 and n.sent == 0 and len(rx.hits) == 3
    assert "not delivered" in caplog.text
    rx2 = receiver(script=[400])
    m = WebhookNotifier(WebhookConfig(rx2.url, retries=5, backoff_s=0.01))
    m.notify(N)
    assert m.flush(5) and m.failed == 1 and len(rx2.hits) == 1
    n.close()
    m.close()


def test_never_blocks_the_caller_and_unreachable_is_only_logged(receiver, caplog):
    gate = threading.Event()
    slow = receiver(gate=gate)                        # answers nothing until the gate opens
    n = WebhookNotifier(WebhookConfig(slow.url, timeout_s=30))
    dead = WebhookNotifier(WebhookConfig("http://127.0.0.1:9/nothing-listens", retries=1, backoff_s=0.01,
                                         timeout_s=0.5))
    both = MultiNotifier([n, dead])
    returned = threading.Event()

    def caller():
        for _ in range(3):
            both.notify(N)
        returned.set()
    threading.Thread(target=caller, daemon=True).start()
    # every notify() returned while the receiver still holds the first request: they only enqueue
    assert returned.wait(20) and not gate.is_set() and slow.bodies == []
    gate.set()
    assert dead.flush(5) and dead.failed == 3
    assert n.flush(10) and n.sent == 3 and len(slow.bodies) == 3
    assert "ConnectionError" in caplog.text
    n.close()
    dead.close()


def test_full_queue_drops_and_filters_events(receiver):
    rx = receiver(delay=0.3)
    n = WebhookNotifier(WebhookConfig(rx.url, queue_size=1, events=("rolled_back", "promoted")))
    n.notify(Notification("step", "chat", "r", "canary at 10 %"))     # filtered out
    for _ in range(4):
        n.notify(N)                                                   # one in flight, one queued, the rest dropped
    assert n.flush(5) and n.dropped >= 1 and n.sent + n.dropped == 4
    assert all(b["event"] == "rolled_back" for b in rx.bodies)
    n.close()


def test_config_validation():
    with pytest.raises(ValueError, match="http"):
        WebhookConfig("ftp://x")
    with pytest.raises(ValueError, match="format"):
        WebhookConfig("http://x", format="teams")
    with pytest.raises(ValueError, match="unknown webhook event"):
        WebhookConfig("http://x", events=("exploded",))


@pytest.mark.parametrize("where", ["file", ":memory:"])
def test_journal_outlives_the_notifier_and_replays_are_no_ops(receiver, tmp_path, where):
    # the worker's webhook queue lives in the store's delivery journal: a notification still being retried when the
    # worker stops is delivered by the next worker's notifier, once; a replayed key (a Notify action re-run after a
    # crash) queues nothing. An in-memory store journals the same way.
    db = Store(str(tmp_path / "sits.db") if where == "file" else ":memory:")
    rx = receiver(script=[503] * 1000)
    first = WebhookNotifier(WebhookConfig(rx.url, retries=1000, backoff_s=0.02, max_backoff_s=0.02), journal=db.deliveries)
    keyed = Notification("rolled_back", "chat", "chat-1", "restored", key="chat-1:7")
    first.notify(keyed)
    wait_for("two delivery attempts", lambda: len(rx.hits) >= 2, timeout=5, interval=0.01)
    first.close(timeout=0.1)   # stops mid-retry: the row stays pending
    assert len(rx.hits) >= 2 and rx.bodies == [] and first.sent == 0
    rx.script.clear()
    second = WebhookNotifier(WebhookConfig(rx.url, retries=2, backoff_s=0.01), journal=db.deliveries)
    assert second.flush(5)
    assert [b["key"] for b in rx.bodies] == ["chat-1:7"] and rx.bodies[0]["event"] == "rolled_back"
    second.notify(keyed)                                              # the same key again: already delivered
    second.notify(Notification("promoted", "chat", "chat-2", "done", key="chat-2:9"))
    assert second.flush(5)
    assert [b["key"] for b in rx.bodies] == ["chat-1:7", "chat-2:9"]
    other = receiver()                                                # another webhook: its own queue in the file
    third = WebhookNotifier(WebhookConfig(other.url), journal=db.deliveries)
    third.notify(keyed)
    assert third.flush(5) and [b["key"] for b in other.bodies] == ["chat-1:7"]
    second.close()
    third.close()
    log = db.deliveries.of_rollout("chat-1")                     # one row per webhook, read back by rollout
    assert [(d["key"], d["status"]) for d in log] == [("chat-1:7", "sent"), ("chat-1:7", "sent")]
    assert len({d["webhook"] for d in log}) == 2 and all(rx.url not in d["webhook"] for d in log)
    db.close()


def test_webhook_secrets_stay_out_of_the_logs(caplog):
    url = "http://127.0.0.1:9/services/T0001/B0002/S3cr3tT0ken"
    n = WebhookNotifier(WebhookConfig(url, retries=1, backoff_s=0.01, timeout_s=0.5))
    with caplog.at_level("ERROR"):
        n.notify(N)
        assert n.flush(5) and n.failed == 1
    assert "not delivered" in caplog.text and "127.0.0.1" in caplog.text
    assert "S3cr3tT0ken" not in caplog.text and "T0001" not in caplog.text
    n.close()
