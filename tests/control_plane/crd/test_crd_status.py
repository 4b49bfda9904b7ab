"""What a KernelRollout's status says about its rollout (control_plane/crd/status.py): literal rollouts and
check evidence in, status dicts out."""
import pytest

from sits.control_plane.crd.status import RolloutRequest, last_check, refused_status, rollout_status
from sits.control_plane.rollout import Phase, Rollout

T0 = 1_780_000_000.0


def result(check, outcome, delta, low, high, low_traffic=False):
    return {"check": check, "series": check.split(":")[0], "outcome": outcome, "delta_rel": delta, "ci_low": low,
            "ci_high": high, "low_traffic": low_traffic}


def evidence(*results, outcome="fail", decision="rollback", seq=3):
    return {"seq": seq, "at": T0, "step": 0, "weight": 50, "decision": decision,
            "verdict": {"outcome": outcome, "reason": "x", "results": list(results)}}


def test_last_check_names_the_result_that_made_the_checks_outcome_as_the_ui_does():
    ev = evidence(result("lat:p99", "pass", 0.30, 0.1, 0.4), result("lat:p90", "fail", 0.25, 0.2, 0.3))
    assert last_check(ev) == {"seq": 3, "verdict": "fail", "decision": "rollback", "time": "2026-05-28T20:26:40Z",
                              "metric": "lat:p90", "delta": "+25.0 %", "interval": "[+20.0 %, +30.0 %]"}
    ev = evidence(result("lat:p99", "pass", 0.01, -0.02, 0.04), result("lat:p90", "pass", 0.03, -0.01, 0.05),
                  result("err", "inconclusive", 0.9, None, None, low_traffic=True), outcome="pass", decision="pass")
    # a passed check: a passing result, the highest quantile (view.headline.lead, the list's and the CLI's rule)
    assert last_check(ev)["metric"] == "lat:p99" and last_check(ev)["interval"] == "[-2.0 %, +4.0 %]"
    # an inconclusive check: the inconclusive result, never a larger passing delta beside it
    ev = evidence(result("lat:p99", "pass", 0.30, 0.1, 0.4), result("lat:p90", "inconclusive", 0.02, -0.1, 0.3),
                  outcome="inconclusive", decision="hold")
    assert (last_check(ev)["metric"], last_check(ev)["delta"]) == ("lat:p90", "+2.0 %")
    gate = {**evidence(), "verdict": {"outcome": "fail", "correctness": {"identical_fraction": 0.78, "diverged": 11,
                                                                       "prompts": 50}}}
    assert last_check(gate)["metric"] == "correctness" and last_check(gate)["delta"] == "78% identical"
    assert last_check(None) is None


def test_a_sequential_check_shows_its_sequence_both_boundaries_windows_and_time_to_decide():
    r = {**result("lat:p90", "inconclusive", 0.18, 0.037, 0.342), "method": "sequential", "ship": 0.125,
         "threshold": 0.25, "windows": 8, "eta_s": 310.4}
    got = last_check(evidence(r, outcome="inconclusive", decision="hold"))
    assert got["interval"] == "[+3.7 %, +34.2 %]" and got["boundaries"] == "+12.5 % / +25.0 %"
    assert got["windows"] == 8 and got["decidesIn"] == "~310 s"
    err = {"check": "error_rate", "series": "error_rate", "outcome": "fail", "delta_rel": 0.031, "delta_abs": 0.031,
           "ci_low": 0.012, "ci_high": 0.05, "method": "sequential", "ship": 0.01, "threshold": 0.02, "windows": 9}
    got = last_check(evidence(err))
    assert (got["delta"], got["interval"], got["boundaries"]) == ("+3.10 pt", "[+1.20 pt, +5.00 pt]",
                                                                  "+1.00 pt / +2.00 pt")
    assert got["decidesIn"] == "-"


@pytest.mark.parametrize("phase,completed,degraded", [(Phase.PROGRESSING, "False", "False"),
                                                      (Phase.SUCCEEDED, "True", "False"),
                                                      (Phase.ROLLED_BACK, "True", "True"),
                                                      (Phase.FAILED, "True", "True")])
def test_conditions_follow_the_phase(phase, completed, degraded):
    r = Rollout("r1", "chat", "triton-v1", "torch", phase=phase, weight=10, step=0, reason="why")
    st = rollout_status(r, None, 2, None, T0)
    conds = {c["type"]: c for c in st["conditions"]}
    assert (conds["Completed"]["status"], conds["Degraded"]["status"]) == (completed, degraded)
    assert conds["Progressing"]["status"] == ("False" if phase.terminal else "True")
    assert st["rolloutId"] == "r1" and st["observedGeneration"] == 2 and st["phase"] == phase.value


def test_transition_times_move_only_with_the_status_and_empty_strings_are_left_out():
    r = Rollout("r1", "chat", "triton-v1", "torch", phase=Phase.PROGRESSING)
    first = rollout_status(r, None, 1, None, T0)
    assert "reason" not in first and all(c.get("message", "x") for c in first["conditions"])
    again = rollout_status(r, None, 1, first, T0 + 60)
    assert again == first   # nothing changed: nothing to write
    done = rollout_status(Rollout("r1", "chat", "triton-v1", "torch", phase=Phase.ROLLED_BACK, reason="p90"), None, 1,
                          first, T0 + 120)
    times = {c["type"]: c["lastTransitionTime"] for c in done["conditions"]}
    assert times["Completed"] == times["Degraded"] == "2026-05-28T20:28:40Z"
    refused = refused_status("refused: kernels: unknown kernel set 'x'", "InvalidSpec", 2, done, T0 + 180)
    assert refused["rolloutId"] == "r1" and refused["reason"].startswith("refused")
    deg = next(c for c in refused["conditions"] if c["type"] == "Degraded")
    assert deg["reason"] == "InvalidSpec" and deg["lastTransitionTime"] == times["Degraded"]   # was True already


def test_request_from_a_resource():
    req = RolloutRequest.from_object({"spec": {"service": "chat", "kernels": "k", "replicas": 2, "image": "i:1",
                                               "args": ["--x"], "paused": True}})
    assert (req.service, req.kernels, req.production_kernels, req.paused) == ("chat", "k", "torch", True)
    assert req.spec == {"model": "tiny", "canary_args": ["--x"], "replicas": 2, "canary_image": "i:1"}
