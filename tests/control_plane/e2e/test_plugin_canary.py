"""A user's own kernel, end to end on CPU, exactly as docs/kernels.md says: a plugin module in the user's directory,
`export SITS_KERNEL_PLUGINS=my_kernels PYTHONPATH=.`, `sits-engine kernels` lists its sets, `sits-control rollout
start` takes them, and `sits-control worker` (local deployer, real engine processes) canaries them. The wrong release
(decode attention with its softmax scale 15 % too large) is rolled back by the correctness gate's op-level
conformance before any traffic, naming the op; the good one passes the gate and takes traffic."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sits.control_plane.adapters.deploy.local import process
from sits.control_plane.rollout import Phase
from sits.control_plane.store.db import Store
from tests.control_plane.deploy.test_local_limits import _engines
from tests.waiting import wait_for

pytestmark = pytest.mark.slow

PLUGIN = '''"""my_kernels: two releases of decode attention (docs/kernels.md, "Releasing a new version of one op")."""
from sits.kernels import get_kernel_set, register_kernel_set

base = get_kernel_set("torch")


def paged_decode_attention_v2(q, k_cache, v_cache, block_tables, context_lens, scale):
    return base.paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale)


def paged_decode_attention_v2_wrong(q, k_cache, v_cache, block_tables, context_lens, scale):
    return base.paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale * 1.15)


register_kernel_set(base.derive("my-attn-good", "1.0.1", paged_decode_attention=paged_decode_attention_v2))
register_kernel_set(base.derive("my-attn-wrong", "1.0.2", paged_decode_attention=paged_decode_attention_v2_wrong))
'''
POLICY = {"steps": [50], "check_interval_s": 1, "warmup_s": 0, "min_samples": 1000000}   # decides only on the gate


@pytest.fixture
def user_dir(tmp_path):
    (tmp_path / "my_kernels.py").write_text(PLUGIN)
    (tmp_path / "policy.json").write_text(json.dumps(POLICY))
    return tmp_path


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SITS_KERNEL_PLUGINS")}
    return {**env, "SITS_KERNEL_PLUGINS": "my_kernels", "PYTHONPATH": "."}   # relative: the user's directory


def _cli(user_dir: Path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sits.control_plane.cli", *argv], cwd=user_dir, env=_env(),
                          capture_output=True, text=True, timeout=120)


def test_a_plugin_set_is_canaried_through_the_worker(user_dir):
    listed = subprocess.run([str(Path(sys.executable).with_name("sits-engine")), "kernels"], cwd=user_dir,
                            env=_env(), capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert "my-attn-good" in listed.stdout and "my-attn-wrong" in listed.stdout

    db = str(user_dir / "s.db")
    ids = {}

    def start(service: str, kernels: str) -> None:
        p = _cli(user_dir, "rollout", "start", "--service", service, "--kernels", kernels, "--policy", "policy.json",
                 "--store", db)
        assert p.returncode == 0, p.stderr
        ids[service] = p.stdout.split()[1]

    def phase(service: str) -> Phase:
        with Store(db) as store:
            return store.get(ids[service]).phase

    def progressing(service: str) -> bool:
        got = phase(service)
        assert not got.terminal, f"{service} ended {got.value}: " + (user_dir / "worker.log").read_text()[-3000:]
        return got is Phase.PROGRESSING

    start("wrong", "my-attn-wrong")
    (user_dir / "w").mkdir()
    worker = process.spawn([sys.executable, "-m", "sits.control_plane.cli", "worker", "--store", db, "--interval",
                            "0.2", "--workdir", str(user_dir / "w"), "--cpu-threads", "1"],
                           log_path=user_dir / "worker.log", env=_env(), cwd=str(user_dir))
    try:
        wait_for("the wrong release ends", lambda: phase("wrong").terminal, timeout=300, proc=worker)
        start("good", "my-attn-good")   # one at a time: three engines each, on a small machine
        wait_for("the good release takes traffic", lambda: progressing("good"), timeout=300, proc=worker)
        with Store(db) as store:
            wrong, good = store.get(ids["wrong"]), store.get(ids["good"])
            wrong_checks, good_checks = store.checks(ids["wrong"]), store.checks(ids["good"])
        assert wrong.phase is Phase.ROLLED_BACK and "op-level conformance" in wrong.reason, wrong.reason
        assert "paged_decode_attention" in wrong.reason
        (gate,) = wrong_checks   # the gate before traffic, and nothing after it
        assert gate["step"] == -1 and gate["decision"] == "rollback"
        cf = gate["verdict"]["correctness"]["conformance"]
        assert cf["outcome"] == "fail" and cf["judged_ops"] == ["paged_decode_attention"]
        assert cf["failures"][0]["error"] > cf["failures"][0]["allowed"]

        first = good_checks[0]["verdict"]["correctness"]
        assert first["outcome"] == "pass" and first["conformance"]["outcome"] == "pass"
        assert first["conformance"]["judged_ops"] == ["paged_decode_attention"]

        shown = _cli(user_dir, "rollout", "show", ids["wrong"], "--store", db)
        assert shown.returncode == 0 and "op-level conformance: FAIL" in shown.stdout, shown.stdout
        assert "paged_decode_attention at context" in shown.stdout
    finally:
        if "good" in ids:
            _cli(user_dir, "rollout", "abort", ids["good"], "--store", db)
        worker.terminate()
        try:
            worker.wait(60)
        finally:
            process.stop(worker, 5)
    assert wait_for("no engine left", lambda: not _engines("good") and not _engines("wrong"), timeout=60)
    assert "Traceback" not in (user_dir / "worker.log").read_text()
