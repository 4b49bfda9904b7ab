"""`sits-control serve` under waitress (a real process and port), and `sits-control rollout ... --url` / `--wait`
against a live service whose worker drives rollouts (in-memory deployer, canned metrics)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import httpx
import pytest

from sits.control_plane.analysis import ERROR_RATE, REQUEST_LATENCY, MetricCheck, Policy
from sits.control_plane.web import create_app
from sits.control_plane.cli.main import main
from sits.control_plane.cli.client import progress_line
from sits.control_plane.store.db import Store
from sits.control_plane.web.common import is_loopback
from sits.control_plane.worker.loop import Worker
from sits.control_plane.worker.config import WorkerConfig

from tests.waitress_thread import ThreadedWaitress
from tests.control_plane.worker.support import CannedSource, InMemoryDeployer

from sits.control_plane.web.users import token_sha256

from .accounts import NAMES, TOKENS


def _auth_file(tmp_path) -> str:
    lines = ["users:"] + [f"  - {{name: {NAMES[r]}, role: {r}, token_sha256: {token_sha256(t)}}}"
                          for r, t in TOKENS.items()]
    path = tmp_path / "users.yaml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "example.org"])
def test_serve_refuses_a_non_loopback_host_without_auth(host, capsys):
    assert main(["serve", "--host", host, "--port", "0"]) == 2
    assert "without --auth-file" in capsys.readouterr().err


def test_loopback_hosts():
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.0.1.5", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "192.168.1.1", "::", "sits.example"))


@pytest.mark.parametrize("argv,secret,points_to", [
    (["--webhook", "https://hooks.example/x?token=tok-hunter1"], "tok-hunter1", "--webhook-file"),
    (["--webhook", "https://ops:hunter2@hooks.example/x"], "hunter2", "$SITS_WEBHOOK_URLS"),
    (["--slack-webhook", "https://hooks.slack.com/services/T0/B0/hunter3"], "hunter3", "--slack-webhook-file"),
    (["--metrics", "prometheus", "--prometheus-url", "http://sits:hunter4@prom:9090"], "hunter4",
     "--prometheus-password-file"),
    (["--metrics", "prometheus", "--prometheus-url", "http://prom:9090/?access_token=hunter5"], "hunter5",
     "$SITS_PROMETHEUS_URL"),
])
@pytest.mark.parametrize("cmd", ["worker", "serve"])
def test_secret_bearing_urls_on_the_command_line_are_refused(tmp_path, capsys, cmd, argv, secret, points_to):
    """Issue 26 row 13: `--slack-webhook URL`, `--webhook URL?token=` and `--prometheus-url user:pass@` put secrets
    on argv (/proc/PID/cmdline); now each is a one-line error naming where the secret belongs, without echoing it."""
    assert main([cmd, "--store", str(tmp_path / "s.db"), *argv]) == 2
    err = capsys.readouterr().err
    assert points_to in err and secret not in err and len(err.strip().splitlines()) == 1, err


def test_webhook_and_prometheus_urls_from_files_and_env(tmp_path, monkeypatch):
    from sits.control_plane.cli.build import build_worker
    from sits.control_plane.cli.main import build_parser
    (tmp_path / "hooks").write_text("# ops\nhttps://hooks.example/a?token=t1\n\nhttps://hooks.example/b\n")
    (tmp_path / "slack").write_text("https://hooks.slack.com/services/T0/B0/s1\n")
    monkeypatch.setenv("SITS_WEBHOOK_URLS", "https://hooks.example/c?sig=t2,https://hooks.example/d")
    monkeypatch.setenv("SITS_SLACK_WEBHOOK_URLS", "https://hooks.slack.com/services/T0/B0/s2")
    monkeypatch.setenv("SITS_PROMETHEUS_URL", "http://sits:pw-from-env@127.0.0.1:9")
    a = build_parser().parse_args(["worker", "--store", str(tmp_path / "s.db"),
                                   "--webhook-file", str(tmp_path / "hooks"),
                                   "--slack-webhook-file", str(tmp_path / "slack"),
                                   "--webhook", "https://plain.example/", "--metrics", "prometheus"])
    w = build_worker(a)
    try:
        got = [(n.config.format, n.config.url) for n in w.notifier.notifiers]
        assert got == [("json", "https://plain.example/"), ("json", "https://hooks.example/a?token=t1"),
                       ("json", "https://hooks.example/b"), ("json", "https://hooks.example/c?sig=t2"),
                       ("json", "https://hooks.example/d"), ("slack", "https://hooks.slack.com/services/T0/B0/s1"),
                       ("slack", "https://hooks.slack.com/services/T0/B0/s2")]
        assert w.source.config.url == "http://127.0.0.1:9" and w.source.config.basic_auth == ("sits", "pw-from-env")
    finally:   # as `sits-control worker` shuts down: the notifiers' journal threads stop before the store closes
        w.notifier.close()
        w.deployer.close()
        w.store.close()


def test_a_malformed_url_in_a_webhook_file_is_named_by_line_not_echoed(tmp_path, capsys):
    (tmp_path / "slack").write_text("https://hooks.slack.com/services/T0/B0/ok\nhooks.slack.com/services/T/B/hunter6\n")
    assert main(["worker", "--store", str(tmp_path / "s.db"), "--slack-webhook-file", str(tmp_path / "slack")]) == 2
    err = capsys.readouterr().err
    assert "line 2" in err and "hunter6" not in err


def test_serve_refuses_a_bad_auth_file(tmp_path, capsys):
    (tmp_path / "bad.json").write_text('{"users": [{"name": "a", "role": "god", "token_sha256": "00"}]}')
    assert main(["serve", "--port", "0", "--auth-file", str(tmp_path / "bad.json"), "--no-worker"]) == 2
    assert "role must be one of" in capsys.readouterr().err


def test_serve_process_answers_and_the_cli_talks_to_it(tmp_path, monkeypatch, capsys):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "SITS_POLICY_DEFAULTS": str(tmp_path / "policy.yaml")}
    (tmp_path / "policy.yaml").write_text("steps: [3, 30, 100]\ncheck_interval_s: 15\n")   # as the Helm chart mounts it
    proc = subprocess.Popen([sys.executable, "-m", "sits.control_plane.cli", "serve", "--port", "0", "--auth-file",
                             _auth_file(tmp_path), "--store", str(tmp_path / "s.db"), "--no-worker"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        line = proc.stdout.readline()
        url = re.search(r"(http://127\.0\.0\.1:\d+)/", line).group(1)
        assert httpx.get(url + "/healthz").json() == {"status": "ok"}
        assert httpx.get(url + "/readyz").status_code == 200   # --no-worker: the store is enough

        def run(args, role):   # the CLI in this process, the service in its own
            monkeypatch.setenv("SITS_TOKEN", TOKENS[role])
            rc = main(["rollout", *args, "--url", url])
            out = capsys.readouterr()
            return subprocess.CompletedProcess(args, rc, out.out, out.err)
        out = run(["start", "--service", "chat", "--kernels", "triton-v1.1"], "operator")
        assert out.returncode == 0, out.stderr
        rid = re.search(r"rollout (\S+) created", out.stdout).group(1)
        got = httpx.get(f"{url}/api/v1/rollouts/{rid}", headers={"Authorization": f"Bearer {TOKENS['viewer']}"}).json()
        assert got["steps"] == [3, 30, 100] and got["policy"]["check_interval_s"] == 15
        listed = run(["list"], "viewer")
        assert rid in listed.stdout and "pending" in listed.stdout
        denied = run(["abort", rid], "viewer")
        assert denied.returncode == 2 and "operator role" in denied.stderr and "HTTP 403" in denied.stderr
        bad = run(["start", "--service", "chat", "--kernels", "nope"], "operator")
        assert bad.returncode == 2 and "unknown kernel set" in bad.stderr
        ok = run(["abort", rid], "operator")
        assert ok.returncode == 0 and "queued" in ok.stdout and NAMES["operator"] in ok.stdout
        shown = run(["show", rid], "viewer")
        assert f"created by {NAMES['operator']}" in shown.stdout
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0


def test_behind_a_trusted_proxy_each_client_has_its_own_lock_out(tmp_path):
    """Issue 26 row 7 as the chart runs it (`serve --trusted-proxy '*'` behind its Ingress): 5 wrong tokens from one
    client (X-Forwarded-For 10.0.0.1) lock out that client only, not another one behind the same proxy."""
    proc = subprocess.Popen([sys.executable, "-m", "sits.control_plane.cli", "serve", "--port", "0", "--auth-file",
                             _auth_file(tmp_path), "--store", str(tmp_path / "s.db"), "--no-worker",
                             "--trusted-proxy", "*"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        url = re.search(r"(http://127\.0\.0\.1:\d+)/", proc.stdout.readline()).group(1)

        def me(token: str, client: str) -> int:
            return httpx.get(url + "/api/v1/me", headers={"Authorization": f"Bearer {token}",
                                                          "X-Forwarded-For": client}).status_code
        assert [me("guess", "10.0.0.1") for _ in range(6)] == [401] * 5 + [429]
        assert me(TOKENS["viewer"], "10.0.0.1") == 429   # never logged in from there
        assert me(TOKENS["viewer"], "10.0.0.2") == 200   # another client behind the same proxy
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0


@pytest.fixture
def live(tmp_path, users):
    """A waitress server on a free port with a started worker (fast passes, canned metrics at 1000 req/s)."""
    store = Store(str(tmp_path / "live.db"))
    source = CannedSource(rate=1000.0, scale={"slow": 2.0})
    worker = Worker(store, InMemoryDeployer(), source, config=WorkerConfig(interval_s=0.05, lease_ttl_s=5))
    app = create_app({"STORE": store, "SITS_USERS": users, "WORKER": worker, "SECRET_KEY": "k"})
    server = ThreadedWaitress(app, threads=4)
    worker.start()
    try:
        yield server.url
    finally:
        worker.stop()
        server.close()
        store.close()


FAST = Policy(steps=(50, 100), check_interval_s=0.3, warmup_s=0.0, min_samples=50, min_tail_samples=2,
              checks=(MetricCheck(REQUEST_LATENCY, quantile=0.99, max_rel_delta=0.5),
                      MetricCheck(ERROR_RATE, max_abs_delta=0.05)), failure_limit=2, min_error_samples=50,
              correctness={"enabled": False},   # the test engines cannot replay prompts
              window_s=1.0)   # the sequence's 6 windows in ~6 s: this is about following a rollout, not statistics


@pytest.mark.parametrize("service,rc,final", [("good", 0, "succeeded"), ("slow", 1, "rolled back")])
def test_start_wait_follows_the_rollout_to_its_end(live, tmp_path, monkeypatch, capsys, service, rc, final):
    (tmp_path / "policy.json").write_text(json.dumps(FAST.to_dict()))
    monkeypatch.setenv("SITS_TOKEN", TOKENS["operator"])
    code = main(["rollout", "start", "--service", service, "--kernels", "triton-v1.1", "--production-kernels",
                 "triton-v1", "--policy", str(tmp_path / "policy.json"), "--url", live, "--wait"])
    out = capsys.readouterr().out
    assert code == rc, out
    assert re.search(r"step 1/2 at 50 %", out)
    assert re.search(r"check \d+: (pass|fail) -> \w+ · p99 request latency [+-]\d+\.\d % \[", out), out
    assert out.strip().splitlines()[-1].split(":")[0].endswith(final)


def test_progress_line_shows_step_weight_delta_interval_and_verdict():
    r = {"phase": "progressing", "step": 1, "steps": [5, 25, 100], "weight": 25,
         "last_check": {"seq": 7, "outcome": "inconclusive", "decision": "hold", "label": "p99 request latency",
                        "delta": 0.031, "ci": [-0.02, 0.08], "threshold": 0.1, "kind": "rel", "need_more": 640}}
    assert progress_line(r) == ("progressing · step 2/3 at 25 % · check 7: inconclusive -> hold · p99 request "
                                "latency +3.1 % [-2.0 %, +8.0 %] <= +10.0 % (needs about 640 more requests)")


def test_progress_line_shows_the_sequence_between_its_boundaries():
    r = {"phase": "progressing", "step": 0, "steps": [50, 100], "weight": 50,
         "last_check": {"seq": 9, "outcome": "inconclusive", "decision": "hold", "label": "p90 request latency",
                        "delta": 0.18, "ci": [0.037, 0.342], "threshold": 0.25, "kind": "rel", "need_more": 640,
                        "method": "sequential", "ship": 0.125, "windows": 8, "eta_s": 310.4}}
    assert progress_line(r) == ("progressing · step 1/2 at 50 % · check 9: inconclusive -> hold · p90 request latency "
                                "+18.0 % [+3.7 %, +34.2 %] ship +12.5 % / limit +25.0 % · 8 windows · decides in "
                                "~310 s")


def test_start_wait_follows_the_store_when_no_url_is_given(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("SITS_URL", raising=False)
    db = str(tmp_path / "s.db")
    (tmp_path / "policy.json").write_text(json.dumps(FAST.to_dict()))
    store = Store(db)
    worker = Worker(store, InMemoryDeployer(), CannedSource(rate=1000.0, scale={"slow": 2.0}),
                    config=WorkerConfig(interval_s=0.05, lease_ttl_s=5)).start()
    try:
        code = main(["rollout", "start", "--service", "slow", "--kernels", "triton-v1.1", "--production-kernels",
                     "triton-v1", "--policy", str(tmp_path / "policy.json"), "--store", db, "--wait"])
    finally:
        worker.stop()
        store.close()
    out = capsys.readouterr().out
    assert code == 1 and "rolled back" in out.splitlines()[-1] and "check " in out
