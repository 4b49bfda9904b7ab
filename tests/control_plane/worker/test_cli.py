"""`sits-control rollout ...` against a real store, with the worker (in-memory deployer) applying what it queues."""
import json

import pytest

from sits.control_plane.cli.main import main
from sits.control_plane.rollout import Phase
from sits.control_plane.store.db import Store
from sits.control_plane.worker.loop import Worker

from sits.control_plane.adapters.notify import WebhookConfig, WebhookNotifier

from .support import CannedSource, InMemoryDeployer
from .test_notify import Receiver

POLICY = {"steps": [50], "check_interval_s": 10, "warmup_s": 0,
          "checks": [{"metric": "http_request_duration_seconds", "quantile": 0.9, "max_rel_delta": 0.1},
                     {"metric": "error_rate", "max_abs_delta": 0.01}],
          "correctness": {"enabled": False}, "statistics": "fixed"}   # in-memory deployer: canned windows


def cli(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_rollout_lifecycle_through_the_cli(tmp_path, capsys):
    db, pol = str(tmp_path / "s.db"), tmp_path / "p.json"
    pol.write_text(json.dumps(POLICY))
    rc, out = cli(capsys, "rollout", "start", "--service", "chat", "--kernels", "triton-v1", "--production-kernels", "torch",
                  "--policy", str(pol), "--store", db, "--args", "--seed", "7")
    assert rc == 0 and "created for service chat" in out
    rid = out.split()[1]
    rc, out = cli(capsys, "rollout", "start", "--service", "chat", "--kernels", "triton-v1.1", "--store", db)
    assert rc == 2 and "active rollout" in out
    rc, out = cli(capsys, "rollout", "list", "--store", db)
    assert rc == 0 and rid in out and "pending" in out

    deployer, t = InMemoryDeployer(), [0.0]
    store = Store(db)
    rx = Receiver()
    hook = WebhookNotifier(WebhookConfig(rx.url), journal=store.deliveries)
    w = Worker(store, deployer, CannedSource(), hook, clock=lambda: t[0])

    def tick():
        t[0] += 5
        return w.reconcile_rollout(rid).phase
    assert [tick(), tick()] == [Phase.INITIALIZING, Phase.PROGRESSING]
    assert ("deploy", "chat", "canary", "triton-v1", ("--seed", "7")) in deployer.calls
    assert cli(capsys, "rollout", "pause", rid, "--store", db, "--by", "alice")[0] == 0
    assert tick() is Phase.PAUSED
    assert cli(capsys, "rollout", "resume", rid, "--store", db)[0] == 0
    phases = [tick() for _ in range(4)]
    assert phases[0] is Phase.PROGRESSING and phases[-1] is Phase.SUCCEEDED
    assert hook.flush(10)
    rc, out = cli(capsys, "rollout", "show", rid, "--store", db)
    assert rc == 0 and "phase succeeded" in out and "paused by alice" in out
    assert f"rollout {rid}  service chat  canary triton-v1 with --seed 7  production torch" in out   # its flags
    assert "notifications (webhook deliveries):" in out and rx.url not in out
    assert [b["event"] for b in rx.bodies] == ["started", "step", "paused", "resumed", "promoting", "promoted"]
    assert out.count(" sent") == len(rx.bodies)
    assert "request latency p90 /v1/completions" in out and "PASS -> promote" in out and "<= +10.0 %" in out
    rc, out = cli(capsys, "rollout", "show", rid, "--json", "--store", db)
    doc = json.loads(out)
    assert doc["rollout"]["phase"] == "succeeded" and doc["checks"][-1]["decision"] == "promote"
    assert all(a["status"] == "done" for a in doc["actions"])
    assert [(n["event"], n["status"]) for n in doc["notifications"]] == [(b["event"], "sent") for b in rx.bodies]
    rc, out = cli(capsys, "rollout", "abort", rid, "--store", db)
    assert rc == 2 and "already succeeded" in out
    hook.close()
    store.close()
    rx.close()


@pytest.mark.parametrize("argv,message", [
    (["rollout", "show", "nope"], "no rollout 'nope'"),
    (["rollout", "pause", "nope"], "no rollout 'nope'"),
    (["rollout", "start", "--service", "Chat!", "--kernels", "torch"], "service"),
    (["rollout", "start", "--service", "chat", "--kernels", "torch", "--replicas", "0"], "replicas"),
    (["rollout", "start", "--service", "chat", "--kernels", "triton-v9"], "unknown kernel set 'triton-v9'"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, message):
    db = str(tmp_path / "s.db")
    Store(db).close()
    rc, out = cli(capsys, *argv, "--store", db) if argv[1] != "start" else cli(capsys, *argv[:2], "--store", db,
                                                                               *argv[2:])
    assert rc == 2 and message in out and "Traceback" not in out


def test_bad_policy_file_and_missing_store(tmp_path, capsys):
    pol = tmp_path / "p.yaml"
    pol.write_text("steps: [10, 5]\n")
    rc, out = cli(capsys, "rollout", "start", "--service", "chat", "--kernels", "torch", "--policy", str(pol),
                  "--store", str(tmp_path / "s.db"))
    assert rc == 2 and "strictly increasing" in out
    pol.write_text("stepz: [10]\n")
    rc, out = cli(capsys, "rollout", "start", "--service", "chat", "--kernels", "torch", "--policy", str(pol),
                  "--store", str(tmp_path / "s.db"))
    assert rc == 2 and "stepz is not a policy field" in out
    rc, out = cli(capsys, "rollout", "list", "--store", str(tmp_path / "missing.db"))
    assert rc == 2 and "no store at" in out


@pytest.mark.parametrize("argv,production,canary", [
    # repeatable, each one or several shell-quoted args
    (["--arg", "--seed 7", "--arg=--enforce-eager", "--production-arg", "--max-num-seqs 8 --dtype float32"],
     ("--max-num-seqs", "8", "--dtype", "float32"), ("--seed", "7", "--enforce-eager")),
    # the older rest-of-the-line forms: each ends where the other begins, in either order
    (["--production-args", "--seed", "1", "--args", "--seed", "2"], ("--seed", "1"), ("--seed", "2")),
    (["--args", "--seed", "2", "--production-args", "--no-warmup"], ("--no-warmup",), ("--seed", "2")),
    (["--arg", "--dtype 'bfloat16'", "--args", "--seed", "3"], (), ("--dtype", "bfloat16", "--seed", "3")),
])
def test_engine_args_for_both_sides_and_the_device(tmp_path, capsys, argv, production, canary):
    db = str(tmp_path / "s.db")
    rc, out = cli(capsys, "rollout", "start", "--service", "chat", "--kernels", "triton-v1", "--store", db,
                  "--device", "cuda", "--ready-timeout", "900", *argv)
    assert rc == 0, out
    with Store(db) as s:
        (r,) = s.list()
        spec = s.spec(r.id)
    assert spec.production_args == production and spec.canary_args == canary
    assert spec.device == "cuda" and spec.ready_timeout_s == 900.0


def test_start_without_production_compares_with_what_the_service_runs_now(tmp_path, capsys):
    # as over the API: after a promoted flag release (an FP8 KV cache on production's set), a local `rollout start`
    # that names neither production nor flags compares with that production and gives the canary its flags (the
    # canary changes only its kernels); an explicit empty --arg '' is kept, as is a named production
    db, pol = str(tmp_path / "s.db"), tmp_path / "p.json"
    pol.write_text(json.dumps(POLICY))
    kv = ("--kv-cache-dtype", "fp8")
    rc, out = cli(capsys, "rollout", "start", "--service", "chat", "--kernels", "triton-v1.5", "--production-kernels",
                  "triton-v1.5", "--arg", " ".join(kv), "--policy", str(pol), "--store", db)
    assert rc == 0, out
    rid, t = out.split()[1], [0.0]
    with Store(db) as store:
        w = Worker(store, InMemoryDeployer(), CannedSource(), clock=lambda: t[0])
        for _ in range(8):
            t[0] += 5
            if w.reconcile_rollout(rid).phase is Phase.SUCCEEDED:
                break
        assert store.get(rid).phase is Phase.SUCCEEDED

    def started(*argv):
        rc, out = cli(capsys, "rollout", "start", "--service", "chat", "--kernels", "triton-v1.8", "--store", db,
                      "--policy", str(pol), *argv)
        assert rc == 0, out
        with Store(db) as store:
            r = store.list(limit=1)[0]
            spec = store.spec(r.id)
        assert cli(capsys, "rollout", "abort", r.id, "--store", db)[0] == 0
        with Store(db) as store:   # the abort ends it before a deploy (the worker applies it)
            w = Worker(store, InMemoryDeployer(), CannedSource(), clock=lambda: t[0])
            for _ in range(4):
                t[0] += 5
                if not w.reconcile_rollout(r.id).active:
                    break
        return out, r, spec
    out, r, spec = started()
    assert r.production_kernels == "triton-v1.5" and spec.production_args == spec.canary_args == kv
    assert "vs production triton-v1.5 --kv-cache-dtype fp8;" in out
    _, r, spec = started("--arg", "")
    assert spec.production_args == kv and spec.canary_args == ()
    _, r, spec = started("--production-kernels", "torch", "--production-arg", "--seed 3")
    assert r.production_kernels == "torch" and spec.production_args == spec.canary_args == ("--seed", "3")


def test_an_unclosed_quote_in_an_engine_arg_is_one_line_naming_the_flag(tmp_path, capsys):
    rc, out = cli(capsys, "rollout", "start", "--service", "chat", "--kernels", "torch", "--store",
                  str(tmp_path / "s.db"), "--production-arg", "--served-model-name 'x")
    assert rc == 2 and "--production-arg" in out and "quotation" in out and len(out.strip().splitlines()) == 1


def test_calibrate_prints_the_replica_offset_and_a_ship_boundary(tmp_path, capsys):
    import dataclasses
    import math
    from sits.control_plane.analysis import Policy
    from sits.control_plane.analysis.sequential import SequenceState, Window, series_key
    from sits.control_plane.rollout import Rollout
    db = str(tmp_path / "s.db")
    store = Store(db)
    r = store.create(Rollout("aa1", "chat", "torch", "torch", Policy.from_dict(POLICY)))
    key = series_key("http_request_duration_seconds:p90", "http_request_duration_seconds")
    ws = tuple(Window(math.log(1.04) + 0.01 * (-1) ** i, 300, 300, 10.0 * i, 10.0 * i + 10) for i in range(12))
    store.save(dataclasses.replace(r, sequence=SequenceState({key: ws})))
    store.close()
    rc, out = cli(capsys, "rollout", "calibrate", "aa1", "--store", db)
    assert rc == 0, out
    assert "request latency p90 [canary vs baseline (A/A)]: +4.0 % [" in out and "ship_rel_delta 0.075" in out
    rc, out = cli(capsys, "rollout", "calibrate", "aa1", "--store", db, "--json")
    assert rc == 0 and '"suggested_ship": 0.075' in out
