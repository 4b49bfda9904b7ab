"""A store written before issue 26 (prompt sets as file paths, any engine flag in args) still loads: every listing
and pass works, a path is turned into a set name and never read, fault flags keep the canary as it was started
(canary_faults) and every other refused flag is dropped before any engine sees it."""
import json
import sqlite3

import pytest

from sits.control_plane.adapters.deploy.spec import DeploySpec
from sits.control_plane.analysis.prompts import stored_prompt_set
from sits.control_plane.service.rollouts import start_rollout
from sits.control_plane.store.db import Store


@pytest.mark.parametrize("old,new", [("/etc/sits/config/prompts-smoke.json", "smoke"), ("/etc/passwd", "passwd"),
                                     ("../../etc/shadow", "shadow"), ("/dev/zero", "zero"), ("/x/my set.json", "my-set"),
                                     ("/", "legacy-path"), ("default", "default"), ("smoke", "smoke")])
def test_stored_paths_become_names(old, new):
    assert stored_prompt_set(old) == new


def test_an_old_store_loads_with_names_and_allowed_flags(tmp_path):
    path = str(tmp_path / "old.db")
    with Store(path) as s:
        start_rollout(s, "chat", "torch", "torch", None, None, rollout_id="r1", now=0.0)
    db = sqlite3.connect(path)
    state = json.loads(db.execute("SELECT state FROM rollouts").fetchone()[0])
    state["policy"]["correctness"]["prompt_set"] = "/etc/sits/config/prompts-smoke.json"
    db.execute("UPDATE rollouts SET state = ?", (json.dumps(state),))
    db.execute("UPDATE rollout_specs SET body = ?", (json.dumps(
        {"model": "tiny", "canary_args": ["--seed", "7", "--fault-latency-ms", "50", "--host", "0.0.0.0"],
         "production_args": ["--fault-error-rate", "0.5", "--otlp-endpoint=http://x"]}),))
    db.commit()
    db.close()
    with Store(path) as s:
        assert [r.id for r in s.list()] == ["r1"]
        assert s.get("r1").policy.correctness.prompt_set == "smoke"
        assert s.spec("r1") == DeploySpec(canary_args=("--seed", "7"), canary_faults=("--fault-latency-ms", "50"))
