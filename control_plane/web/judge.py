"""`POST /api/v1/judge`: a verdict with its evidence for a rollout controller (docs/judge.md).

Argo Rollouts (Web metric provider): always 200 with the verdict JSON; `jsonPath: "{$.verdict}"`, then
`successCondition: result == "pass"` and `failureCondition: result == "fail"` (inconclusive: neither, Argo's
Inconclusive). Flagger (webhook; detected by its payload): 200 = pass, 412 = fail or inconclusive (Flagger has no
third answer: it holds and counts a failed check), the reason in the body. Errors: 422 bad input, 502 the metrics
source failed. Auth: the API's bearer tokens, or a Flagger payload's `metadata.token` (Flagger cannot send headers);
the viewer role, the operator role when the request names URLs to contact (prometheus_url, scrape_urls).
"""
from __future__ import annotations

import logging
import threading
import time

from flask import Blueprint, current_app, jsonify, request

from sits.control_plane.adapters.metrics import MetricsError
from sits.control_plane.adapters.metrics.prometheus import PrometheusConfig, PrometheusSource
from sits.control_plane.analysis import Outcome
from sits.control_plane.errors import ValidationError
from sits.control_plane.service.judge import Judgement, JudgeRequest, ScrapeHistory, evaluate, parse_request
from sits.control_plane.redact import redact
from sits.control_plane.web.auth import require, use_token, users
from sits.control_plane.web.common import API_PREFIX, error_response, json_body, nonfinite_to_null
from sits.wire.tracing import Tracing, set_attributes

bp = Blueprint("judge", __name__, url_prefix=API_PREFIX)
_LOCK = threading.Lock()
log = logging.getLogger(__name__)
_UNPARSED = object()


@bp.post("/judge")
def judge():
    """Authenticate first (a bearer token, a session, or a Flagger body's metadata.token), then parse: an anonymous
    caller gets 401 whatever its body; only a body without an Authorization header is read for a Flagger token,
    through the bounded parser (never a traceback)."""
    body = _UNPARSED
    if "Authorization" not in request.headers and users() is not None:
        try:
            body = json_body()
        except ValidationError:
            body = None   # no token to be found in it: anonymous (401), unless a session authenticates
        token = _flagger_token(body)
        if token is not None:
            use_token(token)
    denied = require("viewer")(lambda: None)()
    if denied is not None:
        return denied
    if body is _UNPARSED or body is None:
        body = json_body()   # an authenticated caller learns what is wrong with its body (422)
    req = parse_request(body)
    if req.urls_given:
        denied = require("operator")(lambda: None)()
        if denied is not None:
            return denied
    prometheus, own = _prometheus(req)
    tracing = current_app.config["TRACING"] or Tracing()
    with tracing.span("sits.judge", attributes={"sits.judge.source": req.source, "sits.judge.window_s": req.window_s,
                                                "sits.judge.flagger": req.flagger, **{
                                                    f"sits.judge.{k}": v for k, v in req.subject.items()}}) as span:
        try:
            j = evaluate(req, current_app.config.get("CLOCK", time.time)(), prometheus=prometheus,
                         scrape=_scrape_history() if req.source == "scrape" else None)
        except MetricsError as e:
            if req.prometheus_url is not None:
                # the caller's URL: what answered there (an internal page, another service's error) is never echoed,
                # or the judge would read internal pages for anyone holding the operator role; the log has it
                log.warning("judge: prometheus_url could not be queried: %s", redact(str(e))[:2000])
                return error_response(502, "metrics_unavailable", "the Prometheus at prometheus_url could not be "
                                      "queried (not reachable, not a Prometheus query API, or it failed); the "
                                      "service log has the details")
            return error_response(502, "metrics_unavailable", redact(f"{req.source}: {e}")[:2000])
        finally:
            if own:
                prometheus.close()
        set_attributes(span, {"sits.verdict": j.verdict.outcome, "sits.reason": j.verdict.reason[:500],
                              "sits.need_more": j.verdict.need_more})
    return _answer(j)


def _flagger_token(body) -> str | None:
    md = body.get("metadata") if isinstance(body, dict) else None
    if isinstance(md, dict) and isinstance(md.get("token"), str):
        return md.pop("token")   # never echoed, never parsed as an option
    return None


def _prometheus(req: JudgeRequest) -> tuple[PrometheusSource | None, bool]:
    """(source, whether this request owns it): the request's URL, else JUDGE_PROMETHEUS, else the worker's."""
    if req.prometheus_url is not None:
        return PrometheusSource(PrometheusConfig(req.prometheus_url, timeout_s=5.0, retries=1)), True
    cfg = current_app.config["JUDGE_PROMETHEUS"]
    if cfg is not None:
        with _LOCK:
            src = current_app.extensions.get("sits_judge_prometheus")
            if src is None:
                src = current_app.extensions["sits_judge_prometheus"] = PrometheusSource(cfg)
        return src, False
    worker = current_app.config["WORKER"]
    if worker is not None and isinstance(worker.source, PrometheusSource):
        return worker.source, False
    return None, False


def _scrape_history() -> ScrapeHistory:
    with _LOCK:
        h = current_app.extensions.get("sits_judge_scrape")
        if h is None:
            h = current_app.extensions["sits_judge_scrape"] = ScrapeHistory()
        return h


def _answer(j: Judgement):
    v, w, req = j.verdict, j.window, j.request
    out = {"verdict": v.outcome.value, "reason": v.reason, "need_more": v.need_more,
           "window": {"start": w.start, "end": w.end, "seconds": req.window_s}, "source": w.source or req.source}
    if req.flagger:   # Flagger puts the body in its events: short
        out.update({k: req.subject[k] for k in ("name", "namespace", "phase") if k in req.subject})
        return jsonify(out), 200 if v.outcome is Outcome.PASS else 412
    out.update({"pass": v.outcome is Outcome.PASS, "fail": v.outcome is Outcome.FAIL,
                "inconclusive": v.outcome is Outcome.INCONCLUSIVE,
                "variants": {role: {"requests": d.requests, "errors": d.errors} for role, d in w.variants.items()},
                "queries": dict(w.queries), "evidence": nonfinite_to_null(v.to_dict())})
    return jsonify(out), 200
