"""The GPU demo's short table, from its store (sits-demo.db), its log and a GPU-memory sample file:

    python3 bench/gpu_demo_report.py STORE DEMO_LOG GPUMEM_CSV

Per rollout (oldest first, its lane's service with `--parallel`): kernels, outcome, checks, seconds from creation to
the deciding check, the deciding check's deltas with their intervals (or the correctness gate's verdict), requests
answered/failed per variant and client TTFT/ITL P50/P99 as the demo printed them; the engines' own peak allocator
memory per role (as the demo printed it), then nvidia-smi's per-process peaks (CUDA contexts included, roles unknown);
last, the decisions per scenario over every lane (an A/A campaign's count of false rollbacks).
"""
from __future__ import annotations

import csv
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sits.control_plane.adapters.deploy.engine_args import flag_changes  # noqa: E402
from sits.control_plane.demo.profiles import GPU_SCENARIOS, SCENARIOS  # noqa: E402
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


def per_lane(log: str, pattern: str, services: list[str]) -> dict[str, list[str]]:
    """What `pattern` (one group) caught in the demo's log, in order, per service: a lane prefixes its lines with
    `[service] `; with one lane (no prefix) every line is its."""
    caught: dict[str, list[str]] = defaultdict(list)
    for line in log.splitlines():
        m = re.search(pattern, line)
        if m:
            svc = next((s for s in services if f"] [{s}] " in line), services[0] if len(services) == 1 else "?")
            caught[svc].append(m.group(1))
    return caught


def canary_of(r, spec) -> str:
    """A rollout's canary as the demo names it: its kernel set and the flags it changes."""
    return " ".join((r.canary_kernels, *spec.changed_flags()))


def scenario_of(kernels: str, production: str = "", flags: list[str] | None = None) -> tuple[str, str]:
    """(scenario name, expected phase) of a canary's kernel set and changed flags (DeploySpec.changed_flags; the GPU
    demo's, else the CPU demo's), else (kernels, ?)."""
    for table in (GPU_SCENARIOS, SCENARIOS):
        sc = next((s for s in table.values() if s.canary_kernels(production or kernels) == kernels
                   and flag_changes((), s.canary_args) == (flags or [])), None)
        if sc is not None:
            return sc.name, sc.expected.value
    return kernels, "?"


def decisions(rollouts, specs: dict | None = None) -> list[str]:
    """One line per scenario: its runs, how the decided ones ended and how many as expected (an A/A run rolled back
    is a false rollback), and those still running when the demo stopped (its timeout). `specs`: rollout id -> its
    DeploySpec (to tell a flag release such as kvfp8 from an A/A run of the same set)."""
    runs: dict[tuple[str, str, str], Counter] = defaultdict(Counter)
    for r in rollouts:
        flags = specs[r.id].changed_flags() if specs and r.id in specs else []
        key = (" ".join((r.canary_kernels, *flags)), *scenario_of(r.canary_kernels, r.production_kernels, flags))
        runs[key]["unfinished" if r.active else r.phase.value] += 1
    lines = [f"{'scenario':8} {'canary':22} {'runs':>4} {'promoted':>8} {'rolled back':>11} {'other':>5} "
             f"{'unfinished':>10}  as expected"]
    for (kernels, name, expected), n in sorted(runs.items(), key=lambda kv: kv[0][1]):
        total, done = sum(n.values()), sum(n.values()) - n["unfinished"]
        lines.append(f"{name:8} {kernels:22} {total:4d} {n['succeeded']:8d} {n['rolled_back']:11d} "
                     f"{done - n['succeeded'] - n['rolled_back']:5d} {n['unfinished']:10d}  {n[expected]}/{done}")
    return lines


def main(store_path: str, log_path: str, mem_path: str) -> int:
    log = Path(log_path).read_text(errors="replace") if Path(log_path).is_file() else ""
    with Store(store_path) as s:
        rollouts = sorted(s.list(active=None), key=lambda r: r.created_at)
        services = sorted({r.service for r in rollouts})
        loads = per_lane(log, r"scenario load: (.*)", services)
        lats = per_lane(log, r"client TTFT p50/p99, ITL p50/p99 \(ms\): (.*)", services)
        mems = per_lane(log, r"GPU memory per engine \(peak held by its CUDA allocator[^:]*: (.*)", services)
        width = max(map(len, services)) if len(services) > 1 else 0   # a lane column with --parallel
        print(f"{'#':>2}{' ' + 'lane'.ljust(width) if width else ''} {'canary':22} {'outcome':12} {'checks':>6} "
              f"{'decided s':>9}  deciding evidence")
        seen: Counter = Counter()   # the rollouts of each service so far: its i-th matches its lane's i-th lines
        specs: dict = {}
        for i, r in enumerate(rollouts):
            checks = s.checks(r.id)
            last = checks[-1] if checks else None
            t = f"{last['at'] - r.created_at:9.0f}" if last else "        -"
            j = seen[r.service]
            seen[r.service] += 1
            tag = " " + r.service.ljust(width) if width else ""
            specs[r.id] = s.spec(r.id)
            print(f"{i + 1:2d}{tag} {canary_of(r, specs[r.id]):22} {r.phase.value:12} {r.checks:6d} {t}  "
                  f"{deciding(last) if last else r.reason[:120]}")
            for label, lines in (("load", loads), ("client TTFT/ITL p50/p99 ms", lats),
                                 ("GPU memory (engine allocators, peak)", mems)):
                if j < len(lines[r.service]):
                    print(f"{'':3}{label}: {lines[r.service][j]}")
        counted = decisions(rollouts, specs)
    # nvidia-smi's per-process figures include each CUDA context; its pids are the host's, so no roles
    peak: dict[str, int] = defaultdict(int)
    if Path(mem_path).is_file():
        for row in csv.reader(open(mem_path)):
            if len(row) >= 4 and row[2].strip().isdigit():
                peak[row[1].strip()] = max(peak[row[1].strip()], int(row[2]))
    print(f"GPU memory per process (nvidia-smi, context included): {len(peak)} processes, peak "
          + (f"{min(peak.values())}-{max(peak.values())} MiB" if peak else "not visible"))
    print(f"decisions per scenario ({len(rollouts)} rollouts, {len(services)} lane(s)):")
    for line in counted:
        print("  " + line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:4]))
