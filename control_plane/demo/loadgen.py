"""Open-loop load through a router (the demo's traffic, and the end-to-end tests'): Poisson arrivals, chat-like prompt
and output lengths, streaming and non-streaming requests; every answer is verified token by token and counted per
variant (the router's x-sits-variant header), request kind and outcome.

Open loop: arrival times are drawn in advance (exponential gaps, seeded) and do not wait for answers; `threads`
senders take them in order, and a request's latency counts from its scheduled arrival, so a sender that falls behind
shows as latency instead of silently lowering the rate (no coordinated omission).

Verification: every request asks for exactly `max_tokens` tokens (`ignore_eos`) with their logprobs. A plain answer
is good when it has status 200, finish_reason "length", `usage.completion_tokens == max_tokens` and one logprob entry
per token; a streamed one when, in addition, the logprob entries across its chunks add up to max_tokens, the usage
chunk agrees, no in-band error arrives and the stream ends with [DONE]. Anything else is counted under its outcome.
"""
from __future__ import annotations

import json
import queue
import re
import threading
import time
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field

import httpx

from sits.control_plane.demo.traffic import Planned, TrafficMix, plan
from sits.control_plane.rollout import ROLES
from sits.wire.tracing import SpanKind, Tracing, inject, set_attributes

OK = "ok"
# outcomes other than OK: "http_<status>", "short" (a 200 with fewer/more tokens than asked), "stream_error" (an
# in-band error event), "truncated" (the stream ended without [DONE]), "transport" (no answer at all)

_NO_CHOICES = re.compile(r'"choices":\s*\[\s*\]')


def _timed(lines, arrivals: list[float]):
    """The SSE lines, recording when each one carrying choices arrived (its token events; the usage-only last
    event has an empty list)."""
    for line in lines:
        if line.startswith("data:") and '"choices"' in line and not _NO_CHOICES.search(line):
            arrivals.append(time.monotonic())
        yield line


def _count_logprobs(choice: dict, chat: bool) -> int:
    lp = choice.get("logprobs") or {}
    return len(lp.get("content") or ()) if chat else len(lp.get("tokens") or ())


def verify_plain(p: Planned, data: dict) -> tuple[str, int]:
    """(outcome, tokens) of a non-streamed 200 answer."""
    choice = (data.get("choices") or [{}])[0]
    n = _count_logprobs(choice, p.route.endswith("chat/completions"))
    used = (data.get("usage") or {}).get("completion_tokens")
    good = n == used == p.max_tokens and choice.get("finish_reason") == "length"
    return (OK if good else "short"), n


def verify_stream(p: Planned, lines) -> tuple[str, int]:
    """(outcome, tokens) of a streamed 200 answer, read from its SSE lines."""
    chat = p.route.endswith("chat/completions")
    tokens, usage, finish, done = 0, None, None, False
    for line in lines:
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            done = True
            break
        ev = json.loads(payload)
        if "error" in ev:
            return "stream_error", tokens
        if ev.get("usage"):
            usage = ev["usage"].get("completion_tokens")
        for c in ev.get("choices") or ():
            tokens += _count_logprobs(c, chat)
            finish = c.get("finish_reason") or finish
    if not done:
        return "truncated", tokens
    good = tokens == usage == p.max_tokens and finish == "length"
    return (OK if good else "short"), tokens


@dataclass(slots=True)
class Tally:
    """Counts of finished requests: (variant, kind, outcome) -> requests, plus verified tokens per variant."""
    requests: Counter = field(default_factory=Counter)
    tokens: Counter = field(default_factory=Counter)

    def per_variant(self) -> dict[str, dict[str, int]]:
        """variant -> {"answered": ok requests, "failed": the rest, "tokens": tokens of ok answers, <outcome>: n},
        in role order (production, baseline, canary, then any other answerer such as "?"), whichever answered first."""
        out: dict[str, dict[str, int]] = {}
        order = {r: i for i, r in enumerate(ROLES)}
        for (variant, _kind, outcome), n in sorted(self.requests.items(),
                                                   key=lambda kv: (order.get(kv[0][0], len(order)), kv[0])):
            row = out.setdefault(variant, {"answered": 0, "failed": 0, "tokens": self.tokens[variant]})
            row["answered" if outcome == OK else "failed"] += n
            row[outcome] = row.get(outcome, 0) + n
        return out


class LoadGenerator:
    """`LoadGenerator(url, rate, threads, max_tokens, prompt)`: Poisson arrivals at `rate` requests/s through the
    router, sent by `threads` senders. With no `mix`, every request is the same non-streamed completion of
    `max_tokens` tokens for `prompt`; with a TrafficMix, lengths, streaming and route are drawn per request (seeded).
    `sent`, `answered`, `tally` and `summary()` may be read while it runs; `stop()` waits for requests in flight.
    The router names the variant that answered (X-SITS-Variant) only to trusted callers: `pin_token` makes this one
    (its requests are still routed by weight), else every variant is "?"."""

    def __init__(self, url: str, rate: float = 20.0, threads: int = 16, max_tokens: int = 4,
                 prompt: str = "Once upon a time", *, mix: TrafficMix | None = None, seed: int = 0,
                 model: str = "tiny", timeout_s: float = 60.0, tracing: Tracing | None = None,
                 pin_token: str | None = None) -> None:
        if not rate > 0 or threads < 1 or max_tokens < 1:
            raise ValueError("load rate must be > 0, threads and max_tokens >= 1")
        self.url, self.rate, self.threads, self.timeout_s = url.rstrip("/"), rate, threads, timeout_s
        self.tracing = tracing or Tracing()
        self._headers = {"X-SITS-Pin-Token": pin_token} if pin_token else {}
        self.mix = mix or TrafficMix.fixed(len(prompt), max_tokens)
        self._plan = plan(rate, self.mix, seed, model=model, prompt=None if mix else prompt)
        self.sent = 0          # requests sent (answered or not)
        self.tally = Tally()
        self.recent: deque[tuple[float, str, int, float, str]] = deque(maxlen=20000)  # (t, variant, status, s, outcome)
        # client-side TTFT and gaps between token events of verified streams, per variant (token_latency())
        self.ttft: defaultdict[str, deque] = defaultdict(lambda: deque(maxlen=20000))
        self.itl: defaultdict[str, deque] = defaultdict(lambda: deque(maxlen=20000))
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._t0 = 0.0

    @property
    def answered(self) -> int:
        with self._lock:
            return sum(n for (_, _, o), n in self.tally.requests.items() if o == OK)

    @property
    def finished(self) -> int:
        with self._lock:
            return sum(self.tally.requests.values())

    def start(self) -> "LoadGenerator":
        self._t0 = time.monotonic()
        self._threads = [threading.Thread(target=self._arrivals, name="sits-load-arrivals", daemon=True)]
        self._threads += [threading.Thread(target=self._sender, name=f"sits-load-{i}", daemon=True)
                          for i in range(self.threads)]
        for t in self._threads:
            t.start()
        return self

    @property
    def backlog(self) -> int:
        """Arrivals waiting for a free sender (grows while the service answers slower than the rate)."""
        return self._queue.qsize()

    def stop(self, timeout: float = 60.0) -> None:
        """No new requests: arrivals stop, and those still queued behind busy senders (an overloaded service) are
        dropped unsent; requests already sent finish (up to `timeout`), so sent == finished afterwards."""
        self._stop.set()
        for _ in range(self.threads):
            self._queue.put(None)
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def _arrivals(self) -> None:
        for p in self._plan:
            delay = self._t0 + p.at - time.monotonic()
            if delay > 0 and self._stop.wait(delay):
                return
            if self._stop.is_set():
                return
            self._queue.put(p)

    def _sender(self) -> None:
        with httpx.Client(timeout=self.timeout_s, trust_env=False) as c:
            while True:
                p = self._queue.get()
                if p is None or self._stop.is_set():
                    return
                with self._lock:
                    self.sent += 1
                variant, status, outcome, tokens = self._send(c, p)
                done = time.monotonic()
                with self._lock:
                    self.tally.requests[(variant, p.kind, outcome)] += 1
                    if outcome == OK:
                        self.tally.tokens[variant] += tokens
                    self.recent.append((done, variant, status, done - (self._t0 + p.at), outcome))

    def _send(self, c: httpx.Client, p: Planned) -> tuple[str, int, str, int]:
        # one CLIENT span per request; its traceparent is continued by the engine that answers (through the router)
        with self.tracing.span(f"POST {p.route}", kind=SpanKind.CLIENT,
                               attributes={"sits.load.kind": p.kind, "http.request.method": "POST"}) as span:
            variant, status, outcome, n = self._exchange(c, p)
            set_attributes(span, {"http.response.status_code": status, "sits.variant": variant,
                                  "sits.load.outcome": outcome})
            return variant, status, outcome, n

    def _exchange(self, c: httpx.Client, p: Planned) -> tuple[str, int, str, int]:
        variant, status = "?", 0
        sent_at = time.monotonic()
        try:
            with c.stream("POST", self.url + p.route, json=p.body, headers={**self._headers, **inject()}) as r:
                variant, status = r.headers.get("x-sits-variant", "?"), r.status_code
                if status != 200:
                    r.read()
                    return variant, status, f"http_{status}", 0
                if p.stream:
                    arrivals: list[float] = []
                    outcome, n = verify_stream(p, _timed(r.iter_lines(), arrivals))
                    if outcome == OK and arrivals:
                        self._record_stream(variant, sent_at, arrivals)
                else:
                    outcome, n = verify_plain(p, json.loads(r.read()))
                return variant, status, outcome, n
        except httpx.HTTPError:
            return variant, status, "truncated" if status == 200 else "transport", 0
        except (ValueError, KeyError, IndexError, TypeError):   # a 200 whose body is not what the API promises
            return variant, status, "short", 0

    def _record_stream(self, variant: str, sent_at: float, arrivals: list[float]) -> None:
        with self._lock:
            self.ttft[variant].append(arrivals[0] - sent_at)
            self.itl[variant].extend(b - a for a, b in zip(arrivals, arrivals[1:]))

    def token_latency(self, reset: bool = False) -> dict[str, dict[str, float]]:
        """Client-side TTFT and inter-token latency of the verified streamed answers per variant (seconds, each over
        its last 20,000 samples, since the last reset): {variant: {"ttft_p50", "ttft_p99", "itl_p50", "itl_p99",
        "streams"}}. `reset`: start the next one afresh."""
        with self._lock:
            ttft, itl = {v: sorted(x) for v, x in self.ttft.items()}, {v: sorted(x) for v, x in self.itl.items()}
            if reset:
                self.ttft.clear()
                self.itl.clear()

        def q(xs: list[float], f: float) -> float:
            return xs[min(len(xs) - 1, int(f * len(xs)))] if xs else float("nan")
        return {v: {"ttft_p50": q(ttft[v], 0.5), "ttft_p99": q(ttft[v], 0.99), "itl_p50": q(itl.get(v, []), 0.5),
                    "itl_p99": q(itl.get(v, []), 0.99), "streams": len(ttft[v])} for v in sorted(ttft)}

    def counts(self) -> dict[str, dict[str, int]]:
        """Per variant: answered (verified), failed, tokens, and each outcome's count."""
        with self._lock:
            return self.tally.per_variant()

    def summary(self, last_s: float = 10.0) -> dict:
        """Requests/s, errors, share and p90 client latency per variant over the last `last_s` seconds."""
        cut = time.monotonic() - last_s
        with self._lock:
            rows = [x for x in self.recent if x[0] >= cut]
        out = {"rate": len(rows) / last_s, "errors": sum(1 for r in rows if r[4] != OK), "variants": {}}
        for v in sorted({r[1] for r in rows}):
            lat = sorted(r[3] for r in rows if r[1] == v)
            out["variants"][v] = {"share": len(lat) / len(rows), "p90_ms": 1000 * lat[int(0.9 * (len(lat) - 1))]}
        return out
