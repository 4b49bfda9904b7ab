"""SITS as a judge for rollout controllers that have no statistics of their own (Argo Rollouts, Flagger): one
look at a canary and its baseline over a window, with the analysis every SITS rollout uses.

    parse_request(body)                    -> JudgeRequest  (the JSON body, or a Flagger webhook payload)
    evaluate(request, now, prometheus=..., scrape=...) -> Judgement (verdict + evidence)

Where the data comes from, per variant: a Prometheus label selector (`selector`, queried with the PromQL templates of
analysis/promql.py, the same increase() windows as a rollout's checks) or the variant's scrape URLs (`scrape_urls`:
each call scrapes them and compares with the earliest scrape of the same URLs inside the window, so the first call is
INCONCLUSIVE and records the starting point). Too little data is INCONCLUSIVE, never a pass. Bad input raises
ValidationError naming the field (`canary.selector`, `metadata.window`, ...). The web view: web/judge.py.
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Mapping
from urllib.parse import urlsplit

from sits.control_plane.adapters.metrics import MetricsQueryError, MetricsWindow, NoDataError, Target
from sits.control_plane.adapters.metrics.prometheus import PrometheusSource
from sits.control_plane.adapters.metrics.scrape import ScrapeSource
from sits.control_plane import validation
from sits.control_plane.analysis import Outcome, Policy, Verdict, assess, promql
from sits.control_plane.analysis.sequential import SequenceState, observe
from sits.control_plane.errors import ValidationError

ROLES = ("canary", "baseline")
MIN_WINDOW_S, MAX_WINDOW_S = 10.0, 86400.0
MAX_URLS = 32
MAX_URL = 2048
SCRAPE_FAILED = "scrape_urls: a target's /metrics could not be read"
FIELDS = ("canary", "baseline", "window", "policy", "prometheus_url", "service")
FLAGGER_FIELDS = ("name", "namespace", "phase", "checksum", "metadata")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)?$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


@dataclass(slots=True, frozen=True)
class VariantSource:
    """Where one variant's histograms come from: a Prometheus matcher list, or the variant's scrape URLs."""
    match: str | None = None
    scrape_urls: tuple[str, ...] = ()


@dataclass(slots=True, frozen=True)
class JudgeRequest:
    canary: VariantSource
    baseline: VariantSource
    window_s: float
    policy: Policy
    prometheus_url: str | None = None
    service: str | None = None        # scrape: only series with this `service` label (default: every series)
    flagger: bool = False             # a Flagger webhook: the answer is in the status code
    subject: Mapping[str, str] = field(default_factory=dict)   # Flagger's name/namespace/phase/checksum, echoed

    @property
    def source(self) -> str:
        return "prometheus" if self.canary.match is not None else "scrape"

    @property
    def urls_given(self) -> bool:
        """The caller names hosts this service will contact (an SSRF surface: needs the operator role)."""
        return self.prometheus_url is not None or bool(self.canary.scrape_urls)


@dataclass(slots=True, frozen=True)
class Judgement:
    verdict: Verdict
    window: MetricsWindow
    request: JudgeRequest
    note: str = ""   # why there was nothing to judge (no data, first scrape)


def parse_duration(v: Any, field_name: str) -> float:
    """"5m", "30s", "1h", "1500ms" or a number of seconds, within [10 s, 24 h]."""
    if isinstance(v, bool) or v is None:
        raise ValidationError(f"{field_name} is required: a duration such as \"5m\" or a number of seconds",
                              field_name)
    if isinstance(v, (int, float)):
        seconds = float(v)
    else:
        m = _DURATION.match(str(v).strip())
        if m is None:
            raise ValidationError(f"{field_name} must be a duration such as \"5m\", \"30s\" or \"1h\", got "
                                  f"{str(v)[:40]!r}", field_name)
        seconds = float(m[1]) * _UNIT_S[m[2]]
    if not MIN_WINDOW_S <= seconds <= MAX_WINDOW_S:
        raise ValidationError(f"{field_name} must be between {MIN_WINDOW_S:g} s and {MAX_WINDOW_S:g} s, got "
                              f"{seconds:g} s", field_name)
    return seconds


def _url(v: Any, field_name: str) -> str:
    """A scrape target: `http(s)://host[:port]` (a trailing `/` or `/metrics` is allowed); `/metrics` of it is
    fetched and nothing else, so no path, query, fragment, credentials or backslash. Returns scheme://host:port."""
    if not isinstance(v, str) or not v.startswith(("http://", "https://")) or len(v) > MAX_URL or any(
            c.isspace() or not c.isprintable() for c in v):
        raise ValidationError(f"{field_name} must be an http(s) URL of at most {MAX_URL} characters", field_name)
    try:
        u = urlsplit(v)
        u.port   # noqa: B018 -- raises ValueError for a port out of range
    except ValueError:
        u = None
    if u is None or not u.hostname or "@" in u.netloc or any(c in v for c in "?#\\") \
            or u.path not in ("", "/", "/metrics"):
        raise ValidationError(f"{field_name}: {v[:100]!r} must be http(s)://host[:port] -- its /metrics is scraped: "
                              "no other path, no query, fragment or credentials", field_name)
    return f"{u.scheme}://{u.netloc}"


def _variant(d: Any, name: str, flagger: bool = False) -> VariantSource:
    """name: "canary" or "baseline"; the fields at fault are `canary.selector` (JSON body) or
    `metadata.canary_selector` (Flagger)."""
    sel_field, urls_field = ((f"metadata.{name}_selector", f"metadata.{name}_scrape_urls") if flagger
                             else (f"{name}.selector", f"{name}.scrape_urls"))
    if not isinstance(d, Mapping):
        raise ValidationError(f"{name} must be an object with a selector or scrape_urls", name)
    unknown = set(d) - {"selector", "scrape_urls"}
    if unknown:
        raise ValidationError(f"{name}: unknown field {sorted(unknown)[0]!r}; give selector or scrape_urls",
                              f"{name}.{sorted(unknown)[0]}")
    if ("selector" in d) == ("scrape_urls" in d):
        raise ValidationError(f"{name} needs exactly one of selector (Prometheus) and scrape_urls", name)
    if "selector" in d:
        try:
            return VariantSource(match=promql.selector(d["selector"]))
        except promql.TemplateError as e:
            raise ValidationError(str(e.args[0]), sel_field) from None
    urls = d["scrape_urls"]
    if isinstance(urls, str):
        urls = [u for u in urls.split(",") if u.strip()]
    if not isinstance(urls, list) or not urls or len(urls) > MAX_URLS:
        raise ValidationError(f"{urls_field} must be a list of 1 to {MAX_URLS} URLs", urls_field)
    return VariantSource(scrape_urls=tuple(_url(u.strip() if isinstance(u, str) else u, urls_field) for u in urls))


def _policy(d: Any, field_name: str) -> Policy:
    if d is None:
        d = {}
    if isinstance(d, str):   # Flagger metadata values are strings: the policy is JSON text there
        try:
            d = json.loads(d)
        except ValueError:
            raise ValidationError(f"{field_name} must be a JSON object (fields of Policy)", field_name) from None
    if not isinstance(d, Mapping):
        raise ValidationError(f"{field_name} must be an object (fields of Policy)", field_name)
    # one look, no rollout: the steps and the correctness gate (which replays prompts) do not apply
    policy = validation.policy({**d, "correctness": {"enabled": False}}, field_name)
    if policy.compare_to != "baseline":
        raise ValidationError(f"{field_name}.compare_to: the judge compares the canary with the baseline you give",
                              f"{field_name}.compare_to")
    return policy


def parse_request(body: Any) -> JudgeRequest:
    """The body of `POST /api/v1/judge`: {canary, baseline, window, policy?, prometheus_url?, service?}; or a Flagger
    webhook payload {name, namespace, phase, checksum, metadata: {canary_selector | canary_scrape_urls,
    baseline_selector | baseline_scrape_urls, window, policy (JSON text), prometheus_url, service}}."""
    if not isinstance(body, Mapping):
        raise ValidationError("the body must be a JSON object", None)
    if "metadata" in body and "canary" not in body:
        return _parse_flagger(body)
    unknown = set(body) - set(FIELDS)
    if unknown:
        key = sorted(unknown)[0]
        raise ValidationError(f"unknown field {key!r}; fields are {', '.join(FIELDS)}", key)
    for role in ROLES:
        if role not in body:
            raise ValidationError(f"{role} is required: {{\"selector\": ...}} or {{\"scrape_urls\": [...]}}", role)
    return _build(body["canary"], body["baseline"], body.get("window"), body.get("policy"),
                  body.get("prometheus_url"), body.get("service"), "", flagger=False, subject={})


def _parse_flagger(body: Mapping) -> JudgeRequest:
    unknown = set(body) - set(FLAGGER_FIELDS)
    if unknown:
        key = sorted(unknown)[0]
        raise ValidationError(f"unknown field {key!r} in a Flagger webhook payload", key)
    md = body["metadata"]
    if not isinstance(md, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in md.items()):
        raise ValidationError("metadata must map strings to strings (Flagger webhook metadata)", "metadata")
    variants = {}
    for role in ROLES:
        if f"{role}_selector" in md:
            variants[role] = {"selector": md[f"{role}_selector"]}
        elif f"{role}_scrape_urls" in md:
            variants[role] = {"scrape_urls": md[f"{role}_scrape_urls"]}
        else:
            raise ValidationError(f"metadata.{role}_selector (or metadata.{role}_scrape_urls) is required",
                                  f"metadata.{role}_selector")
    subject = {k: str(body[k])[:253] for k in ("name", "namespace", "phase", "checksum") if k in body}
    return _build(variants["canary"], variants["baseline"], md.get("window"), md.get("policy"),
                  md.get("prometheus_url"), md.get("service"), "metadata.", flagger=True, subject=subject)


def _build(canary: Any, baseline: Any, window: Any, policy: Any, prometheus_url: Any, service: Any, prefix: str,
           *, flagger: bool, subject: Mapping[str, str]) -> JudgeRequest:
    c, b = _variant(canary, "canary", flagger), _variant(baseline, "baseline", flagger)
    if (c.match is None) != (b.match is None):
        raise ValidationError("canary and baseline must both use selectors or both scrape_urls",
                              "metadata.baseline_selector" if flagger else "baseline")
    if prometheus_url is not None:
        prometheus_url = _url(prometheus_url, f"{prefix}prometheus_url")
    if service is not None and (not isinstance(service, str) or not service or len(service) > 253):
        raise ValidationError("service must be a non-empty string (the `service` label to keep)", f"{prefix}service")
    return JudgeRequest(c, b, parse_duration(window, f"{prefix}window"), _policy(policy, f"{prefix}policy"),
                        prometheus_url, service, flagger, dict(subject))


class ScrapeHistory:
    """The judge's direct-scrape memory: one ScrapeSource, its histories keyed by the URLs asked about (the
    `max_keys` most recently used are kept, so arbitrary callers cannot grow it without bound)."""

    def __init__(self, source: ScrapeSource | None = None, max_keys: int = 256) -> None:
        self.source = source or ScrapeSource()
        self.max_keys = max_keys
        self._keys: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def window(self, req: JudgeRequest, now: float) -> MetricsWindow:
        key = "judge:" + hashlib.sha256(json.dumps([req.service, req.canary.scrape_urls, req.baseline.scrape_urls]
                                                   ).encode()).hexdigest()
        with self._lock:
            self._keys[key] = None
            self._keys.move_to_end(key)
            while len(self._keys) > self.max_keys:
                self.source.forget(self._keys.popitem(last=False)[0])
        targets = {role: Target(role, getattr(req, role).scrape_urls) for role in ROLES}
        try:
            return self.source.window(req.service, targets, now - req.window_s, now, req.policy.metrics, ROLES,
                                      history_key=key)
        except MetricsQueryError:   # one answer for refused, unreachable, timed out, not 200 or not metrics: the
            raise MetricsQueryError(SCRAPE_FAILED) from None   # judge is no port scanner and echoes no body

    def close(self) -> None:
        self.source.close()


def evaluate(req: JudgeRequest, now: float, *, prometheus: PrometheusSource | None = None,
             scrape: ScrapeHistory | None = None) -> Judgement:
    """One verdict over [now - window, now]. A MetricsError other than NoDataError (Prometheus unreachable, a
    scrape failed) propagates: the caller answers it as an error, not as a verdict."""
    policy, seq = req.policy, None
    try:
        if req.canary.match is not None:
            if prometheus is None:
                raise ValidationError("no Prometheus to query: give prometheus_url (or run the service with "
                                      "--metrics prometheus --prometheus-url)", "prometheus_url")
            match = {"canary": req.canary.match, "baseline": req.baseline.match}
            w = prometheus.window_for(match, now - req.window_s, now, policy.metrics, ROLES)
            if policy.statistics == "sequential":
                seq = _sequence(prometheus, match, policy, now - req.window_s, now)
        else:
            if scrape is None:
                raise ValidationError("direct scrape is not available here", "scrape_urls")
            w = scrape.window(req, now)
            # one delta since the earliest scrape in the window: no paired windows to build a sequence from
            policy = replace(policy, statistics="fixed")
    except NoDataError as e:
        return _nothing(req, now, str(e))
    if w.start is None:
        return _nothing(req, now, "first scrape of these URLs recorded: the next call compares against it (call "
                        f"again within the {req.window_s:g} s window)", w)
    return Judgement(assess(dict(w.variants), policy, seq), w, req)


SUB_WINDOW_MIN_S = 30.0   # a Prometheus increase() needs a few scrapes (15 s apart by default) in each sub-window
SUB_WINDOWS_MAX = 40      # Prometheus queries per judgement: (1 + this) x the metrics


def _sequence(prometheus: PrometheusSource, match: Mapping[str, str], policy: Policy, start: float,
              end: float) -> SequenceState:
    """Sequential statistics for one judgement: the window cut into paired sub-windows (at least
    max(policy.window_s, SUB_WINDOW_MIN_S) long, at most SUB_WINDOWS_MAX of them), each queried on its own and fed to
    the sequence in order, as the worker's polls are. A sub-window without data on both sides is skipped."""
    span = end - start
    n = max(1, min(SUB_WINDOWS_MAX, int(span // max(policy.window_s, SUB_WINDOW_MIN_S))))
    step, seq = span / n, SequenceState()
    for i in range(n):
        a, b = start + i * step, start + (i + 1) * step
        try:
            sub = prometheus.window_for(match, a, b, policy.metrics, ROLES)
        except NoDataError:
            continue
        seq = observe(seq, sub.variants, policy, a, b)
    return seq


def _nothing(req: JudgeRequest, now: float, note: str, w: MetricsWindow | None = None) -> Judgement:
    verdict = Verdict(Outcome.INCONCLUSIVE, f"no data: {note}", "baseline")
    return Judgement(verdict, w or MetricsWindow(None, now, {}, req.source, {}), req, note)
