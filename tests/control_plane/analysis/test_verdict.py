"""Table tests for assess(): every verdict path on literal, deterministic data (no mocks, no randomness)."""
import math

import pytest

from sits.control_plane.analysis import (ERROR_RATE, REQUEST_LATENCY, HistogramSnapshot, MetricCheck, Outcome, Policy,
                                    VariantData, assess)
from tests.control_plane.helpers import lat

def var(n=20000, scale=1.0, *, errors=None, ready=True, crashing=False, tail_scale=1.0, key=REQUEST_LATENCY):
    errors = n * 0.005 if errors is None else errors
    return VariantData({key: lat(n, scale, tail_scale=tail_scale)} if n else {}, float(n), float(errors), ready,
                       crashing)


P = Policy(statistics="fixed")
P99_ONLY = Policy(statistics="fixed", checks=(MetricCheck(REQUEST_LATENCY, quantile=0.99, max_rel_delta=0.10),))

CASES = [
    # name, variants, policy, outcome, guard, reason fragment
    ("identical -> pass", {"canary": var(), "baseline": var()}, P, Outcome.PASS, None, "every check passed"),
    ("+50 % -> fail", {"canary": var(scale=1.5), "baseline": var()}, P, Outcome.FAIL, None, "p99 +5"),
    ("+20 %: p90 fails first", {"canary": var(scale=1.2), "baseline": var()}, P, Outcome.FAIL, None, "p90"),
    ("tail only: p99 fails, p90 passes", {"canary": var(tail_scale=1.5), "baseline": var()}, P, Outcome.FAIL,
     None, "p99"),
    ("low traffic -> inconclusive", {"canary": var(300), "baseline": var(300)}, P, Outcome.INCONCLUSIVE, None,
     "need about"),
    ("near threshold -> inconclusive", {"canary": var(3000, 1.08), "baseline": var(3000)}, P99_ONLY,
     Outcome.INCONCLUSIVE, None, "need about"),
    ("no canary data -> inconclusive", {"baseline": var()}, P, Outcome.INCONCLUSIVE, None, "no data from canary"),
    ("no baseline -> inconclusive", {"canary": var()}, P, Outcome.INCONCLUSIVE, None, "no data from baseline"),
    ("baseline not ready -> inconclusive", {"canary": var(), "baseline": var(ready=False)}, P,
     Outcome.INCONCLUSIVE, None, "baseline is not ready"),
    ("metric missing -> inconclusive", {"canary": var(key="other"), "baseline": var(key="other")}, P,
     Outcome.INCONCLUSIVE, None, "http_request_duration_seconds:p99"),
    ("canary crashing -> guard", {"canary": var(crashing=True), "baseline": var()}, P, Outcome.FAIL, "crashing",
     "crashing"),
    ("canary not ready -> guard", {"canary": var(ready=False), "baseline": var()}, P, Outcome.FAIL, "not_ready",
     "not ready"),
    ("canary error rate above limit -> guard", {"canary": var(errors=2000), "baseline": var()}, P, Outcome.FAIL,
     "error_rate", "above the limit"),
    ("error-rate delta +2.5 pt -> fail", {"canary": var(errors=600), "baseline": var()}, P, Outcome.FAIL, None,
     "error rate"),
    ("error-rate delta tiny -> pass", {"canary": var(errors=110), "baseline": var()}, P, Outcome.PASS, None,
     "every check passed"),
]


@pytest.mark.parametrize("name,variants,policy,outcome,guard,fragment", CASES, ids=[c[0] for c in CASES])
def test_assess_table(name, variants, policy, outcome, guard, fragment):
    v = assess(variants, policy)
    assert (v.outcome, v.guard) == (outcome, guard), v.reason
    assert fragment in v.reason, v.reason
    if outcome is Outcome.INCONCLUSIVE and "need about" in fragment:
        assert v.need_more and v.need_more > 0


def test_nan_guard():
    bad = VariantData({REQUEST_LATENCY: HistogramSnapshot((0.1, math.inf), (1.0, math.nan))}, 100.0, 0.0)
    v = assess({"canary": bad, "baseline": var()}, P)
    assert (v.outcome, v.guard) == (Outcome.FAIL, "nan")


def test_evidence_fields_are_consistent():
    v = assess({"canary": var(scale=1.3), "baseline": var(), "production": var(40000, 1.0)}, P)
    p99 = next(r for r in v.results if r.check == "http_request_duration_seconds:p99")
    assert p99.outcome is Outcome.FAIL and p99.threshold == 0.10 and p99.n_canary == 20000
    assert p99.ci_low < p99.delta_rel < p99.ci_high
    assert p99.delta_rel == pytest.approx(0.30, abs=0.02)
    assert p99.delta_abs == pytest.approx(p99.canary - p99.target)
    assert p99.vs_production is not None and p99.vs_production[1] == pytest.approx(0.30, abs=0.02)
    er = next(r for r in v.results if r.check == ERROR_RATE)
    assert er.canary == pytest.approx(0.005) and er.outcome is Outcome.PASS
    assert er.to_dict()["vs_production"] == [pytest.approx(0.0), None]           # JSON-safe: NaN -> null
    d = v.to_dict()
    assert d["outcome"] == "fail" and d["results"][0]["outcome"] in ("fail", "pass", "inconclusive")


def test_compare_to_production_decides():
    variants = {"canary": var(scale=1.5), "baseline": var(scale=1.5), "production": var()}
    assert assess(variants, P).outcome is Outcome.PASS            # same as the (slow) baseline
    v = assess(variants, Policy(statistics="fixed", compare_to="production"))
    assert v.outcome is Outcome.FAIL and v.compare_to == "production"


def test_per_route_series():
    slow, fast = 'http_request_duration_seconds{route="/v1/chat/completions"}', \
        'http_request_duration_seconds{route="/v1/completions"}'
    base = VariantData({slow: lat(20000), fast: lat(20000)}, 40000.0, 200.0)
    good = VariantData({slow: lat(20000), fast: lat(20000)}, 40000.0, 200.0)
    bad = VariantData({slow: lat(20000, 1.5), fast: lat(20000)}, 40000.0, 200.0)
    assert assess({"canary": good, "baseline": base}, P).outcome is Outcome.PASS
    v = assess({"canary": bad, "baseline": base}, P)
    assert v.outcome is Outcome.FAIL and "chat/completions" in v.reason and '"/v1/completions"' not in v.reason
    # a route with too little traffic is skipped when another route of the same check decides
    sparse = VariantData({fast: lat(20000), slow: lat(50)}, 20050.0, 100.0)
    v = assess({"canary": sparse, "baseline": VariantData({fast: lat(20000), slow: lat(50)}, 20050.0, 100.0)}, P)
    assert v.outcome is Outcome.PASS
    assert any(r.low_traffic for r in v.results)


def test_more_data_moves_inconclusive_to_a_decision():
    small = assess({"canary": var(3000, 1.25), "baseline": var(3000)}, P99_ONLY)
    assert small.outcome is Outcome.INCONCLUSIVE and small.need_more
    n = 3000 + small.need_more * 2
    assert assess({"canary": var(n, 1.25), "baseline": var(n)}, P99_ONLY).outcome is Outcome.FAIL


def test_inputs_not_mutated():
    c, b = var(scale=1.5), var()
    before = (c.histograms[REQUEST_LATENCY].counts, b.requests)
    assess({"canary": c, "baseline": b}, P)
    assert (c.histograms[REQUEST_LATENCY].counts, b.requests) == before


def test_deltas_are_shown_for_every_series_and_both_targets():
    ttft = "sits_time_to_first_token_seconds"
    c = VariantData({REQUEST_LATENCY: lat(20000, 1.2), ttft: lat(20000, 2.0)}, 20000.0, 200.0)
    b = VariantData({REQUEST_LATENCY: lat(20000), ttft: lat(20000)}, 20000.0, 100.0)
    p = VariantData({REQUEST_LATENCY: lat(20000, 1.1)}, 20000.0, 0.0)
    v = assess({"canary": c, "baseline": b, "production": p}, P)
    by = {(d.series, d.quantile): d for d in v.deltas}
    assert set(by) == {(REQUEST_LATENCY, 0.9), (REQUEST_LATENCY, 0.99), (ttft, 0.9), (ttft, 0.99), (ERROR_RATE, None)}
    assert by[ttft, 0.99].vs_baseline_rel == pytest.approx(1.0, abs=0.03)
    assert math.isnan(by[ttft, 0.99].production)                       # production did not report TTFT
    assert by[REQUEST_LATENCY, 0.9].vs_production_rel == pytest.approx(1.2 / 1.1 - 1, abs=0.02)
    assert by[REQUEST_LATENCY, 0.9].vs_baseline_abs == pytest.approx(by[REQUEST_LATENCY, 0.9].canary
                                                                     - by[REQUEST_LATENCY, 0.9].baseline)
    assert by[ERROR_RATE, None].vs_baseline_abs == pytest.approx(0.005)
    assert by[ERROR_RATE, None].vs_production_abs == pytest.approx(0.01)
    d = v.to_dict()["deltas"]
    assert d[-1]["series"] == ERROR_RATE and d[-1]["vs_baseline_rel"] is None   # NaN -> null in JSON
    # guards still show the deltas
    g = assess({"canary": VariantData(c.histograms, 20000.0, 200.0, ready=False), "baseline": b}, P)
    assert g.guard == "not_ready" and len(g.deltas) == 5


def test_policy_metrics_lists_what_a_source_must_fetch():
    assert P.metrics == (REQUEST_LATENCY, "sits_time_to_first_token_seconds", "sits_inter_token_latency_seconds",
                         "sits_e2e_request_latency_seconds")
    only = Policy(statistics="fixed", checks=(MetricCheck("sits_inter_token_latency_seconds", quantile=0.99, max_rel_delta=0.1),),
                  report_metrics=())
    assert only.metrics == (REQUEST_LATENCY, "sits_inter_token_latency_seconds")


def test_sample_floor_keeps_bounds_finite():
    # min_tail_samples=1 would allow n=100 for p99, where q + z*s > 1: the floor z^2 q / (1-q) takes over
    loose = Policy(statistics="fixed", min_samples=10, min_tail_samples=1)
    v = assess({"canary": var(200), "baseline": var(200)}, loose)
    p99 = next(r for r in v.results if r.check.endswith("p99"))
    assert p99.low_traffic and p99.need_more == math.ceil(2.3 ** 2 * 0.99 / 0.01) + 1 - 200
    v = assess({"canary": var(600), "baseline": var(600)}, loose)
    p99 = next(r for r in v.results if r.check.endswith("p99"))
    assert not p99.low_traffic and math.isfinite(p99.ci_high)
