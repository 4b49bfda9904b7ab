"""`sits-control demo` end to end, as a user runs it (all three scenarios, ~2.3 min here; `make test` runs it alone,
after the parallel part): the service comes up with a
fresh token, the slower kernel set is rolled back by its latency checks, the wrong one by the correctness gate, the
good one promoted; the summary says so, and the API serves the rollouts with their checks' evidence; Ctrl-C stops
every engine."""
import json
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.control_plane.e2e.support import engine_pids
from tests.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]


def get(url, token):
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


@pytest.mark.slow
@pytest.mark.solo   # its slow canary must fail on P99 too: a test beside it on the 2 cores would blur that
def test_demo_scenarios_end_as_expected_and_are_served_by_the_api(tmp_path):
    log = tmp_path / "demo.log"
    proc = subprocess.Popen([sys.executable, "-m", "sits.control_plane.cli", "demo", "--scenario", "all",
                             "--keep-running", "--workdir", str(tmp_path / "w")], cwd=REPO,
                            stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            # a suite run as a background job starts with SIGINT ignored, and the demo (like any
                            # Python program) keeps it so; Ctrl-C is what a user sends, so give the demo its default
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        text = wait_for("the demo's summary", lambda: "UI still up" in log.read_text() and log.read_text(), 420)
        assert "demo passed" in text and text.count("(as expected)") == 3, text[-3000:]
        url, token = re.search(r"UI (http://127\.0\.0\.1:\d+/)  \(log in with token (\S+)\)", text).groups()
        auth = json.loads((tmp_path / "w" / "auth.json").read_text())
        assert token not in json.dumps(auth) and len(auth["users"][0]["token_sha256"]) == 64   # only its hash
        assert re.search(r"check +\d+ · step 1/2 at  50 % · P99 [+-]\d+\.\d % \[[+-]\d+\.\d, [+-]\d+\.\d\]", text)
        good, wrong, slow = get(url + "api/v1/rollouts", token)["rollouts"]     # newest first
        assert [(r["kernels"], r["phase"]) for r in (slow, wrong, good)] == [
            ("torch-slow-attn", "rolled_back"), ("torch-wrong-rope", "rolled_back"), ("torch", "succeeded")]
        checks = {r["kernels"]: get(url + f"api/v1/rollouts/{r['id']}/checks", token)["checks"]
                  for r in (slow, wrong, good)}
        last = checks["torch-slow-attn"][-1]
        assert last["decision"] == "rollback" and "p99" in {
            x["check"].split(":")[-1] for x in last["verdict"]["results"] if x["outcome"] == "fail"}
        assert re.search(r"low-traffic mode replayed \d+ requests to the canary", text)
        gate = checks["torch-wrong-rope"][-1]
        assert gate["decision"] == "rollback" and gate["verdict"]["correctness"]["outcome"] == "fail"
        assert checks["torch"][-1]["decision"] == "promote"
        load_line = next((line for line in text.splitlines() if " load: " in line and "answered" in line), text[-2000:])
        assert re.search(r"production \d+ answered / 0 failed; baseline \d+ answered / 0 failed; canary \d+ answered "
                         r"/ 0 failed", load_line), load_line               # no request lost, every token there
        with pytest.raises(urllib.error.HTTPError) as e:   # the API wants the token
            urllib.request.urlopen(url + "api/v1/rollouts", timeout=10)
        assert e.value.code == 401
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    wait_for("the demo's engines to stop", lambda: not engine_pids("demo", under=tmp_path), 15)
