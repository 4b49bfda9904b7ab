"""Prometheus `MetricsSource`: per-variant bucket increases over the window, by PromQL over the HTTP API.

For each variant and metric: `sum by (le[, route]) (increase(<metric>_bucket{service=..., env=<role>}[W]))` evaluated
at the window's end, so the analysis gets bucket COUNTS per variant (replicas summed by the `sum`), not a single
quantile; plus the inference requests and 5xx errors. Templates: control_plane/analysis/promql.py (shared with the
dashboards). The analysis does not use `_sum`, so the snapshots carry sum 0. The `env` label is the role.

Stateless: the window is exactly [start, end] as asked (start = the end of the last window the caller counted), so a
restarted worker continues where the persisted state left off. Transport errors and 5xx/429 are retried with
exponential backoff; auth is a bearer token or basic auth.
"""
from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import requests

from sits.control_plane.adapters.metrics import (INFERENCE_ROUTES, MetricsQueryError, MetricsWindow, MultipleSeriesError,
                                            NoDataError, Target)
from sits.control_plane.analysis import promql
from sits.control_plane.analysis import REQUEST_LATENCY, HistogramError, HistogramSnapshot, VariantData
from sits.control_plane.redact import redact, split_credentials
from sits.wire.metrics import INFERENCE_REQUESTS, ORIGIN, ORIGIN_LIVE, ORIGIN_REPLAY


@dataclass(slots=True)
class PrometheusConfig:
    url: str                                     # user:password@ in it moves to basic_auth (never kept in url)
    bearer_token: str | None = field(default=None, repr=False)
    basic_auth: tuple[str, str] | None = field(default=None, repr=False)    # (user, password)
    timeout_s: float = 5.0
    retries: int = 3                             # attempts after the first one
    backoff_s: float = 0.25                      # doubled after each failed attempt ...
    max_backoff_s: float = 5.0                   # ... up to this
    routes: tuple[str, ...] = INFERENCE_ROUTES
    lag_s: float = 0.0                           # evaluate at end - lag_s (let the last scrape land)
    verify_tls: bool | str = True
    headers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url.startswith(("http://", "https://")):
            raise ValueError(f"prometheus url must start with http:// or https://, got {self.url!r}")
        self.url, in_url = split_credentials(self.url.rstrip("/"))
        if in_url is not None:
            if self.basic_auth is not None or self.bearer_token is not None:
                raise ValueError("prometheus credentials given twice: in the url and as token/basic auth")
            self.basic_auth = in_url
        if self.bearer_token is not None and self.basic_auth is not None:
            raise ValueError("give a bearer token or basic auth, not both")
        if self.basic_auth is not None:
            if len(self.basic_auth) != 2 or not all(isinstance(x, str) for x in self.basic_auth):
                raise ValueError("basic_auth must be (user, password)")
            self.basic_auth = tuple(self.basic_auth)
        if not self.timeout_s > 0 or self.backoff_s < 0 or self.lag_s < 0 or self.max_backoff_s < self.backoff_s:
            raise ValueError("timeout_s must be > 0, backoff_s and lag_s >= 0, max_backoff_s >= backoff_s")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError("retries must be an integer >= 0")
        self.routes = tuple(self.routes)


class PrometheusSource:
    name = "prometheus"

    def __init__(self, config: PrometheusConfig, *, sleep: Callable[[float], None] = time.sleep) -> None:
        self._sleep = sleep   # between retries (tests pass a recorder)
        self.config = config
        self._session = requests.Session()
        self._session.trust_env = False
        self._session.headers.update(config.headers)
        if config.bearer_token:
            self._session.headers["Authorization"] = f"Bearer {config.bearer_token}"
        if config.basic_auth:
            self._session.auth = config.basic_auth
        self._pool = ThreadPoolExecutor(8, thread_name_prefix="sits-promql")

    # ---- HTTP API ----
    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """Instant query -> the result vector. Retries transport errors, 5xx and 429."""
        data = {"query": expr}
        if at is not None:
            data["time"] = f"{at:.3f}"
        url, last = f"{self.config.url}/api/v1/query", ""
        for attempt in range(self.config.retries + 1):
            if attempt:
                self._sleep(min(self.config.max_backoff_s, self.config.backoff_s * 2 ** (attempt - 1)))
            try:
                r = self._session.post(url, data=data, timeout=self.config.timeout_s, verify=self.config.verify_tls)
            except requests.RequestException as e:
                last = redact(f"{type(e).__name__}: {e}")
                continue
            if r.status_code >= 500 or r.status_code == 429:
                last = f"HTTP {r.status_code}: {r.text[:200]}"
                continue
            if r.status_code in (401, 403):
                raise MetricsQueryError(f"prometheus {url}: HTTP {r.status_code} (check the bearer token or basic "
                                        "auth credentials)")
            try:
                body = r.json()
            except ValueError:
                raise MetricsQueryError(f"prometheus {url}: HTTP {r.status_code}, not JSON: {r.text[:200]}") from None
            if body.get("status") != "success":
                raise MetricsQueryError(f"query {expr!r} failed: {body.get('errorType')}: {body.get('error')}")
            res = body.get("data", {})
            if res.get("resultType") != "vector":
                raise MetricsQueryError(f"query {expr!r}: expected a vector, got {res.get('resultType')}")
            return res["result"]
        raise MetricsQueryError(f"prometheus {url}: {self.config.retries + 1} attempts failed; last: {last}")

    # ---- MetricsSource ----
    def window(self, service: str, targets: Mapping[str, Target], start: float | None, end: float,
               metrics: Sequence[str] = (REQUEST_LATENCY,), required: Sequence[str] = ()) -> MetricsWindow:
        roles = tuple(targets)
        if start is None or end - start < 1e-3 or not roles:
            return MetricsWindow(None, end, {}, self.name, {})
        match = {role: promql.matchers(service=service, env=role) for role in roles}
        return self.window_for(match, start, end, metrics, required, f"of service {service!r} ")

    def window_for(self, match: Mapping[str, str], start: float, end: float,
                   metrics: Sequence[str] = (REQUEST_LATENCY,), required: Sequence[str] = (),
                   what: str = "") -> MetricsWindow:
        """Window deltas per role whose series the matcher list `match[role]` selects (promql.matchers() or
        promql.selector()): what window() asks for a rollout's variants, and `POST /api/v1/judge` for any two
        label selectors."""
        roles = tuple(match)
        c, at, window = self.config, end - self.config.lag_s, duration(end - start)
        routes = f',route=~"{alternation(c.routes)}"'
        jobs: dict[tuple[str, str], str] = {}   # (role, what) -> PromQL
        for role in roles:
            for metric in dict.fromkeys(metrics):
                if metric == REQUEST_LATENCY:
                    latency = match[role] + routes + promql.LATENCY_FILTER.get(metric, "")
                    jobs[role, metric] = promql.render("bucket_increase_by_route_match", metric=metric, window=window,
                                                       match=latency)
                else:
                    jobs[role, metric] = promql.render("bucket_increase_match", metric=metric, window=window,
                                                       match=match[role])
            # every inference request but client errors, and the server errors among them (promql.status_class)
            jobs[role, "requests"] = promql.render("count_increase_match", metric=REQUEST_LATENCY, window=window,
                                                   match=match[role] + routes + f',status=~"{promql.COUNTED}"')
            jobs[role, "errors"] = promql.render("count_increase_match", metric=REQUEST_LATENCY, window=window,
                                                 match=match[role] + routes + f',status=~"{promql.SERVER_ERROR}"')
            # low-traffic mode: replayed requests, and live ones that streamed (engines without the counter: none)
            jobs[role, "replayed"] = promql.render("counter_increase_match", metric=INFERENCE_REQUESTS, window=window,
                                                   match=match[role] + routes + f',{ORIGIN}="{ORIGIN_REPLAY}"')
            jobs[role, "streamed"] = promql.render("counter_increase_match", metric=INFERENCE_REQUESTS, window=window,
                                                   match=match[role] + routes + f',{ORIGIN}="{ORIGIN_LIVE}",stream="true"')
        results = self._all(jobs, at)
        variants: dict[str, VariantData] = {}
        for role in roles:
            hists: dict[str, HistogramSnapshot] = {}
            for metric in dict.fromkeys(metrics):
                expr = jobs[role, metric]
                for route, pairs in self._group(results[role, metric], metric == REQUEST_LATENCY, expr).items():
                    key = promql.series_key(metric, {"route": route} if route is not None else None)
                    try:
                        hists[key] = HistogramSnapshot.from_buckets(pairs)
                    except (HistogramError, ValueError) as e:
                        raise MetricsQueryError(f"{key} of {role}: {e} (query: {expr})") from None
            reqs = self._scalar(results[role, "requests"], jobs[role, "requests"])
            errs = self._scalar(results[role, "errors"], jobs[role, "errors"])
            if hists or reqs is not None:
                variants[role] = VariantData(hists, reqs or 0.0, errs or 0.0,
                                             replayed=self._scalar(results[role, "replayed"], jobs[role, "replayed"])
                                             or 0.0,
                                             streamed=self._scalar(results[role, "streamed"], jobs[role, "streamed"])
                                             or 0.0)
        empty = [r for r in required if r in roles and r not in variants]
        if empty:
            raise NoDataError(f"no series for {', '.join(empty)} {what}in the {window} window "
                              f"ending at {at:.3f} (e.g. {jobs[empty[0], 'requests']})")
        queries = {f"{role}:{what}": q for (role, what), q in jobs.items()}
        return MetricsWindow(start, end, variants, self.name, queries)

    def _all(self, jobs: Mapping[tuple[str, str], str], at: float) -> dict[tuple[str, str], list[dict]]:
        """Every query of a window on the pool; the first MetricsError propagates to the caller, and the queries of
        this window that have not started yet are cancelled with it: a Prometheus that stops answering would
        otherwise leave each pass's unanswered queries queued behind the next pass's, a backlog that outlives the
        outage and times out the queries after it (tests/control_plane/e2e/test_faults.py)."""
        futures = {k: self._pool.submit(self.query, q, at) for k, q in jobs.items()}
        try:
            return {k: f.result() for k, f in futures.items()}
        except BaseException:
            for f in futures.values():
                f.cancel()
            raise

    @staticmethod
    def _group(result: list[dict], per_route: bool, expr: str) -> dict[str | None, list[tuple[float, float]]]:
        """{route or None: [(le, count)]}; a repeated (route, le) is a MultipleSeriesError."""
        out: dict[str | None, list[tuple[float, float]]] = {}
        seen = set()
        for s in result:
            labels = s.get("metric", {})
            route = labels.get("route") if per_route else None
            ident = (route, labels.get("le"))
            if ident in seen or ident[1] is None:
                raise MultipleSeriesError(f"{'several series' if ident in seen else 'a series without le'} for "
                                          f"{labels} in {expr!r}")
            seen.add(ident)
            out.setdefault(route, []).append((float(ident[1]), _value(s, expr)))
        return out

    @staticmethod
    def _scalar(result: list[dict], expr: str) -> float | None:
        """The one value of a `sum(...)` query; None when there is no series."""
        if len(result) > 1:
            raise MultipleSeriesError(f"{len(result)} series where one was expected in {expr!r}")
        return _value(result[0], expr) if result else None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._session.close()


def _value(sample: Mapping, expr: str) -> float:
    try:
        return float(sample["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        raise MetricsQueryError(f"bad sample {sample!r} in {expr!r}") from None


def duration(seconds: float) -> str:
    """A PromQL range in whole milliseconds."""
    return f"{max(1, round(seconds * 1000))}ms"


def alternation(values: Sequence[str]) -> str:
    """A regex matching exactly these values, as the body of a double-quoted PromQL string."""
    return "|".join(re.escape(v).replace("\\", "\\\\").replace('"', '\\"') for v in values)
