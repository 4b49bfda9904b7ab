"""The rollout state machine: reconcile() stepped with a frozen clock and canned observations; phase after each step."""
from dataclasses import replace

import pytest

from sits.control_plane.analysis import REQUEST_LATENCY, VariantData
from sits.control_plane.rollout import (Command, Deploy, Notify, Observation, Phase, Promote, Rollback, Rollout,
                                   SetWeights, reconcile, weights_for)
from tests.control_plane.helpers import latency_policy as Policy, lat

GOOD, BAD = lat(3000), lat(3000, 1.5)   # one 10 s window of traffic per variant


def window(canary=GOOD, baseline=GOOD, *, ready=True, crashing=False, errors=15.0):
    return {"canary": VariantData({REQUEST_LATENCY: canary}, canary.total, errors, ready, crashing),
            "baseline": VariantData({REQUEST_LATENCY: baseline}, baseline.total, 15.0)}


class Clock:
    """Frozen clock + driver: each tick advances 10 s and feeds one window [t - 10, t]."""

    def __init__(self, rollout):
        self.r, self.t, self.actions = rollout, 0.0, []

    def step(self, variants=None, *, command=None, failed=(), dt=10.0, source="scrape", messages=None):
        self.t += dt
        obs = Observation(self.t - dt, self.t, variants if variants is not None else {}, source=source,
                          queries={"canary": "http://canary/metrics"}, command=command, failed_actions=failed,
                          status_messages=messages or {})
        before = self.r
        self.r, self.actions = reconcile(self.r, obs, self.t)
        assert before is not self.r
        return self.r.phase


def start(policy=None) -> Clock:
    c = Clock(Rollout("r1", "chat", "triton-v2", "triton-v1", policy or Policy()))
    assert c.step() is Phase.INITIALIZING
    assert c.actions[:2] == [Deploy("baseline", "triton-v1"), Deploy("canary", "triton-v2")]
    assert isinstance(c.actions[2], Notify) and c.actions[2].event == "started"
    return c


def progressing(policy=None) -> Clock:
    c = start(policy)
    assert c.step(window(ready=False)) is Phase.INITIALIZING          # canary not ready yet: wait
    assert c.step(window()) is Phase.PROGRESSING
    assert c.r.weight == 5 and SetWeights(weights_for(5)) in c.actions
    assert weights_for(5) == {"production": 90, "baseline": 5, "canary": 5}
    return c


def test_good_canary_walks_every_step_and_is_promoted():
    c = progressing()
    seen = [c.r.weight]
    for _ in range(100):
        phase = c.step(window())
        if c.r.weight != seen[-1]:
            seen.append(c.r.weight)
        if phase is not Phase.PROGRESSING:
            break
    assert seen == [5, 10, 25, 50] and c.r.phase is Phase.PROMOTING and Promote() in c.actions
    assert all(ch.verdict.outcome.value == "pass" for ch in c.r.new_checks)
    assert c.step() is Phase.SUCCEEDED and c.actions[-1].event == "promoted"
    assert c.step(command=Command.ABORT) is Phase.SUCCEEDED                        # terminal: commands ignored
    assert "ignored" in c.r.new_events[-1].message


def test_warmup_window_is_dropped_and_checks_wait_for_the_interval():
    c = progressing()
    assert c.step(window()) is Phase.PROGRESSING       # window starts before warm-up end: dropped
    assert c.r.data == {} and c.r.excluded_requests == GOOD.total
    assert c.step(window()) is Phase.PROGRESSING       # counted; no check yet (interval 30 s)
    assert c.r.checks == 0 and c.r.data["canary"].requests == GOOD.total
    c.step(window())
    assert c.r.checks == 1 and len(c.r.new_checks) == 1 and c.r.new_checks[0].decision == "advance"
    assert c.r.weight == 10 and c.r.data == {}          # next step starts with fresh data


def test_bad_canary_needs_two_failed_checks_then_rolls_back():
    c = progressing()
    phases = [c.step(window(BAD)) for _ in range(3)]
    assert phases == [Phase.PROGRESSING] * 3 and c.r.consecutive_failures == 1
    assert c.r.new_checks[0].decision == "hold" and c.r.new_checks[0].verdict.outcome.value == "fail"
    phases = [c.step(window(BAD)) for _ in range(3)]
    assert phases[-1] is Phase.ROLLING_BACK and Rollback() in c.actions
    assert c.r.new_checks[0].decision == "rollback" and "2 failed check(s)" in c.r.reason
    assert c.step() is Phase.ROLLED_BACK


def test_crashing_canary_rolls_back_at_once():
    c = progressing()
    c.step(window())
    assert c.step(window(crashing=True)) is Phase.ROLLING_BACK    # no waiting for the check interval
    assert c.r.new_checks[0].verdict.guard == "crashing" and Rollback() in c.actions


def test_one_failed_readiness_probe_does_not_roll_back_a_sustained_one_does():
    c = progressing(Policy(not_ready_grace_s=25.0))
    c.step(window())
    messages = {"canary": "0/1 ready; weight 5%; replica 0 at http://127.0.0.1:1 not ready (/readyz)"}
    assert c.step(window(ready=False), messages=messages) is Phase.PROGRESSING   # one slow probe (issue 39)
    assert c.r.not_ready_since == c.t and not c.r.new_checks                     # not a check of its own
    assert c.step(window()) is Phase.PROGRESSING and c.r.not_ready_since is None   # answered again: forgotten
    assert c.r.new_checks and c.r.new_checks[0].verdict.guard is None             # judged on its metrics
    # not ready on every observation: the guard fires once the grace period is over, and says how long and why
    phases = [c.step(window(ready=False), messages=messages, dt=10.0) for _ in range(4)]
    assert phases == [Phase.PROGRESSING] * 3 + [Phase.ROLLING_BACK]
    assert c.r.new_checks[0].verdict.guard == "not_ready" and Rollback() in c.actions
    assert c.r.reason == f"guard: canary not ready for 30 s (grace 25 s): canary: {messages['canary']}"


def test_a_zero_grace_period_rolls_back_on_the_first_failed_probe():
    c = progressing(Policy(not_ready_grace_s=0.0))
    c.step(window())
    assert c.step(window(ready=False)) is Phase.ROLLING_BACK
    assert c.r.reason == "guard: canary not ready for 0 s (grace 0 s): canary: not ready"


def test_error_rate_guard():
    c = progressing()
    c.step(window())
    c.step(window(errors=600.0))
    assert c.step(window(errors=600.0)) is Phase.ROLLING_BACK
    assert c.r.new_checks[0].verdict.guard == "error_rate"


@pytest.mark.parametrize("on_inconclusive,final", [("pause", Phase.PAUSED), ("rollback", Phase.ROLLING_BACK)])
def test_no_data_is_inconclusive_then_pause_or_rollback(on_inconclusive, final):
    c = progressing(Policy(inconclusive_limit=3, on_inconclusive=on_inconclusive))
    phases = [c.step({}) for _ in range(9)]           # three checks, every one without data
    assert phases[:8] == [Phase.PROGRESSING] * 8 and phases[8] is final
    assert c.r.checks == 3 and "no data from canary" in c.r.reason


def test_manual_pause_resume_promote():
    c = progressing()
    assert c.step(window(), command=Command.PAUSE) is Phase.PAUSED
    assert c.step(window()) is Phase.PAUSED and c.r.checks == 0    # no checks while paused
    assert c.step(window(), command=Command.RESUME) is Phase.PROGRESSING
    assert c.step(window(), command=Command.PROMOTE) is Phase.PROMOTING and Promote() in c.actions
    assert c.step() is Phase.SUCCEEDED


def test_manual_abort_and_abort_before_deploy():
    c = progressing()
    assert c.step(command=Command.ABORT) is Phase.ROLLING_BACK and Rollback() in c.actions
    assert c.step() is Phase.ROLLED_BACK
    fresh = Clock(Rollout("r2", "chat", "b", "a"))
    assert fresh.step(command=Command.ABORT) is Phase.ROLLED_BACK and not any(
        isinstance(a, (Deploy, Rollback)) for a in fresh.actions)


def test_manual_gate_waits_for_promote():
    c = progressing(Policy(steps=(5, 100), auto_promote=False))
    for _ in range(3):
        c.step(window())
    assert c.r.phase is Phase.PAUSED and c.r.awaiting_promotion
    assert c.step(command=Command.RESUME) is Phase.PAUSED and "awaiting promotion" in c.r.new_events[-1].message
    assert c.step(command=Command.PROMOTE) is Phase.PROMOTING


def test_ready_timeout_and_max_duration():
    c = start(Policy(ready_timeout_s=25))
    assert [c.step(window(ready=False)) for _ in range(3)] == [Phase.INITIALIZING] * 2 + [Phase.ROLLING_BACK]
    assert c.r.reason == "not ready after 25 s: canary: not ready"   # the deployer said nothing more
    c = progressing(Policy(max_duration_s=40, inconclusive_limit=100))
    phases = [c.step({}) for _ in range(5)]
    assert phases[-1] is Phase.ROLLING_BACK and "max duration" in c.r.reason


K8S = ("0/1 ready, 1 updated, 0 available; Available: Deployment does not have minimum availability.; weight 0%; "
       "pod chat-canary-7d4b9c-x2x9z last log line: loading weights 3/4")


def test_ready_timeout_reason_carries_the_deployers_status_of_each_variant_not_ready():
    c = start(Policy(ready_timeout_s=25))
    messages = {"canary": K8S, "baseline": "1/1 ready, 1 updated, 1 available", "production": "2/2 ready"}
    phases = [c.step(window(ready=False), messages=messages) for _ in range(3)]
    assert phases == [Phase.INITIALIZING] * 2 + [Phase.ROLLING_BACK] and Rollback() in c.actions
    assert c.r.reason == f"not ready after 25 s: canary: {K8S}"        # the ready baseline is not named
    assert c.actions[-2] == Notify("rolling_back", f"chat: {c.r.reason}")
    # both not ready, the local deployer's words for an exited replica (its log tail after a newline): one line each,
    # cut in the middle past 300 characters so that the counts lead and what the engine logged last ends it
    tail = "\n".join(f"INFO step {i} of the warm-up" for i in range(40)) + "\nRuntimeError: CUDA error: out of memory\n"
    local = f"0/1 ready; weight 0%; kernels torch; replica 0 (pid 4242) exited with code 1; log /w/b.log:\n{tail}"
    c = start(Policy(ready_timeout_s=25))
    both = {"canary": VariantData(ready=False), "baseline": VariantData(ready=False)}
    for _ in range(3):
        c.step(both, messages={"canary": K8S + "\n" + "x" * 400, "baseline": local})
    assert c.r.phase is Phase.ROLLING_BACK and "\n" not in c.r.reason
    assert c.r.reason.startswith("not ready after 25 s: canary: ")
    canary, baseline = c.r.reason.removeprefix("not ready after 25 s: ").split("; baseline: ")
    assert canary.startswith("canary: 0/1 ready, 1 updated")
    assert len(canary) == len("canary: ") + 300 and " … " in canary and canary.endswith("x" * 100)
    assert baseline.startswith("0/1 ready; weight 0%; kernels torch; replica 0 (pid 4242) exited with code 1")
    assert len(baseline) == 300
    assert baseline.endswith("INFO step 39 of the warm-up RuntimeError: CUDA error: out of memory")
    # a variant the deployer did not report at all (e.g. its status call failed)
    c = start(Policy(ready_timeout_s=25))
    for _ in range(3):
        c.step({"canary": VariantData(ready=False)}, messages={"canary": "0/1 ready"})
    assert c.r.reason == "not ready after 25 s: canary: 0/1 ready; baseline: not reported by the deployer"


def test_overlapping_window_is_not_counted_twice():
    c = progressing()
    c.step(window())
    c.step(window())
    n = c.r.data["canary"].requests
    c.r, _ = reconcile(c.r, Observation(c.t - 10, c.t, window(), source="scrape"), c.t + 1)   # same window again
    assert c.r.data["canary"].requests == n and "overlaps" in c.r.new_events[-1].message


def test_failed_actions():
    c = start()
    assert c.step(failed=("deploy",)) is Phase.ROLLING_BACK
    assert c.step(failed=("rollback",)) is Phase.FAILED and "operator" in c.r.reason


def test_reconcile_is_pure():
    c = progressing()
    c.step(window())
    r, obs = c.r, Observation(c.t, c.t + 10, window(BAD))
    snapshot = (r.phase, r.checks, dict(r.data), r.observed_until)
    out1, out2 = reconcile(r, obs, c.t + 10), reconcile(r, obs, c.t + 10)
    assert (r.phase, r.checks, dict(r.data), r.observed_until) == snapshot
    assert out1 == out2


def test_observation_validation():
    assert Observation(command="pause").command is Command.PAUSE
    with pytest.raises(ValueError, match="unknown command"):
        Observation(command="explode")
    with pytest.raises(ValueError, match="before it starts"):
        Observation(10.0, 5.0)
    assert Observation(None, 10.0).window_end == 10.0       # first poll of a source: no window yet
    with pytest.raises(ValueError, match="unknown variant role"):
        Observation(0.0, 1.0, {"shadow": VariantData()})


def test_window_with_one_side_missing_is_dropped():
    c = progressing(Policy(check_interval_s=60))
    c.step(window())                                     # warm-up
    only_canary = {"canary": window()["canary"], "baseline": VariantData()}
    c.step(only_canary)
    assert c.r.data == {} and "no data from baseline" in c.r.new_events[-1].message
    c.step(window())
    assert c.r.data["canary"].requests == c.r.data["baseline"].requests == GOOD.total


def test_data_cursor_starts_even_without_a_window():
    c = start()
    c.t += 10
    c.r, _ = reconcile(c.r, Observation(variants={"canary": VariantData(), "baseline": VariantData()}), c.t)
    assert c.r.phase is Phase.PROGRESSING and c.r.observed_until == c.t     # readiness only: cursor = now
    r = replace(c.r, observed_until=None)
    r2, _ = reconcile(r, Observation(None, c.t + 5), c.t + 5)
    assert r2.observed_until == c.t + 5                                      # first poll of a source


def test_pause_and_resume_during_initialization():
    c = start()
    assert c.step(window(ready=False), command=Command.PAUSE) is Phase.PAUSED
    assert c.r.paused_from is Phase.INITIALIZING
    assert c.step(window()) is Phase.PAUSED                          # ready, but paused: no traffic shift
    assert c.step(command=Command.RESUME) is Phase.INITIALIZING
    assert c.step(window()) is Phase.PROGRESSING and c.r.weight == 5


def test_compare_to_production_decides_and_evidence_keeps_every_variant():
    c = progressing(Policy(compare_to="production"))
    prod = VariantData({REQUEST_LATENCY: GOOD}, GOOD.total, 15.0)
    for _ in range(3):
        w = window(BAD, BAD)                                         # canary as slow as the baseline...
        w["production"] = prod                                       # ...but slower than production
        c.step(w)
    check = c.r.new_checks[0]
    assert check.verdict.compare_to == "production" and check.verdict.outcome.value == "fail"
    assert set(check.data) == {"canary", "baseline", "production"}
