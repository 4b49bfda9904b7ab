"""Rollouts for the browser tests, built directly in a store by the real worker, state machine and analysis
(in-memory deployer, canned lognormal latencies, frozen clock): no engines, a few hundred milliseconds in all.

- chat: `torch` -> `triton-v1` promoted, then `torch-slow-attn` rolled back by the P90 check (P99 inconclusive);
- embed: aborted by otto at step 1;
- search: the canary's deploy fails (the deployer refuses it), production restored;
- rank: progressing at step 1 (active), a few checks in.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from sits.control_plane.adapters.deploy.spec import DeploySpec
from sits.control_plane.analysis import ERROR_RATE, REQUEST_LATENCY, MetricCheck
from sits.control_plane.rollout import Command, Phase
from sits.control_plane.service.rollouts import send_command, start_rollout
from sits.control_plane.store.db import Store
from sits.control_plane.worker.loop import Worker

from tests.control_plane.helpers import latency_policy
from tests.control_plane.worker.support import CannedSource, InMemoryDeployer

# P99 within +50 %, P90 within +25 % (the demo's), error rate +1 pt; 20 requests/s per variant and a check every
# 10 s: a 1.6x slower canary fails P90 while P99's interval is still too wide to decide
CHECKS = (MetricCheck(REQUEST_LATENCY, quantile=0.99, max_rel_delta=0.5),
          MetricCheck(REQUEST_LATENCY, quantile=0.9, max_rel_delta=0.25),
          MetricCheck(ERROR_RATE, max_abs_delta=0.01))
POLICY = latency_policy(steps=(20, 50, 100), check_interval_s=10, warmup_s=5, checks=CHECKS, min_samples=50)
# the rollouts' frozen clock starts ~7 minutes before the build, so ages read sensibly; the store stamps actions with
# the wall clock (the step timeline's durations come from those, so they are short here)
T0 = float(int(time.time()) - 420)


@dataclass
class Scenario:
    store: Store
    promoted: str
    slow: str
    aborted: str
    deploy_failed: str
    running: str
    clock: float


def _drive(store, rid, deployer, source, t, passes, dt=5.0, until=None) -> float:
    now = [t]
    w = Worker(store, deployer, source, clock=lambda: now[0], owner="test-worker")
    for _ in range(passes):
        now[0] += dt
        w.run_once()
        if until is not None and until(store.get(rid)):
            break
    return now[0]


def build(path: str) -> Scenario:
    store = Store(path)
    deployer = InMemoryDeployer()
    t = T0

    def start(service, canary, production, at, replicas=1):
        return start_rollout(store, service, canary, production, POLICY, DeploySpec(replicas=replicas), now=at,
                             actor="otto").id

    ended = lambda r: not r.active   # noqa: E731
    promoted = start("chat", "triton-v1", "torch", t)
    t = _drive(store, promoted, deployer, CannedSource(rate=20.0), t, 200, until=ended)
    slow = start("chat", "torch-slow-attn", "triton-v1", t + 60)
    t = _drive(store, slow, deployer, CannedSource(rate=20.0, scale={"chat": 1.6}), t + 60, 200, until=ended)

    aborted = start("embed", "torch-slow-attn", "torch", t + 10)
    t2 = _drive(store, aborted, deployer, CannedSource(rate=20.0), t + 10, 4,
                until=lambda r: r.phase is Phase.PROGRESSING and r.checks >= 1)
    send_command(store, aborted, Command.ABORT, "otto")
    t2 = _drive(store, aborted, deployer, CannedSource(rate=20.0), t2, 20, until=ended)

    deployer.fail.add(("search", "canary"))
    deploy_failed = start("search", "triton-v1.1", "triton-v1", t2 + 10, replicas=2)
    t3 = _drive(store, deploy_failed, deployer, CannedSource(rate=20.0), t2 + 10, 20, until=ended)

    running = start("rank", "triton-v1.1", "triton-v1", t3 + 10)
    t4 = _drive(store, running, deployer, CannedSource(rate=20.0), t3 + 10, 6)
    for rid, phase in ((promoted, Phase.SUCCEEDED), (slow, Phase.ROLLED_BACK), (aborted, Phase.ROLLED_BACK),
                       (deploy_failed, Phase.ROLLED_BACK), (running, Phase.PROGRESSING)):
        got = store.get(rid)
        assert got.phase is phase, (rid, got.phase, got.reason)
    return Scenario(store, promoted, slow, aborted, deploy_failed, running, t4)
