"""`sits-engine serve` as a real process tree (API server + engine core), for the tests of engine/core/."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sits.engine import LLMEngine
from sits.control_plane.adapters.deploy.local.process import listening_socket
from tests.engine.server.harness import http
from tests.waiting import wait_for

CRASH_TOKEN = 7   # a prompt of only this token makes CrashOnMarkedPrompt.step() fail


class CrashOnMarkedPrompt(LLMEngine):
    """A real engine whose step() fails once a request whose prompt is all CRASH_TOKEN runs (a kernel that faults
    on some input). Module-level, so it crosses the spawn into the engine-core process."""

    def step(self):
        if any(set(seq.token_ids[:seq.num_prompt_tokens]) == {CRASH_TOKEN} for seq in self.scheduler.running):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return super().step()


class ServeProcess:
    """`python -m sits.engine.cli serve` on a free port, its output in `log_path`."""

    def __init__(self, tmp_path: Path, *args: str):
        sock = listening_socket("127.0.0.1", 0)   # handed over (--listen-fd): no other process can take the port
        port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = tmp_path / "serve.log"
        with sock, open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sits.engine.cli", "serve", "--model", "tiny", "--device", "cpu", "--port",
                 str(port), "--listen-fd", str(sock.fileno()), "--env", "test", "--service", "proc-test",
                 "--no-access-log", *args],
                stdout=log, stderr=subprocess.STDOUT, pass_fds=(sock.fileno(),))

    def logs(self) -> str:
        return self.log_path.read_text()

    def wait_ready(self, timeout: float = 90) -> "ServeProcess":
        def ready() -> bool:
            assert self.proc.poll() is None, self.logs()
            try:
                return http("GET", self.url + "/readyz", timeout=2)[0] == 200
            except OSError:
                return False

        wait_for("the server to answer /readyz", ready, timeout, 0.1)
        return self

    def core_pid(self) -> int:
        """The engine-core child (multiprocessing's spawn child; its resource tracker is the other child)."""
        pids = children(self.proc.pid)
        cores = [p for p in pids if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert len(cores) == 1, (pids, cores)
        return cores[0]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


def children(pid: int) -> list[int]:
    """The processes `pid` started that are still its children (every thread's list)."""
    return [int(c) for task in os.listdir(f"/proc/{pid}/task")
            for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (an exited child its parent has not reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
