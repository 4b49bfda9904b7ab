"""One Deployer contract, the same scenarios against the in-memory deployer the worker tests use and the real
LocalDeployer (engine processes behind the router): deploy, weights, crashing, promote, rollback, close, and the
engines each lists (replicas()). The tests
run in order on one deployer per implementation (starting engines is the slow part)."""
import os
import signal

import pytest

from sits.control_plane.adapters.deploy import Deployer, DeployError, DeployNotFoundError, VariantSpec
from sits.control_plane.adapters.deploy.local.config import LocalConfig
from sits.control_plane.adapters.deploy.local.deployer import LocalDeployer
from tests.control_plane.worker.support import InMemoryDeployer

SVC = "contract"
CANARY_ARGS = ("--seed", "7")


class Local:
    """LocalDeployer and how a test reaches into it: the router's weights, and a replica that dies (SIGKILL, as
    the OOM killer would) -- a real engine process exiting."""

    def __init__(self, workdir):
        self.d = LocalDeployer(LocalConfig(workdir=str(workdir), cpu_threads=1, ready_timeout_s=240))

    def weights(self):
        return self.d._services[SVC].router.weights()

    def production_args(self):
        return self.d._services[SVC].variants["production"].spec.args

    def crash(self, role):
        proc = self.d._services[SVC].variants[role].replicas[0].proc
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)


class Memory:
    def __init__(self, workdir):
        self.d = InMemoryDeployer()

    def weights(self):
        return self.d.weights(SVC)

    def production_args(self):
        return self.d.services[SVC]["variants"]["production"].args

    def crash(self, role):
        self.d.crash(SVC, role)


@pytest.fixture(scope="module", params=[Memory, Local], ids=["memory", "local"])
def impl(request, tmp_path_factory):
    x = request.param(tmp_path_factory.mktemp("contract"))
    yield x
    x.d.close()


def spec(role, kernels="torch", args=()):
    return VariantSpec(service=SVC, role=role, kernels=kernels, args=args)


def test_deploy(impl):
    d = impl.d
    assert isinstance(d, Deployer) and d.status(SVC) == {}
    d.deploy(spec("production"))
    d.deploy(spec("baseline"))
    d.deploy(spec("canary", args=CANARY_ARGS))
    d.deploy(spec("canary", args=CANARY_ARGS))                   # idempotent
    st = d.status(SVC)
    assert set(st) == {"production", "baseline", "canary"}
    assert all(s.ready and not s.crashing and s.ready_replicas == 1 and s.endpoints for s in st.values()), st
    assert impl.weights() == {"production": 100, "baseline": 0, "canary": 0}   # a first production takes all
    assert d.router_url(SVC)
    reps = d.replicas(SVC)   # every engine, in role order, with readiness, restarts, state and a last log line
    assert [(r.role, r.name, r.ready, r.restarts, r.state) for r in reps] == [
        (role, f"{role}-0", True, 0, "running") for role in ("production", "baseline", "canary")]
    assert all(r.last_log_line and "\n" not in r.last_log_line and len(r.last_log_line) <= 200 for r in reps)
    assert d.replicas("nothing-here") == []


def test_weights(impl):
    d = impl.d
    d.set_weights(SVC, {"production": 80, "baseline": 10, "canary": 10})
    assert impl.weights() == {"production": 80, "baseline": 10, "canary": 10}
    with pytest.raises(DeployError, match="sum to 100"):
        d.set_weights(SVC, {"production": 50})
    with pytest.raises(DeployNotFoundError):
        d.set_weights("nothing-here", {"production": 100})
    assert impl.weights() == {"production": 80, "baseline": 10, "canary": 10}   # a refused split changes nothing


def test_crashing(impl):
    d = impl.d
    impl.crash("canary")
    st = d.status(SVC)
    assert not st["canary"].ready and st["canary"].crashing and st["canary"].ready_replicas == 0
    assert st["production"].ready and not st["production"].crashing and not st["baseline"].crashing
    assert d.status(SVC)["canary"].crashing                    # nothing restarted it behind our back
    canary = d.replicas(SVC)[-1]
    assert canary.role == "canary" and not canary.ready and canary.state.startswith("exited ") and canary.restarts == 0
    d.deploy(spec("canary", args=CANARY_ARGS))                 # an explicit deploy converges again
    st = d.status(SVC)["canary"]
    assert st.ready and not st.crashing


def test_promote(impl):
    d = impl.d
    d.promote(SVC)
    st = d.status(SVC)
    assert set(st) == {"production"} and st["production"].ready
    assert impl.weights() == {"production": 100, "baseline": 0, "canary": 0}
    assert impl.production_args() == CANARY_ARGS               # production now runs the canary's spec
    d.promote(SVC)                                             # idempotent
    assert set(d.status(SVC)) == {"production"}


def test_rollback(impl):
    d = impl.d
    d.deploy(spec("canary", kernels="torch", args=("--seed", "8")))
    d.set_weights(SVC, {"production": 90, "canary": 10})
    d.rollback(SVC)
    assert set(d.status(SVC)) == {"production"} and impl.weights()["production"] == 100
    d.rollback(SVC)                                            # idempotent
    assert set(d.status(SVC)) == {"production"}
    assert [r.role for r in d.replicas(SVC)] == ["production"]


def test_close(impl):
    d = impl.d
    d.close()
    assert d.status(SVC) == {}
    assert d.replicas(SVC) == []
    d.close()                                                  # twice is fine
