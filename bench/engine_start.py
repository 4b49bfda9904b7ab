"""What starting local engines costs, with and without the engine zygote (docs/deployers.md): the LocalDeployer
deploys N replicas of a service's production (`sits-engine serve --model tiny --kernels torch` on CPU) and, once
every one answers /readyz, this reads the wall time and the CPU seconds of every process it started (API servers,
engine cores, the zygote, multiprocessing's resource trackers) from /proc. Rounds alternate the two modes; the zygote
is started afresh each round, so its own start is counted in every zygote row.

    .venv/bin/python bench/engine_start.py                   # 4 replicas, 3 rounds a mode
    .venv/bin/python bench/engine_start.py --replicas 8 --rounds 2
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sits.control_plane.adapters.deploy import VariantSpec  # noqa: E402
from sits.control_plane.adapters.deploy.local.config import LocalConfig  # noqa: E402
from sits.control_plane.adapters.deploy.local.deployer import LocalDeployer  # noqa: E402

HZ = os.sysconf("SC_CLK_TCK")


def _descendants(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            parents[int(d)] = int(stat.rsplit(")", 1)[1].split()[1])
    out, frontier = [], [root]
    while frontier:
        kids = [p for p, pp in parents.items() if pp in frontier]
        out += kids
        frontier = kids
    return out


def _cpu_s(pids: list[int]) -> float:
    total = 0
    for p in pids:
        try:
            f = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(f[11]) + int(f[12])
    return total / HZ


def one_round(replicas: int, zygote: bool) -> tuple[float, float]:
    """(seconds until every replica answered /readyz, CPU seconds of every process started for them)."""
    with tempfile.TemporaryDirectory(prefix="sits-bench-start-") as work:
        cfg = LocalConfig(workdir=work, cpu_threads=1, gpu_devices=(), engine_zygote=zygote,
                          max_replicas=replicas)
        with LocalDeployer(cfg) as d:
            t0 = time.perf_counter()
            d.deploy(VariantSpec(service="bench-start", role="production", kernels="torch", replicas=replicas,
                                 device="cpu"))
            wall = time.perf_counter() - t0
            cpu = _cpu_s(_descendants(os.getpid()))
            logs = "".join(p.read_text() for p in Path(work).glob("bench-start-*.log"))
            forked = logs.count("forked by the engine zygote")
            if forked != (replicas if zygote else 0):
                raise SystemExit(f"expected {replicas if zygote else 0} forked cores, the logs say {forked}")
    return wall, cpu


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    rows: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for r in range(a.rounds):
        for zygote in ((False, True) if r % 2 == 0 else (True, False)):
            wall, cpu = one_round(a.replicas, zygote)
            rows[zygote].append((wall, cpu))
            print(f"round {r + 1}, {'zygote' if zygote else 'spawn '}: {a.replicas} engines ready in {wall:5.2f} s, "
                  f"{cpu:5.2f} CPU-s", flush=True)
    print(f"\n{a.replicas} tiny CPU engines through the LocalDeployer, {a.rounds} rounds a mode "
          f"({os.cpu_count()} CPUs here)")
    print("| cores started by | ready, s (median) | CPU-s, all processes (median) | CPU-s an engine |")
    print("|---|---:|---:|---:|")
    for zygote in (False, True):
        wall = statistics.median(w for w, _ in rows[zygote])
        cpu = statistics.median(c for _, c in rows[zygote])
        print(f"| {'the zygote (fork)' if zygote else 'each API server (spawn)'} | {wall:.2f} | {cpu:.2f} | "
              f"{cpu / a.replicas:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
