"""SITS and Hugging Face's `kernels` in one environment (transformers >= 5.25 requires theirs; the lock installs it):
SITS imports only as `sits.*`, so both packages import and SITS still serves, from inside the checkout and from
outside it, through python with and without -P and through the installed `sits-engine` script."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import httpx
import pytest

from sits.control_plane.adapters.deploy.local import process
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[1]

BOTH = """
import json, kernels, sits, sits.engine
from sits import kernels as sits_kernels
from transformers.integrations import hub_kernels   # `from kernels import ...` inside transformers
print(json.dumps({"hf": kernels.__file__, "hf_api": hasattr(kernels, "get_kernel"),
                  "sits": sits_kernels.__file__, "sets": sits_kernels.list_kernel_sets()}))
"""


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def test_hugging_face_kernels_is_installed_beside_sits():
    # the lock pins it (transformers needs it): the tests below would prove nothing without it
    assert metadata.version("kernels")
    assert any(r.replace(" ", "").startswith("kernels<") or r.startswith("kernels>") for r in
               metadata.requires("transformers") if "extra ==" not in r), metadata.requires("transformers")


@pytest.mark.parametrize("where", ["checkout", "elsewhere"])
@pytest.mark.parametrize("flags", [[], ["-P"]], ids=["python", "python -P"])
def test_both_packages_import_in_one_process(where, flags, tmp_path):
    cwd = ROOT if where == "checkout" else tmp_path
    out = subprocess.run([sys.executable, *flags, "-c", BOTH], cwd=cwd, env=_clean_env(), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["hf_api"] and "site-packages" in Path(got["hf"]).parts, got   # theirs, not our folder
    assert Path(got["sits"]) == ROOT / "kernels" / "__init__.py" and "torch" in got["sets"]


def test_the_checkout_root_on_sys_path_still_gives_theirs_and_ours_by_its_own_name(tmp_path):
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import kernels, sits.kernels; "
            "print(kernels.__name__, hasattr(kernels, 'get_kernel'), sits.kernels.get_kernel_set('torch').name)")
    out = subprocess.run([sys.executable, "-c", code, str(ROOT)], cwd=tmp_path, env=_clean_env(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["kernels", "True", "torch"]


@pytest.mark.slow
@pytest.mark.parametrize("where", ["checkout", "elsewhere"])
def test_sits_engine_serves_with_hugging_face_kernels_installed(where, tmp_path):
    script = Path(sys.executable).with_name("sits-engine")
    assert script.is_file(), f"{script}: the project is installed in this environment (make test does it)"
    sock = process.listening_socket()
    port = sock.getsockname()[1]
    argv = [str(script), "serve", "--model", "tiny", "--kernels", "torch", "--device", "cpu", "--port", str(port),
            "--listen-fd", str(sock.fileno()), "--no-access-log", "--log-level", "warning"]
    with sock:
        proc = process.spawn(argv, log_path=tmp_path / "engine.log", env=_clean_env(), pass_fds=(sock.fileno(),),
                             cwd=str(ROOT if where == "checkout" else tmp_path))
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for("the engine is ready", lambda: httpx.get(url + "/readyz", timeout=2).status_code == 200,
                 timeout=120, proc=proc)
        r = httpx.post(url + "/v1/completions", timeout=60,
                       json={"model": "tiny", "prompt": "hello", "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 4
        assert httpx.get(url + "/version", timeout=5).json()["kernel_set"] == "torch"
    finally:
        process.stop(proc, 10)


def test_no_bench_script_shadows_an_installed_package():
    # bench/ goes on sys.path when its scripts run (and when the profile test loads them): a script named like an
    # installed package (bench/kernels.py was, beside Hugging Face's `kernels`) would replace it there
    bench = ROOT / "bench"
    elsewhere = [p for p in sys.path if p and Path(p).resolve() not in (ROOT, bench)]
    import importlib.machinery
    clashes = [p.stem for p in bench.glob("*.py")
               if importlib.machinery.PathFinder.find_spec(p.stem, elsewhere) is not None]
    assert clashes == []
