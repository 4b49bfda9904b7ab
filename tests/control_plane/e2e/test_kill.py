"""The control plane SIGKILLed at seeded random points of a rollout and restarted: the same outcome as a run without
kills, no check lost or duplicated, no orphaned engine process, and no deploy action done twice with another result.
The whole control plane (worker, store, LocalDeployer with its engines and router, load) is one subprocess."""
import json
import random
import signal
import urllib.request

import pytest

from sits.control_plane.rollout import Phase
from sits.control_plane.service.rollouts import start_rollout
from sits.control_plane.adapters.deploy.spec import DeploySpec
from sits.control_plane.store.db import Store

from tests.waiting import wait_for

from .control_proc import PIN_TOKEN
from .support import FAST, SLOW, engine_pids, start_control_proc

# where the first control plane dies (between the steps of a pass, after deploying, after moving traffic), and where
# its restart dies (right after restoring the variants, after storing a check, after rolling back): Worker.step_hook
FIRST = ("loaded:5", "reconciled:4", "saved:3", "executed:deploy:1", "executed:set_weights:1")
SECOND = ("restored:1", "saved:2", "executed:rollback:1")


def start(store_path, workdir, svc, die_at=None):
    return start_control_proc(store_path, workdir, svc, *(["--die-at", die_at] if die_at else []))


@pytest.mark.slow
@pytest.mark.parametrize("seed", [19])   # seed 5 (dies after set_weights, then after a saved check) passes too
def test_sigkilled_control_plane_resumes_to_the_same_outcome(tmp_path, seed):
    rng = random.Random(seed)
    kills = [rng.choice(FIRST), rng.choice(SECOND)]
    svc, db = f"kill{seed}", tmp_path / "s.db"
    with Store(str(db)) as s:
        r = start_rollout(s, svc, "torch", "torch", FAST, DeploySpec(canary_faults=SLOW), actor="test")
    died = []
    for die_at in kills + [None]:
        proc = start(db, tmp_path, svc, die_at)
        try:
            def over():
                with Store(str(db)) as s:
                    got = s.get(r.id)
                    return proc.poll() is not None or (not got.active and not s.pending_actions(r.id))
            wait_for(f"the rollout to end or the control plane to die at {die_at}", over, 240)
        finally:
            if proc.poll() is None:
                try:
                    url = (tmp_path / f"router-{proc.pid}").read_text()
                    req = urllib.request.Request(url + "/_sits/weights", headers={"X-SITS-Pin-Token": PIN_TOKEN})
                    with urllib.request.urlopen(req, timeout=10) as resp:
                        routed = json.load(resp)
                finally:   # never leave the control plane (and its engines) running
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(60)
        if proc.returncode == -signal.SIGKILL:
            died.append(die_at)
            wait_for("the dead control plane's engines to exit", lambda: not engine_pids(svc), 15)   # no orphans
    assert died == kills, f"the control plane did not die at every chosen point: {died} of {kills}"
    assert proc.returncode == 0 and not engine_pids(svc)
    with Store(str(db)) as s:
        got, checks, events, actions = s.get(r.id), s.checks(r.id), s.events(r.id), s.actions(r.id)
    # the same outcome as without kills: the slow canary fails its P90 check twice and is rolled back
    assert got.phase is Phase.ROLLED_BACK and "2 failed check(s)" in got.reason, got.reason
    assert [c["seq"] for c in checks] == list(range(1, got.checks + 1))          # none lost, none duplicated
    for a, b in zip(checks, checks[1:]):
        assert b["window_start"] is None or a["window_end"] is None or b["window_start"] >= a["window_end"] - 1e-6 \
            or b["step"] == a["step"]
    assert any(e["message"].startswith("restart:") for e in events)             # a kill after the deploys restored
    assert all(a["status"] == "done" for a in actions), [(a["kind"], a["status"], a["error"]) for a in actions]
    deploys = {}
    for a in actions:
        if a["kind"] == "deploy":                                                 # one spec per role, ever
            deploys.setdefault(a["body"]["role"], set()).add(a["body"]["kernels"])
    assert deploys == {"baseline": {"torch"}, "canary": {"torch"}}
    assert len([a for a in actions if a["kind"] == "rollback"]) == 1
    # what the last control plane left: production alone, with all the traffic
    assert routed["weights"] == {"production": 100, "baseline": 0, "canary": 0}
    assert set(routed["backends"]) == {"production"}
