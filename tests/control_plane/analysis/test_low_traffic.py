"""Low-traffic mode in the pure core: the `low_traffic` policy section (parsed by the one policy parser, errors
naming the field), the replay-only rule of the verdict, and what the analysis asks replay for."""
import pytest

from sits.control_plane.analysis import (ERROR_RATE, GENERATION_TOKENS, PROMPT_TOKENS, REQUEST_LATENCY, HistogramSnapshot,
                                    LowTrafficPolicy, MetricCheck, Outcome, Policy, VariantData, assess,
                                    live_requests_needed)
from sits.control_plane.errors import ValidationError
from sits.control_plane.validation import policy as parse_policy

BOUNDS = [0.05 * 1.1 ** i for i in range(60)]
SERIES = REQUEST_LATENCY + '{route="/v1/completions"}'


def _variant(latencies, *, replayed=0.0, errors=0.0, tokens=()):
    hists = {SERIES: HistogramSnapshot.from_values(latencies, BOUNDS)}
    for metric in tokens:
        hists[metric] = HistogramSnapshot.from_values([10.0] * 5, [1, 5, 10, 20])
    return VariantData(hists, float(len(latencies)), errors, replayed=replayed)


def _same(n):   # a spread-out distribution, identical for both variants: a clear PASS with enough data
    return [0.1 + 0.4 * (i % 100) / 100 for i in range(n)]


def _policy(**lt):
    return Policy(statistics="fixed", checks=(MetricCheck(REQUEST_LATENCY, quantile=0.9, max_rel_delta=0.25),
                          MetricCheck(ERROR_RATE, max_abs_delta=0.02)),
                  min_samples=100, min_tail_samples=2, min_error_samples=100, low_traffic=LowTrafficPolicy(**lt))


def test_defaults_off_and_round_trip():
    p = Policy(statistics="fixed")
    assert p.low_traffic.enabled is False and p.low_traffic.allow_replay_only is False
    assert PROMPT_TOKENS not in p.metrics   # off: the token histograms are not fetched
    on = Policy.from_dict({"low_traffic": {"enabled": True, "max_rps": 2.5, "prompt_set": ["a", "b"]}})
    assert on.low_traffic.max_rps == 2.5 and on.low_traffic.prompt_set == ("a", "b")
    assert on.metrics[-2:] == (PROMPT_TOKENS, GENERATION_TOKENS)
    assert Policy.from_dict(on.to_dict()) == on
    assert Policy.from_dict({k: v for k, v in Policy(statistics="fixed").to_dict().items() if k != "low_traffic"}) == Policy(statistics="fixed")


@pytest.mark.parametrize("lt,field,words", [
    ({"max_rps": 0}, "policy.low_traffic.max_rps", ["0.01 to 1000 requests per second", "got 0"]),
    ({"max_rps": "fast"}, "policy.low_traffic.max_rps", ["got 'fast'"]),
    ({"enabled": "yes"}, "policy.low_traffic.enabled", ["true or false"]),
    ({"allow_replay_only": 1}, "policy.low_traffic.allow_replay_only", ["true or false"]),
    ({"max_requests_per_step": 0}, "policy.low_traffic.max_requests_per_step", ["integer from 1"]),
    ({"max_requests_per_step": 500, "max_requests_per_rollout": 100}, "policy.low_traffic.max_requests_per_step",
     ["at most max_requests_per_rollout (100)"]),
    ({"concurrency": 65}, "policy.low_traffic.concurrency", ["from 1 to 64"]),
    ({"min_live_requests": -1}, "policy.low_traffic.min_live_requests", ["null (the policy's min_samples)"]),
    ({"prompt_set": "../etc/passwd"}, "policy.low_traffic.prompt_set", ["no paths"]),
    ({"max_rsp": 3}, "policy.low_traffic.max_rsp", ["not a low_traffic field", "max_rps"]),
])
def test_the_one_parser_names_the_field(lt, field, words):
    with pytest.raises(ValidationError) as e:
        parse_policy({"low_traffic": lt})
    assert e.value.field == field
    for w in words:
        assert w in str(e.value), str(e.value)


def test_low_traffic_must_be_an_object():
    with pytest.raises(ValidationError) as e:
        parse_policy({"low_traffic": True})
    assert e.value.field == "policy.low_traffic"


def test_live_requests_needed():
    assert live_requests_needed(LowTrafficPolicy(), 200) == 200
    assert live_requests_needed(LowTrafficPolicy(min_live_requests=30), 200) == 30
    assert live_requests_needed(LowTrafficPolicy(allow_replay_only=True, min_live_requests=30), 200) == 0


@pytest.mark.parametrize("replayed,lt,outcome", [
    (0, {}, Outcome.PASS),                                    # all live: the ordinary pass
    (250, {}, Outcome.INCONCLUSIVE),                          # 50 live < min_samples 100: would-be pass held
    (200, {}, Outcome.PASS),                                  # 100 live = min_samples: enough live load
    (250, {"min_live_requests": 50}, Outcome.PASS),           # the policy's own minimum
    (250, {"min_live_requests": 51}, Outcome.INCONCLUSIVE),
    (300, {}, Outcome.INCONCLUSIVE),                          # replayed alone
    (300, {"allow_replay_only": True}, Outcome.PASS),         # explicitly allowed
])
def test_a_pass_needs_live_canary_load_unless_replay_only_is_allowed(replayed, lt, outcome):
    p = _policy(enabled=True, **lt)
    c = _variant(_same(300), replayed=replayed)
    b = _variant(_same(300), replayed=replayed)
    v = assess({"canary": c, "baseline": b}, p)
    assert v.outcome is outcome, v.reason
    if outcome is Outcome.INCONCLUSIVE:
        assert "on replayed load" in v.reason and f"{300 - replayed:g} live canary requests" in v.reason
        assert v.need_more is None          # more replay cannot turn it into a pass
        assert all(r.outcome is Outcome.PASS for r in v.results)   # the metrics themselves passed


def test_a_fail_on_replayed_load_alone_is_a_fail():
    p = _policy(enabled=True)
    c = _variant([x * 3 for x in _same(300)], replayed=300)
    b = _variant(_same(300), replayed=300)
    v = assess({"canary": c, "baseline": b}, p)
    assert v.outcome is Outcome.FAIL and "p90" in v.reason


def test_no_data_yet_asks_for_what_the_quantile_needs():
    """A step with no request at all on the canary says how many it needs: what replay sends first."""
    p = _policy(enabled=True)
    empty = VariantData()
    v = assess({"canary": empty, "baseline": empty}, p)
    assert v.outcome is Outcome.INCONCLUSIVE and v.need_more == 100
    latency = next(r for r in v.results if r.check.endswith(":p90"))
    assert latency.need_more == 100 and latency.low_traffic and "no data" in latency.reason


def test_token_histograms_are_not_shown_as_latency_deltas():
    p = _policy(enabled=True)
    c = _variant(_same(300), tokens=(PROMPT_TOKENS, GENERATION_TOKENS))
    v = assess({"canary": c, "baseline": c}, p)
    assert {d.series for d in v.deltas} == {SERIES, ERROR_RATE}


def test_live_property():
    assert VariantData(requests=10, replayed=4).live == 6
    assert VariantData(requests=3, replayed=4).live == 0   # counters scraped a moment apart
