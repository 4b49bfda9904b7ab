"""Issue 26 rows 2 and 3: a long pass keeps its lease (a second worker on the same store stays out) and an abort
applies during long steps: the correctness replay stops between prompts, a failing deploy is not retried, a restart
does not restore variants first. Two real Workers on one store file; an injected clock; no sleeps."""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sits.control_plane.adapters.deploy import NotReadyError
from sits.control_plane.analysis import Policy
from sits.control_plane.rollout import Phase
from sits.control_plane.service.rollouts import send_command, start_rollout
from sits.control_plane.store.db import Store
from sits.control_plane.worker.config import WorkerConfig
from sits.control_plane.worker.loop import Worker
from tests.control_plane.helpers import latency_policy

from .support import CannedSource, FixedEndpointDeployer, InMemoryDeployer

POLICY = latency_policy(steps=(50, 100), check_interval_s=10, warmup_s=0)


class Hung(InMemoryDeployer):
    """Deploys signal `entered`, then wait for `release` (a deploy that takes as long as the test wants)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.release = threading.Event(), threading.Event()

    def deploy(self, spec, interrupted=None):
        self.entered.set()
        assert self.release.wait(60)
        super().deploy(spec)


class Shared:
    """Another worker's view of the same deployer (its calls go to `inner`, never blocked)."""

    def __init__(self, inner, calls):
        self.inner, self.calls = inner, calls

    def __getattr__(self, name):
        fn = getattr(InMemoryDeployer, name)
        if name not in ("status", "router_url"):
            self.calls.append(name)
        return lambda *a, **kw: fn(self.inner, *a, **kw)


def test_a_long_pass_keeps_its_lease_and_a_second_worker_stays_out(tmp_path):
    db, t, w2_calls = str(tmp_path / "l.db"), [0.0], []
    deployer = Hung()
    cfg = WorkerConfig(interval_s=5, lease_ttl_s=30, max_pass_s=100)
    with Store(db) as s1, Store(db) as s2:
        start_rollout(s1, "chat", "triton-v1", "torch", POLICY, now=0.0, rollout_id="r1")
        w1 = Worker(s1, deployer, CannedSource(), config=cfg, clock=lambda: t[0], owner="w1")
        w2 = Worker(s2, Shared(deployer, w2_calls), CannedSource(), config=cfg, clock=lambda: t[0], owner="w2")
        [pass1] = w1.tick()
        assert deployer.entered.wait(30)                      # w1's first pass is inside its deploys, and stays
        for _ in range(6):                                     # 60 s of the clock: twice the lease
            t[0] += 10
            assert w1.tick() == []                             # still busy: no second pass, the lease renewed
            assert w2.tick() == [], s2.leases.get("r1")
            assert s2.leases.get("r1") == ("w1", t[0] + 30)
        assert w2_calls == []
        # past max_pass_s the hung pass is given up: not renewed, and w2 takes over once the lease has expired
        t[0] = 110.0
        assert w1.tick() == [] and s1.leases.get("r1") == ("w1", 90.0)
        [pass2] = w2.tick()
        pass2.join(30)
        assert s2.leases.get("r1")[0] == "w2" and "deploy" in w2_calls
        version = s2.get("r1").version
        deployer.release.set()                                 # w1's hung deploys return; its pass stops there
        pass1.join(30)
        assert not pass1.is_alive() and s1.get("r1").version == version and s2.leases.get("r1")[0] == "w2"


class Engine(BaseHTTPRequestHandler):
    """Answers every completion 500 (a replay that fails fast) and counts them; `on_request(n)` runs first."""
    count = 0
    on_request = staticmethod(lambda n: None)

    def do_POST(self):
        type(self).count += 1
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).on_request(type(self).count)
        body = json.dumps({"error": {"message": "boom"}}).encode()
        self.send_response(500)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass


def test_an_abort_stops_the_correctness_replay_between_prompts_and_applies_in_that_pass(tmp_path):
    db = str(tmp_path / "g.db")
    server = ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    api = Store(db)                                            # the API's connection to the same store
    Engine.count = 0
    Engine.on_request = staticmethod(lambda n: n == 3 and send_command(api, "r1", "abort", "api-user"))
    t = [0.0]
    policy = Policy(steps=(10, 100), check_interval_s=10, warmup_s=0,
                    correctness={"prompt_set": [f"prompt {i}" for i in range(40)], "concurrency": 1,
                                 "request_timeout_s": 5})
    try:
        with Store(db) as s:
            start_rollout(s, "chat", "triton-v1", "torch", policy, now=0.0, rollout_id="r1")
            w = Worker(s, FixedEndpointDeployer(f"http://127.0.0.1:{server.server_port}"), CannedSource(),
                       clock=lambda: t[0])
            t[0] = 1
            assert w.reconcile_rollout("r1").phase is Phase.INITIALIZING      # deployed
            t[0] = 11
            r = w.reconcile_rollout("r1")                                      # ready: the gate's replay
            assert Engine.count == 3                                           # stopped after the 3rd prompt
            assert r.phase in (Phase.ROLLING_BACK, Phase.ROLLED_BACK), r.reason
            assert s.commands.pending("r1") == [] and s.checks("r1") == []     # no verdict of a partial replay
            assert "abort" in " ".join(e["message"] for e in s.events("r1")).lower()
    finally:
        server.shutdown()
        api.close()


def test_a_failing_deploy_is_not_retried_with_an_abort_pending(tmp_path):
    db, t = str(tmp_path / "d.db"), [0.0]
    api = Store(db)

    class FailingCanary(InMemoryDeployer):
        attempts = 0

        def deploy(self, spec, interrupted=None):
            if spec.role == "canary":
                type(self).attempts += 1
                if self.attempts == 1:
                    send_command(api, "r1", "abort", "api-user")       # arrives while the deploy fails
            super().deploy(spec)

    d = FailingCanary()
    d.fail.add(("chat", "canary"))
    try:
        with Store(db) as s:
            start_rollout(s, "chat", "triton-v1", "torch", POLICY, now=0.0, rollout_id="r1")
            w = Worker(s, d, CannedSource(), clock=lambda: t[0],
                       config=WorkerConfig(interval_s=5, action_retries=2, action_backoff_s=0))
            phases = []
            for _ in range(4):
                t[0] += 5
                phases.append(w.reconcile_rollout("r1").phase)
            assert FailingCanary.attempts == 1                         # not 3: the retries gave way to the abort
            failed = [a for a in s.actions("r1") if a["status"] == "failed"]
            assert [a["kind"] for a in failed] == ["deploy"] and "an abort is pending" in failed[0]["error"]
            assert phases[1] in (Phase.ROLLING_BACK, Phase.ROLLED_BACK) and phases[-1] is Phase.ROLLED_BACK
            assert "canary" not in d.status("chat")
    finally:
        api.close()


def test_a_restart_applies_a_pending_abort_before_restoring(tmp_path):
    db, t = str(tmp_path / "r.db"), [0.0]
    with Store(db) as s:
        start_rollout(s, "chat", "triton-v1", "torch", POLICY, now=0.0, rollout_id="r1")
        w1 = Worker(s, InMemoryDeployer(), CannedSource(), clock=lambda: t[0], owner="w1")
        while s.get("r1").phase is not Phase.PROGRESSING:
            t[0] += 5
            w1.reconcile_rollout("r1")
            assert t[0] < 100
        send_command(s, "r1", "abort", "api-user")            # then the control plane is killed: its variants
        t[0] += 30                                             # are gone, and so is its lease after lease_ttl_s
        fresh = InMemoryDeployer()
        fresh.fail.update({("chat", "production"), ("chat", "baseline"), ("chat", "canary")})   # cannot start
        w2 = Worker(s, fresh, CannedSource(), clock=lambda: t[0], owner="w2")
        r = w2.reconcile_rollout("r1")
        assert r.phase in (Phase.ROLLING_BACK, Phase.ROLLED_BACK), r.reason
        assert [c for c in fresh.calls if c[0] == "deploy"] == [] and s.commands.pending("r1") == []


NEVER_READY = r'''
import http.server, socket, sys
fd = int(sys.argv[sys.argv.index("--listen-fd") + 1])
class H(http.server.BaseHTTPRequestHandler):   # loading forever: /readyz 503
    def do_GET(self):
        self.send_response(503); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a):
        pass
print("loading", flush=True)
server = http.server.HTTPServer(("127.0.0.1", 0), H, bind_and_activate=False)
server.socket = socket.socket(fileno=fd)
server.serve_forever()
'''


def test_an_abort_queued_while_a_local_deploy_waits_for_its_engines_applies_within_seconds(tmp_path):
    """The local deployer waits for engines that never get ready (deadline 600 s); an abort queued through another
    connection to the store stops that wait within a few seconds: the deploy actions are superseded (not failed),
    the rollout rolls back as aborted by its sender, and no engine is left running."""
    import sys
    from sits.control_plane.adapters.deploy.local.deployer import LocalDeployer
    from sits.control_plane.adapters.deploy.local.config import LocalConfig
    from tests.waiting import wait_for

    db, t = str(tmp_path / "a.db"), [0.0]
    d = LocalDeployer(LocalConfig(workdir=str(tmp_path / "w"), ready_timeout_s=600.0, stop_timeout_s=5,
                                  engine_command=(sys.executable, "-c", NEVER_READY)))
    api = Store(db)
    try:
        with Store(db) as s:
            start_rollout(s, "chat", "triton-v1", "torch", latency_policy(steps=(50, 100), ready_timeout_s=600.0),
                          now=0.0, rollout_id="r1")
            w = Worker(s, d, CannedSource(), clock=lambda: t[0], config=WorkerConfig(interval_s=5))
            t[0] = 1
            first = threading.Thread(target=w.reconcile_rollout, args=("r1",))
            first.start()                                              # deploys production, then the others
            wait_for("an engine loading", lambda: "loading" in "".join(
                p.read_text() for p in (tmp_path / "w").glob("*.log")))
            send_command(api, "r1", "abort", "api-user")
            first.join(30)
            assert not first.is_alive()                                # not the 600 s deadline
            assert {a["status"] for a in s.actions("r1") if a["kind"] == "deploy"} == {"superseded"}
            assert d.status("chat") == {}                              # the loading engines were stopped
            t[0] = 6
            r = w.reconcile_rollout("r1")
            assert r.phase in (Phase.ROLLING_BACK, Phase.ROLLED_BACK) and r.reason == "aborted by api-user", r.reason
    finally:
        api.close()
        d.close()


def test_a_rollback_with_no_production_that_ever_ran_never_claims_to_restore_it(tmp_path):
    """Production itself never gets ready (its engine cannot load): it is tried once for the whole group of
    deploys, not once per deploy; the rollback has no production to restore, so the rollout fails (needs an
    operator) naming the engine's load error, never "production torch restored"."""
    t = [0.0]

    class NoProduction(InMemoryDeployer):
        def deploy(self, spec, interrupted=None):
            if spec.role == "production":
                self.deploy_calls.append(spec)
                raise NotReadyError("chat/production: engine failed to load: UnknownModelError: unknown model "
                                    "'/models/nope'\nits last log line: loading\nlog x.log:\nloading", waited_s=2.0)
            super().deploy(spec, interrupted)

    d = NoProduction()
    with Store(str(tmp_path / "p.db")) as s:
        start_rollout(s, "chat", "triton-v1", "torch", POLICY, now=0.0, rollout_id="r1")
        w = Worker(s, d, CannedSource(), clock=lambda: t[0], config=WorkerConfig(action_retries=2, action_backoff_s=0))
        for _ in range(4):
            t[0] += 5
            r = w.reconcile_rollout("r1")
        assert [spec.role for spec in d.deploy_calls] == ["production"]
        assert r.phase is Phase.FAILED, r.reason
        assert "restored" not in r.reason and "log x.log" not in r.reason
        assert r.reason.startswith("rollback failed during rolling_back: NoProductionError: service chat: no "
                                   "production to restore: production torch never ran here (deploy, deploy failed: "
                                   "NotReadyError: chat/production: engine failed to load: UnknownModelError: "
                                   "unknown model '/models/nope'"), r.reason


def test_a_rollback_that_finds_production_gone_deploys_it_before_saying_it_is_restored(tmp_path):
    """The variants died with a previous control plane and an abort was pending (no restore first): the rollback
    deploys production again, so the rollout's "production torch restored" is true."""
    t = [0.0]
    with Store(str(tmp_path / "g.db")) as s:
        start_rollout(s, "chat", "triton-v1", "torch", POLICY, now=0.0, rollout_id="r1")
        w1 = Worker(s, InMemoryDeployer(), CannedSource(), clock=lambda: t[0], owner="w1")
        while s.get("r1").phase is not Phase.PROGRESSING:
            t[0] += 5
            w1.reconcile_rollout("r1")
        send_command(s, "r1", "abort", "api-user")
        t[0] += 30
        fresh = InMemoryDeployer()
        w2 = Worker(s, fresh, CannedSource(), clock=lambda: t[0], owner="w2")
        for _ in range(3):
            t[0] += 5
            r = w2.reconcile_rollout("r1")
        assert r.phase is Phase.ROLLED_BACK and r.reason.startswith("production torch restored (aborted by api-user")
        assert "production" in fresh.status("chat") and fresh.services["chat"]["weights"]["production"] == 100
