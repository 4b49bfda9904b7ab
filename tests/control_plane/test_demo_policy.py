"""The CPU demo's policy: sequential statistics with request-latency P99 gated between two boundaries at every rate,
and at thin live rates (--rate 0.5, replayed load, the slow set not saturated) inter-token latency P99 too
(BENCHMARKS.md "Low-traffic mode")."""
from sits.control_plane.demo.profiles import BUSY_RATE, demo_policy
from sits.control_plane.demo.runner import DemoConfig


def test_the_demo_policy_is_sequential_with_two_boundaries_on_p99(tmp_path):
    for rate in (0.5, 25.0):
        p = demo_policy(rate)
        assert p.statistics == "sequential" and p.low_traffic.enabled
        p99 = next(c for c in p.checks if c.metric == "http_request_duration_seconds")
        assert p99.quantile == 0.99 and p99.ship < p99.limit
    assert DemoConfig(workdir=str(tmp_path)).policy == demo_policy(25.0)      # the default rate, 25 req/s


def test_thin_live_rates_also_gate_inter_token_latency_at_p99(tmp_path):
    """Replayed load leaves the slow set's request-latency P99 lower; its ITL P99 (several observations per request)
    is far beyond its gate, so below BUSY_RATE a P99 check decides every time."""
    def gates(policy):
        return {(c.metric, c.quantile, c.max_rel_delta) for c in policy.checks if c.quantile is not None}

    itl = ("sits_inter_token_latency_seconds", 0.99, 1.00)
    assert itl in gates(demo_policy(0.5)) and itl in gates(demo_policy(2.0))
    assert itl not in gates(demo_policy(25.0)) and itl not in gates(demo_policy(BUSY_RATE))
    assert gates(demo_policy(0.5)) - {itl} == gates(demo_policy(25.0))   # the request-latency gates stay
    assert itl in gates(DemoConfig(workdir=str(tmp_path), rate=0.5).policy)
