"""Which backend gets the next request: a service's traffic weights, its variants' replica URLs and what is in flight.

`RouteTable` is the router's selection state, thread-safe (setters from the deployer's threads, `pick` on the
router's event loop): smooth weighted round-robin over the variants with weight and a backend (the split over N
requests is exact to within one request per variant), round-robin over a variant's replicas, and a count of requests
in flight per variant, so a deployer can drain a variant before stopping it. Swapping weights or backends is atomic:
a request already picked finishes on the backend it got.
"""
from __future__ import annotations

import threading
from typing import Mapping

import httpx

from sits.control_plane.rollout import ROLES, traffic_split
from sits.control_plane.router import RouterError
from sits.control_plane.router import forwarding as rh


class RouteTable:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._weights = {r: 0 for r in ROLES}
        self._backends: dict[str, tuple[httpx.URL, ...]] = {}
        self._current = {r: 0 for r in ROLES}   # smooth WRR state
        self._rr = {r: 0 for r in ROLES}        # round-robin among a variant's replicas
        self._in_flight = {r: 0 for r in ROLES}

    def set_weights(self, weights: Mapping[str, int]) -> dict[str, int]:
        """Replace the weights (normalized to sum 100, RouterError if they cannot be); returns them."""
        try:
            w = traffic_split(weights)
        except ValueError as e:
            raise RouterError(str(e)) from None
        with self._lock:
            self._weights = w
            self._current = {r: 0 for r in ROLES}
        return w

    def weights(self) -> dict[str, int]:
        with self._lock:
            return dict(self._weights)

    def set_backends(self, role: str, urls: list[str] | tuple[str, ...] | None) -> None:
        """The replicas of `role` (None or empty: the variant has no backend and gets no requests)."""
        if role not in ROLES:
            raise RouterError(f"unknown role {role!r}")
        try:
            parsed = tuple(rh.parse_backend(u) for u in urls or ())
        except (ValueError, httpx.InvalidURL) as e:
            raise RouterError(f"role {role}: {e}") from None
        with self._lock:
            if parsed:
                self._backends[role] = parsed
            else:
                self._backends.pop(role, None)

    def in_flight(self, role: str) -> int:
        with self._lock:
            return self._in_flight[role]

    def pick(self, pinned: str | None) -> tuple[str, httpx.URL] | None:
        """The variant and replica for the next request (the pinned variant if any), counted in flight until
        done(role); None when no variant can take it."""
        with self._lock:
            if pinned is not None:
                role = pinned
                if role not in self._backends:
                    return None
            else:
                live = [r for r in ROLES if self._weights[r] > 0 and r in self._backends]
                if not live:
                    return None
                total = sum(self._weights[r] for r in live)
                for r in live:
                    self._current[r] += self._weights[r]
                role = max(live, key=lambda r: self._current[r])
                self._current[role] -= total
            urls = self._backends[role]
            url = urls[self._rr[role] % len(urls)]
            self._rr[role] += 1
            self._in_flight[role] += 1
        return role, url

    def done(self, role: str) -> None:
        with self._lock:
            self._in_flight[role] -= 1

    def snapshot(self) -> dict:
        """Weights, backends and in-flight counts, as the router's /_sits/weights shows them."""
        with self._lock:
            return {"weights": dict(self._weights),
                    "backends": {r: [str(x) for x in u] for r, u in self._backends.items()},
                    "in_flight": dict(self._in_flight)}
