"""Why do identical engines differ on one GPU? Three `sits-engine serve` processes with the same kernels, model and
flags (the GPU demo's), each fed the same seeded request stream at the same time; their inter-token and first-token
latency compared window by window, under several placements:

  shared    the engines' CPUs not set (what the local deployer did): the OS places their threads on any core
  pinned    each engine on cores of its own (sched_setaffinity at spawn), the load generators on the rest

and, for each, two start orders (A B C, then C B A: a persistent offset that follows the start position is the
start order's; one that changes with the placement is the CPUs'). The offset of an engine is the mean over 5 s
windows of log(its window P90 / the geometric mean of the three), with a t interval over windows; the spread is the
largest offset minus the smallest. Prints a table last; `--json PATH` keeps the per-window numbers.

  python3 bench/replica_offset.py [--device cuda] [--seconds 50] [--rate 10] [--json out.json]

Needs the engine's packages (torch, Triton on a GPU); the load generator and the histogram arithmetic are the
control plane's own (control_plane/demo/loadgen.py, control_plane/analysis/histogram.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from sits.control_plane.adapters.metrics.scrape import parse_exposition
from sits.control_plane.demo.loadgen import LoadGenerator
from sits.control_plane.demo.profiles import GPU, GPU_MIX, DEMO_MIX
from sits.wire.metrics import ITL, TTFT

WINDOW_S = 5.0
T95 = {2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23}


@dataclass
class Engine:
    name: str
    port: int
    proc: subprocess.Popen
    cpus: list[int] | None
    windows: dict[str, list[float]] = field(default_factory=lambda: {ITL: [], TTFT: []})
    last: object = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_engine(name: str, device: str, cpus: list[int] | None, log_dir: Path) -> Engine:
    port = free_port()
    args = [sys.executable, "-m", "sits.engine.cli", "serve", "--model", "tiny", "--device", device,
            "--kernels", "triton-v1" if device == "cuda" else "torch", "--port", str(port), "--env", "aa",
            "--service", f"replica-{name}", "--no-access-log", "--log-level", "warning",
            *(GPU.engine_args if device == "cuda" else ())]
    env = {**os.environ, "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "TORCH_NUM_THREADS": "2"}
    log = open(log_dir / f"engine-{name}-{port}.log", "wb")
    preexec = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=preexec)
    return Engine(name, port, proc, cpus)


def wait_ready(e: Engine, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if e.proc.poll() is not None:
            raise RuntimeError(f"engine {e.name} exited with code {e.proc.returncode}")
        try:
            if httpx.get(e.url + "/readyz", timeout=2, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"engine {e.name} not ready after {timeout:g} s")


def scrape(e: Engine) -> object:
    text = httpx.get(e.url + "/metrics", timeout=10, trust_env=False).text
    return parse_exposition(text, None, [ITL, TTFT])


def offsets(engines: list[Engine], metric: str) -> list[tuple[float, float, int]]:
    """Per engine: (mean log ratio to the windows' geometric mean, t half-width, windows), in percent."""
    n = min(len(e.windows[metric]) for e in engines)
    rows = []
    per = [[math.log(e.windows[metric][i]) for i in range(n)] for e in engines]
    centre = [statistics.fmean(col) for col in zip(*per)]
    for xs in per:
        d = [x - c for x, c in zip(xs, centre)]
        if len(d) < 2:
            rows.append((math.nan, math.nan, len(d)))
            continue
        m, sd = statistics.fmean(d), statistics.stdev(d)
        half = T95.get(len(d) - 1, 2.0) * sd / math.sqrt(len(d))
        rows.append((100 * (math.exp(m) - 1), 100 * half, len(d)))
    return rows


def run_condition(label: str, order: list[str], placement: dict[str, list[int] | None], device: str,
                  seconds: float, rate: float, log_dir: Path, loadgen_cpus: list[int] | None) -> dict:
    print(f"[{label}] starting engines in order {' '.join(order)} ...", flush=True)
    engines: list[Engine] = []
    try:
        for name in order:   # one after another, as production starts before baseline and canary
            e = start_engine(name, device, placement[name], log_dir)
            engines.append(e)
            wait_ready(e)
        engines.sort(key=lambda e: e.name)
        mix = GPU_MIX if device == "cuda" else DEMO_MIX
        if loadgen_cpus:
            os.sched_setaffinity(0, loadgen_cpus)
        loads = [LoadGenerator(e.url, rate, 32, mix=mix, seed=7, model="tiny").start() for e in engines]
        time.sleep(8)   # warm: queues and caches settle
        for e in engines:
            e.last = scrape(e)
        t_end = time.monotonic() + seconds
        while time.monotonic() < t_end:
            time.sleep(WINDOW_S)
            for e in engines:
                now = scrape(e)
                for metric in (ITL, TTFT):
                    old, new = e.last.histograms.get(metric), now.histograms.get(metric)
                    if old is not None and new is not None:
                        w = new.delta(old)
                        e.windows[metric].append(w.quantile(0.9) if w.total >= (20 if metric == ITL else 5) else math.nan)
                e.last = now
        for load in loads:
            load.stop(20)
        # windows where any engine had too few tokens are dropped for all
        keep = [i for i in range(min(len(e.windows[ITL]) for e in engines))
                if all(not math.isnan(e.windows[m][i]) for e in engines for m in (ITL, TTFT))]
        for e in engines:
            for m in (ITL, TTFT):
                e.windows[m] = [e.windows[m][i] for i in keep]
        start_pos = {name: i + 1 for i, name in enumerate(order)}
        result = {"label": label, "order": order, "engines": []}
        itl, ttft = offsets(engines, ITL), offsets(engines, TTFT)
        for e, (io, ih, n), (to, th, _) in zip(engines, itl, ttft):
            result["engines"].append({"name": e.name, "start": start_pos[e.name], "cpus": e.cpus, "windows": n,
                                      "itl_p90_offset_pct": io, "itl_half_pct": ih,
                                      "ttft_p90_offset_pct": to, "ttft_half_pct": th,
                                      "itl_p90_ms": [1000 * x for x in e.windows[ITL]]})
        return result
    finally:
        for e in engines:
            e.proc.terminate()
        for e in engines:
            try:
                e.proc.wait(20)
            except subprocess.TimeoutExpired:
                e.proc.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seconds", type=float, default=50.0, help="measured seconds per condition")
    ap.add_argument("--rate", type=float, default=10.0, help="requests/s to each engine")
    ap.add_argument("--json", default=None)
    ap.add_argument("--log-dir", default="/tmp/replica-offset")
    a = ap.parse_args()
    log_dir = Path(a.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    cpus = sorted(os.sched_getaffinity(0))
    per = max(1, (len(cpus) - 4) // 3)
    pinned = {n: cpus[i * per:(i + 1) * per] for i, n in enumerate("ABC")}
    engine_cpus = cpus[:3 * per]
    loadgen_cpus = cpus[3 * per:] or None
    shared = {n: engine_cpus for n in "ABC"}
    print(f"{len(cpus)} CPUs; pinned: {per} per engine, load generators on {loadgen_cpus}", flush=True)
    results = []
    for label, placement in (("shared", shared), ("pinned", pinned)):
        for order in (["A", "B", "C"], ["C", "B", "A"]):
            results.append(run_condition(label, order, placement, a.device, a.seconds, a.rate, log_dir,
                                         loadgen_cpus))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    print()
    print("| placement | start order | engine (start position) | windows | ITL P90 offset | TTFT P90 offset |")
    print("|---|---|---|---|---|---|")
    for r in results:
        for e in r["engines"]:
            print(f"| {r['label']} | {' '.join(r['order'])} | {e['name']} ({e['start']}) | {e['windows']} | "
                  f"{e['itl_p90_offset_pct']:+.1f} % ±{e['itl_half_pct']:.1f} | "
                  f"{e['ttft_p90_offset_pct']:+.1f} % ±{e['ttft_half_pct']:.1f} |")
    print()
    for r in results:
        o = [e["itl_p90_offset_pct"] for e in r["engines"]]
        print(f"{r['label']:>7} {' '.join(r['order'])}: ITL P90 spread {max(o) - min(o):.1f} points")
    return 0


if __name__ == "__main__":
    sys.exit(main())
