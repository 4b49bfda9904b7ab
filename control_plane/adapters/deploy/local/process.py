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
    """A port that was free a moment ago: another process may bind it before the caller's child does. For a server
    started here, prefer listening_socket() and hand the socket over (pass_fds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def listening_socket(host: str = "127.0.0.1", port: int = 0, backlog: int = 4096) -> socket.socket:
    """A bound, listening TCP socket (port 0: a free one), inheritable: a child given its fd (spawn(pass_fds=...),
    `sits-engine serve --listen-fd`) serves on it, so no other process can take the port between choosing and
    binding it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    sock.set_inheritable(True)
    return sock


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
          cwd: str | None = None, death_signal: int = signal.SIGKILL, pass_fds: Sequence[int] = ()
          ) -> subprocess.Popen:
    """Start argv in its own session; it receives `death_signal` when this process dies. Output -> log_path;
    `pass_fds` stay open in the child under the same numbers (a listening socket, say)."""
    parent = os.getpid()

    def start() -> subprocess.Popen:
        out = open(log_path, "ab", buffering=0) if log_path is not None else subprocess.DEVNULL
        try:
            return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    env=env, cwd=cwd, start_new_session=True, pass_fds=tuple(pass_fds),
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
