"""A check's latency distributions (web/distribution.py and GET .../checks/<seq>/distribution), from evidence the
real worker stored (canned lognormal latencies, the canary 1.6x slower)."""
from __future__ import annotations

import copy
import math

from sits.control_plane.web.distribution import distributions

from .conftest import auth, drive, new_rollout


def _slow_check(store):
    r = new_rollout(store)
    drive(store, r.id, 8, scale=1.6)
    return r.id, store.check(r.id, store.get(r.id).checks)


def test_canary_and_baseline_share_one_axis_and_the_slow_one_sits_right(store):
    _, ev = _slow_check(store)
    d = distributions(ev)
    assert d["compare_to"] == "baseline" and d["seq"] == ev["seq"]
    (s,) = d["series"]
    assert s["metric"] == "http_request_duration_seconds" and 1 < len(s["lower"]) <= 48
    assert all(s["lower"][i + 1] == s["upper"][i] for i in range(len(s["lower"]) - 1))   # contiguous, shared
    assert math.isclose(sum(s["canary"]), 1.0) and math.isclose(sum(s["target"]), 1.0)
    assert s["canary"][0] > 0 or s["target"][0] > 0            # trimmed to the buckets used
    assert s["canary"][-1] > 0 or s["target"][-1] > 0
    mid = lambda i: math.log(s["upper"][i] if s["upper"][i] else s["lower"][i])   # noqa: E731
    mean = lambda shares: sum(p * mid(i) for i, p in enumerate(shares))   # noqa: E731
    assert mean(s["canary"]) > mean(s["target"]) + math.log(1.3)
    deltas = {x["quantile"]: x for x in ev["verdict"]["deltas"] if x["quantile"] is not None}
    assert s["quantiles"]["p99"] == {"canary": deltas[0.99]["canary"], "target": deltas[0.99]["baseline"]}
    bins = ev["variants"]["canary"]["histograms"][s["series"]]["counts"]
    assert s["n_canary"] == max(float(x) for x in bins)


def test_layouts_that_differ_are_left_out(store):
    _, ev = _slow_check(store)
    ev = copy.deepcopy(ev)
    h = next(iter(ev["variants"]["baseline"]["histograms"].values()))
    h["bounds"] = [float(b) * 2 for b in h["bounds"][:-1]] + [h["bounds"][-1]]
    assert distributions(ev)["series"] == []


def test_the_api_serves_it(client, store):
    rid, ev = _slow_check(store)
    body = client.get(f"/api/v1/rollouts/{rid}/checks/{ev['seq']}/distribution", headers=auth("viewer")).get_json()
    assert body == distributions(ev)
    assert client.get(f"/api/v1/rollouts/{rid}/checks/999/distribution", headers=auth("viewer")).status_code == 404
