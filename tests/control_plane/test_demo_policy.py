"""The CPU demo's policy follows its live rate: at the default 25 req/s users supply the step's samples and the slow
set saturates, so 700 requests per variant decide P90 and P99 together; at thin rates (--rate 0.5, replayed load,
the slow set not saturated) P99 needs 1200 (BENCHMARKS.md "Low-traffic mode")."""
from sits.control_plane.demo.profiles import BUSY_RATE, demo_policy
from sits.control_plane.demo.runner import DemoConfig


def test_the_demo_policy_needs_more_requests_per_variant_at_thin_live_rates(tmp_path):
    assert demo_policy(25.0).min_samples == 700 and demo_policy(BUSY_RATE).min_samples == 700
    assert demo_policy(0.5).min_samples == demo_policy(2.0).min_samples == 1200
    # a P99 bound is finite from ~520 requests (z 2.3): below that the P90 would decide alone
    assert min(demo_policy(r).min_samples for r in (0.5, 25.0)) > 2.3 ** 2 * 0.99 * 0.01 / 0.01 ** 2
    assert DemoConfig(workdir=str(tmp_path), rate=0.5).policy.min_samples == 1200
    assert DemoConfig(workdir=str(tmp_path)).policy.min_samples == 700      # the default rate, 25 req/s
    assert demo_policy(0.5).low_traffic.enabled and demo_policy(25.0).low_traffic.enabled


def test_thin_live_rates_also_gate_inter_token_latency_at_p99(tmp_path):
    """Replayed load leaves the slow set's request-latency P99 near its +50 % gate; its ITL P99 (several observations
    per request) is far beyond it, so below BUSY_RATE a P99 check decides every time."""
    def gates(policy):
        return {(c.metric, c.quantile, c.max_rel_delta) for c in policy.checks if c.quantile is not None}

    itl = ("sits_inter_token_latency_seconds", 0.99, 1.00)
    assert itl in gates(demo_policy(0.5)) and itl in gates(demo_policy(2.0))
    assert itl not in gates(demo_policy(25.0)) and itl not in gates(demo_policy(BUSY_RATE))
    assert gates(demo_policy(0.5)) - {itl} == gates(demo_policy(25.0))   # the request-latency gates stay
    assert itl in gates(DemoConfig(workdir=str(tmp_path), rate=0.5).policy)
