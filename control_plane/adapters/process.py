"""Child processes that never outlive their parent: own process group, PR_SET_PDEATHSIG, group-wide stop.

PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, not only the process. So every child is forked
from one long-lived daemon thread (`_Spawner`) that lives as long as the interpreter: the signal then fires exactly
when this process dies, however it dies (SIGKILL included).
"""
from __future__ import annotations

import ctypes
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Sequence

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _make_preexec(parent_pid: int, sig: int):
    prctl = _libc.prctl if _libc is not None else None

    def preexec() -> None:  # runs in the child between fork and exec: keep it minimal
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)
    return preexec


class _Spawner(threading.Thread):
    def __init__(self) -> None:
        super().__init__(name="sits-spawner", daemon=True)
        self.jobs: queue.Queue = queue.Queue()

    def run(self) -> None:
        while True:
            fn, box, done = self.jobs.get()
            try:
                box.append(("ok", fn()))
            except BaseException as e:  # handed back to the caller's thread
                box.append(("err", e))
            done.set()


_spawner: _Spawner | None = None
_spawner_lock = threading.Lock()


def _on_spawner(fn):
    global _spawner
    with _spawner_lock:
        if _spawner is None or not _spawner.is_alive():
            _spawner = _Spawner()
            _spawner.start()
        sp = _spawner
    box: list = []
    done = threading.Event()
    sp.jobs.put((fn, box, done))
    done.wait()
    kind, value = box[0]
    if kind == "err":
        raise value
    return value


def spawn(argv: Sequence[str], *, log_path: str | os.PathLike | None = None, env: dict | None = None,
          cwd: str | None = None, death_signal: int = signal.SIGKILL) -> subprocess.Popen:
    """Start argv in its own session; it receives `death_signal` when this process dies. Output -> log_path."""
    parent = os.getpid()

    def start() -> subprocess.Popen:
        out = open(log_path, "ab", buffering=0) if log_path is not None else subprocess.DEVNULL
        try:
            return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    env=env, cwd=cwd, start_new_session=True,
                                    preexec_fn=_make_preexec(parent, int(death_signal)))
        finally:
            if log_path is not None:
                out.close()
    return _on_spawner(start)


def stop(proc: subprocess.Popen, timeout: float = 10.0) -> int | None:
    """SIGTERM the child's process group, wait up to `timeout`, then SIGKILL it. Returns the exit code."""
    if proc.poll() is None:
        _killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    # the leader may be gone while others in its group live on: always sweep the group
    _killpg(proc.pid, signal.SIGKILL)
    try:
        return proc.wait(5)
    except subprocess.TimeoutExpired:
        return None


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def pid_alive(pid: int) -> bool:
    """True if pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def wait_until(pred, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if pred():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
