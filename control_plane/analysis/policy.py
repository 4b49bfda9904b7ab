"""`Policy`: traffic steps, checks and limits of a rollout. Validated once, serialisable to/from plain dicts."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields
from typing import Mapping

from sits.wire.metrics import E2E, ITL, REQUEST_LATENCY, TTFT

from .gate_policy import CorrectnessPolicy
from .low_traffic import WORKLOAD_METRICS, LowTrafficPolicy
from .policy_error import PolicyError, _name, _num, _short

ERROR_RATE = "error_rate"  # pseudo-metric: errors / requests of the variant
TARGETS = ("baseline", "production")
MAX_CHECKS = 32
MAX_REPORT_METRICS = 32
_METRIC_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]{0,199}$")   # a Prometheus metric name: it goes into PromQL
# (low, high) of every numeric policy field: a typo or a hostile file cannot ask for 1e-300 s or 1e25 failures
LIMITS: dict[str, tuple[float, float]] = {
    "check_interval_s": (0.1, 86400.0), "warmup_s": (0.0, 3600.0), "max_duration_s": (1.0, 30 * 86400.0),
    "not_ready_grace_s": (0.0, 3600.0),
    "ready_timeout_s": (1.0, 86400.0), "min_samples": (1, 10 ** 9), "min_tail_samples": (1, 10 ** 6),
    "failure_limit": (1, 1000), "inconclusive_limit": (1, 100_000), "min_error_samples": (1, 10 ** 9),
    "z_fail": (0.01, 10.0), "z_pass": (0.01, 10.0), "max_error_rate": (0.0001, 1.0), "max_rel_delta": (0.0001, 100.0),
    "alpha": (0.0001, 0.5), "min_windows": (2, 10_000), "window_requests": (1, 10 ** 7),
    "window_tail_samples": (1, 10 ** 5), "window_s": (0.0, 86400.0),
}
STATISTICS = ("sequential", "fixed")
ON_MAX_DURATION = ("rollback", "pause", "hold")


@dataclass(slots=True, frozen=True)
class MetricCheck:
    """One gate. Latency: relative delta of the `quantile` of `metric` (every series whose key is `metric` or
    `metric{...}`, e.g. one per route) must be <= max_rel_delta. Error rate: canary - target <= max_abs_delta.

    Two boundaries (sequential statistics): max_rel_delta (max_abs_delta) is the regression that must not ship: the
    canary passes once the upper bound is below it. ship_rel_delta (ship_abs_delta), smaller, is a change small
    enough to ship: the canary fails once the lower bound is above it. Between the two either decision is acceptable;
    the gap is what lets every check decide in bounded time. Default: half the large one."""
    metric: str
    quantile: float | None = None
    max_rel_delta: float | None = None
    max_abs_delta: float | None = None
    ship_rel_delta: float | None = None
    ship_abs_delta: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.metric, str) or not (self.metric == ERROR_RATE or _METRIC_RE.match(self.metric)):
            raise PolicyError("metric", f"must be a Prometheus metric name or {ERROR_RATE!r}, got "
                              f"{_short(self.metric)}")
        if self.metric == ERROR_RATE:
            if self.quantile is not None:
                raise PolicyError("quantile", "does not apply to an error_rate check (it takes max_abs_delta)")
            if self.max_rel_delta is not None:
                raise PolicyError("max_rel_delta", "does not apply to an error_rate check (it takes max_abs_delta)")
            if not _num(self.max_abs_delta) or not 0 <= self.max_abs_delta < 1:
                raise PolicyError("max_abs_delta", "(the error-rate increase allowed) must be from 0 up to 100 "
                                  f"percentage points (0.01 = +1 pt), got {_points(self.max_abs_delta)}")
            if self.ship_rel_delta is not None:
                raise PolicyError("ship_rel_delta", "does not apply to an error_rate check (it takes ship_abs_delta)")
            if self.ship_abs_delta is not None and (not _num(self.ship_abs_delta)
                                                    or not 0 <= self.ship_abs_delta < self.max_abs_delta):
                raise PolicyError("ship_abs_delta", "(an error-rate increase small enough to ship) must be from 0 up "
                                  f"to max_abs_delta ({_points(self.max_abs_delta)}), got "
                                  f"{_points(self.ship_abs_delta)}")
        else:
            if not _num(self.quantile) or not 0 < self.quantile < 1:
                raise PolicyError("quantile", f"must be between 0 and 1 (0.99 = P99), got {_short(self.quantile)}")
            if not _num(self.max_rel_delta) or not _within("max_rel_delta", self.max_rel_delta):
                lo, hi = LIMITS["max_rel_delta"]
                raise PolicyError("max_rel_delta", f"(the {self.name.split(':')[-1].upper()} increase allowed) must "
                                  f"be between +{lo * 100:g} % and +{hi * 100:g} % (0.10 = +10 %), got "
                                  f"{_percent(self.max_rel_delta)}")
            if self.max_abs_delta is not None:
                raise PolicyError("max_abs_delta", "does not apply to a latency check (it takes max_rel_delta)")
            if self.ship_abs_delta is not None:
                raise PolicyError("ship_abs_delta", "does not apply to a latency check (it takes ship_rel_delta)")
            if self.ship_rel_delta is not None and (not _num(self.ship_rel_delta)
                                                    or not 0 <= self.ship_rel_delta < self.max_rel_delta):
                raise PolicyError("ship_rel_delta", "(a change small enough to ship) must be from 0 up to "
                                  f"max_rel_delta ({_percent(self.max_rel_delta)}), got "
                                  f"{_percent(self.ship_rel_delta)}")

    @property
    def name(self) -> str:
        if self.metric == ERROR_RATE:
            return ERROR_RATE
        return f"{self.metric}:p{_quantile_suffix(self.quantile)}"

    @property
    def limit(self) -> float:
        """The regression that must not ship: relative for latency (0.25 = +25 %), points for the error rate."""
        return self.max_abs_delta if self.metric == ERROR_RATE else self.max_rel_delta

    @property
    def ship(self) -> float:
        """A change small enough to ship (the smaller boundary): as set, else half of `limit`."""
        own = self.ship_abs_delta if self.metric == ERROR_RATE else self.ship_rel_delta
        return self.limit / 2 if own is None else own


def _percent(v) -> str:
    return f"{v * 100:+g} %" if _num(v) else _short(v)


def _points(v) -> str:
    return f"{v * 100:+g} pt" if _num(v) else _short(v)


def default_checks() -> tuple[MetricCheck, ...]:
    return (MetricCheck(REQUEST_LATENCY, quantile=0.99, max_rel_delta=0.10),
            MetricCheck(REQUEST_LATENCY, quantile=0.90, max_rel_delta=0.05),
            MetricCheck(ERROR_RATE, max_abs_delta=0.01))


@dataclass(slots=True, frozen=True)
class Policy:
    steps: tuple[int, ...] = (5, 10, 25, 50, 100)   # canary traffic %, the last one reached by promotion
    check_interval_s: float = 30.0
    warmup_s: float = 10.0                           # data right after a deploy or weight change is dropped
    checks: tuple[MetricCheck, ...] = field(default_factory=default_checks)
    min_samples: int = 200                          # requests per variant before a latency check may decide
    min_tail_samples: int = 10                      # n * (1 - q) needed for a quantile
    statistics: str = "sequential"                  # "sequential" (analysis/sequential.py) | "fixed" (stats.py)
    alpha: float = 0.05                             # sequential: error rate of each decision, over all checks
    min_windows: int = 6                            # sequential: paired windows before a check may decide
    window_requests: int = 20                       # sequential: observations per arm before a window closes
    window_tail_samples: int = 2                    # sequential: ... and this many beyond the check's quantile
    window_s: float = 10.0                          # sequential: ... and at least this long (drift: docs)
    failure_limit: int = 2                          # fixed: consecutive failed checks before rolling back
    inconclusive_limit: int = 20                    # fixed: consecutive inconclusive checks before on_inconclusive
    on_inconclusive: str = "pause"                  # fixed: "pause" | "rollback"
    max_duration_s: float = 4 * 3600.0              # rollout deadline (paused time excluded) -> on_max_duration
    on_max_duration: str = "rollback"               # "rollback" | "pause" (for an operator) | "hold" (keep checking)
    ready_timeout_s: float = 600.0                  # deploy -> ready deadline -> rollback
    not_ready_grace_s: float = 30.0                 # canary not ready on every observation this long -> rollback
    compare_to: str = "baseline"                    # "baseline" | "production"
    auto_promote: bool = True                       # False: wait in PAUSED for a manual promote at the last step
    z_fail: float = 2.3                             # fixed: one-sided z of each variant's bound in the fail test
    z_pass: float = 1.0                             # fixed: one-sided z of each variant's bound in the pass test
    max_error_rate: float = 0.05                    # guard: canary error rate above this fails at once
    min_error_samples: int = 100                    # requests before the error-rate guard may fire
    report_metrics: tuple[str, ...] = (TTFT, ITL, E2E)  # deltas shown in every check, not decided on
    correctness: CorrectnessPolicy = field(default_factory=CorrectnessPolicy)
    low_traffic: LowTrafficPolicy = field(default_factory=LowTrafficPolicy)   # replay when live traffic is thin

    def __post_init__(self) -> None:
        steps = tuple(self.steps)
        if not steps or any(isinstance(s, bool) or not isinstance(s, int) or not 0 < s <= 100 for s in steps):
            raise PolicyError("steps", f"must be integer percents of traffic from 1 to 100, e.g. [5, 10, 25, 50, "
                              f"100], got {_short(list(steps))}")
        if any(a >= b for a, b in zip(steps, steps[1:])):
            raise PolicyError("steps", f"must be strictly increasing, got {_short(list(steps))}")
        if steps[0] >= 100:
            raise PolicyError("steps", "need at least one step below 100 % (the canary is analysed next to a "
                              "baseline before promotion)")
        object.__setattr__(self, "steps", steps)
        if isinstance(self.checks, (str, bytes, Mapping)) or not isinstance(self.checks, (list, tuple)):
            raise PolicyError("checks", "must be a list of check objects")
        if not 1 <= len(self.checks) <= MAX_CHECKS:
            raise PolicyError("checks", f"must hold at least one check and at most {MAX_CHECKS}, got "
                              f"{len(self.checks)}")
        checks = tuple(_check(c, i) for i, c in enumerate(self.checks))
        object.__setattr__(self, "checks", checks)
        for name in ("check_interval_s", "max_duration_s", "ready_timeout_s", "warmup_s", "not_ready_grace_s",
                     "window_s"):
            if not _num(getattr(self, name)) or not _within(name, getattr(self, name)):
                lo, hi = LIMITS[name]
                raise PolicyError(name, f"must be from {lo:g} to {hi:g} seconds, got {_short(getattr(self, name))}")
        for name in ("min_samples", "failure_limit", "inconclusive_limit", "min_error_samples", "min_tail_samples",
                     "min_windows", "window_requests", "window_tail_samples"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not _within(name, v):
                lo, hi = LIMITS[name]
                raise PolicyError(name, f"must be an integer from {lo:g} to {hi:g}, got {_short(v)}")
        if self.statistics not in STATISTICS:
            raise PolicyError("statistics", f"must be 'sequential' or 'fixed', got {_short(self.statistics)}")
        if self.on_max_duration not in ON_MAX_DURATION:
            raise PolicyError("on_max_duration", "must be 'rollback', 'pause' or 'hold', got "
                              f"{_short(self.on_max_duration)}")
        if not _num(self.alpha) or not _within("alpha", self.alpha):
            lo, hi = LIMITS["alpha"]
            raise PolicyError("alpha", f"(the chance of a wrong decision) must be from {lo:g} to {hi:g} (0.05 = 5 %), "
                              f"got {_short(self.alpha)}")
        if self.on_inconclusive not in ("pause", "rollback"):
            raise PolicyError("on_inconclusive", f"must be 'pause' or 'rollback', got {_short(self.on_inconclusive)}")
        if self.compare_to not in TARGETS:
            raise PolicyError("compare_to", f"must be 'baseline' or 'production', got {_short(self.compare_to)}")
        if not isinstance(self.auto_promote, bool):
            raise PolicyError("auto_promote", f"must be true or false, got {_short(self.auto_promote)}")
        for name in ("z_fail", "z_pass"):
            if not _num(getattr(self, name)) or not _within(name, getattr(self, name)):
                lo, hi = LIMITS[name]
                raise PolicyError(name, f"must be from {lo:g} to {hi:g} (standard deviations), got "
                                  f"{_short(getattr(self, name))}")
        if not _num(self.max_error_rate) or not _within("max_error_rate", self.max_error_rate):
            lo, hi = LIMITS["max_error_rate"]
            raise PolicyError("max_error_rate", f"(the canary error rate that fails at once) must be from "
                              f"{lo * 100:g} % to {hi * 100:g} % (0.05 = 5 %), got {_short(self.max_error_rate)}")
        if isinstance(self.report_metrics, (str, bytes, Mapping)) or not isinstance(self.report_metrics, (list, tuple)):
            raise PolicyError("report_metrics", "must be a list of metric names")
        if len(self.report_metrics) > MAX_REPORT_METRICS:
            raise PolicyError("report_metrics", f"has {len(self.report_metrics)} names; at most {MAX_REPORT_METRICS}")
        report = tuple(self.report_metrics)
        for i, m in enumerate(report):
            if not (isinstance(m, str) and _METRIC_RE.match(m)):
                raise PolicyError(f"report_metrics[{i}]", f"must be a Prometheus metric name, got {_short(m)}")
        object.__setattr__(self, "report_metrics", report)
        if not isinstance(self.correctness, CorrectnessPolicy):
            object.__setattr__(self, "correctness", _correctness(self.correctness))
        if not isinstance(self.low_traffic, LowTrafficPolicy):
            object.__setattr__(self, "low_traffic", _low_traffic(self.low_traffic))

    @property
    def metrics(self) -> tuple[str, ...]:
        """Every histogram metric a metrics source should fetch: the checked ones, the reported ones, then (low-traffic
        mode) the token counts that replayed requests are drawn from."""
        checked = [c.metric for c in self.checks if c.metric != ERROR_RATE]
        workload = WORKLOAD_METRICS if self.low_traffic.enabled else ()
        return tuple(dict.fromkeys([REQUEST_LATENCY, *checked, *self.report_metrics, *workload]))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["steps"] = list(self.steps)
        d["report_metrics"] = list(self.report_metrics)
        d["checks"] = [{k: v for k, v in asdict(c).items() if v is not None} for c in self.checks]
        d["correctness"] = self.correctness.to_dict()
        d["low_traffic"] = self.low_traffic.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: Mapping | None) -> "Policy":
        if d is not None and not isinstance(d, Mapping):
            raise PolicyError("", f"a policy must be an object of fields, got {type(d).__name__}")
        d = dict(d or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(k) for k in set(d) - known)
        if unknown:
            raise PolicyError(_name(unknown[0]), "is not a policy field; fields are "
                              f"{', '.join(f.name for f in fields(cls))}")
        for key in ("steps", "report_metrics"):
            if key in d and not isinstance(d[key], (list, tuple)):
                raise PolicyError(key, f"must be a list, got {type(d[key]).__name__}")
            if key in d:
                d[key] = tuple(d[key])
        if "correctness" in d:
            d["correctness"] = _correctness(d["correctness"])
        if "low_traffic" in d:
            d["low_traffic"] = _low_traffic(d["low_traffic"])
        return cls(**d)


def _check(c, i: int) -> MetricCheck:
    if isinstance(c, MetricCheck):
        return c
    if not isinstance(c, Mapping):
        raise PolicyError(f"checks[{i}]", "must be an object like {\"metric\": ..., \"quantile\": 0.99, "
                          f"\"max_rel_delta\": 0.1}}, got {_short(c)}")
    unknown = sorted(str(k) for k in set(c) - {f.name for f in fields(MetricCheck)})
    if unknown:
        raise PolicyError(f"checks[{i}].{_name(unknown[0])}", "is not a check field; fields are metric, quantile, "
                          "max_rel_delta, max_abs_delta")
    try:
        return MetricCheck(**c)
    except PolicyError as e:
        raise e.under(f"checks[{i}]") from None


def _correctness(d) -> CorrectnessPolicy:
    try:
        return CorrectnessPolicy.from_dict(d)
    except PolicyError as e:
        raise e.under("correctness") from None


def _low_traffic(d) -> LowTrafficPolicy:
    try:
        return LowTrafficPolicy.from_dict(d)
    except PolicyError as e:
        raise e.under("low_traffic") from None


def _within(name: str, v: float) -> bool:
    lo, hi = LIMITS[name]
    return lo <= v <= hi


def _quantile_suffix(q: float) -> str:
    """0.999 -> '99_9': the quantile as a check's name writes it (no dots in names)."""
    return f"{q * 100:g}".replace(".", "_")
