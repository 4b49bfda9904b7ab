"""One request's accounting in the server (engine/server/handlers.py): queue time, TTFT, inter-token and end-to-end
latency into the histograms (probes, `X-SITS-Probe: 1`, are kept out), live requests' token counts (replayed ones,
`X-SITS-Replay: 1`, are kept out), the tokens and logprobs collected for the
answer, and the request's span, finished once."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from sits.engine.core.runner import Output
from sits.engine.server.state import ServerState


@dataclass(slots=True)
class Tracker:
    """Per-request timing and counts; feeds the histograms and the span."""

    state: ServerState
    span: Any
    arrival: float
    prompt_tokens: int
    first_token: float | None = None
    last_token: float | None = None
    output_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    queued: bool = False
    closed: bool = False
    finish_reason: str | None = None
    text: list[str] = field(default_factory=list)
    logprobs: list[dict] = field(default_factory=list)   # one engine entry per generated token, when asked for
    token_ids: list[int] = field(default_factory=list)
    prompt_logprobs: list[dict] = field(default_factory=list)   # echo + logprobs: prompt tokens 1.. scored
    probe: bool = False   # X-SITS-Probe: 1 -- a control-plane probe, kept out of the latency histograms
    replay: bool = False  # X-SITS-Replay: 1 -- low-traffic replay: timed like live, kept out of the token counts

    def on_output(self, item: Output) -> None:
        m = self.state.metrics
        now = time.perf_counter()
        observe = not self.probe
        if not self.queued:
            self.queued = True
            if observe:
                m.observe_queue_time(max(0.0, item.step_start - self.arrival))
        n = len(item.out.new_token_ids)
        if item.out.prompt_logprobs is not None:
            self.prompt_logprobs = item.out.prompt_logprobs
        if n:
            self.token_ids.extend(item.out.new_token_ids)
            if self.first_token is None:
                self.first_token = now
                if observe:
                    m.observe_ttft(now - self.arrival)
                n_itl = n - 1
                gap = 0.0
            else:
                n_itl = n
                gap = (now - self.last_token) / n
            for _ in range(n_itl if observe else 0):
                m.observe_itl(gap)
            self.last_token = now
            self.output_tokens += n
            if item.out.logprobs:
                self.logprobs.extend(item.out.logprobs)
        if item.out.finished:
            self.finish_reason = item.out.finish_reason
            self.prompt_tokens = item.out.num_prompt_tokens or self.prompt_tokens
            self.cached_tokens = item.out.num_cached_tokens or 0

    def close(self, error: str | None = None, *, aborted: bool = False) -> None:
        """Account the request once: finished (finish_reason set), aborted (client gone) or failed (error)."""
        if self.closed:
            return
        self.closed = True
        m = self.state.metrics
        if aborted:
            reason = "abort"
            if not self.probe:
                m.count_finished(reason)
        elif error is not None:
            reason = "error"  # counted by HTTP status in sits_request_errors_total, not as a finished request
        else:
            reason = self.finish_reason or "abort"
            if not self.probe:
                m.observe_e2e(time.perf_counter() - self.arrival)
                m.count_finished(reason)
                if not self.replay:   # the live workload's shape, which replayed requests are drawn from
                    m.observe_tokens(self.prompt_tokens, self.output_tokens)
        ttft = None if self.first_token is None else self.first_token - self.arrival
        self.state.tracer.finish(self.span, prompt_tokens=self.prompt_tokens, output_tokens=self.output_tokens,
                                 ttft_s=ttft, finish_reason=reason, error=error)

    def usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.output_tokens,
                "total_tokens": self.prompt_tokens + self.output_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}
