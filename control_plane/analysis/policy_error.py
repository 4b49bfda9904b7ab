"""What every part of the policy's validation shares: `PolicyError` (the field path and the problem, in the user's
units) and the small checks and formatters of values."""
from __future__ import annotations

import math


class PolicyError(ValueError):
    """An invalid policy value. `field` is its path in the policy ("checks[1].max_rel_delta",
    "correctness.max_tokens"; "" for the policy as a whole), `problem` what is wrong with it: the value it had and
    what is allowed, in the units the UI asks for (percent for thresholds, seconds for times)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field} {problem}" if field else problem)
        self.field, self.problem = field, problem

    def under(self, prefix: str) -> "PolicyError":
        """The same error one level down: `checks[1]` + `max_rel_delta`."""
        return PolicyError(f"{prefix}.{self.field}" if self.field else prefix, self.problem)


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _name(key: str) -> str:
    """An unknown key as it goes into a field path: at most 24 characters."""
    return key if len(key) <= 24 else key[:24] + "..."


def _short(v) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:80] + "..."
