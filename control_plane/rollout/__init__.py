"""The rollout state machine, pure: `reconcile(rollout, observation, now) -> (rollout', actions)` (machine.py) over
the typed state in state.py (phases, checks, events, actions, commands), with the per-call builder in builder.py.

No I/O and no flask/kubernetes/requests/torch/engine imports (tests/control_plane/analysis/test_purity.py).
"""
from .machine import (CORRECTNESS_PREFIX, allowed_commands, correctness_due, reconcile)
from .state import (ROLES, Phase, Command, Decision, EventKind, Action, Deploy, SetWeights, Promote, Rollback,
    Notify, weights_for, traffic_split, Observation, Check, Event, Rollout)

__all__ = ["CORRECTNESS_PREFIX", "Action", "Check", "Command", "Decision", "Deploy", "Event", "EventKind", "Notify",
    "Observation", "Phase", "Promote", "ROLES", "Rollback", "Rollout", "SetWeights", "allowed_commands", "correctness_due",
    "reconcile", "traffic_split", "weights_for"]
