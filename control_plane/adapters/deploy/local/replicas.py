"""The local deployer's engine processes: start a variant's replicas, wait until they answer /readyz, probe, stop.

`ReplicaLauncher` starts `sits-engine serve` subprocesses (one free loopback port each, an explicit environment:
config.engine_environment, with the GPUs of the variant's placement: gpus.py) in bounded batches, and waits for each
batch to answer /readyz before starting the next, so a machine never loads more models at once than it has cores. A
replica that exits, or is not ready by its readiness deadline (the spec's ready_timeout_s, else
LocalConfig.ready_timeout_s), fails the start with NotReadyError (its exit code, its engine's last log line and the
log tail), and every replica this start began is stopped. `cancel()` makes starts in progress (other threads) stop starting and waiting and raise DeployCancelled;
a start's own `interrupted()` callback (an abort queued for its rollout) makes that start stop: DeployInterrupted.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import httpx

from sits.control_plane.adapters.deploy.local import process
from sits.control_plane.adapters.deploy import (DeployCancelled, DeployInterrupted, NotReadyError, ReplicaStatus,
                                                VariantSpec, VariantStatus)
from sits.control_plane.adapters.deploy.log_line import (collapse_repeats, is_probe_line, shown_log_line,
                                                         without_probe_lines)
from sits.control_plane.adapters.deploy.local.config import LocalConfig, engine_environment
from sits.control_plane.adapters.deploy.local.gpus import Placement
from sits.control_plane.adapters.deploy.local.zygote import EngineZygote
from sits.wire.models import LOAD_FAILED
from sits.wire.zygote import ZYGOTE_ENV

_REPO_ROOT = str(Path(__file__).resolve().parents[4])   # control_plane/adapters/deploy/local/ -> the checkout
PROBE_FIRST_S, PROBE_MAX_S = 0.1, 1.0   # /readyz probes while an engine loads: 0.1 s apart, slowing down to 1 s
INTERRUPT_POLL_S = 1.0                  # how often a deploy asks its `interrupted()` (a store query) while waiting


@dataclass(slots=True)
class Replica:
    proc: object
    port: int
    url: str
    log_path: Path


class ReplicaLauncher:
    def __init__(self, config: LocalConfig, workdir: Path) -> None:
        self.config = config
        self.workdir = workdir
        self.start_batch = config.start_batch or len(os.sched_getaffinity(0))
        self._http = httpx.Client(timeout=config.probe_timeout_s, trust_env=False)
        self._cancelled = threading.Event()
        engine = tuple(config.engine_command)
        # only `sits-engine serve` itself knows the zygote (a test's stand-in command does not)
        self.zygote = EngineZygote(engine[0], workdir, self._environment({}, {})) \
            if config.engine_zygote and engine[1:] == ("-m", "sits.engine.cli") else None

    def cancel(self) -> None:
        self._cancelled.set()

    def close(self) -> None:
        """Close the probe client and stop the engine zygote; later starts work again (a deployer may be used after
        close())."""
        self._http.close()
        if self.zygote is not None:
            self.zygote.stop()
        self._cancelled.clear()

    def start(self, spec: VariantSpec, interrupted: Callable[[], bool] | None = None,
              placement: Placement = Placement()) -> list[Replica]:
        """spec.replicas engines, every one ready, or DeployError/DeployCancelled/DeployInterrupted with none of them
        left running. `interrupted()` is asked about every INTERRUPT_POLL_S while they load; replica i sees the GPUs
        `placement` gives it (`placement.env(i)`)."""
        started: list[Replica] = []
        try:
            for first in range(0, spec.replicas, self.start_batch):   # bounded batches: start some, wait, repeat
                batch = []
                for i in range(first, min(spec.replicas, first + self.start_batch)):
                    self._check_cancelled(spec)
                    batch.append(self.start_one(spec, i, placement.env(i), zygote=not placement.mode))
                    started.append(batch[-1])
                started_at = time.monotonic()
                for r in batch:
                    self._wait_ready(spec, r, started_at, interrupted)
        except BaseException:
            self.stop(started)
            raise
        return started

    def start_one(self, spec: VariantSpec, index: int, gpu_env: Mapping[str, str] | None = None, *,
                  zygote: bool = False) -> Replica:
        """One replica; `zygote` (an engine on no GPU): its core forks from the engine zygote when that runs."""
        # bound here and handed over: no other process can take the port before the engine serves on it
        sock = process.listening_socket(self.config.host)
        port = sock.getsockname()[1]
        log_path = self.workdir / f"{spec.service}-{spec.role}-{index}-{port}.log"
        argv = [*self.config.engine_command, *spec.engine_args(port=port, host=self.config.host),
                "--listen-fd", str(sock.fileno())]
        env = self._environment(spec.env, gpu_env or {})
        address = self.zygote.address() if zygote and self.zygote is not None else None
        if address is not None:
            env[ZYGOTE_ENV] = address
        log_path.write_text(f"$ {' '.join(argv)}\n")
        try:
            proc = process.spawn(argv, log_path=log_path, env=env, cwd=str(self.workdir), pass_fds=(sock.fileno(),))
        finally:
            sock.close()   # the engine holds its own copy
        return Replica(proc, port, f"http://{self.config.host}:{port}", log_path)

    def _environment(self, spec_env: Mapping[str, str], gpu_env: Mapping[str, str]) -> dict[str, str]:
        """An engine's environment (config.engine_environment), the repository on its PYTHONPATH, its threads."""
        env = engine_environment(os.environ, self.config.env, spec_env, {"PYTHONUNBUFFERED": "1"}, gpu_env)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO_ROOT, env.get("PYTHONPATH")) if p)
        if self.config.cpu_threads is not None:
            for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TORCH_NUM_THREADS"):
                env[k] = str(self.config.cpu_threads)
        return env

    def stop(self, replicas: list[Replica]) -> None:
        for r in replicas:
            process.stop(r.proc, self.config.stop_timeout_s)

    def _probe(self, url: str) -> tuple[bool, str]:
        """One /readyz probe: (ready, the load error the engine reports or "")."""
        if self._http.is_closed:  # used again after close()
            self._http = httpx.Client(timeout=self.config.probe_timeout_s, trust_env=False)
        try:
            r = self._http.get(url + "/readyz")
        except httpx.HTTPError:
            return False, ""
        if r.status_code == 200:
            return True, ""
        try:
            body = r.json()
        except ValueError:
            return False, ""
        err = body.get("error") if isinstance(body, dict) and body.get("status") == "failed" else None
        return False, " ".join(str(err).split())[:300] if err else ""

    def ready(self, url: str) -> bool:
        """Whether the engine at url answers /readyz with 200 now (one probe, probe_timeout_s)."""
        return self._probe(url)[0]

    def status(self, role: str, spec: VariantSpec, replicas: list[Replica], weight: int,
               placement: Placement = Placement()) -> VariantStatus:
        """Probe every replica: ready, not ready (/readyz), or exited (with its exit code and log tail); where its
        engines run on GPUs, which (placement.describe())."""
        ready_n, exited, problems = 0, 0, []
        for i, r in enumerate(replicas):
            rc = r.proc.poll()
            if rc is not None:
                exited += 1
                problems.append(f"replica {i} (pid {r.proc.pid}) exited with code {rc}; "
                                f"log {r.log_path}:\n{log_tail(r.log_path, 800)}")
            elif self.ready(r.url):
                ready_n += 1
            else:
                problems.append(f"replica {i} at {r.url} not ready (/readyz)")
        want = len(replicas)
        msg = f"{ready_n}/{want} ready; weight {weight}%; kernels {spec.kernels}"
        if placement.describe():
            msg += f"; {placement.describe()}"
        if problems:
            msg += "; " + "; ".join(problems)
        return VariantStatus(role=role, ready=want > 0 and ready_n == want, replicas=want, ready_replicas=ready_n,
                             endpoint=replicas[0].url if replicas else None, message=msg,
                             endpoints=tuple(r.url for r in replicas), crashing=exited > 0)

    def replica_statuses(self, role: str, replicas: list[Replica],
                         placement: Placement = Placement()) -> list[ReplicaStatus]:
        """Each replica now: running and ready (/readyz), running, or exited with its code; its log's last line; the
        GPUs it sees (placement). A local engine is never restarted (restarts 0): one that exited stays so until the
        variant is deployed again."""
        out = []
        for i, r in enumerate(replicas):
            rc = r.proc.poll()
            out.append(ReplicaStatus(role=role, name=f"{role}-{i}", ready=rc is None and self.ready(r.url), restarts=0,
                                     state="running" if rc is None else f"exited {rc}",
                                     last_log_line=shown_log_line(without_probe_lines(_tail(r.log_path, 8192))),
                                     address=r.url, gpu_placement=placement.seen_as, gpus=placement.gpus(i),
                                     gpu_note=placement.describe(i)))
        return out

    def _check_cancelled(self, spec: VariantSpec) -> None:
        if self._cancelled.is_set():
            raise DeployCancelled(f"{spec.service}/{spec.role}: deploy cancelled (the deployer is shutting down)")

    def _wait_ready(self, spec: VariantSpec, r: Replica, started_at: float,
                    interrupted: Callable[[], bool] | None = None) -> None:
        """Until r answers /readyz; NotReadyError (its engine's own load error, else its last log line) once it
        exits, its /readyz says it failed to load, or the spec's readiness deadline (else
        LocalConfig.ready_timeout_s) has passed since its batch started; DeployInterrupted once `interrupted()`
        says so. Probes start 0.1 s apart and slow down to 1 s (an engine logs each one it answers)."""
        limit = spec.ready_timeout_s or self.config.ready_timeout_s
        pause, asked = PROBE_FIRST_S, time.monotonic()
        while True:
            self._check_cancelled(spec)
            if interrupted is not None and time.monotonic() - asked >= INTERRUPT_POLL_S:
                asked = time.monotonic()
                if interrupted():
                    raise DeployInterrupted(f"{spec.service}/{spec.role}: deploy interrupted after "
                                            f"{asked - started_at:.0f} s of its engines loading (an abort is queued)")
            rc = r.proc.poll()
            ready, failed = self._probe(r.url) if rc is None else (False, "")
            if ready:
                return
            if failed:   # the engine says it cannot load (an unknown model, ...): waiting longer changes nothing
                line = last_line(r.log_path)
                raise NotReadyError(f"{spec.service}/{spec.role}: engine failed to load: {failed}\nits last log line: "
                                    f"{line or '(none)'}\nlog {r.log_path}:\n{log_tail(r.log_path)}",
                                    waited_s=time.monotonic() - started_at, last_line=line, exit_code=None)
            if rc is not None or time.monotonic() - started_at > limit:
                waited = time.monotonic() - started_at
                line = last_line(r.log_path)
                if rc is not None and line.startswith(LOAD_FAILED):   # the engine's own words for why it exited
                    raise NotReadyError(f"{spec.service}/{spec.role}: engine failed to load: "
                                        f"{line[len(LOAD_FAILED):]} (it exited with code {rc})\n"
                                        f"log {r.log_path}:\n{log_tail(r.log_path)}",
                                        waited_s=waited, last_line=line, exit_code=rc)
                why = (f"engine exited with code {rc} before it was ready" if rc is not None
                       else f"engine not ready after {limit:g} s")
                raise NotReadyError(f"{spec.service}/{spec.role}: {why}; its last log line: {line or '(none)'}\n"
                                    f"log {r.log_path}:\n{log_tail(r.log_path)}",
                                    waited_s=waited, last_line=line, exit_code=rc)
            self._cancelled.wait(pause)
            pause = min(PROBE_MAX_S, pause * 1.5)


def last_line(path: Path, limit: int = 300) -> str:
    """The last non-empty line of a replica's log that is not an access line of a probe (what its engine said
    last, not that it answered /readyz), at most `limit` characters."""
    lines = [x.strip() for x in _tail(path, 8192).splitlines() if x.strip() and not is_probe_line(x)]
    return lines[-1][:limit] if lines else ""


def log_tail(path: Path, n: int = 2000) -> str:
    """The end of a replica's log for an error message: runs of repeated lines (probe access lines, ...) collapsed
    into one with a count, at most about n characters."""
    return collapse_repeats(_tail(path, 4 * n))[-n:]


def _tail(path: Path, n: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""
