"""Shared by the end-to-end fault tests: the engine processes of a service (from /proc), a short policy, waiting."""
import os
import subprocess
import sys
from pathlib import Path

from sits.control_plane.adapters.deploy.local.process import pid_alive
from sits.control_plane.analysis import ERROR_RATE, REQUEST_LATENCY, MetricCheck, Policy

# one step at 50 %, a check every 3 s: P90 and the error rate; latency only (the correctness gate has its own
# end-to-end tests, and the demo's test runs it). The slow canary's injected delay is 800 ms: P90 fails at +35 %, so
# a delay d is caught while the baseline's P90 stays under about d / 0.35. CI at 84173e7 promoted a 300 ms-slow
# canary (on 2 cores shared with the helm test's engines the baseline's P90 must have passed ~0.86 s); 800 ms holds
# up to ~2.3 s
FAST = Policy(correctness={"enabled": False}, steps=(50,), check_interval_s=3.0, warmup_s=1.0,
              checks=(MetricCheck(REQUEST_LATENCY, quantile=0.90, max_rel_delta=0.35),
                      MetricCheck(ERROR_RATE, max_abs_delta=0.02)),
              min_samples=60, min_tail_samples=2, failure_limit=2, inconclusive_limit=40,
              on_inconclusive="rollback", max_duration_s=240.0, ready_timeout_s=240.0, min_error_samples=60,
              # these tests are about faults (kills, a stopped Prometheus, lost requests), not statistics: the
              # per-look test decides in seconds on 2 loaded cores; the sequential default runs end to end in the
              # demo's test, the plugin canary's and the helm one
              statistics="fixed")
SLOW = ("--fault-latency-ms", "800")


def engine_pids(service: str, role: str | None = None, *, under: str | os.PathLike | None = None) -> list[int]:
    """Live `sits-engine serve` processes labelled with this service (and role); with `under`, only those whose
    working directory is in that tree (a deployer's workdir: another run's engines with the same labels are not
    this test's)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "serve" in argv and "--service" in argv and argv[argv.index("--service") + 1] == service \
                and (role is None or ("--env" in argv and argv[argv.index("--env") + 1] == role)) \
                and pid_alive(int(d)) and (under is None or _cwd_under(int(d), under)):
            out.append(int(d))
    return out


def _cwd_under(pid: int, root) -> bool:
    try:
        return os.path.realpath(f"/proc/{pid}/cwd").startswith(os.path.realpath(root) + os.sep)
    except OSError:
        return False


def start_control_proc(store_path, workdir, svc: str, *extra: str) -> subprocess.Popen:
    """tests/control_plane/e2e/control_proc.py as its own process, its stderr in workdir/control.log. It imports
    `tests.*`: the repository root goes on its PYTHONPATH (make test runs Python with -P, so the working directory
    is not on sys.path)."""
    root = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    argv = [sys.executable, "-m", "tests.control_plane.e2e.control_proc", "--store", str(store_path),
            "--workdir", str(workdir), "--service", svc, *extra]
    return subprocess.Popen(argv, cwd=root, env=env, stdout=subprocess.DEVNULL,
                            stderr=open(Path(workdir) / "control.log", "ab"))
