"""The local deployer's engine zygote: one process that has imported torch, from which the engines it places on no
GPU fork their engine cores (engine/core/zygote.py), instead of each core importing torch again (about 2 of a tiny
engine's 2.3 CPU-seconds to start, on CPU).

Started on the first such deploy and kept until the deployer closes; it dies with this process
(PR_SET_PDEATHSIG), and its cores with it. Its socket lives in a private directory (0700) under the temp dir:
AF_UNIX paths are short, a deployer's workdir may not be. When it cannot start or has died, engines start as
before: `address()` is None and they spawn their own cores; an engine whose environment the zygote refuses does
the same.
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Mapping, Sequence

from sits.control_plane.adapters.deploy.local import process
from sits.wire.zygote import ZYGOTE_READY_LINE

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 60.0


class EngineZygote:
    def __init__(self, python: str, workdir: Path, env: Mapping[str, str]) -> None:
        self.python = python
        self.log_path = workdir / "engine-zygote.log"
        self.env = dict(env)
        self._proc: subprocess.Popen | None = None
        self._dir: str | None = None
        self._failed_at: float | None = None
        self._lock = threading.Lock()

    def address(self) -> str | None:
        """The running zygote's socket, started first if need be; None if it cannot run (logged; tried again a
        minute later)."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                return self._socket()
            if self._proc is not None:
                log.warning("the engine zygote exited with code %s; starting another (log %s)", self._proc.returncode,
                            self.log_path)
                self._cleanup()
            if self._failed_at is not None and time.monotonic() - self._failed_at < 60.0:
                return None
            try:
                self._start()
            except (OSError, RuntimeError) as e:
                log.warning("engine zygote not started (%s); engines spawn their own cores", e)
                self._failed_at = time.monotonic()
                self._cleanup()
                return None
            self._failed_at = None
            return self._socket()

    @property
    def process(self) -> subprocess.Popen | None:
        """The zygote's process while one is started (status and tests), else None."""
        return self._proc

    def stop(self) -> None:
        with self._lock:
            self._cleanup()

    def _socket(self) -> str:
        return os.path.join(self._dir, "zygote.sock")

    def _start(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="sits-zygote-")
        argv: Sequence[str] = (self.python, "-m", "sits.engine.core.zygote", "--socket", self._socket())
        self.log_path.write_text(f"$ {' '.join(argv)}\n")
        t0 = time.monotonic()
        self._proc = process.spawn(argv, log_path=self.log_path, env=self.env, cwd=str(self.log_path.parent))
        while ZYGOTE_READY_LINE not in self.log_path.read_text(errors="replace"):
            if self._proc.poll() is not None:
                raise RuntimeError(f"it exited with code {self._proc.returncode}: "
                                   f"{self.log_path.read_text(errors='replace')[-500:].strip()}")
            if time.monotonic() - t0 > READY_TIMEOUT_S:
                raise RuntimeError(f"not ready after {READY_TIMEOUT_S:g} s (log {self.log_path})")
            time.sleep(0.05)
        log.info("engine zygote (pid %d) ready in %.1f s: CPU engines fork their cores from it", self._proc.pid,
                 time.monotonic() - t0)

    def _cleanup(self) -> None:
        if self._proc is not None:
            process.stop(self._proc, 5.0)
            self._proc = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
