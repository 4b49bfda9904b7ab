"""Low-traffic mode's policy (`Policy.low_traffic`): when a check is inconclusive and the analysis says how many more
requests per variant it needs (`Verdict.need_more`), the worker replays that many workload-matched requests to canary
AND baseline (control_plane/worker/replay.py), never to production and never through the router, within a rate and
two budgets. The analysis uses live and replayed requests together; a PASS needs live canary load too (see
`live_requests_needed` and analysis/verdict.py) unless `allow_replay_only`."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Mapping

from sits.wire.metrics import GENERATION_TOKENS, PROMPT_TOKENS

from .policy_error import PolicyError, _name, _num, _short
from .prompts import prompt_set_problem

# engine histograms of each live request's token counts: what replayed requests are drawn from
WORKLOAD_METRICS = (PROMPT_TOKENS, GENERATION_TOKENS)


@dataclass(slots=True, frozen=True)
class LowTrafficPolicy:
    """Replay within bounds. Counts are per variant: a "request" of the budgets is one sent to canary plus its twin
    sent to baseline."""
    enabled: bool = False
    max_rps: float = 5.0                    # replayed requests per second to each of canary and baseline
    max_requests_per_step: int = 1000       # per variant, per traffic step
    max_requests_per_rollout: int = 5000    # per variant, over the whole rollout
    concurrency: int = 4                    # replayed requests in flight per variant (a slow canary queues no more)
    allow_replay_only: bool = False         # True: a check may PASS with fewer live canary requests than min_live
    min_live_requests: int | None = None    # live canary requests a PASS needs if any were replayed (None: min_samples)
    prompt_set: str | tuple[str, ...] | None = None   # None: the correctness gate's set (correctness.prompt_set)
    request_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        for name in ("enabled", "allow_replay_only"):
            if not isinstance(getattr(self, name), bool):
                raise PolicyError(name, f"must be true or false, got {_short(getattr(self, name))}")
        if not _num(self.max_rps) or not 0.01 <= self.max_rps <= 1000:
            raise PolicyError("max_rps", f"must be from 0.01 to 1000 requests per second (to each of canary and "
                              f"baseline), got {_short(self.max_rps)}")
        for name, lo, hi in (("max_requests_per_step", 1, 10 ** 7), ("max_requests_per_rollout", 1, 10 ** 8),
                             ("concurrency", 1, 64)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise PolicyError(name, f"must be an integer from {lo} to {hi:g}, got {_short(v)}")
        if self.max_requests_per_step > self.max_requests_per_rollout:
            raise PolicyError("max_requests_per_step", f"({self.max_requests_per_step}) must be at most "
                              f"max_requests_per_rollout ({self.max_requests_per_rollout})")
        m = self.min_live_requests
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or not 0 <= m <= 10 ** 9):
            raise PolicyError("min_live_requests", f"must be null (the policy's min_samples) or an integer from 0 "
                              f"to 1e+09, got {_short(m)}")
        if self.prompt_set is not None:
            if why := prompt_set_problem(self.prompt_set):
                raise PolicyError("prompt_set", why + " (or null: the correctness gate's set)")
            if not isinstance(self.prompt_set, str):
                object.__setattr__(self, "prompt_set", tuple(self.prompt_set))
        if not _num(self.request_timeout_s) or not 0 < self.request_timeout_s <= 3600:
            raise PolicyError("request_timeout_s", "must be more than 0 and at most 3600 seconds, got "
                              f"{_short(self.request_timeout_s)}")

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        if isinstance(self.prompt_set, tuple):
            d["prompt_set"] = list(self.prompt_set)
        return d

    @classmethod
    def from_dict(cls, d) -> "LowTrafficPolicy":
        if isinstance(d, LowTrafficPolicy):
            return d
        if not isinstance(d, Mapping):
            raise PolicyError("", "must be an object, e.g. {\"enabled\": true, \"max_rps\": 5}")
        unknown = sorted(str(k) for k in set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise PolicyError(_name(unknown[0]), "is not a low_traffic field; fields are "
                              f"{', '.join(f.name for f in fields(cls))}")
        return cls(**d)


def live_requests_needed(lt: LowTrafficPolicy, min_samples: int) -> int:
    """Live (not replayed) canary requests a check needs to PASS when part of its load was replayed."""
    if lt.allow_replay_only:
        return 0
    return min_samples if lt.min_live_requests is None else lt.min_live_requests
