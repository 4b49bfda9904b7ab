"""`sits-engine serve` as a real process: answers the openai client, logs requests without secrets, exits cleanly."""

import json
import signal
import socket
import subprocess
import sys

import openai

from sits.control_plane.adapters.deploy.local.process import listening_socket
from sits.engine.server.main import build_parser, main
from tests.engine.server.harness import http
from tests.waiting import wait_for

SECRET = "sk-very-secret-token-0123456789"


def _free_port() -> int:
    with listening_socket("127.0.0.1", 0) as s:
        return s.getsockname()[1]


def test_serve_process_end_to_end(tmp_path):
    port = _free_port()
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sits.engine.cli", "serve", "--model", "tiny", "--kernels", "torch", "--host",
             "127.0.0.1", "--port", str(port), "--env", "ci", "--service", "cli-test", "--device", "cpu"],
            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: f"the server to answer /readyz: {log_path.read_text()}",
                 lambda: http("GET", url + "/readyz", timeout=2)[0] == 200, timeout=90, interval=0.1, proc=proc,
                 retry_on=(OSError,))
        client = openai.OpenAI(base_url=url + "/v1", api_key=SECRET, max_retries=0)
        r = client.completions.create(model="tiny", prompt="Hello", max_tokens=4, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 4
        status, _, body = http("GET", url + "/metrics")
        assert status == 200 and b'env="ci"' in body and b'service="cli-test"' in body
        assert json.loads(http("GET", url + "/version")[2])["kernel_set"] == "torch"
    finally:
        proc.send_signal(signal.SIGTERM)  # what Kubernetes sends
        rc = proc.wait(30)
    logs = log_path.read_text()
    assert rc == 0, logs
    assert "POST /v1/completions" in logs and "engine ready" in logs
    assert SECRET not in logs and "Authorization" not in logs and "Traceback" not in logs


def test_bad_flags_fail_fast_with_a_clear_message(capsys):
    assert main(["--kernels", "no-such-set"]) == 2
    err = capsys.readouterr().err
    assert "unknown kernel set 'no-such-set'" in err and "Traceback" not in err
    assert main(["--fault-error-rate", "2"]) == 2 and "--fault-error-rate" in capsys.readouterr().err
    assert main(["--otel-exporter", "otlp"]) == 2 and "endpoint" in capsys.readouterr().err
    help_text = build_parser().format_help()
    for flag in ("--fault-latency-ms", "--fault-token-latency-ms", "--fault-error-rate", "--otel-exporter",
                 "--otlp-endpoint", "--max-waiting", "--env", "--service"):
        assert flag in help_text


def test_listen_fd_must_be_a_listening_tcp_socket(tmp_path, capsys):
    """--listen-fd (the local deployer hands each engine its bound socket) refuses what is not one, in one line."""
    with open(tmp_path / "not-a-socket", "w") as f:
        assert main(["--listen-fd", str(f.fileno())]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sits-engine serve: error: --listen-fd") and "Traceback" not in err
    with socket.socket() as s:   # a TCP socket that was never bound or listened on
        assert main(["--listen-fd", str(s.fileno())]) == 2
        assert "not a listening TCP socket" in capsys.readouterr().err
        assert s.fileno() >= 0   # refused, not closed under its owner
