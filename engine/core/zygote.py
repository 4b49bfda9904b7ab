"""A pre-loaded parent for engine-core processes on a machine without GPUs: torch imported once, each core forked
from it. On a 2-core CPU machine a tiny engine's core takes about 2.3 CPU-s to start when spawned, nearly all of it
importing torch; forked from the zygote, about 0.6 (measured: 0.61-0.67 for three cores, 2.3 spawned).

The local deployer starts one (`python -m sits.engine.core.zygote --socket PATH`) beside the engines it places on
no GPU and names its socket in their environment (sits.wire.zygote.ZYGOTE_ENV). An API server started so asks the
zygote for its core (`fork_core`, engine/core/client.py) and spawns one as before when the zygote is gone or
refuses: an environment that differs from the zygote's in what torch and the C libraries read at start-up
(IMPORT_TIME_PREFIXES).

Protocol, on an AF_UNIX stream socket that takes peers of this user only: the API server sends one length-prefixed
pickle {"opts": pickled CoreOptions, "env": its environment, "cwd": its directory, "sys_path": its sys.path} with its
stdout and stderr descriptors (SCM_RIGHTS); the zygote answers {"pid": N} (or {"error": why}) and, when that core
exits, {"exit": code} (Popen's convention: -N for signal N), then closes. The forked core takes the API server's
environment, directory, sys.path, descriptors and thread count, exactly what a spawned one inherits, then runs
`run_engine_core`. It is the zygote's child, so PR_SET_PDEATHSIG names the zygote; it also watches the API server
(a pidfd) and exits the moment that process ends, as a spawned core does with the signal.
"""
from __future__ import annotations

import argparse
import logging
import os
import pickle
import select
import selectors
import signal
import socket
import struct
import sys
import threading
from typing import Any

from sits.wire.zygote import ZYGOTE_READY_LINE

log = logging.getLogger("sits.engine.core")

# what the interpreter, torch, OpenMP/MKL and the allocator read when they load: a core forked from the zygote
# runs with the zygote's values of these, so a front whose own differ spawns its core instead
IMPORT_TIME_PREFIXES = ("LD_", "PYTHON", "TORCH_", "PYTORCH_", "OMP_", "MKL_", "KMP_", "GOMP_", "MALLOC_", "CUDA_")
# read again, or applied by hand, in the forked core
APPLIED_IN_CORE = frozenset({"PYTHONPATH", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "TORCH_NUM_THREADS"})
_HEADER = struct.Struct("!I")
_MAX_MESSAGE = 64 << 20
_PR_SET_NAME = 15


class ZygoteError(Exception):
    """The zygote could not fork a core (unreachable, refused, or a broken exchange): spawn one instead."""


def import_time_differences(zygote_env: dict[str, str], env: dict[str, str]) -> list[str]:
    """Names of the start-up variables whose values differ between the zygote's environment and `env`."""
    keys = {k for k in (*zygote_env, *env) if k.startswith(IMPORT_TIME_PREFIXES) and k not in APPLIED_IN_CORE}
    return sorted(k for k in keys if zygote_env.get(k) != env.get(k))


# ---- messages ----
def _send(sock: socket.socket, obj: Any, fds: tuple[int, ...] = ()) -> None:
    data = pickle.dumps(obj)
    framed = _HEADER.pack(len(data)) + data
    if fds:
        sent = socket.send_fds(sock, [framed], list(fds))
        framed = framed[sent:]
    if framed:
        sock.sendall(framed)


def _recv_exact(sock: socket.socket, n: int, fds: list[int] | None = None) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        if fds is not None and not buf:
            chunk, got, _, _ = socket.recv_fds(sock, n, 2)
            fds.extend(got)
        else:
            chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("the peer closed the connection")
        buf += chunk
    return bytes(buf)


def _recv(sock: socket.socket, fds: list[int] | None = None) -> Any:
    """One message; with `fds`, the descriptors that came with it are appended there. EOFError at a clean end."""
    head = _recv_exact(sock, _HEADER.size, fds)
    (n,) = _HEADER.unpack(head)
    if n > _MAX_MESSAGE:
        raise ZygoteError(f"message of {n} bytes")
    return pickle.loads(_recv_exact(sock, n))


# ---- the API server's side ----
class ForkedCore:
    """A core the zygote forked, with the surface of multiprocessing.Process that EngineCoreClient uses: `pid`,
    `sentinel` (readable once the core has exited: the zygote's exit message, or its end), `is_alive()`,
    `join(timeout)`, `exitcode`, `kill()`."""

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self._sock = sock
        self.pid = pid
        self.exitcode: int | None = None

    @property
    def sentinel(self) -> int:
        return self._sock.fileno()

    def join(self, timeout: float | None = None) -> None:
        if self.exitcode is not None or not select.select([self._sock], [], [], timeout)[0]:
            return
        try:
            self.exitcode = int(_recv(self._sock)["exit"])
        except (EOFError, OSError, KeyError, TypeError, ValueError, pickle.UnpicklingError, ZygoteError):
            # the zygote is gone, and with it (PR_SET_PDEATHSIG) the core
            self.exitcode = -signal.SIGKILL

    def is_alive(self) -> bool:
        self.join(0)
        return self.exitcode is None

    def kill(self) -> None:
        if self.is_alive():
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def fork_core(opts: Any, address: str, timeout_s: float = 30.0) -> ForkedCore:
    """Ask the zygote at `address` for a core running `run_engine_core(opts)` with this process's environment,
    directory, sys.path, stdout and stderr. ZygoteError when it cannot (the caller spawns the core instead)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout_s)
        sock.connect(address)
        _send(sock, {"opts": pickle.dumps(opts), "env": dict(os.environ), "cwd": os.getcwd(),
                     "sys_path": list(sys.path)}, (sys.stdout.fileno(), sys.stderr.fileno()))
        reply = _recv(sock)
    except (OSError, EOFError, pickle.PickleError, ValueError) as e:
        sock.close()
        raise ZygoteError(f"the engine zygote at {address} is unavailable ({type(e).__name__}: {e})") from None
    if not isinstance(reply, dict) or not isinstance(reply.get("pid"), int):
        sock.close()
        raise ZygoteError(f"the engine zygote refused: {reply.get('error') if isinstance(reply, dict) else reply}")
    sock.settimeout(None)
    return ForkedCore(sock, reply["pid"])


# ---- the zygote ----
def preload() -> None:
    """What every core imports and nothing in it depends on the variant's environment: torch (most of a core's
    start), numpy, zmq and the core's own loop. Not Triton or the kernels: Triton decides at a kernel's definition
    whether it runs under the interpreter (TRITON_INTERPRET), and plugins come from the variant's environment."""
    import numpy  # noqa: F401
    import torch  # noqa: F401
    import zmq  # noqa: F401

    import sits.engine.config  # noqa: F401
    import sits.engine.core.process  # noqa: F401
    if torch.cuda.is_initialized():   # forking after CUDA's initialisation would break every core
        raise RuntimeError("CUDA was initialised while preloading")


class Zygote:
    def __init__(self, address: str) -> None:
        self.address = address
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)   # the socket file is this user's alone (0600)
        try:
            self.listener.bind(address)
        finally:
            os.umask(old)
        self.listener.listen(64)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.children: dict[int, tuple[int, socket.socket]] = {}   # pidfd -> (pid, the front's connection)
        self.env = dict(os.environ)

    def serve_forever(self) -> None:
        while True:
            for key, _ in self.selector.select():
                if key.fileobj is self.listener:
                    try:
                        conn, _ = self.listener.accept()
                    except OSError:
                        continue
                    self._handle(conn)
                else:
                    self._reap(key.fd)

    def _handle(self, conn: socket.socket) -> None:
        fds: list[int] = []
        try:
            conn.settimeout(10.0)
            pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            if uid != os.getuid():
                raise ZygoteError(f"a peer of uid {uid}")
            req = _recv(conn, fds)
            if len(fds) != 2:
                raise ZygoteError(f"{len(fds)} descriptors instead of stdout and stderr")
            differ = import_time_differences(self.env, req["env"])
            if differ:
                _send(conn, {"error": "the environment differs from the zygote's in what is read at start-up: "
                                      + ", ".join(differ)})
                conn.close()
                return
            front = os.pidfd_open(pid)   # the API server, alive: it is waiting for this answer
        except (OSError, EOFError, KeyError, TypeError, ValueError, pickle.UnpicklingError, ZygoteError) as e:
            print(f"sits engine zygote: refused a request: {type(e).__name__}: {e}", flush=True)
            for fd in fds:
                os.close(fd)
            conn.close()
            return
        try:
            child = os.fork()
        except OSError as e:
            child = -1
            reason = f"fork failed: {e}"
        if child == 0:
            self._become_core(req, fds, front, conn)   # never returns
        os.close(front)
        for fd in fds:
            os.close(fd)
        if child < 0:
            print(f"sits engine zygote: {reason}", flush=True)
            try:
                _send(conn, {"error": reason})
            except OSError:
                pass
            conn.close()
            return
        pidfd = os.pidfd_open(child)   # a child that already ended is a zombie until reaped: still found
        self.children[pidfd] = (child, conn)
        self.selector.register(pidfd, selectors.EVENT_READ)
        try:
            _send(conn, {"pid": child})
        except OSError:
            pass   # the front is gone; the core follows it (its pidfd watch)

    def _reap(self, pidfd: int) -> None:
        self.selector.unregister(pidfd)
        pid, conn = self.children.pop(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        try:
            _send(conn, {"exit": os.waitstatus_to_exitcode(status)})
        except OSError:
            pass
        conn.close()

    def _become_core(self, req: dict, fds: list[int], front: int, conn: socket.socket) -> None:
        """In the forked child: take the front's process state, then run the engine core; never returns."""
        code = 1
        try:
            self.selector.close()
            self.listener.close()
            conn.close()   # the front's end must see the zygote's messages and end, not this process's copy
            for pidfd, (_, conn) in self.children.items():
                os.close(pidfd)
                conn.close()
            os.setsid()   # not in the zygote's process group: a signal to that group is not this core's
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.dup2(fds[0], 1)
            os.dup2(fds[1], 2)
            for fd in fds:
                os.close(fd)
            os.chdir(req["cwd"])
            os.environ.clear()
            os.environ.update(req["env"])
            sys.path[:] = req["sys_path"]
            _name_process(b"sits-core")
            _apply_threads(req["env"])
            _exit_with_front(front)
            from sits.engine.core.process import run_engine_core
            run_engine_core(pickle.loads(req["opts"]))   # exits the process itself
        except BaseException as e:   # noqa: BLE001 -- anything here must end this process, never the zygote's loop
            code = e.code if isinstance(e, SystemExit) and isinstance(e.code, int) else 1
            try:
                print(f"engine core (forked by the zygote) failed to start: {type(e).__name__}: {e}", file=sys.stderr,
                      flush=True)
            except BaseException:  # noqa: BLE001
                pass
        os._exit(code)


def _apply_threads(env: dict[str, str]) -> None:
    """The intra-op thread count a spawned core takes from OMP_NUM_THREADS / TORCH_NUM_THREADS at start-up (OpenMP
    read the zygote's when torch loaded)."""
    value = env.get("TORCH_NUM_THREADS") or env.get("OMP_NUM_THREADS")
    if value and value.strip().isdigit() and int(value) >= 1:
        import torch
        torch.set_num_threads(int(value))


def _exit_with_front(front: int) -> None:
    """End this process as soon as the API server does (what PR_SET_PDEATHSIG does for a spawned core)."""
    def watch() -> None:
        select.select([front], [], [])
        os._exit(1)
    threading.Thread(target=watch, name="sits-front-watch", daemon=True).start()


def _name_process(name: bytes) -> None:
    try:
        import ctypes
        ctypes.CDLL(None).prctl(_PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sits.engine.core.zygote",
                                description="fork engine-core processes from one process that has imported torch")
    p.add_argument("--socket", required=True, help="the AF_UNIX socket path to listen on (must not exist)")
    a = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    preload()
    zygote = Zygote(a.socket)
    print(f"{ZYGOTE_READY_LINE} on {a.socket} (pid {os.getpid()})", flush=True)
    try:
        zygote.serve_forever()
    finally:
        try:
            os.unlink(a.socket)
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
