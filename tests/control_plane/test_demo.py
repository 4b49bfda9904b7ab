"""`sits-control demo --scenario good` end to end, as a user runs it: the service comes up with a fresh token, the
good canary is promoted, the summary says so, and the API serves the rollout with its checks' evidence; Ctrl-C stops
every engine."""
import json
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.control_plane.e2e.support import engine_pids, wait_for

REPO = Path(__file__).resolve().parents[2]


def get(url, token):
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


@pytest.mark.slow
def test_demo_good_scenario_is_promoted_and_served_by_the_api(tmp_path):
    log = tmp_path / "demo.log"
    proc = subprocess.Popen([sys.executable, "-m", "control_plane.cli", "demo", "--scenario", "good",
                             "--keep-running", "--workdir", str(tmp_path / "w")], cwd=REPO,
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        text = wait_for(lambda: "UI still up" in log.read_text() and log.read_text(), 300, "the demo's summary")
        assert "demo passed" in text and "=> SUCCEEDED (as expected)" in text, text[-3000:]
        url, token = re.search(r"UI (http://127\.0\.0\.1:\d+/)  \(log in with token (\S+)\)", text).groups()
        auth = json.loads((tmp_path / "w" / "auth.json").read_text())
        assert token not in json.dumps(auth) and len(auth["users"][0]["token_sha256"]) == 64   # only its hash
        assert re.search(r"check +\d+ · step 1/2 at  50 % · P99 [+-]\d+\.\d % \[[+-]\d+\.\d, [+-]\d+\.\d\]", text)
        (ro,) = get(url + "api/v1/rollouts", token)["rollouts"]
        assert ro["phase"] == "succeeded" and ro["kernels"] == "torch"
        checks = get(url + f"api/v1/rollouts/{ro['id']}/checks", token)["checks"]
        assert checks and checks[-1]["decision"] == "promote"
        assert "canary: 0 failed" not in text and re.search(r"canary \d+ answered / 0 failed", text)
        with pytest.raises(urllib.error.HTTPError) as e:   # the API wants the token
            urllib.request.urlopen(url + "api/v1/rollouts", timeout=10)
        assert e.value.code == 401
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    wait_for(lambda: not engine_pids("demo"), 15, "the demo's engines to stop")
