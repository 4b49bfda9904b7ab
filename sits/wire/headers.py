"""The request headers the control plane marks its own traffic with, and the engine reads (value "1").

A probe (`PROBE_HEADER`: the correctness gate's requests) is kept out of every latency histogram and error count;
a replay (`REPLAY_HEADER`: low-traffic mode's workload-matched requests) is timed like live traffic but counted with
origin="replay" and kept out of the live token-count histograms.
"""
from __future__ import annotations

from typing import Iterable, Mapping

PROBE_HEADER = "X-SITS-Probe"
REPLAY_HEADER = "X-SITS-Replay"
MARK = "1"


def marked(headers: Mapping[str, str], name: str) -> bool:
    """True when `headers` (a case-insensitive mapping: starlette's, httpx's) carry `name: 1`."""
    return headers.get(name, "").strip() == MARK


def marked_raw(headers: Iterable[tuple[bytes, bytes]], name: str) -> bool:
    """The same over an ASGI scope's raw header pairs (lower-cased names)."""
    return (name.lower().encode(), MARK.encode()) in headers
