"""The GPU demo's short table, from its store (sits-demo.db), its log and a GPU-memory sample file:

    python3 bench/gpu_demo_report.py STORE DEMO_LOG GPUMEM_CSV

Per rollout (oldest first): kernels, outcome, checks, seconds from creation to the deciding check, the deciding
check's deltas with their intervals (or the correctness gate's verdict), requests answered/failed per variant and
client TTFT/ITL P50/P99 as the demo printed them; the engines' own peak allocator memory per
role (as the demo printed it), then nvidia-smi's per-process peaks (CUDA contexts included, roles unknown).
"""
from __future__ import annotations

import csv
import re
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sits.control_plane.store.db import Store  # noqa: E402


def _pct(x) -> str:
    return "-" if not isinstance(x, (int, float)) else f"{x * 100:+.1f}%"


def deciding(check: dict) -> str:
    v = check["verdict"]
    if v.get("correctness"):
        c = v["correctness"]
        return f"correctness {c['outcome']}: {c.get('reason', '')[:110]}"
    parts = []
    for r in v.get("results", []):
        if r.get("delta_rel") is not None:
            name = r["check"].replace("sits_inter_token_latency_seconds", "ITL").replace(
                "http_request_duration_seconds", "req")
            parts.append(f"{name} {_pct(r['delta_rel'])} [{_pct(r.get('ci_low'))}, {_pct(r.get('ci_high'))}] "
                         f"{r['outcome']}")
    return "; ".join(parts) or v.get("reason", "")[:120]


def main(store_path: str, log_path: str, mem_path: str) -> int:
    log = Path(log_path).read_text(errors="replace") if Path(log_path).is_file() else ""
    loads = re.findall(r"scenario load: (.*)", log)
    lats = re.findall(r"client TTFT p50/p99, ITL p50/p99 \(ms\): (.*)", log)
    mems = re.findall(r"GPU memory per engine \(peak held by its CUDA allocator[^:]*: (.*)", log)
    with Store(store_path) as s:
        rollouts = sorted(s.list(active=None), key=lambda r: r.created_at)
        print(f"{'#':>2} {'canary':22} {'outcome':12} {'checks':>6} {'decided s':>9}  deciding evidence")
        for i, r in enumerate(rollouts):
            checks = s.checks(r.id)
            last = checks[-1] if checks else None
            t = f"{last['at'] - r.created_at:9.0f}" if last else "        -"
            print(f"{i + 1:2d} {r.canary_kernels:22} {r.phase.value:12} {r.checks:6d} {t}  "
                  f"{deciding(last) if last else r.reason[:120]}")
            if i < len(loads):
                print(f"{'':3}load: {loads[i]}")
            if i < len(lats):
                print(f"{'':3}client TTFT/ITL p50/p99 ms: {lats[i]}")
            if i < len(mems):
                print(f"{'':3}GPU memory (engine allocators, peak): {mems[i]}")
    # nvidia-smi's per-process figures include each CUDA context; its pids are the host's, so no roles
    peak: dict[str, int] = defaultdict(int)
    if Path(mem_path).is_file():
        for row in csv.reader(open(mem_path)):
            if len(row) >= 4 and row[2].strip().isdigit():
                peak[row[1].strip()] = max(peak[row[1].strip()], int(row[2]))
    print(f"GPU memory per process (nvidia-smi, context included): {len(peak)} processes, peak "
          + (f"{min(peak.values())}-{max(peak.values())} MiB" if peak else "not visible"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:4]))
