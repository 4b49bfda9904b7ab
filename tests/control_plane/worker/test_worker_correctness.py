"""The worker's side of the correctness gate without engines: a gate that cannot replay (an address that is not
HTTP, nothing listening, an unreadable prompt set) holds traffic back as INCONCLUSIVE -- never a pass -- until
ready_timeout_s."""
import json
import socket

import pytest

from sits.control_plane.adapters.inference.correctness import CorrectnessProbe
from sits.control_plane.analysis import Policy
from sits.control_plane.rollout import Phase
from sits.control_plane.service.rollouts import start_rollout
from sits.control_plane.store.db import Store
from sits.control_plane.worker.loop import Worker

from .support import CannedSource, FixedEndpointDeployer, InMemoryDeployer


def closed_port_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"   # closed again when the block ends


@pytest.mark.parametrize("case", ["not http", "nothing listening", "bad prompt set"])
def test_a_gate_that_cannot_replay_holds_traffic_and_times_out(tmp_path, case):
    prompts = tmp_path / "prompts-t.json"
    prompts.write_text(json.dumps({"not": "a list"}) if case == "bad prompt set" else json.dumps(["a", "b"]))
    deployer = InMemoryDeployer() if case == "not http" else FixedEndpointDeployer(closed_port_url())   # mem:// URLs
    t = [0.0]
    policy = Policy(steps=(10, 100), check_interval_s=10, warmup_s=0, ready_timeout_s=25,
                    correctness={"prompt_set": "t", "request_timeout_s": 2})
    with Store(str(tmp_path / "s.db")) as s:
        start_rollout(s, "chat", "triton-v1", "torch", policy, now=0.0, rollout_id="r1")
        w = Worker(s, deployer, CannedSource(), clock=lambda: t[0], correctness=CorrectnessProbe(prompt_dir=tmp_path))
        phases = []
        for dt in (1, 10, 10, 10):   # deploy at 1; ready (and the first replay) at 11, retried at 21 and 31
            t[0] += dt
            phases.append(w.reconcile_rollout("r1").phase)
        assert phases == [Phase.INITIALIZING] * 3 + [Phase.ROLLING_BACK]   # 31 - 1 > ready_timeout_s
        checks = s.checks("r1")
        assert [c["source"] for c in checks] == ["correctness"] * 3   # retried every check_interval_s
        assert {c["verdict"]["outcome"] for c in checks} == {"inconclusive"}
        assert {c["decision"] for c in checks} == {"hold"}
        reason = checks[0]["verdict"]["correctness"]["reason"]
        expect = {"not http": "No connection adapters", "nothing listening": "2/2 prompts could not be replayed",
                  "bad prompt set": "must be a non-empty JSON list"}[case]
        assert expect in reason, reason
        assert "no passing correctness verdict within 25 s" in s.get("r1").reason
        assert not any(c[0] == "set_weights" and ("canary", 10) in c[2] for c in deployer.calls)
