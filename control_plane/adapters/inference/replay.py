"""The HTTP side of low-traffic replay: one replayed request to one variant's engine, marked `X-SITS-Replay: 1` so
the engine counts it apart (sits_inference_requests_total{origin="replay"}) and leaves it out of the live token-count
histograms. Sent straight to the engine's endpoint, never through the router. Thread-safe (a session per thread)."""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Protocol

import requests

from sits.control_plane.adapters.sessions import thread_session
from sits.wire.headers import MARK, REPLAY_HEADER


@dataclass(slots=True, frozen=True)
class ReplayAnswer:
    ok: bool
    prompt_tokens: int = 0     # the engine's usage.prompt_tokens (calibrates characters per token)
    prompt_chars: int = 0
    error: str = ""


class ReplaySender(Protocol):
    def model(self, url: str, timeout: float) -> str:
        """The model id the variant serves ("" when it does not say)."""
        ...

    def send(self, url: str, route: str, model: str, prompt: str, max_tokens: int, stream: bool,
             timeout: float) -> ReplayAnswer: ...


class HTTPReplaySender:
    def __init__(self) -> None:
        self._local = threading.local()

    def _session(self) -> requests.Session:
        return thread_session(self._local)

    def model(self, url: str, timeout: float) -> str:
        try:
            r = self._session().get(url.rstrip("/") + "/v1/models", timeout=timeout)
            data = r.json().get("data") if r.status_code == 200 else None
            return str(data[0].get("id", "")) if data else ""
        except (requests.RequestException, ValueError, AttributeError, IndexError, TypeError):
            return ""

    def send(self, url: str, route: str, model: str, prompt: str, max_tokens: int, stream: bool,
             timeout: float) -> ReplayAnswer:
        chat = route == "/v1/chat/completions"
        body = {"model": model, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": stream}
        body.update({"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt})
        if stream:
            body["stream_options"] = {"include_usage": True}
        try:
            with self._session().post(url.rstrip("/") + route, json=body, headers={REPLAY_HEADER: MARK},
                                      timeout=timeout, stream=stream) as r:
                if r.status_code != 200:
                    return ReplayAnswer(False, error=f"HTTP {r.status_code}")
                usage = _usage_of_stream(r) if stream else r.json().get("usage") or {}
        except (requests.RequestException, ValueError) as e:
            return ReplayAnswer(False, error=f"{type(e).__name__}: {e}"[:300])
        return ReplayAnswer(True, int(usage.get("prompt_tokens") or 0), len(prompt))


def _usage_of_stream(r: requests.Response) -> dict:
    usage: dict = {}
    for line in r.iter_lines():
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        try:
            chunk = json.loads(line[6:])
        except ValueError:
            continue
        if isinstance(chunk, dict) and chunk.get("usage"):
            usage = chunk["usage"]
    return usage
