"""ActionRunner is an object of its own (issue 25's STYLE item: no mixin reading attributes it never declares): built
from what it uses, it runs a stored outbox without a Worker, under the lease callable it was given."""
import threading

import pytest

from sits.control_plane.adapters.notify import MultiNotifier
from sits.control_plane.rollout import Deploy
from sits.control_plane.service.rollouts import start_rollout
from sits.control_plane.store.db import Store
from sits.control_plane.worker.actions import ActionRunner, LeaseLostError
from sits.control_plane.worker.config import WorkerConfig, WorkerMetrics
from sits.wire.tracing import Tracing
from tests.control_plane.helpers import latency_policy

from .support import InMemoryDeployer


def runner(store, deployer, lease, steps):
    return ActionRunner(store, deployer, MultiNotifier(), tracing=Tracing(), metrics=WorkerMetrics(),
                        config=WorkerConfig(), clock=lambda: 5.0, lease=lease, step=steps.append,
                        abort_pending=lambda rid: False, stopping=threading.Event())


def test_an_action_runner_runs_an_outbox_on_its_own(tmp_path):
    with Store(str(tmp_path / "s.db")) as s:
        r = start_rollout(s, "chat", "triton-v1", "torch", latency_policy(), now=0.0, rollout_id="r1")
        r = s.save(r, [Deploy("canary", "triton-v1")])
        d, steps, leased = InMemoryDeployer(), [], []
        runner(s, d, lambda rid, fresh: leased.append(rid) or True, steps).run(r, s.pending_actions("r1"))
        assert [c[:4] for c in d.calls if c[0] == "deploy"] == [("deploy", "chat", "production", "torch"),
                                                                ("deploy", "chat", "canary", "triton-v1")]
        assert s.pending_actions("r1") == [] and leased == ["r1"] and steps == ["executed:deploy"]
        r = s.save(s.get("r1"), [Deploy("baseline", "torch")])
        with pytest.raises(LeaseLostError):                    # a lease it cannot renew: nothing runs
            runner(s, d, lambda rid, fresh: False, []).run(r, s.pending_actions("r1"))
        assert len(s.pending_actions("r1")) == 1
