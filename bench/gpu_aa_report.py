"""The sequential-statistics GPU runs' table, from the stores of several `sits-control demo --device cuda` runs:

    python3 bench/gpu_aa_report.py STORE [STORE ...]

Per rollout: canary kernels, outcome, seconds from its first traffic to the decision (started_at -> the deciding
check), the deciding (or last) latency check's ITL P90 effect with its confidence sequence and windows, and a count
of A/A runs (canary = production kernels) that were rolled back: every one of those is a false rollback.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sits.control_plane.store.db import Store  # noqa: E402


def _pct(x) -> str:
    return "-" if not isinstance(x, (int, float)) else f"{x * 100:+.1f}%"


def main(paths: list[str]) -> int:
    rows, aa, aa_rb, effects = [], 0, 0, []
    for path in paths:
        store = Store(path)
        for r in sorted(store.list(), key=lambda r: r.created_at):
            checks = [c for c in store.checks(r.id) if c["source"] != "correctness"]
            last = checks[-1] if checks else None
            res = next((x for x in (last or {}).get("verdict", {}).get("results", [])
                        if x["check"].startswith("sits_inter_token_latency_seconds:p90")), None)
            t = (last["at"] - r.started_at) if last and r.started_at else None
            same = r.canary_kernels == r.production_kernels
            aa += same
            aa_rb += same and r.phase.value != "succeeded"
            if same and res and res.get("delta_rel") is not None:
                effects.append(res["delta_rel"])
            seq = f"{_pct(res.get('delta_rel'))} [{_pct(res.get('ci_low'))}, {_pct(res.get('ci_high'))}] " \
                  f"{res.get('windows')} windows" if res else "-"
            rows.append((Path(path).parent.name, r.canary_kernels, r.phase.value, "-" if t is None else f"{t:.0f}",
                         len(checks), seq, (r.reason or "")[:90]))
        store.close()
    print("| demo | canary | outcome | s to decide | checks | ITL P90 effect [sequence] | reason |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(str(x) for x in row) + " |")
    if effects:
        effects.sort()
        print(f"\nA/A runs: {aa}, not promoted: {aa_rb}; ITL P90 effect (replica offset) from {_pct(effects[0])} to "
              f"{_pct(effects[-1])}, median {_pct(effects[len(effects) // 2])}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
