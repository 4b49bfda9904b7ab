"""Low-traffic mode on CPU with the tiny model: the demo's machinery (real engines, router, worker, Poisson load), the
demo policy with and without `low_traffic`, at thin live rates.

    .venv/bin/python bench/low_traffic.py slow --rates 0.5 2          # the slow canary, mode on and off per rate
    .venv/bin/python bench/low_traffic.py aa --rollouts 20 --rate 2   # A/A (torch vs torch): false rollbacks?

`slow`: for each rate and mode, one rollout of torch-slow-attn; reports how it ended, the time from its first traffic
to the decision, which metrics failed in the deciding check, and the requests replayed to the canary (the baseline got
as many). `aa`: N rollouts of torch against production torch, one after the other behind one production engine,
with the mode on; a false rollback is any rollback (the canary is the production set). With `--replay-only`, checks
may pass on replayed load alone (`allow_replay_only`), which is what bounds a rollout's time at a thin live rate.
Prints one JSON line per rollout and a summary; `--out FILE` writes them as JSON.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sits.control_plane.demo.profiles import demo_policy  # noqa: E402
from sits.control_plane.demo.runner import DemoConfig, run_demo  # noqa: E402
from sits.control_plane.store.db import Store  # noqa: E402


def policy(on: bool, replay_only: bool = False, rate: float = 0.5):
    p = demo_policy(rate)
    return dataclasses.replace(p, low_traffic=dataclasses.replace(p.low_traffic, enabled=on,
                                                                  allow_replay_only=replay_only))


def rollouts(store_path: str) -> list[dict]:
    """What each rollout of a finished run did, read back from its store."""
    store = Store(store_path)
    try:
        out = []
        for r in sorted(store.list(active=False, limit=1000), key=lambda r: r.created_at):
            checks = store.checks(r.id)
            latency = [c for c in checks if c.get("source") != "correctness"]
            last = latency[-1] if latency else None
            failed = sorted({x["check"].split(":")[-1] for x in last["verdict"]["results"] if x["outcome"] == "fail"}
                            ) if last else []
            canary = (last or {}).get("variants", {}).get("canary", {})
            out.append({"rollout": r.id, "kernels": r.canary_kernels, "phase": r.phase.value,
                        "seconds_to_decision": None if r.started_at is None else round(r.phase_since - r.started_at, 1),
                        "checks": len(latency), "deciding_failed": failed,
                        "deciding_outcome": last["verdict"]["outcome"] if last else None,
                        "canary_requests": canary.get("requests"), "canary_replayed": canary.get("replayed", 0),
                        "replayed_total": r.replayed_requests, "reason": r.reason})
        return out
    finally:
        store.close()


def run(scenarios: tuple[str, ...], rate: float, pol, timeout_s: float) -> list[dict]:
    work = tempfile.mkdtemp(prefix="sits-bench-lt-")
    t0 = time.monotonic()
    res = run_demo(DemoConfig(workdir=work, scenarios=scenarios, rate=rate, policy=pol, rollout_timeout_s=timeout_s))
    rows = rollouts(res.store_path)
    for row in rows:
        row.update(rate=rate, low_traffic=pol.low_traffic.enabled, allow_replay_only=pol.low_traffic.allow_replay_only,
                   run_seconds=round(time.monotonic() - t0, 1))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("slow")
    s.add_argument("--rates", type=float, nargs="+", default=[0.5, 2.0])
    s.add_argument("--modes", choices=["on", "off"], nargs="+", default=["on", "off"])
    s.add_argument("--timeout", type=float, default=480.0, help="a rollout still running then is aborted")
    a = sub.add_parser("aa")
    a.add_argument("--rollouts", type=int, default=20)
    a.add_argument("--rate", type=float, default=2.0)
    a.add_argument("--replay-only", action="store_true")
    a.add_argument("--timeout", type=float, default=480.0)
    for p in (s, a):
        p.add_argument("--out", help="write the rows and the summary as JSON here")
    args = ap.parse_args(argv)
    rows: list[dict] = []
    if args.what == "slow":
        for rate in args.rates:
            for mode in args.modes:
                rows += run(("slow",), rate, policy(mode == "on", rate=rate), args.timeout)
        summary = [{k: r[k] for k in ("rate", "low_traffic", "phase", "seconds_to_decision", "deciding_failed",
                                      "replayed_total", "checks")} for r in rows]
    else:
        rows = run(("good",) * args.rollouts, args.rate, policy(True, args.replay_only, args.rate), args.timeout)
        rolled = [r for r in rows if r["phase"] != "succeeded"]
        summary = {"rollouts": len(rows), "promoted": len(rows) - len(rolled), "rolled_back": len(rolled),
                   "false_rollbacks": [r["reason"] for r in rolled],
                   "median_seconds": sorted(r["seconds_to_decision"] or 0 for r in rows)[len(rows) // 2] if rows
                   else None, "replayed_total": sum(r["replayed_total"] for r in rows)}
    print()
    for r in rows:
        print(json.dumps(r))
    print(json.dumps({"summary": summary, "cpus": os.cpu_count(), "python": platform.python_version()}, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "summary": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
