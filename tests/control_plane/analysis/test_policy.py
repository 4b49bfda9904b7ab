"""Policy defaults, validation (typed errors naming the field) and the dict round trip."""
import pytest

from control_plane.analysis import ERROR_RATE, REQUEST_LATENCY, MetricCheck, Policy, PolicyError


def test_defaults_match_the_issue():
    p = Policy()
    assert p.steps == (5, 10, 25, 50, 100) and p.compare_to == "baseline" and p.on_inconclusive == "pause"
    by_name = {c.name: c for c in p.checks}
    assert by_name[f"{REQUEST_LATENCY}:p99"].max_rel_delta == 0.10
    assert by_name[f"{REQUEST_LATENCY}:p90"].max_rel_delta == 0.05
    assert by_name[ERROR_RATE].max_abs_delta == 0.01


@pytest.mark.parametrize("kwargs,field", [
    (dict(steps=()), "steps"), (dict(steps=(10, 5)), "increasing"), (dict(steps=(0, 50)), "steps"),
    (dict(steps=(5, 101)), "steps"), (dict(steps=(100,)), "below 100"), (dict(check_interval_s=0), "check_interval_s"), (dict(warmup_s=-1), "warmup_s"),
    (dict(failure_limit=0), "failure_limit"), (dict(min_samples=1.5), "min_samples"),
    (dict(on_inconclusive="abort"), "on_inconclusive"), (dict(compare_to="canary"), "compare_to"),
    (dict(auto_promote="yes"), "auto_promote"), (dict(z_fail=0), "z_fail"), (dict(max_error_rate=2), "max_error_rate"),
    (dict(checks=()), "at least one check"), (dict(max_duration_s=float("inf")), "max_duration_s"),
])
def test_invalid_policy(kwargs, field):
    with pytest.raises(PolicyError, match=field):
        Policy(**kwargs)


@pytest.mark.parametrize("kwargs,msg", [
    (dict(metric=""), "metric"), (dict(metric="m", quantile=1.0, max_rel_delta=0.1), "quantile"),
    (dict(metric="m", quantile=0.9, max_rel_delta=0), "max_rel_delta"),
    (dict(metric="m", quantile=0.9, max_rel_delta=0.1, max_abs_delta=0.1), "max_rel_delta, not"),
    (dict(metric=ERROR_RATE, max_abs_delta=1.5), "max_abs_delta"),
    (dict(metric=ERROR_RATE, quantile=0.9, max_abs_delta=0.01), "max_abs_delta only"),
])
def test_invalid_check(kwargs, msg):
    with pytest.raises(PolicyError, match=msg):
        MetricCheck(**kwargs)


def test_round_trip_and_unknown_fields():
    p = Policy(steps=(10, 50, 100), auto_promote=False, compare_to="production",
               checks=(MetricCheck("sits_time_to_first_token_seconds", quantile=0.99, max_rel_delta=0.2),))
    assert Policy.from_dict(p.to_dict()) == p
    assert Policy.from_dict(None) == Policy()
    with pytest.raises(PolicyError, match="unknown policy field"):
        Policy.from_dict({"stepz": [1]})
    with pytest.raises(PolicyError, match="bad check"):
        Policy.from_dict({"checks": [{"metrik": "x"}]})
