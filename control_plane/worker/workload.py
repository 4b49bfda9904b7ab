"""What low-traffic replay sends (control_plane/worker/replay.py): requests drawn from the service's own recent live
workload. Pure: no I/O, randomness from the caller's `random.Random`.

`Workload.from_data(variants)`: the step's live token-count histograms summed over every variant
(sits_request_prompt_tokens / sits_request_generation_tokens; engines leave replayed requests out of them), the live
streamed share, and the route mix of the request-latency series. `sample(rng)` draws one request's prompt and answer
lengths by inverting the histograms (uniform inside a bucket, the interpolation histogram_quantile uses), streamed
with the live share, on a route in the live mix. `prompt(...)` builds a prompt of about N tokens from the rollout's
prompt set, using the chars-per-token ratio the engines' answers reported (`usage.prompt_tokens`).
"""
from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass
from typing import Mapping, Sequence

from sits.control_plane.analysis import GENERATION_TOKENS, PROMPT_TOKENS, REQUEST_LATENCY, HistogramSnapshot, VariantData
from sits.control_plane.analysis.histogram import merge_all

DEFAULT_ROUTE = "/v1/completions"


@dataclass(slots=True, frozen=True)
class ReplayRequest:
    route: str
    prompt_tokens: int
    max_tokens: int
    stream: bool


def _merged(variants: Mapping[str, VariantData], key: str) -> HistogramSnapshot | None:
    hs = [v.histograms[key] for v in variants.values() if key in v.histograms and v.histograms[key].total > 0]
    return merge_all(hs) if hs else None


def _draw(h: HistogramSnapshot, rng: random.Random) -> int:
    """One value from the histogram: a bucket by its count, then uniform between its bounds."""
    total = h.counts[-1]
    u = rng.random() * total
    i = bisect.bisect_right(h.counts, u)
    i = min(i, len(h.counts) - 1)
    hi = h.bounds[i]
    lo = h.bounds[i - 1] if i > 0 else 0.0
    if math.isinf(hi):   # above the last finite bound: that bound (as histogram_quantile does)
        return max(1, int(lo))
    return max(1, int(math.ceil(lo + rng.random() * (hi - lo))))


@dataclass(slots=True, frozen=True)
class Workload:
    prompt_tokens: HistogramSnapshot | None
    generation_tokens: HistogramSnapshot | None
    stream_share: float
    routes: tuple[tuple[str, float], ...]   # (route, share), shares summing to 1
    live_requests: float

    @classmethod
    def from_data(cls, variants: Mapping[str, VariantData]) -> "Workload":
        live = sum(v.live for v in variants.values())
        streamed = sum(v.streamed for v in variants.values())
        counts: dict[str, float] = {}
        prefix = REQUEST_LATENCY + '{route="'
        for v in variants.values():
            for key, h in v.histograms.items():
                if key.startswith(prefix) and h.total > 0:
                    route = key[len(prefix):].split('"', 1)[0]
                    counts[route] = counts.get(route, 0.0) + h.total
        total = sum(counts.values())
        routes = tuple((r, n / total) for r, n in sorted(counts.items())) if total > 0 else ((DEFAULT_ROUTE, 1.0),)
        return cls(_merged(variants, PROMPT_TOKENS), _merged(variants, GENERATION_TOKENS),
                   min(1.0, streamed / live) if live > 0 else 0.0, routes, live)

    @property
    def known(self) -> bool:
        """The live token counts are known (some live request finished): replay can match them."""
        return self.prompt_tokens is not None and self.generation_tokens is not None

    def sample(self, rng: random.Random, default_max_tokens: int = 16) -> ReplayRequest:
        """One request. Unknown lengths (no live request finished yet): prompt 0 tokens (the prompt set's own prompt
        as it is) and `default_max_tokens`."""
        u, acc, route = rng.random(), 0.0, self.routes[-1][0]
        for r, share in self.routes:
            acc += share
            if u < acc:
                route = r
                break
        p = _draw(self.prompt_tokens, rng) if self.prompt_tokens is not None else 0
        g = _draw(self.generation_tokens, rng) if self.generation_tokens is not None else default_max_tokens
        return ReplayRequest(route, p, g, rng.random() < self.stream_share)


def prompt(prompts: Sequence[str], tokens: int, chars_per_token: float, rng: random.Random) -> str:
    """A prompt of about `tokens` tokens: prompts of the set, picked at random and joined by blank lines until long
    enough, then cut to tokens * chars_per_token characters. tokens 0: one prompt of the set as it is."""
    first = prompts[rng.randrange(len(prompts))]
    if tokens <= 0:
        return first
    want = max(1, int(round(tokens * chars_per_token)))
    parts, n = [first], len(first)
    while n < want:
        nxt = prompts[rng.randrange(len(prompts))]
        parts.append(nxt)
        n += len(nxt) + 2
    return "\n\n".join(parts)[:want]
