"""A fast end-to-end smoke of bench/canary_eval.py: the real policy and state machine on simulated traffic decide
the obvious cases (the full measurement with >= 1,000 rollouts is the bench itself)."""
import importlib.util
import sys
from pathlib import Path

from sits.control_plane.analysis import Policy

spec = importlib.util.spec_from_file_location(
    "canary_eval", Path(__file__).resolve().parents[3] / "bench" / "canary_eval.py")
ce = importlib.util.module_from_spec(spec)
sys.modules.setdefault("canary_eval", ce)   # dataclasses look their module up
spec.loader.exec_module(ce)


def test_big_regression_is_rolled_back_fast_and_identical_canaries_are_promoted():
    bad = ce.batch(1, 6, Policy(), ce.LOGNORMAL, ce.LOGNORMAL.with_scale(0.5), 20.0, horizon=600.0)
    assert all(r.outcome == "rolled_back" and r.t_decision <= 90 for r in bad), bad
    good = ce.batch(2, 6, Policy(), ce.LOGNORMAL, ce.LOGNORMAL, 100.0, horizon=1200.0)
    assert all(r.outcome == "promoted" for r in good), good


def test_tail_only_distribution_moves_only_the_tail():
    d = ce.LOGNORMAL.with_scale(0.5, tail_only=True)
    p95 = ce.LOGNORMAL.quantile95()
    assert abs(float(d.cdf(p95 * 0.9)) - float(ce.LOGNORMAL.cdf(p95 * 0.9))) < 1e-12
    assert float(d.cdf(p95 * 1.4)) < float(ce.LOGNORMAL.cdf(p95 * 1.4)) - 0.01
    assert abs(d.bucket_probs().sum() - 1.0) < 1e-9 and len(d.bucket_probs()) == len(ce.BOUNDS)


def test_the_timed_pass_is_a_real_check_of_every_rollout():
    rollouts, observations = ce.analysis_inputs(5)
    out = [ce.reconcile(r, o, 41.0) for r, o in zip(rollouts, observations)]
    assert [len(r.new_checks) for r, _ in out] == [1] * 5
    for r, _ in out:
        (check,) = r.new_checks
        assert check.source != "correctness" and check.verdict.results   # the latency tests ran on the step data
        assert {t.n_canary for t in check.verdict.results if t.n_canary} and all(
            t.n_canary >= 2000 for t in check.verdict.results if t.n_canary)
