"""Why a P99 check can stay undecided: the quantile sits on a cliff between two modes of the latency.

Inter-token latency has two modes when prefill chunks share steps with decodes: plain decode steps, and the steps
that carry a prefill chunk (several times slower). When the slow mode holds about 1 % of the tokens, a window's P99
lands in one mode or the other depending on how many prefill chunks fell into that window, so the per-window log
ratios that the sequential statistics average (control_plane/analysis/sequential.py) jump by 1-1.5 in a few windows
and the confidence sequence narrows slowly. Two parts:

    .venv/bin/python bench/tail_cliff.py --store sits-demo.db [--rollout ID]   # replay a rollout's checks
    .venv/bin/python bench/tail_cliff.py --simulate --runs 200    # the product's estimator and a pooled one

--store: each check's evidence holds both arms' histograms since the step's start; their differences are the check
intervals, each taken as one window (as in the GPU demo, where every interval holds thousands of samples; at thin
traffic the product's windows span several intervals, so its sequence has fewer windows than shown). Per interval
the two arms' P90 / P99 and the slow mode's share (samples above --gap-s), then the spread of the per-window log
ratios, the pooled quantiles' ratio, and what a pooled estimator (the step's quantile ratio, its variance from
delete-one-window jackknife pseudo-values fed to the same sequence) would have said at each look.

--simulate: two arms whose windows are drawn from the two-mode model the replay fits (clustered slow-mode tokens:
--events prefill events per window, each hitting a gamma-distributed number of tokens), through the product's
`estimate()` with the GPU demo's P99 boundaries (ship +25 %, limit +50 %) and its alpha share; each run decides
with the per-window estimator and with the pooled one. It counts wrong decisions (a rollback at no effect, a
promotion at the limit) against alpha: an estimator that decides faster but breaks alpha is not a fix.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.sequential_sim import clopper_pearson_upper  # noqa: E402
from sits.control_plane.analysis import HistogramSnapshot  # noqa: E402
from sits.control_plane.analysis.quantile import quantile_sorted  # noqa: E402
from sits.control_plane.analysis.sequential import estimate  # noqa: E402
from sits.wire.buckets import LATENCY_BUCKETS  # noqa: E402

ITL = "sits_inter_token_latency_seconds"
BOUNDS = tuple(LATENCY_BUCKETS) + (math.inf,)
EDGES = np.array(LATENCY_BUCKETS)
SHIP, LIMIT = math.log(1.25), math.log(1.5)   # the GPU demo policy's ITL P99 boundaries
ALPHA = 0.05 / 4                              # its alpha over its four checks (the simulation's)


def _q(per_bucket: np.ndarray, q: float) -> float:
    return quantile_sorted(q, BOUNDS, np.cumsum(per_bucket))


def _log_ratio(c: np.ndarray, t: np.ndarray, q: float) -> float:
    return math.log(_q(c, q) / _q(t, q))


def per_window(c: np.ndarray, t: np.ndarray, q: float) -> list[float]:
    """The product's window values: log(canary q / target q) of each window (rows of c and t)."""
    return [_log_ratio(ci, ti, q) for ci, ti in zip(c, t)]


def pooled_pseudo(c: np.ndarray, t: np.ndarray, q: float) -> tuple[float, list[float]]:
    """The pooled quantiles' log ratio over all windows, and its delete-one-window jackknife pseudo-values (their
    mean is the bias-corrected estimate, their spread its variance: windows are the independent units)."""
    k, cs, ts = len(c), c.sum(0), t.sum(0)
    pooled = _log_ratio(cs, ts, q)
    return pooled, [k * pooled - (k - 1) * _log_ratio(cs - ci, ts - ti, q) for ci, ti in zip(c, t)]


def _pct(x: float) -> str:
    return f"{math.expm1(x) * 100:+.1f}"


# -- replay ------------------------------------------------------------------------------------------------------

class ReplayError(ValueError):
    """The store has nothing to replay (no such rollout, no latency checks of the metric)."""


def intervals(store_path: str, metric: str, rollout_id: str | None = None
              ) -> tuple[object, np.ndarray, np.ndarray, list[float]]:
    """One rollout's check intervals of one histogram (the newest rollout unless `rollout_id`): the rollout, and the
    canary's and its target's (the policy's compare_to) per-bucket counts per interval, with each interval's end
    (seconds from its step's first data)."""
    from sits.control_plane.store.db import Store
    from sits.control_plane.store.queues import RolloutNotFoundError
    store = Store(store_path, readonly=True)
    try:
        if rollout_id is None:
            newest = store.list(limit=1)
            if not newest:
                raise ReplayError(f"{store_path}: no rollouts")
            r = newest[0]
        else:
            try:
                r = store.get(rollout_id)
            except RolloutNotFoundError:
                raise ReplayError(f"{store_path}: no rollout {rollout_id!r}") from None
        target, checks, seq = r.policy.compare_to, [], 0
        while True:   # every check, a page at a time
            page = store.checks(r.id, since_seq=seq)
            if not page:
                break
            seq = page[-1]["seq"]
            checks += [e for e in page if e.get("window_start") and all(
                metric in e.get("variants", {}).get(role, {}).get("histograms", {}) for role in ("canary", target))]
    finally:
        store.close()
    rows_c, rows_t, ends, prev = [], [], [], None
    for e in checks:
        cur = {role: np.array(HistogramSnapshot.from_dict(e["variants"][role]["histograms"][metric]).per_bucket())
               for role in ("canary", target)}
        if prev is not None and prev[0] == e["window_start"]:   # the same step: the checks' data accumulate
            rows_c.append(cur["canary"] - prev[1]["canary"])
            rows_t.append(cur[target] - prev[1][target])
        else:
            rows_c.append(cur["canary"])
            rows_t.append(cur[target])
        ends.append(e["at"] - e["window_start"])
        prev = (e["window_start"], cur)
    return r, np.array(rows_c), np.array(rows_t), ends


def replay(path: str, metric: str, gap_s: float, rollout_id: str | None = None) -> int:
    try:
        r, c, t, ends = intervals(path, metric, rollout_id)
    except ReplayError as e:
        print(e, file=sys.stderr)
        return 1
    keep = (c.sum(1) > 0) & (t.sum(1) > 0)   # an interval without samples on an arm has no quantile
    dropped = int((~keep).sum())
    c, t, ends = c[keep], t[keep], [e for e, k in zip(ends, keep) if k]
    if len(c) < 2:
        print(f"{path}: rollout {r.id} has fewer than two check intervals of {metric} with samples on both arms",
              file=sys.stderr)
        return 1
    # the rollout's own alpha share (over its checks; one series each) and its windows before a decision
    alpha, min_windows = r.policy.alpha / len(r.policy.checks), r.policy.min_windows
    name = f"rollout {r.id} ({r.canary_kernels} vs {r.production_kernels}, canary against {r.policy.compare_to})"
    slow = EDGES >= gap_s
    slow = np.append(slow, True)
    print(f"{path}: {name}, {len(c)} check intervals of {metric}; slow mode = above {gap_s * 1e3:g} ms; sequences "
          f"at alpha {alpha:.4f}, {min_windows} windows first (the rollout's policy)"
          + (f"; {dropped} intervals without samples on an arm left out" if dropped else ""))
    print(" interval  s  samples  canary P90 / P99 / slow share   baseline P90 / P99 / slow share   log P99 ratio")
    for i, (ci, ti) in enumerate(zip(c, t)):
        sc, st = ci[slow].sum() / ci.sum(), ti[slow].sum() / ti.sum()
        print(f"  {i + 1:7d} {ends[i]:4.0f} {ci.sum():8.0f}  {_q(ci, .9) * 1e3:5.2f} / {_q(ci, .99) * 1e3:5.2f} ms / "
              f"{sc:6.2%}        {_q(ti, .9) * 1e3:5.2f} / {_q(ti, .99) * 1e3:5.2f} ms / {st:6.2%}     "
              f"{_log_ratio(ci, ti, .99):+.2f}")
    share = np.concatenate([c[:, slow].sum(1) / c.sum(1), t[:, slow].sum(1) / t.sum(1)])
    print(f"slow-mode share per arm and interval: mean {share.mean():.2%}, sd {share.std(ddof=1):.2%}, "
          f"{(share > 0.01).sum()} of {len(share)} above 1 %")
    for q in (0.9, 0.99, 0.999):
        xs = per_window(c, t, q)
        pooled, pv = pooled_pseudo(c, t, q)
        print(f"P{q * 100:g}: per-window log ratios mean {np.mean(xs):+.3f} sd {np.std(xs, ddof=1):.3f}; pooled "
              f"{_pct(pooled)} %, jackknife pseudo-values sd {np.std(pv, ddof=1):.3f}")
        for n in sorted({min_windows, 12, 16, 20, len(c)}):
            if n > len(c):
                continue
            e1 = estimate(xs[:n], alpha, min_windows)
            p, ps = pooled_pseudo(c[:n], t[:n], q)
            e2 = estimate(ps, alpha, min_windows)
            print(f"   after {n:2d} windows: per-window {_pct(e1.mean)} % [{_pct(e1.lower)}, {_pct(e1.upper)}]   "
                  f"pooled {_pct(p)} % [{_pct(e2.lower)}, {_pct(e2.upper)}]")
    return 0


# -- simulation --------------------------------------------------------------------------------------------------

def window(rng, scale: float, a: argparse.Namespace) -> np.ndarray:
    """One arm's window: per-bucket counts of its inter-token latencies under the two-mode model."""
    n = int(rng.poisson(a.tokens))
    events = int(rng.poisson(a.events))
    per_event = a.share * a.tokens / a.events
    m = min(n, int(rng.gamma(a.event_shape, per_event / a.event_shape, size=events).sum()))
    load = math.exp(a.load_sd * rng.standard_normal())
    fast = a.fast_ms * 1e-3 * np.exp(a.fast_sigma * rng.standard_normal(n - m))
    slow = a.slow_ms * 1e-3 * np.exp(a.slow_sigma * rng.standard_normal(m) + a.slow_load_sd * rng.standard_normal())
    lat = np.concatenate([fast, slow]) * load * scale
    return np.bincount(np.searchsorted(EDGES, lat), minlength=len(BOUNDS)).astype(float)


def decide(xs: list[float], min_windows: int) -> str | None:
    e = estimate(xs, ALPHA, min_windows)
    if e.lower > SHIP:
        return "rollback"
    if e.upper < LIMIT:
        return "promote"
    return None


def one_run(rng, effect: float, q: float, a: argparse.Namespace) -> dict[str, tuple[str, int]]:
    c, t, out = [], [], {}
    for n in range(1, a.windows + 1):
        c.append(window(rng, 1.0 + effect, a))
        t.append(window(rng, 1.0, a))
        if n < a.min_windows:
            continue
        cn, tn = np.array(c), np.array(t)
        for name in ("per-window", "pooled"):
            if name in out:
                continue
            xs = per_window(cn, tn, q) if name == "per-window" else pooled_pseudo(cn, tn, q)[1]
            d = decide(xs, a.min_windows)
            if d:
                out[name] = (d, n)
        if len(out) == 2:
            break
    return out


def simulate(a: argparse.Namespace) -> int:
    print(f"two-mode ITL: fast {a.fast_ms} ms (sigma {a.fast_sigma}), slow {a.slow_ms} ms (sigma {a.slow_sigma}) "
          f"x a per-window factor (sd {a.slow_load_sd}) holding {a.share:.2%} of {a.tokens} tokens a window in "
          f"~{a.events} events; per-window load sd "
          f"{a.load_sd}; P{a.quantile * 100:g} checked, boundaries ship +25 % / limit +50 %, alpha {ALPHA:.4f}; "
          f"{a.runs} runs a case")
    rng = np.random.default_rng(a.seed)
    c = np.array([window(rng, 1.0, a) for _ in range(400)])
    t = np.array([window(rng, 1.0, a) for _ in range(400)])
    slow = np.append(EDGES >= a.gap_s, True)
    share = c[:, slow].sum(1) / c.sum(1)
    sds = ", ".join(f"P{q * 100:g} {np.std(per_window(c, t, q), ddof=1):.3f}" for q in (0.9, 0.99, 0.999))
    print(f"the model's A/A windows (400): per-window log ratio sd {sds}; slow share sd {share.std(ddof=1):.2%}, "
          f"{(share > 0.01).mean():.0%} of windows above 1 %")
    print(f"| P{a.quantile * 100:g}, slow share {a.share:.2%} | estimator | rolled back | promoted | undecided | "
          "windows to decide (median / P90) | wrong |")
    print("|---|---|---:|---:|---:|---|---|")
    for effect in (0.0, 0.5):
        rng = np.random.default_rng([a.seed, int(effect * 100)])
        runs = [one_run(rng, effect, a.quantile, a) for _ in range(a.runs)]
        for name in ("per-window", "pooled"):
            got = [r.get(name, ("undecided", a.windows)) for r in runs]
            rb = sum(d == "rollback" for d, _ in got)
            pr = sum(d == "promote" for d, _ in got)
            ns = sorted(n for d, n in got if d != "undecided")
            med = f"{ns[len(ns) // 2]} / {ns[min(int(len(ns) * 0.9), len(ns) - 1)]}" if ns else "-"
            wrong, k = ("rollback at no effect", rb) if effect == 0.0 else ("promotion at the limit", pr)
            # over alpha only where the 95 % Clopper-Pearson interval of the wrong decisions' rate lies above it
            lower = 1.0 - clopper_pearson_upper(a.runs - k, a.runs)
            flag = f" (CP95 lower {lower:.1%}: **over alpha**)" if lower > ALPHA else ""
            print(f"| {'A/A' if effect == 0 else f'+{effect:.0%}'} | {name} | {rb / a.runs:.1%} | {pr / a.runs:.1%} | "
                  f"{(a.runs - rb - pr) / a.runs:.1%} | {med} | {wrong}: {k}/{a.runs} ({k / a.runs:.1%}){flag} |",
                  flush=True)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[2:]))
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--store", help="a demo or control-plane store (SQLite) to replay a rollout of")
    mode.add_argument("--simulate", action="store_true", help="the two estimators on the two-mode model")
    ap.add_argument("--rollout", help="--store: the rollout to replay (default: the newest)")
    ap.add_argument("--metric", default=ITL, help="the histogram to replay, as the evidence names it (default: "
                                                  "%(default)s; request latency has its route label)")
    ap.add_argument("--gap-s", type=float, default=0.002, help="latency between the modes (default: 2 ms)")
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--quantile", type=float, default=0.99, help="the checked quantile (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--windows", type=int, default=60, help="windows before a run counts as undecided")
    ap.add_argument("--min-windows", type=int, default=8, help="the GPU demo policy's min_windows")
    # the model, fitted to triton-v1.8's GPU canary (2026-12-04): see BENCHMARKS.md
    ap.add_argument("--tokens", type=float, default=6300, help="tokens per arm and window")
    ap.add_argument("--share", type=float, default=0.0070, help="the slow mode's mean share of the tokens")
    ap.add_argument("--events", type=float, default=18, help="prefill events per window (clustering)")
    ap.add_argument("--event-shape", type=float, default=2.0, help="gamma shape of the tokens one event hits")
    ap.add_argument("--fast-ms", type=float, default=0.55)
    ap.add_argument("--fast-sigma", type=float, default=0.25)
    ap.add_argument("--slow-ms", type=float, default=6.3)
    ap.add_argument("--slow-sigma", type=float, default=0.25)
    ap.add_argument("--load-sd", type=float, default=0.08, help="per-window load factor of an arm (log sd)")
    ap.add_argument("--slow-load-sd", type=float, default=0.18,
                    help="per-window factor of an arm's slow mode alone (log sd; the prefill chunks it carries)")
    a = ap.parse_args(argv)
    if a.store:
        if not os.path.exists(a.store):
            ap.error(f"--store {a.store}: no such file")
        return replay(a.store, a.metric, a.gap_s, a.rollout)
    return simulate(a)


if __name__ == "__main__":
    sys.exit(main())
