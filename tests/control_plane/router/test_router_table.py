"""The router's selection state on its own: exact weighted split, replica round-robin, pinning, in-flight counts."""
from collections import Counter

import pytest

from sits.control_plane.router import RouterError
from sits.control_plane.router.table import RouteTable


def test_split_is_exact_within_one_request_and_replicas_take_turns():
    t = RouteTable()
    t.set_backends("production", ["http://127.0.0.1:1", "http://127.0.0.1:2"])
    t.set_backends("canary", ["http://127.0.0.1:3"])
    t.set_weights({"production": 90, "canary": 10})
    picks = [t.pick(None) for _ in range(100)]
    assert Counter(role for role, _ in picks) == {"production": 90, "canary": 10}
    assert Counter(str(url) for role, url in picks if role == "production") == {
        "http://127.0.0.1:1": 45, "http://127.0.0.1:2": 45}
    assert t.in_flight("production") == 90 and t.in_flight("canary") == 10
    for role, _ in picks:
        t.done(role)
    assert t.in_flight("production") == 0 and t.snapshot()["in_flight"]["canary"] == 0


def test_weight_without_a_backend_gets_nothing_and_a_pin_needs_a_backend():
    t = RouteTable()
    assert t.pick(None) is None                              # no weights yet
    t.set_backends("production", ["http://127.0.0.1:1"])
    t.set_weights({"production": 50, "canary": 50})           # the canary has no backend (yet)
    assert {t.pick(None)[0] for _ in range(10)} == {"production"}
    assert t.pick("baseline") is None
    t.set_backends("baseline", ["http://127.0.0.1:4"])
    assert t.pick("baseline")[0] == "baseline"                 # pinned: weight 0 does not matter
    t.set_backends("production", None)
    assert t.pick(None) is None


def test_bad_input_is_refused_and_changes_nothing():
    t = RouteTable()
    t.set_backends("production", ["http://127.0.0.1:1"])
    t.set_weights({"production": 100})
    with pytest.raises(RouterError):
        t.set_backends("shadow", ["http://127.0.0.1:2"])
    with pytest.raises(RouterError):
        t.set_backends("canary", ["ftp://x"])
    with pytest.raises(RouterError):
        t.set_weights({"production": -5})
    assert t.weights()["production"] == 100 and list(t.snapshot()["backends"]) == ["production"]
