"""Policy defaults, validation (typed errors naming the field) and the dict round trip."""
import pytest

from sits.control_plane.analysis import ERROR_RATE, REQUEST_LATENCY, MetricCheck, Policy, PolicyError


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
    (dict(metric="m", quantile=0.9, max_rel_delta=0.1, max_abs_delta=0.1), "max_abs_delta does not apply"),
    (dict(metric=ERROR_RATE, max_abs_delta=1.5), "max_abs_delta"),
    (dict(metric=ERROR_RATE, quantile=0.9, max_abs_delta=0.01), "quantile does not apply"),
])
def test_invalid_check(kwargs, msg):
    with pytest.raises(PolicyError, match=msg) as e:
        MetricCheck(**kwargs)
    assert str(e.value).startswith(e.value.field + " ")   # the message opens with the field it names


@pytest.mark.parametrize("d,field,words", [
    ({"checks": [{"metric": REQUEST_LATENCY, "quantile": 0.9, "max_rel_delta": 0.1},
                 {"metric": REQUEST_LATENCY, "quantile": 0.99, "max_rel_delta": -0.05}]},
     "checks[1].max_rel_delta", ["P99 increase allowed", "+0.01 %", "+10000 %", "got -5 %"]),
    ({"checks": [{"metric": ERROR_RATE, "max_abs_delta": 2}]}, "checks[0].max_abs_delta", ["points", "got +200 pt"]),
    ({"correctness": {"max_tokens": 0}}, "correctness.max_tokens", ["from 1 to 256", "got 0"]),
    ({"correctness": {"tolerances": {"bfloat16": {"max_logprob_drift": -1}}}},
     "correctness.tolerances.bfloat16.max_logprob_drift", ["nats from 0 to 100"]),
    ({"check_interval_s": 0}, "check_interval_s", ["from 0.1 to 86400 seconds", "got 0"]),
    ({"report_metrics": ["ok_metric", "a b"]}, "report_metrics[1]", ["Prometheus metric name"]),
    ({"max_error_rate": 2}, "max_error_rate", ["0.01 % to 100 %"]),
    ({"stepz": [1]}, "stepz", ["not a policy field", "steps, check_interval_s"]),
])
def test_errors_name_the_exact_field_the_value_and_the_range_in_user_units(d, field, words):
    with pytest.raises(PolicyError) as e:
        Policy.from_dict(d)
    assert e.value.field == field and str(e.value).startswith(field + " ")
    for w in words:
        assert w in str(e.value)


def test_round_trip_and_unknown_fields():
    p = Policy(steps=(10, 50, 100), auto_promote=False, compare_to="production",
               checks=(MetricCheck("sits_time_to_first_token_seconds", quantile=0.99, max_rel_delta=0.2),))
    assert Policy.from_dict(p.to_dict()) == p
    assert Policy.from_dict(None) == Policy()
    with pytest.raises(PolicyError, match="stepz is not a policy field"):
        Policy.from_dict({"stepz": [1]})
    with pytest.raises(PolicyError, match="checks\\[0\\].metrik is not a check field"):
        Policy.from_dict({"checks": [{"metrik": "x"}]})


HUGE = 10 ** 25


@pytest.mark.parametrize("d,msg", [
    ({"checks": ["abc"]}, "checks\\[0\\] must be an object"),
    ({"checks": [1, 2]}, "checks\\[0\\]"),
    ({"checks": "abc"}, "checks must be a list"),
    ({"checks": {"metric": "m"}}, "checks must be a list"),
    ({"checks": [{"metric": REQUEST_LATENCY, "quantile": 0.9, "max_rel_delta": 0.1}] * 33}, "at most 32"),
    ({"checks": [{"metric": "up) or vector(1", "quantile": 0.9, "max_rel_delta": 0.1}]}, "Prometheus metric name"),
    ({"checks": [{"metric": REQUEST_LATENCY, "quantile": 0.9, "max_rel_delta": 1e300}]}, "max_rel_delta"),
    ({"steps": 5}, "steps must be a list"), ({"steps": {"a": 1}}, "steps must be a list"),
    ({"report_metrics": ["m"] * 3_000_000}, "at most 32"),
    ({"report_metrics": "sits_ttft"}, "report_metrics must be a list"),
    ({"report_metrics": ["a b"]}, "Prometheus metric name"), ({"report_metrics": [1]}, "Prometheus metric name"),
    ({"check_interval_s": 1e-300}, "check_interval_s"), ({"check_interval_s": 1e300}, "check_interval_s"),
    ({"warmup_s": 1e9}, "warmup_s"), ({"max_duration_s": 1e12}, "max_duration_s"),
    ({"ready_timeout_s": 1e-9}, "ready_timeout_s"), ({"failure_limit": HUGE}, "failure_limit"),
    ({"failure_limit": 1e25}, "failure_limit"), ({"inconclusive_limit": HUGE}, "inconclusive_limit"),
    ({"min_samples": HUGE}, "min_samples"), ({"min_tail_samples": HUGE}, "min_tail_samples"),
    ({"min_error_samples": HUGE}, "min_error_samples"), ({"z_fail": 1e300}, "z_fail"), ({"z_pass": 1e-300}, "z_pass"),
    ({"max_error_rate": 1e-300}, "max_error_rate"), ({"x" * 10_000: 1}, "is not a policy field"),
])
def test_hostile_policy_dicts_are_policy_errors(d, msg):
    with pytest.raises(PolicyError, match=msg) as e:
        Policy.from_dict(d)
    assert len(str(e.value)) < 700   # a one-line message (the field list at most), not the input echoed back


@pytest.mark.parametrize("doc", [[], [1, 2], "policy", 5, True])
def test_a_policy_must_be_an_object(doc):
    with pytest.raises(PolicyError, match="must be an object"):
        Policy.from_dict(doc)


def test_every_numeric_field_is_bounded():
    from sits.control_plane.analysis.policy import LIMITS

    numeric = {f for f, v in Policy().to_dict().items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    assert numeric <= set(LIMITS)
    for name in numeric:   # the defaults are inside their bounds, and one past the top is refused
        lo, hi = LIMITS[name]
        assert lo <= getattr(Policy(), name) <= hi
        with pytest.raises(PolicyError, match=name):
            Policy.from_dict({name: hi * 10 if isinstance(hi, float) else hi + 1})
