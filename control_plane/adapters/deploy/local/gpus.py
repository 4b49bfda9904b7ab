"""GPU placement of the local deployer's engines: each variant (a service's production, baseline or canary) gets GPUs
of its own while the machine has enough free -- `gpus_per_engine` (the tensor-parallel size) for every replica, each
replica its own set, handed over as CUDA_VISIBLE_DEVICES -- and shares every GPU, as all engines did before (time-
slicing, or CUDA MPS where its daemon runs), when it has not. `GpuPool` is the bookkeeping, no I/O; the list of GPUs
comes from outside: `visible_gpus()` (CUDA_VISIBLE_DEVICES where set, else nvidia-smi), or a test's list.

Deterministic: a variant takes, in the order the GPUs are listed, aligned blocks of `gpus_per_engine` starting at
block ROLES.index(role) * replicas (production from the first, the baseline after it, the canary after that), wrapping
round and skipping held blocks, then any free GPUs in order; so one service on 8 GPUs with 2 per engine is always
production 0,1, baseline 2,3, canary 4,5, whichever of the baseline and the canary (deployed together) asks first.
"""
from __future__ import annotations

import os
import subprocess
import threading
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from sits.control_plane.adapters.deploy import GPU_OWN as OWN, GPU_SHARED as SHARED
from sits.control_plane.rollout import ROLES

NONE = ""                                 # ReplicaStatus.gpu_placement of an engine not on GPUs
Sets = tuple[tuple[str, ...], ...]        # each replica's GPUs, in replica order


def visible_gpus(environ: Mapping[str, str] = os.environ,
                 smi: Callable[[], str | None] | None = None) -> tuple[str, ...]:
    """The GPUs this process may hand out: CUDA_VISIBLE_DEVICES's entries where it is set (indices or UUIDs, up to
    the first invalid one as CUDA reads it: "" or "-1" means none), else the indices `nvidia-smi` lists, else none.
    The control plane never imports torch, so nvidia-smi rather than torch.cuda.device_count()."""
    if "CUDA_VISIBLE_DEVICES" in environ:
        out = []
        for entry in environ["CUDA_VISIBLE_DEVICES"].split(","):
            entry = entry.strip()
            if not entry or entry.startswith("-"):
                break
            out.append(entry)
        return tuple(out)
    text = (smi or _nvidia_smi)()
    return tuple(line.strip() for line in (text or "").splitlines() if line.strip().isdigit())


def _nvidia_smi() -> str | None:
    try:
        proc = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def gpu_list(gpus: Sequence[str]) -> str:
    """"0-7" for a run of consecutive indices, else "0,2,5" (UUIDs as they are)."""
    if len(gpus) > 2 and all(g.isdigit() for g in gpus) \
            and [int(g) for g in gpus] == list(range(int(gpus[0]), int(gpus[0]) + len(gpus))):
        return f"{gpus[0]}-{gpus[-1]}"
    return ",".join(gpus)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a variant's engines run. `mode` OWN: `sets[i]` are replica i's GPUs, given to no other variant; SHARED:
    every engine sees every GPU the control plane sees (`visible`); NONE: not on GPUs (the CPU, or none listed).
    `note`: why it shares, in words. `sharers` (status time only): engines of other variants placed SHARED, which
    run on an OWN placement's GPUs too -- the first variant placed on a one-GPU machine holds that GPU, but the
    variants after it share it."""
    mode: str = NONE
    sets: Sets = ()
    visible: tuple[str, ...] = ()
    note: str = ""
    sharers: int = 0

    @property
    def seen_as(self) -> str:
        """ReplicaStatus.gpu_placement: SHARED also for GPUs of its own that engines placed SHARED run on."""
        return SHARED if self.mode == OWN and self.sharers else self.mode

    def env(self, replica: int) -> dict[str, str]:
        """Replica's extra environment: its own GPUs, or nothing (it inherits what the control plane sees)."""
        return {"CUDA_VISIBLE_DEVICES": ",".join(self.sets[replica])} if self.mode == OWN else {}

    def gpus(self, replica: int) -> tuple[str, ...]:
        return self.sets[replica] if self.mode == OWN else self.visible if self.mode == SHARED else ()

    def describe(self, replica: int | None = None) -> str:
        """In words, for one replica or (None) the whole variant: "GPUs 2,3 of its own", "shares GPUs 0-7 with the
        other engines: ..." or "" (not on GPUs)."""
        if self.mode == OWN and self.sets:
            sets = self.sets if replica is None else (self.sets[replica],)
            words = " | ".join(gpu_list(s) for s in sets)
            gpus = f"GPU{'s' if sum(map(len, sets)) > 1 else ''} {words}"
            if self.sharers:
                n = self.sharers
                return f"{gpus}, given to no other variant, but shared: {n} engine{'s' if n > 1 else ''} of other " \
                       f"variants run{'' if n > 1 else 's'} on every GPU"
            return f"{gpus} of its own"
        if self.mode == SHARED:
            return f"shares GPU{'s' if len(self.visible) > 1 else ''} {gpu_list(self.visible)} with the other " \
                   f"engines: {self.note}"
        return ""


class GpuPool:
    """The machine's GPUs and which variant holds which: (service, role) -> each replica's GPUs. A deploy reserves
    (its new engines' GPUs are taken while they start) and then commits (the variant holds them, what it held before
    goes back) or aborts (the reservation goes back, the variant keeps what it held). Thread-safe."""

    def __init__(self, devices: Sequence[str]) -> None:
        self.devices = tuple(devices)
        self._held: dict[tuple[str, str], Sets] = {}
        self._reserved: dict[tuple[str, str], Sets] = {}
        self._lock = threading.Lock()

    def reserve(self, service: str, role: str, per_engine: int, engines: int, prefer: Sets = ()) -> Placement:
        """GPUs for a (re)deploy of `engines` replicas of `per_engine` GPUs each: disjoint sets that no other
        variant holds or has reserved, or a SHARED placement (nothing reserved) when too few are free. What the
        variant holds now is free for it, and its own sets are taken first (a redeploy keeps its GPUs; the old
        engines stop once the new ones are ready); `prefer`: sets to take before those, even when another variant
        holds them (a promotion: production takes the canary's GPUs)."""
        key = (service, role)
        with self._lock:
            taken = {g for k, sets in (*self._held.items(), *self._reserved.items()) if k != key
                     for s in sets for g in s}
            free = [g for g in self.devices if g not in taken]
            chosen: list[tuple[str, ...]] = []
            for s in (*prefer, *self._held.get(key, ())):
                if len(chosen) < engines and len(s) == per_engine and s not in chosen \
                        and (s in prefer or all(g in free for g in s)):
                    chosen.append(tuple(s))
            used = {g for s in chosen for g in s}
            chosen += self._blocks([g for g in free if g not in used], per_engine, engines - len(chosen),
                                   ROLES.index(role) * engines)
            if len(chosen) < engines:
                self._reserved[key] = ()
                return Placement(SHARED, visible=self.devices,
                                 note=f"{engines} engine{'s' if engines > 1 else ''} × {per_engine} GPU"
                                      f"{'s' if per_engine > 1 else ''} needed, {len(free)} of "
                                      f"{len(self.devices)} free")
            self._reserved[key] = tuple(chosen)
            return Placement(OWN, tuple(chosen), self.devices)

    def reserve_none(self, service: str, role: str) -> None:
        """The variant's next engines take no GPUs of their own (the CPU, or a device pinned by hand)."""
        with self._lock:
            self._reserved[(service, role)] = ()

    def commit(self, service: str, role: str) -> None:
        """The reserved engines replaced the variant's old ones: it holds their GPUs now (and no others)."""
        with self._lock:
            sets = self._reserved.pop((service, role), ())
            if sets:
                self._held[(service, role)] = sets
            else:
                self._held.pop((service, role), None)

    def abort(self, service: str, role: str) -> None:
        with self._lock:
            self._reserved.pop((service, role), None)

    def release(self, service: str, role: str) -> None:
        """The variant is gone: its GPUs are free again (except those another variant holds too: a promotion's)."""
        with self._lock:
            self._held.pop((service, role), None)
            self._reserved.pop((service, role), None)

    def held(self, service: str, role: str) -> Sets:
        with self._lock:
            return self._held.get((service, role), ())

    def _blocks(self, free: list[str], n: int, want: int, start: int) -> list[tuple[str, ...]]:
        """`want` sets of `n` from `free`: aligned blocks of the device list from block `start` on (wrapping), then
        the remaining free GPUs n at a time in list order; fewer when there are not enough."""
        if want <= 0:
            return []
        blocks = [self.devices[i:i + n] for i in range(0, len(self.devices) - n + 1, n)]
        out: list[tuple[str, ...]] = []
        for i in range(len(blocks)):
            b = blocks[(start + i) % len(blocks)]
            if len(out) < want and all(g in free for g in b):
                out.append(b)
        rest = [g for g in free if all(g not in b for b in out)]
        while len(out) < want and len(rest) >= n:
            out.append(tuple(rest[:n]))
            rest = rest[n:]
        return out
