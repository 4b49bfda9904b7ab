"""What the load generator sends, and when: a seeded schedule of chat-like requests (loadgen.py sends it).

`plan(rate, mix, seed)` is an endless iterator of `Planned` requests with Poisson arrivals at `rate`/s; each one's
prompt and output lengths come from the `TrafficMix` (lognormal `LengthDist`s, ShareGPT-like: most short, a long
tail), and so do whether it streams and whether it is a chat or a completion. Every request asks for exactly its
output length (`ignore_eos`) with logprobs, so that the answer can be verified token by token. Pure and
deterministic in the seed: no I/O here.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

_WORDS = ("the", "a", "canary", "kernel", "latency", "request", "token", "model", "cache", "page", "block", "why",
          "how", "does", "explain", "write", "summarise", "code", "please", "release", "faster", "about", "is", "of")


@dataclass(slots=True, frozen=True)
class LengthDist:
    """Lognormal lengths (median, sigma of the log) clipped to [lo, hi]: the shape of chat traffic's prompt and
    output lengths (ShareGPT-like: most short, a long tail)."""
    median: float
    sigma: float
    lo: int
    hi: int

    def __post_init__(self) -> None:
        if not self.median > 0 or self.sigma < 0 or not 1 <= self.lo <= self.hi:
            raise ValueError(f"length distribution needs median > 0, sigma >= 0 and 1 <= lo <= hi, got {self}")

    def sample(self, rng: random.Random) -> int:
        x = self.median if self.sigma == 0 else rng.lognormvariate(math.log(self.median), self.sigma)
        return int(min(self.hi, max(self.lo, round(x))))


@dataclass(slots=True, frozen=True)
class TrafficMix:
    """What the requests look like. Lengths are in tokens (the tiny model's tokenizer is byte-level: one prompt
    character is one token). `stream_fraction` of requests stream (SSE); `chat_fraction` use /v1/chat/completions."""
    prompt_tokens: LengthDist = LengthDist(48, 0.8, 4, 400)
    output_tokens: LengthDist = LengthDist(6, 0.6, 1, 32)
    stream_fraction: float = 0.5
    chat_fraction: float = 0.5

    def __post_init__(self) -> None:
        if not (0 <= self.stream_fraction <= 1 and 0 <= self.chat_fraction <= 1):
            raise ValueError("stream_fraction and chat_fraction must be in [0, 1]")

    @classmethod
    def fixed(cls, prompt_tokens: int, output_tokens: int, *, stream_fraction: float = 0.0) -> "TrafficMix":
        return cls(LengthDist(prompt_tokens, 0, prompt_tokens, prompt_tokens),
                   LengthDist(output_tokens, 0, output_tokens, output_tokens), stream_fraction, 0.0)


@dataclass(slots=True, frozen=True)
class Planned:
    """One request of the schedule: when (seconds after start), where, what, how many tokens."""
    at: float
    route: str
    stream: bool
    body: dict
    max_tokens: int

    @property
    def kind(self) -> str:
        return ("chat" if self.route.endswith("chat/completions") else "completion") + \
            ("+stream" if self.stream else "")


def _prompt(rng: random.Random, n: int, fixed: str | None) -> str:
    if fixed is not None:
        return fixed
    words: list[str] = []
    size = 0
    while size < n:
        w = rng.choice(_WORDS)
        words.append(w)
        size += len(w) + 1
    return " ".join(words)[:n]


def plan(rate: float, mix: TrafficMix, seed: int, *, model: str = "tiny", prompt: str | None = None):
    """The request schedule: an endless iterator of Planned, Poisson arrivals at `rate`/s. Deterministic in seed."""
    rng = random.Random(seed)
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        n_out = mix.output_tokens.sample(rng)
        text = _prompt(rng, mix.prompt_tokens.sample(rng), prompt)
        stream = rng.random() < mix.stream_fraction
        chat = rng.random() < mix.chat_fraction
        body: dict = {"model": model, "max_tokens": n_out, "temperature": 0, "ignore_eos": True, "stream": stream}
        if chat:
            body |= {"messages": [{"role": "user", "content": text}], "logprobs": True}
        else:
            body |= {"prompt": text, "logprobs": 0}
        if stream:
            body["stream_options"] = {"include_usage": True}
        yield Planned(t, "/v1/chat/completions" if chat else "/v1/completions", stream, body, n_out)
