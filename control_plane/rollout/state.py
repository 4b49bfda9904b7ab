"""The rollout's records: phases, commands, the actions the worker carries out, what it observed, and the rollout
with its checks and events. Plain frozen dataclasses; the state machine that moves them is control_plane/rollout/machine.py."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import ClassVar, Mapping

from sits.control_plane.analysis import CorrectnessVerdict, Policy, VariantData, Verdict
from sits.control_plane.analysis.sequential import SequenceState

ROLES = ("production", "baseline", "canary")


class Phase(str, Enum):
    PENDING = "pending"
    INITIALIZING = "initializing"
    PROGRESSING = "progressing"
    PAUSED = "paused"
    PROMOTING = "promoting"
    SUCCEEDED = "succeeded"
    ROLLING_BACK = "rolling_back"
    ROLLED_BACK = "rolled_back"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        return self in (Phase.SUCCEEDED, Phase.ROLLED_BACK, Phase.FAILED)


class Command(str, Enum):
    PROMOTE = "promote"
    ABORT = "abort"
    PAUSE = "pause"
    RESUME = "resume"


class Decision(str, Enum):
    """What a check led to."""
    HOLD = "hold"            # keep collecting at this step
    ADVANCE = "advance"      # next step
    PROMOTE = "promote"      # every step passed: promote automatically
    GATE = "gate"            # every step passed: wait for a manual promote
    ROLLBACK = "rollback"
    PAUSE = "pause"          # too many inconclusive checks (on_inconclusive="pause")
    PASS = "pass"            # a correctness check passed: traffic may start, the step may advance


class EventKind(str, Enum):
    CREATED = "created"      # the rollout was created (by its actor)
    PHASE = "phase"          # a phase change or a new step
    COMMAND = "command"      # a manual command that changed nothing (ignored in this phase)
    WINDOW = "window"        # a metrics window dropped (overlapping, or one side without data)
    METRICS = "metrics"      # the metrics source failed: the window counts as no data
    CHECK = "check"          # one check's outcome and decision


# ---- actions: the worker maps them onto a Deployer / Notifier -------------------------------------------------------
@dataclass(slots=True, frozen=True)
class Action:
    kind: ClassVar[str] = ""

    def to_dict(self) -> dict:
        return {"kind": self.kind, **{k: getattr(self, k) for k in self.__slots__}}

    @staticmethod
    def from_dict(d: Mapping) -> "Action":
        d = dict(d)
        cls = _ACTIONS[d.pop("kind")]
        return cls(**d)


@dataclass(slots=True, frozen=True)
class Deploy(Action):
    kind: ClassVar[str] = "deploy"
    role: str = "canary"
    kernels: str = ""


@dataclass(slots=True, frozen=True)
class SetWeights(Action):
    kind: ClassVar[str] = "set_weights"
    weights: Mapping[str, int] = field(default_factory=dict)   # role -> percent, sums to 100


@dataclass(slots=True, frozen=True)
class Promote(Action):
    kind: ClassVar[str] = "promote"


@dataclass(slots=True, frozen=True)
class Rollback(Action):
    kind: ClassVar[str] = "rollback"


@dataclass(slots=True, frozen=True)
class Notify(Action):
    kind: ClassVar[str] = "notify"
    event: str = ""          # started | step | paused | resumed | promoting | promoted | rolling_back | rolled_back | failed
    message: str = ""


_ACTIONS = {c.kind: c for c in (Deploy, SetWeights, Promote, Rollback, Notify)}


def weights_for(percent: int) -> dict[str, int]:
    """Canary gets `percent`; the baseline the same share (capped by what is left); production the rest."""
    baseline = min(percent, 100 - percent)
    return {"production": 100 - percent - baseline, "baseline": baseline, "canary": percent}


def traffic_split(weights: Mapping[str, int | float]) -> dict[str, int]:
    """A traffic split {role: percent} checked: known roles, integers 0..100 summing to 100; missing roles get 0.
    ValueError saying what is wrong (the deployers raise it as DeployError, the router as RouterError)."""
    if not isinstance(weights, Mapping) or not weights:
        raise ValueError("weights must be a non-empty mapping {role: percent}")
    out = {r: 0 for r in ROLES}
    for role, w in weights.items():
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r} in weights; roles are {', '.join(ROLES)}")
        if isinstance(w, bool) or not isinstance(w, (int, float)) or w != int(w) or not 0 <= w <= 100:
            raise ValueError(f"weight of {role} must be an integer percent 0..100, got {w!r}")
        out[role] = int(w)
    if sum(out.values()) != 100:
        raise ValueError(f"weights must sum to 100, got {sum(out.values())} ({out})")
    return out


# ---- observation, records, rollout ------------------------------------------------------------------------------------
@dataclass(slots=True, frozen=True)
class Observation:
    """What the worker saw since the previous call. `variants`: role -> VariantData whose histograms, requests and
    errors are WINDOW DELTAS over [window_start, window_end] (the worker takes deltas per replica between its polls,
    handling counter resets, and sums replicas); `ready`/`crashing` are the state at window_end. `queries`: the
    PromQL or scrape URLs used (kept as evidence). `errors`: metrics-source failures (the window counts as no data).
    `failed_actions`: kinds of actions from the previous call that failed for good; `failure`: why the first of them
    failed (the first line of its error, e.g. a deploy's "canary: engine not ready after 300 s; its last log line:
    ..."; empty when unknown). `correctness`: the verdict of a
    correctness-gate replay the worker ran in this pass because `rollout.correctness_due` said so (None: none ran).
    `status_messages`: role -> the deployer's status message of that variant (e.g. Kubernetes' "0/1 ready, ...; pod
    P last log line: ..."), which the start-up deadline's rollback reason repeats for the variants not ready."""
    window_start: float | None = None
    window_end: float | None = None
    variants: Mapping[str, VariantData] = field(default_factory=dict)
    source: str = ""
    queries: Mapping[str, str] = field(default_factory=dict)
    errors: tuple[str, ...] = ()
    command: Command | None = None
    command_by: str = ""
    failed_actions: tuple[str, ...] = ()
    correctness: CorrectnessVerdict | None = None
    failure: str = ""
    status_messages: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.command, str) and not isinstance(self.command, Command):
            try:
                object.__setattr__(self, "command", Command(self.command))
            except ValueError:
                raise ValueError(f"unknown command {self.command!r}; use one of "
                                 f"{', '.join(c.value for c in Command)}") from None
        # a window_end without a start (a source's first poll: nothing to diff against) carries no window
        if self.window_start is not None and self.window_end is not None and self.window_end < self.window_start:
            raise ValueError(f"window ends ({self.window_end}) before it starts ({self.window_start})")
        unknown = (set(self.variants) | set(self.status_messages)) - set(ROLES)
        if unknown:
            raise ValueError(f"unknown variant role(s) {sorted(unknown)}; roles are {', '.join(ROLES)}")
        object.__setattr__(self, "errors", tuple(self.errors))
        object.__setattr__(self, "failed_actions", tuple(self.failed_actions))


@dataclass(slots=True, frozen=True)
class Check:
    """One look, with its full evidence: raw bucket counts per variant, the queries, the verdict and what followed."""
    seq: int
    at: float
    step: int
    weight: int
    window_start: float | None
    window_end: float | None
    source: str
    queries: Mapping[str, str]
    data: Mapping[str, VariantData]
    verdict: Verdict
    decision: Decision   # a correctness check (source "correctness"): PASS, HOLD (inconclusive) or ROLLBACK

    def __post_init__(self) -> None:
        object.__setattr__(self, "decision", Decision(self.decision))


@dataclass(slots=True, frozen=True)
class Event:
    at: float
    kind: EventKind
    message: str
    phase: Phase
    actor: str = ""      # who caused it: a command's or a creation's actor; "" for the worker's own decisions

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", EventKind(self.kind))


@dataclass(slots=True, frozen=True)
class Rollout:
    id: str
    service: str
    canary_kernels: str
    production_kernels: str
    policy: Policy = field(default_factory=Policy)
    phase: Phase = Phase.PENDING
    reason: str = ""
    created_at: float = 0.0
    phase_since: float = 0.0
    started_at: float | None = None          # first traffic to the canary; max_duration counts from here
    paused_total_s: float = 0.0
    paused_from: Phase | None = None
    awaiting_promotion: bool = False
    step: int = -1                           # index into policy.steps; -1 before the first step
    weight: int = 0
    warmup_until: float = 0.0
    last_check_at: float = 0.0
    checks: int = 0                          # sequence number of the last check (never reused)
    step_checks: int = 0
    consecutive_failures: int = 0
    consecutive_inconclusive: int = 0
    not_ready_since: float | None = None     # the first of a run of observations with the canary not ready
    data: Mapping[str, VariantData] = field(default_factory=dict)   # the current step's accumulated windows
    sequence: SequenceState = field(default_factory=SequenceState)  # the rollout's paired windows (sequential)
    deadline_hit: bool = False               # max_duration_s passed (on_max_duration "hold": said once)
    data_since: float | None = None
    observed_until: float | None = None
    excluded_requests: float = 0.0           # canary requests dropped as warm-up in this step
    replayed_requests: float = 0.0           # canary requests replayed by low-traffic mode, whole rollout (measured)
    correctness_step: int = -2               # step whose correctness gate passed (-1: before the first step)
    correctness_at: float | None = None      # when the gate last ran (interval_s and retries count from here)
    source: str = ""
    queries: Mapping[str, str] = field(default_factory=dict)
    retry_of: str | None = None              # the ended rollout this one retries (set at creation, never changed)
    new_checks: tuple[Check, ...] = ()       # produced by the last reconcile call; the store persists them
    new_events: tuple[Event, ...] = ()
    version: int = 0                         # managed by the store (optimistic concurrency)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ValueError("rollout id must be a non-empty string")
        if not isinstance(self.service, str) or not self.service:
            raise ValueError("rollout service must be a non-empty string")
        if not self.canary_kernels or not self.production_kernels:
            raise ValueError("canary_kernels and production_kernels must name kernel sets")
        object.__setattr__(self, "phase", Phase(self.phase))
        if self.paused_from is not None:
            object.__setattr__(self, "paused_from", Phase(self.paused_from))

    @property
    def active(self) -> bool:
        return not self.phase.terminal
