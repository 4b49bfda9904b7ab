"""`sits-control rollout retry ID` against a real store (and over the API with --url): a new rollout linked to an
ended one that did not succeed, with its spec and policy; refused, naming why, for an active or promoted one."""
import json

from sits.control_plane.cli.main import main
from sits.control_plane.rollout import Phase
from sits.control_plane.store.db import Store
from sits.control_plane.web import create_app
from sits.control_plane.worker.loop import Worker

from tests.waitress_thread import ThreadedWaitress

from .support import CannedSource, InMemoryDeployer
from .test_cli import POLICY, cli


def _aborted(tmp_path, capsys, db):
    pol = tmp_path / "p.json"
    pol.write_text(json.dumps({**POLICY, "steps": [20, 100], "min_samples": 40}))
    rc, out = cli(capsys, "rollout", "start", "--service", "chat", "--kernels", "triton-v1.1", "--production-kernels",
                  "triton-v1", "--policy", str(pol), "--replicas", "2", "--arg", "--seed 7", "--store", db)
    assert rc == 0
    rid = out.split()[1]
    store, t = Store(db), [0.0]
    w = Worker(store, InMemoryDeployer(), CannedSource(), clock=lambda: t[0])
    for _ in range(2):
        t[0] += 5
        w.reconcile_rollout(rid)
    rc, out = cli(capsys, "rollout", "retry", rid, "--store", db)
    assert rc == 2 and "only an ended rollout can be retried" in out   # still progressing
    assert cli(capsys, "rollout", "abort", rid, "--store", db, "--by", "alice")[0] == 0
    for _ in range(3):
        t[0] += 5
        w.reconcile_rollout(rid)
    assert store.get(rid).phase is Phase.ROLLED_BACK
    return store, rid


def test_retry_from_the_store_repeats_the_spec_and_policy(tmp_path, capsys):
    db = str(tmp_path / "s.db")
    store, old = _aborted(tmp_path, capsys, db)
    rc, out = cli(capsys, "rollout", "retry", old, "--store", db, "--by", "bob")
    assert rc == 0 and f"as a retry of {old} (rolled_back) for service chat" in out, out
    new = store.get(out.split()[1])
    assert new.retry_of == old and new.canary_kernels == "triton-v1.1" and new.production_kernels == "triton-v1"
    assert new.policy == store.get(old).policy and store.spec(new.id) == store.spec(old)
    assert store.events(new.id)[0]["message"] == f"created by bob as a retry of {old}"
    assert store.retries_of(old) == [new.id]
    rc, out = cli(capsys, "rollout", "retry", "no-such-rollout", "--store", db)
    assert rc == 2 and "no rollout 'no-such-rollout'" in out
    store.close()


def test_retry_over_the_api_with_another_kernel_set(tmp_path, capsys):
    db = str(tmp_path / "s.db")
    store, old = _aborted(tmp_path, capsys, db)
    app = create_app({"STORE": store, "SECRET_KEY": "k"})   # no auth file: loopback only
    server = ThreadedWaitress(app, threads=2)
    try:
        url = server.url
        rc, out = cli(capsys, "rollout", "retry", old, "--kernels", "triton-v1.2", "--url", url)
        assert rc == 0 and f"as a retry of {old} for service chat: canary triton-v1.2" in out, out
        new = store.get(out.split()[1])
        assert new.retry_of == old and new.policy.steps == (20, 100) and new.policy.min_samples == 40
        assert store.spec(new.id).replicas == 2 and store.spec(new.id).canary_args == ("--seed", "7")
        rc, out = cli(capsys, "rollout", "retry", new.id, "--url", url)
        assert rc == 2 and "only an ended rollout can be retried" in out
    finally:
        server.close()
        store.close()
