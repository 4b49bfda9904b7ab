"""A real `sits-engine serve` subprocess (tiny model, torch kernels, one CPU thread) for tests that need live engines
outside a deployer. It serves on a socket bound here and handed over (`--listen-fd`), as the local deployer does, so
no other test's process can take its port first."""
from __future__ import annotations

import os
import subprocess
import sys

from sits.control_plane.adapters.deploy.local import process


def start_tiny_engine(workdir, role: str, service: str, *extra: str) -> tuple[subprocess.Popen, str]:
    """(process, "127.0.0.1:PORT"), labelled env=role, service=service; its output in workdir/ROLE-PORT.log."""
    sock = process.listening_socket()
    port = sock.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "sits.engine.cli", "serve", "--model", "tiny", "--kernels", "torch", "--env", role,
            "--service", service, "--port", str(port), "--listen-fd", str(sock.fileno()), "--no-access-log",
            "--log-level", "warning", *extra]
    with sock:
        proc = process.spawn(argv, log_path=workdir / f"{role}-{port}.log", env=env, pass_fds=(sock.fileno(),))
    return proc, f"127.0.0.1:{port}"
