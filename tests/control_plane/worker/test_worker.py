"""The worker loop with the real store and reconcile, an in-memory deployer and a deterministic metrics source:
crash safety between every two steps, commands, failed actions, concurrency, exported latency."""
import threading

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sits.control_plane.rollout import Command, Phase, weights_for
from sits.control_plane.store.db import Store
from sits.control_plane.service.rollouts import start_rollout
from sits.control_plane.adapters.deploy.spec import DeploySpec
from tests.control_plane.helpers import latency_policy as Policy   # in-memory deployer: no engines, no gate
from sits.control_plane.worker.loop import Worker
from sits.control_plane.worker.config import WorkerConfig
from tests.waiting import wait_for

from .support import CannedSource, InMemoryDeployer

POLICY = Policy(steps=(10, 50, 100), check_interval_s=10, warmup_s=5)
SPEC = DeploySpec(canary_args=("--seed", "7"))


class Crash(BaseException):
    """A simulated kill: nothing in memory survives, only the SQLite file and the (external) deployer."""


class Recorder:
    def __init__(self):
        self.events = []

    def notify(self, n):
        self.events.append((n.event, n.service))

    def flush(self, timeout=10.0):
        return True

    def close(self, timeout=5.0):
        pass


def drive(db, scale, crash_at=None, max_ticks=200, make_notifier=None):
    """Tick every 5 s until the rollout ends. With crash_at, every pass crashes once at that step (a fresh worker,
    store and notifier queue then redo the pass at the same time, as a supervisor restarting the process would).
    make_notifier(store): a fresh notifier for every pass (stopped after it, as a killed process's would be) instead of
    the one recorder."""
    deployer, source, notes = InMemoryDeployer(), CannedSource(scale={"chat": scale}), Recorder()
    with Store(db) as s:
        start_rollout(s, "chat", "triton-v1", "torch", POLICY, SPEC, now=0.0, rollout_id="r1")
    t, crashed = 0.0, set()

    def hook(step):
        if crash_at is not None and any(step.startswith(c) for c in crash_at) and (t, step) not in crashed:
            crashed.add((t, step))
            raise Crash(step)

    for _ in range(max_ticks):
        t += 5.0
        while True:
            store = Store(db)
            notifier = make_notifier(store) if make_notifier else notes
            # a restarted worker process keeps its identity (e.g. a StatefulSet pod name): the lease is its own
            w = Worker(store, deployer, source, notifier, clock=lambda: t, owner="worker-0")
            w.step_hook = hook
            try:
                r = w.reconcile_rollout("r1")
                break
            except Crash:
                continue
            finally:
                if make_notifier:
                    notifier.close(timeout=0)
                    notifier._thread.join(10)
                store.close()
        if not r.active:
            with Store(db) as s:
                if not s.pending_actions("r1"):
                    break
    with Store(db) as s:
        r = s.get("r1")
        checks = [(c["seq"], c["at"], c["step"], c["weight"], c["verdict"]["outcome"], c["decision"],
                   c["window_start"], c["window_end"], c["variants"]["canary"]["requests"]) for c in s.checks("r1")]
        actions = s.actions("r1")
    # deploys of one pass run in parallel (any order) and a redone idempotent call repeats: compare the set of
    # deploys and the order of every other call with back-to-back repeats collapsed
    dedup = lambda xs: [x for i, x in enumerate(xs) if i == 0 or xs[i - 1] != x]   # noqa: E731
    calls = (sorted(set(c for c in deployer.calls if c[0] == "deploy")),
             dedup([c for c in deployer.calls if c[0] != "deploy"]))
    return r, checks, actions, calls, dedup(notes.events), deployer.services, len(crashed)


# "recover" (finishing the outbox of a crashed pass) only happens after a crash after "saved"
STEPS = [("saved", "recover"), "loaded", "observed", "reconciled", "saved", "executed:deploy", "executed:set_weights",
         "executed:notify", "executed:promote", "executed:rollback"]


@pytest.mark.parametrize("scale,final,last_call", [(1.0, Phase.SUCCEEDED, ("promote", "chat")),
                                                   (1.6, Phase.ROLLED_BACK, ("rollback", "chat"))])
def test_crash_between_any_two_steps_converges_with_no_check_lost_or_repeated(tmp_path, scale, final, last_call):
    ref = drive(str(tmp_path / "ref.db"), scale)
    r, checks, actions, calls, notes, services, _ = ref
    assert r.phase is final and calls[1][-1] == last_call
    assert [c[0] for c in checks] == list(range(1, r.checks + 1)) and len(checks) >= 2
    assert all(a["status"] == "done" for a in actions)
    # the variants ran with the rollout's DeploySpec: baseline = production's args, canary its own
    assert calls[0] == [("deploy", "chat", "baseline", "torch", ()),
                        ("deploy", "chat", "canary", "triton-v1", ("--seed", "7")),
                        ("deploy", "chat", "production", "torch", ())]
    assert [e for e, _ in notes][:2] == ["started", "step"]
    with Store(str(tmp_path / "ref.db")) as s:   # warm-up windows after each weight change are not analysed
        steps = [e["at"] for e in s.events("r1") if e["message"].startswith("step ")]
        excluded = s.get("r1").excluded_requests
    for c in checks:
        assert c[6] >= steps[c[2]] + POLICY.warmup_s
    assert excluded > 0                           # the last step dropped its warm-up window
    assert notes[-1][0] == ("promoted" if final is Phase.SUCCEEDED else "rolled_back")
    hit = set()
    for step in STEPS:
        steps = (step,) if isinstance(step, str) else step
        got = drive(str(tmp_path / f"{'-'.join(steps).replace(':', '_')}.db"), scale, crash_at=steps)
        if got[6]:
            hit.update(steps)
        # same checks (seq, time, step, weight, outcome, decision, window, data), same final phase and deployer
        # state, same deployer calls and notifications (a redone idempotent call repeats back to back at most)
        assert got[0].phase is final, step
        assert got[1] == checks, step
        assert all(a["status"] == "done" for a in got[2]), step
        assert got[3] == calls and got[4] == notes and got[5] == services, step
    assert hit >= {"loaded", "observed", "reconciled", "saved", "recover", "executed:deploy", "executed:notify",
                   "executed:set_weights", last_call[0] == "promote" and "executed:promote" or "executed:rollback"}


def test_journaled_webhook_sends_every_notification_once_across_crashes(tmp_path):
    # the worker's webhook queue is in the store's file and keyed by outbox action: a crash after a Notify action ran
    # but before it was marked done replays it, and the receiver still gets each notification exactly once
    from sits.control_plane.adapters.notify import WebhookConfig, WebhookNotifier

    from .test_notify import Receiver
    ref = drive(str(tmp_path / "ref.db"), 1.6)
    want = [e for e, _ in ref[4]]
    rx = Receiver()
    try:
        for steps in (("executed:notify",), ("saved", "executed:notify")):
            db = str(tmp_path / f"{'-'.join(steps).replace(':', '_')}.db")
            rx.bodies.clear()
            got = drive(db, 1.6, crash_at=steps, make_notifier=lambda store: WebhookNotifier(
                WebhookConfig(rx.url, retries=2, backoff_s=0.01), journal=store.deliveries))
            assert got[6] > 0 and got[0].phase is Phase.ROLLED_BACK
            with Store(db) as store:
                last = WebhookNotifier(WebhookConfig(rx.url), journal=store.deliveries)
                assert last.flush(10)
                last.close()
            assert [b["event"] for b in rx.bodies] == want, steps
            assert len({b["key"] for b in rx.bodies}) == len(want)
    finally:
        rx.close()


def test_commands_are_inputs_and_survive_a_crash_before_consumption(tmp_path):
    db = str(tmp_path / "c.db")
    deployer, source = InMemoryDeployer(), CannedSource()
    t = 0.0
    with Store(db) as s:
        start_rollout(s, "chat", "triton-v1", "torch", Policy(steps=(10, 100), check_interval_s=10, warmup_s=0),
                      now=0.0, rollout_id="r1")

    def tick(hook=None):
        with Store(db) as s:
            w = Worker(s, deployer, source, clock=lambda: t, owner="worker-0")
            w.step_hook = hook
            return w.reconcile_rollout("r1").phase

    for _ in range(2):
        t += 1
        tick()
    queue = Store(db)
    queue.commands.add("r1", Command.PAUSE, "alice")
    t += 1

    def crash_after_save(step):
        if step == "saved":
            raise Crash(step)
    with pytest.raises(Crash):
        tick(crash_after_save)
    assert tick() is Phase.PAUSED                       # recovered the outbox (notify "paused")
    t += 1
    assert tick() is Phase.PAUSED                       # the replayed PAUSE is ignored, then consumed
    assert queue.commands.next("r1") is None
    queue.commands.add("r1", "promote", "bob")
    t += 1
    assert tick() is Phase.PROMOTING
    t += 1
    assert tick() is Phase.SUCCEEDED
    with Store(db) as s:
        events = s.events("r1")
    msgs = [e["message"] for e in events]
    assert any("paused by alice" in m for m in msgs) and any("ignored in phase paused" in m for m in msgs)
    assert any("promoted manually by bob" in m for m in msgs)
    # events carry the command's actor; the worker's own decisions none
    assert {e["actor"] for e in events if "by alice" in e["message"]} == {"alice"}
    assert {e["actor"] for e in events if "by bob" in e["message"]} == {"bob"}
    assert {e["actor"] for e in events if e["kind"] == "phase" and "step" in e["message"]} == {""}
    assert ("promote", "chat") in deployer.calls
    queue.close()


def test_failed_deploy_is_reported_and_rolls_back(tmp_path):
    db = str(tmp_path / "f.db")
    deployer, t = InMemoryDeployer(), [0.0]
    deployer.fail.add(("chat", "canary"))
    with Store(db) as s:
        start_rollout(s, "chat", "triton-v1", "torch", POLICY, now=0.0, rollout_id="r1")
        w = Worker(s, deployer, CannedSource(), config=WorkerConfig(action_retries=1, action_backoff_s=0.01),
                   clock=lambda: t[0])
        phases = []
        for _ in range(4):
            t[0] += 1
            phases.append(w.reconcile_rollout("r1").phase)
        failed = [a for a in s.actions("r1") if a["status"] == "failed"]
        assert phases == [Phase.INITIALIZING, Phase.ROLLING_BACK, Phase.ROLLED_BACK, Phase.ROLLED_BACK]
        assert [a["kind"] for a in failed] == ["deploy"] and "image pull failed" in failed[0]["error"]
        why = "deploy failed: DeployError: chat/canary: image pull failed (simulated)"
        assert s.get("r1").reason == f"production torch restored ({why})"   # ROLLED_BACK's, naming the cause
        rolling_back = [e for e in s.events("r1") if e["message"].startswith("initializing -> rolling_back")]
        assert [e["message"] for e in rolling_back] == [f"initializing -> rolling_back: {why}"]
        assert len([a for a in deployer.deploy_calls if a.role == "canary"]) == 2   # a plain DeployError is retried
        assert deployer.calls[-1] == ("rollback", "chat")


@pytest.mark.parametrize("spec_timeout", [None, 42.0])
def test_variant_not_ready_within_the_deadline_rolls_back_at_once_saying_why(tmp_path, spec_timeout):
    """The deploy gets the spec's readiness deadline, else the policy's; a NotReadyError is not retried (it had the
    whole deadline) and the rollout rolls back naming the wait and the engine's last log line."""
    deployer, t = InMemoryDeployer(), [0.0]
    deployer.not_ready[("chat", "canary")] = "autotuning paged_decode_attention 3/5"
    policy = Policy(steps=(10, 50, 100), check_interval_s=10, warmup_s=5, ready_timeout_s=77.0)
    with Store(str(tmp_path / "n.db")) as s:
        start_rollout(s, "chat", "triton-v1", "torch", policy, DeploySpec(ready_timeout_s=spec_timeout), now=0.0,
                      rollout_id="r1")
        w = Worker(s, deployer, CannedSource(), config=WorkerConfig(action_retries=3, action_backoff_s=0.01),
                   clock=lambda: t[0])
        phases = []
        for _ in range(3):
            t[0] += 1
            phases.append(w.reconcile_rollout("r1").phase)
        want = spec_timeout or 77.0
        assert phases == [Phase.INITIALIZING, Phase.ROLLING_BACK, Phase.ROLLED_BACK]
        assert {a.role: a.ready_timeout_s for a in deployer.deploy_calls} == {"production": want, "baseline": want,
                                                                          "canary": want}
        assert [a.role for a in deployer.deploy_calls].count("canary") == 1   # not retried
        reason = s.get("r1").reason
        assert f"engine not ready after {want:g} s" in reason and "autotuning paged_decode_attention 3/5" in reason
        assert reason.startswith("production torch restored (deploy failed: NotReadyError: chat/canary:")
        assert "log (simulated)" not in reason   # the first line of the error only


def test_a_variant_not_ready_by_the_policy_deadline_rolls_back_in_the_deployers_words(tmp_path):
    """deploy() returned but the baseline is not ready (as a Kubernetes deploy returns before its pods are): once the
    policy's ready_timeout_s has passed, the rollback reason repeats the deployer's status message for it."""
    deployer, t = InMemoryDeployer(), [0.0]
    policy = Policy(steps=(10, 50, 100), check_interval_s=10, warmup_s=5, ready_timeout_s=20.0)
    with Store(str(tmp_path / "t.db")) as s:
        start_rollout(s, "chat", "triton-v1", "torch", policy, now=0.0, rollout_id="r1")
        w = Worker(s, deployer, CannedSource(), clock=lambda: t[0])
        t[0] += 1
        w.reconcile_rollout("r1")                          # deploys baseline + canary
        deployer.crash("chat", "baseline")                 # the guard watches the canary only: this waits
        phases = []
        for _ in range(3):
            t[0] += 10
            phases.append(w.reconcile_rollout("r1").phase)
        assert phases == [Phase.INITIALIZING] * 2 + [Phase.ROLLING_BACK]   # 31 - 1 > 20
        why = "not ready after 20 s: baseline: 0/1 ready; replica 0 exited with code 1"
        assert [e["message"] for e in s.events("r1") if "-> rolling_back" in e["message"]] == \
            [f"initializing -> rolling_back: {why}"]


def test_slow_deployer_or_metrics_source_blocks_no_other_rollout(tmp_path):
    """Three services at once: one whose deployer hangs, one whose metrics source takes 1.5 s per window, one
    healthy. The healthy one is promoted while the hung one still waits; then the others finish too."""
    db = str(tmp_path / "m.db")
    deployer = InMemoryDeployer()
    deployer.gates["stuck"] = threading.Event()
    source = CannedSource(rate=20000, delay={"slowmetrics": 1.5})
    fast = Policy(steps=(50, 100), check_interval_s=0.2, warmup_s=0.0)
    store = Store(db)
    for svc in ("stuck", "slowmetrics", "fast"):
        start_rollout(store, svc, "triton-v1", "torch", fast, rollout_id=svc)
    w = Worker(store, deployer, source, config=WorkerConfig(interval_s=0.05, join_timeout_s=5)).start()
    try:
        wait_for("the fast rollout to succeed", lambda: store.get("fast").phase is Phase.SUCCEEDED, timeout=30)
        assert store.get("stuck").phase is Phase.INITIALIZING          # its deploy is still hanging
        deployer.gates["stuck"].set()
        wait_for("stuck and slowmetrics to end", lambda: not any(store.get(s).active for s in ("stuck", "slowmetrics")),
                 timeout=30)
        assert store.get("stuck").phase is Phase.SUCCEEDED and store.get("slowmetrics").phase is Phase.SUCCEEDED
    finally:
        deployer.gates["stuck"].set()
        w.stop()
    # reconcile latency is exported per service and stage
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(w.metrics.registry).decode())}
    counts = {(s.labels["service"], s.labels["stage"]): s.value for s in fams["sits_control_reconcile_seconds"].samples
              if s.name.endswith("_count")}
    assert counts[("fast", "reconcile")] >= 3 and counts[("slowmetrics", "observe")] >= 1
    sums = {(s.labels["service"], s.labels["stage"]): s.value for s in fams["sits_control_reconcile_seconds"].samples
            if s.name.endswith("_sum")}
    assert sums[("slowmetrics", "observe")] >= 1.5 > sums[("fast", "observe")]
    store.close()


def test_variants_lost_with_a_previous_worker_are_deployed_again(tmp_path):
    """Local variants die with the worker process: its restart finds production, baseline and canary gone and deploys
    them again as they were (same kernels, the current step's weights; an event says so, stored first), so the
    rollout carries on instead of being rolled back onto a production that no longer runs."""
    db = str(tmp_path / "l.db")
    deployer, t = InMemoryDeployer(), [0.0]
    with Store(db) as s:
        start_rollout(s, "chat", "triton-v1", "torch", POLICY, now=0.0, rollout_id="r1")
        w = Worker(s, deployer, CannedSource(), clock=lambda: t[0])
        for _ in range(2):
            t[0] += 5
            w.reconcile_rollout("r1")
        before = s.get("r1")
        assert before.phase is Phase.PROGRESSING and before.weight > 0
        deployer.services.clear()                         # the previous worker's processes are gone
        w2 = Worker(s, deployer, CannedSource(), clock=lambda: t[0], owner=w.owner)   # its restart
        t[0] += 5
        after = w2.reconcile_rollout("r1")
        assert after.phase is Phase.PROGRESSING and after.weight == before.weight
        assert after.warmup_until == t[0] + POLICY.warmup_s
        assert {r: v.kernels for r, v in deployer.services["chat"]["variants"].items()} == \
            {"production": "torch", "baseline": "torch", "canary": "triton-v1"}
        assert deployer.weights("chat") == weights_for(before.weight)
        assert any(e["message"].startswith("restart: production, baseline, canary not deployed")
                   for e in s.events("r1"))
        n = len(deployer.calls)
        t[0] += 5
        w2.reconcile_rollout("r1")                        # restored once per worker: no second round of deploys
        assert not [c for c in deployer.calls[n:] if c[0] == "deploy"]
        assert all(a["status"] == "done" for a in s.actions("r1"))


def test_a_crashing_canary_is_rolled_back_from_the_deployer_status(tmp_path):
    """The deployer says the canary crashes (VariantStatus.crashing; not the message text): the guard rolls back at
    once, during start-up and while progressing."""
    for crash_in in (Phase.INITIALIZING, Phase.PROGRESSING):
        deployer, t = InMemoryDeployer(), [0.0]
        with Store(str(tmp_path / f"{crash_in.value}.db")) as s:
            start_rollout(s, "chat", "triton-v1", "torch", POLICY, now=0.0, rollout_id="r1")
            w = Worker(s, deployer, CannedSource(), clock=lambda: t[0])
            t[0] += 1
            w.reconcile_rollout("r1")                          # deploys baseline + canary
            if crash_in is Phase.PROGRESSING:
                t[0] += 1
                assert w.reconcile_rollout("r1").phase is Phase.PROGRESSING
            deployer.crash("chat", "canary")
            t[0] += 1
            r = w.reconcile_rollout("r1")
            assert r.phase is Phase.ROLLING_BACK, crash_in
            assert r.reason == ("canary is crashing during start-up" if crash_in is Phase.INITIALIZING
                                else "guard: canary is crashing (restarts or exited)")
