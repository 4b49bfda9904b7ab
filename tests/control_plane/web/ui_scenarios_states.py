"""More rollouts for the browser tests of rollout states (test_browser_rollout_states.py, issue 40), on top of
ui_scenarios.build and in the same store, driven by the real worker and state machine (in-memory deployer, canned
metrics, frozen clock):

- ads: every step passed, then the deployer's promote failed for good: FAILED, canary and baseline still routed;
- llm: the canary never got ready (its engine reported an unknown model), the error with 30 lines of engine log
  and a log file's path, as the local deployer writes it;
- wrong: a correctness gate that FAILED before traffic (a wrong canary), rolled back;
- queue: pending (no worker picks it up here), no checks;
- hold: progressing, then paused by otto;
- fresh: production deployed before its first rollout (as the demo does), the rollout then run by the worker;
- kv: an engine-flag release (triton-v1.5 with --kv-cache-dtype fp8 on the canary) promoted.
"""
from __future__ import annotations

from sits.control_plane.adapters.deploy import DeployError, NotReadyError, VariantSpec
from sits.control_plane.adapters.deploy.spec import DeploySpec
from sits.control_plane.analysis import CorrectnessVerdict, Outcome
from sits.control_plane.rollout import Command, Observation, Phase, reconcile
from sits.control_plane.service.rollouts import send_command, start_rollout
from sits.control_plane.worker.loop import Worker

from tests.control_plane.test_rollout import window
from tests.control_plane.worker.support import CannedSource, InMemoryDeployer

from . import ui_scenarios
from .conftest import GATED_POLICY
from .ui_scenarios import POLICY

ACCESS = '127.0.0.1:{port} - "GET /readyz HTTP/1.1" 503'
CAUSE = "ValueError: unknown model 'llama3-70b': not a preset (tiny, llama3-8b) and no such path"
LOG_PATH = "/var/lib/sits/variants/llm/canary-0.log"
WRONG = CorrectnessVerdict(Outcome.FAIL, "14 of 32 prompts diverged (56 % identical < 95 %)", prompts=32,
                           identical_fraction=0.56, top1_agreement=0.9, drift_mean=0.2, drift_max=3.1,
                           failed=("identical_fraction",), dtype="float32", evidence=(), diverged=14, tokens=1024,
                           requests=64, seconds=1.5)


class FailingPromote(InMemoryDeployer):
    """promote() fails for good (after the worker's retries): the variants stay deployed and routed."""

    def promote(self, service) -> None:
        raise DeployError(f"service {service}: router refused the new table (simulated)")


class UnknownModel(InMemoryDeployer):
    """The canary's engine never gets ready: the NotReadyError the local deployer raises for an engine that failed
    to load (adapters/deploy/local/replicas.py): what its /readyz reported on the first line, its log tail after it."""

    def deploy(self, spec: VariantSpec, interrupted=None) -> None:
        if spec.service == "llm" and spec.role == "canary":
            tail = "\n".join(ACCESS.format(port=40000 + i) for i in range(30))
            raise NotReadyError(f"llm/canary: engine not ready after 60 s: it reports {CAUSE}\nits last log line: "
                                f"{ACCESS.format(port=40029)}\nlog {LOG_PATH}:\n{tail}", waited_s=60.0,
                                last_line=ACCESS.format(port=40029))
        super().deploy(spec)


def _drive(store, rid, deployer, source, t, passes, dt=5.0, until=None) -> float:
    """Worker passes over this one rollout (the others in the store stay as ui_scenarios left them)."""
    now = [t]
    w = Worker(store, deployer, source, clock=lambda: now[0], owner="test-worker")
    for _ in range(passes):
        now[0] += dt
        w.reconcile_rollout(rid)
        if until is not None and until(store.get(rid)):
            break
    return now[0]


def build(path: str):
    sc = ui_scenarios.build(path)
    store, t = sc.store, sc.clock

    def start(service, canary, production, at, policy=POLICY):
        return start_rollout(store, service, canary, production, policy, DeploySpec(), now=at, actor="otto").id

    ended = lambda r: not r.active   # noqa: E731
    sc.failed_promote = start("ads", "triton-v1.1", "triton-v1", t + 10)
    t = _drive(store, sc.failed_promote, FailingPromote(), CannedSource(rate=20.0), t + 10, 200, until=ended)

    sc.unknown_model = start("llm", "triton-v1.1", "triton-v1", t + 10)
    t = _drive(store, sc.unknown_model, UnknownModel(), CannedSource(rate=20.0), t + 10, 20, until=ended)

    r = start_rollout(store, "wrong", "torch-wrong-rope", "torch", GATED_POLICY, now=t + 10, actor="otto")
    r = store.save(*reconcile(r, Observation(0.0, 10.0, {}, source="scrape"), t + 20))
    r = store.save(*reconcile(r, Observation(10.0, 20.0, window(), source="scrape", correctness=WRONG), t + 30))
    r = store.save(*reconcile(r, Observation(), t + 31))
    sc.gate_failed = r.id

    sc.paused = start("hold", "triton-v1.1", "triton-v1", t + 50)
    deployer = InMemoryDeployer()
    t = _drive(store, sc.paused, deployer, CannedSource(rate=20.0), t + 50, 6)
    send_command(store, sc.paused, Command.PAUSE, "otto")
    t = _drive(store, sc.paused, deployer, CannedSource(rate=20.0), t, 1)

    deployer = InMemoryDeployer()
    deployer.deploy(VariantSpec(service="fresh", role="production", kernels="triton-v1"))   # as the demo does
    sc.fresh = start("fresh", "triton-v1.1", "triton-v1", t + 10)
    t = _drive(store, sc.fresh, deployer, CannedSource(rate=20.0), t + 10, 3)

    # an engine-flag release promoted: production now runs triton-v1.5 with an FP8 KV cache
    sc.flag_release = start_rollout(store, "kv", "triton-v1.5", "triton-v1.5", POLICY,
                                    DeploySpec(canary_args=("--kv-cache-dtype", "fp8")), now=t + 10, actor="otto").id
    t = _drive(store, sc.flag_release, InMemoryDeployer(), CannedSource(rate=20.0), t + 10, 200, until=ended)

    sc.pending = start("queue", "triton-v1.1", "triton-v1", t + 10)   # last: no worker pass picks it up
    sc.clock = t + 10
    for rid, phase in ((sc.failed_promote, Phase.FAILED), (sc.unknown_model, Phase.ROLLED_BACK),
                       (sc.gate_failed, Phase.ROLLED_BACK), (sc.pending, Phase.PENDING), (sc.paused, Phase.PAUSED),
                       (sc.fresh, Phase.PROGRESSING), (sc.running, Phase.PROGRESSING),
                       (sc.flag_release, Phase.SUCCEEDED)):
        got = store.get(rid)
        assert got.phase is phase, (rid, got.phase, got.reason)
    return sc
