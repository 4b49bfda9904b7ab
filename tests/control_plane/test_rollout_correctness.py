"""The correctness gate in the state machine: reconcile() with canned correctness verdicts and a frozen clock.
Traffic starts only after a PASS; a FAIL rolls back at once with its evidence; each step needs a PASS to advance."""
import pytest

from sits.control_plane.analysis import CorrectnessVerdict, Outcome, Policy, PromptComparison
from sits.control_plane.rollout import (Observation, Phase, Rollback, Rollout, SetWeights, correctness_due, reconcile,
                                   weights_for)
from tests.control_plane.test_rollout import window

POLICY = Policy(steps=(10, 50, 100), check_interval_s=10.0, warmup_s=0.0, statistics="fixed")
EVIDENCE = PromptComparison(3, "The capital of France is", 16, 2, False, 0.0, 0.0, 0.5, 2.1, 16, 3.2, 0.4,
                            (1, 2, 3), (1, 2, 9), "abc", "abj")
PASS = CorrectnessVerdict(Outcome.PASS, "32 prompts identical", prompts=32, identical_fraction=1.0, dtype="float32")
FAIL = CorrectnessVerdict(Outcome.FAIL, "float32 tolerances: 1 prompt(s) diverged where the baseline was sure",
                          prompts=32, identical_fraction=0.78, failed=("flip_margin",), evidence=(EVIDENCE,),
                          dtype="float32")
INCONCLUSIVE = CorrectnessVerdict(Outcome.INCONCLUSIVE, "9/32 prompts could not be replayed", errors=9)


class Driver:
    def __init__(self, policy=POLICY):
        self.r, self.t = Rollout("r1", "chat", "torch-wrong-rope", "torch", policy), 0.0
        self.actions = []

    def tick(self, variants=None, correctness=None, dt=10.0):
        """One pass; like the worker, a correctness verdict is only passed when correctness_due said so."""
        self.t += dt
        if correctness is not None:
            assert correctness_due(self.r, self.t)
        obs = Observation(self.t - dt, self.t, variants if variants is not None else {}, source="scrape",
                          correctness=correctness)
        self.r, self.actions = reconcile(self.r, obs, self.t)
        return self.r.phase


def ready_driver(policy=POLICY) -> Driver:
    d = Driver(policy)
    assert d.tick() is Phase.INITIALIZING
    return d


def test_traffic_starts_only_after_the_gate_passes():
    d = ready_driver()
    assert correctness_due(d.r, d.t + 10)
    assert d.tick(window()) is Phase.INITIALIZING and d.r.step == -1   # ready, but no verdict yet: wait
    assert not any(isinstance(a, SetWeights) for a in d.actions)
    assert d.tick(window(), PASS) is Phase.PROGRESSING
    assert d.r.step == 0 and SetWeights(weights_for(10)) in d.actions
    (check,) = d.r.new_checks
    assert (check.source, check.decision, check.step, check.verdict.correctness) == ("correctness", "pass", -1, PASS)
    assert check.verdict.to_dict()["correctness"]["prompts"] == 32
    assert d.r.correctness_step == 0 and not correctness_due(d.r, d.t + 1000)   # the pre-traffic run covers step 0


def test_a_failing_gate_before_traffic_rolls_back_with_its_evidence():
    d = ready_driver()
    assert d.tick(window(), FAIL) is Phase.ROLLING_BACK
    assert Rollback() in d.actions and not any(isinstance(a, SetWeights) for a in d.actions)
    assert d.r.reason.startswith("correctness gate (check 1): float32 tolerances")
    (check,) = d.r.new_checks
    assert check.decision == "rollback" and check.verdict.outcome is Outcome.FAIL
    assert check.verdict.guard == "correctness"
    ev = check.verdict.to_dict()["correctness"]["evidence"][0]
    assert ev["baseline_tokens"] == [1, 2, 3] and ev["canary_tokens"] == [1, 2, 9] and ev["first_divergence"] == 2
    assert d.tick() is Phase.ROLLED_BACK


def test_an_inconclusive_gate_is_retried_after_the_check_interval_then_times_out():
    d = ready_driver(Policy(steps=(10, 100), check_interval_s=10.0, warmup_s=0.0, ready_timeout_s=25.0))
    assert d.tick(window(), INCONCLUSIVE) is Phase.INITIALIZING
    assert d.r.new_checks[0].decision == "hold"
    assert not correctness_due(d.r, d.t + 5) and correctness_due(d.r, d.t + 10)
    assert d.tick(window(), INCONCLUSIVE) is Phase.INITIALIZING
    assert d.tick(window()) is Phase.ROLLING_BACK   # 30 s since deploy without a passing verdict
    assert "no passing correctness verdict" in d.r.reason


def test_each_step_needs_its_own_pass_before_it_advances():
    d = ready_driver()
    d.tick(window(), PASS)
    assert d.tick(window()) is Phase.PROGRESSING and d.r.step == 1   # step 0 was gated before traffic: advance
    assert correctness_due(d.r, d.t)
    assert d.tick(window()) is Phase.PROGRESSING and d.r.step == 1   # latency passes, the gate has not run
    held = d.r.new_checks[-1]
    assert held.decision == "hold" and held.verdict.outcome is Outcome.PASS
    assert "waiting for this step's correctness gate" in d.r.new_events[-1].message
    assert d.tick(window(), PASS) is Phase.PROMOTING   # gate + latency both pass in this pass: the last step promotes
    assert [c.source for c in d.r.new_checks] == ["correctness", "scrape"]


def test_a_failing_gate_during_a_step_rolls_back_even_when_latency_passes():
    d = ready_driver()
    d.tick(window(), PASS)
    d.tick(window())
    assert d.tick(window(), FAIL) is Phase.ROLLING_BACK
    assert [c.decision for c in d.r.new_checks] == ["rollback"]   # no latency look after the gate failed


@pytest.mark.parametrize("interval, dt, due", [(0.0, 1000.0, False), (60.0, 30.0, False), (60.0, 60.0, True)])
def test_interval_reruns_within_a_step(interval, dt, due):
    d = ready_driver(Policy(steps=(10, 100), check_interval_s=10.0, warmup_s=0.0,
                            correctness={"interval_s": interval}))
    d.tick(window(), PASS)
    assert correctness_due(d.r, d.t + dt) is due


def test_disabled_gate_never_runs_and_never_blocks():
    d = ready_driver(Policy(steps=(10, 100), correctness={"enabled": False}))
    assert not correctness_due(d.r, d.t + 10)
    assert d.tick(window()) is Phase.PROGRESSING


@pytest.mark.parametrize("phase", [Phase.PENDING, Phase.PAUSED, Phase.PROMOTING, Phase.ROLLED_BACK])
def test_not_due_outside_initializing_and_progressing(phase):
    assert not correctness_due(Rollout("r", "s", "a", "b", POLICY, phase=phase), 100.0)


def test_reconcile_does_not_mutate_its_input():
    d = ready_driver()
    before = d.r
    snapshot = (before.phase, before.checks, before.correctness_step, before.correctness_at)
    reconcile(before, Observation(0.0, 10.0, window(), correctness=FAIL), 20.0)
    assert (before.phase, before.checks, before.correctness_step, before.correctness_at) == snapshot
