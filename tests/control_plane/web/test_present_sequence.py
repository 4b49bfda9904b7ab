"""The API's shapes of sequential evidence (web/present.py, web/series.py) over rollouts the real worker ran under
sequential statistics (ui_scenarios_sequence): the list's headline, the compact checks (with the replica offset),
the charts' gated columns (both boundaries, windows, time to decide) and why an ended rollout ended; fixed-method
evidence keeps its shape."""
from __future__ import annotations

import pytest

from sits.control_plane.web import create_app
from sits.control_plane.view import decode_check, headline_of
from sits.control_plane.web.present import check_compact, ending
from sits.control_plane.web.series import gated

from . import ui_scenarios_sequence
from .conftest import auth

P90, P99 = "http_request_duration_seconds:p90", "http_request_duration_seconds:p99"


@pytest.fixture(scope="module")
def sc(tmp_path_factory):
    s = ui_scenarios_sequence.build(str(tmp_path_factory.mktemp("seqapi") / "sits.db"))
    yield s
    s.store.close()


@pytest.fixture
def client(sc, users):
    return create_app({"TESTING": True, "STORE": sc.store, "SITS_USERS": users, "SECRET_KEY": "t"}).test_client()


def _last(sc, rid):
    return sc.store.check(rid, sc.store.get(rid).checks)


def headline(ev: dict) -> dict:
    """The API's `last_check` of a stored check."""
    return headline_of(decode_check(ev)).to_dict()


def test_the_headline_of_an_undecided_sequential_check_has_both_boundaries_and_a_time_to_decide(sc):
    h = headline(_last(sc, sc.undecided))
    assert h["method"] == "sequential" and h["result"] == "inconclusive" and h["eta_s"] > 0 and h["windows"] >= 6
    assert (h["ship"], h["threshold"]) == {P90: (0.1, 0.25), P99: (0.25, 0.5)}[h["check"]]
    assert h["ci"][0] < h["delta"] < h["ci"][1]


def test_a_sequential_rollback_ends_on_its_ship_boundary_a_fixed_one_on_its_threshold(sc):
    for rid, tail in ((sc.slow, "> ship +10.0 %"), (sc.fixed, "> +25.0 %")):
        r = sc.store.get(rid)
        e = ending(r, headline_of(decode_check(_last(sc, rid))), sc.store.events(rid, limit=1000),
                   sc.store.actions(rid))
        assert e["kind"] == "latency" and e["text"].startswith("p90 request latency ") and e["text"].endswith(tail), e


def test_compact_checks_carry_the_sequence_and_the_replica_offset_with_labels(sc):
    c = check_compact(_last(sc, sc.undecided))
    p90 = next(r for r in c["results"] if r["check"] == P90)
    for k in ("delta_rel", "ci_low", "ci_high", "threshold", "ship", "alpha", "windows", "block", "lag1", "window_s",
              "eta_s", "jumps"):
        assert k in p90, k
    assert p90["method"] == "sequential" and p90["ship"] == 0.1 and p90["threshold"] == 0.25
    labels = {o["check"]: o["label"] for o in c["replica"]}
    assert labels == {P90: "p90 request latency", P99: "p99 request latency", "error_rate": "error rate"}
    assert all(o["windows"] >= 6 and o["ci_low"] <= o["delta"] <= o["ci_high"] for o in c["replica"])
    fixed = check_compact(_last(sc, sc.fixed))
    assert fixed["replica"] is None and all("ship" not in r for r in fixed["results"])


def test_gated_chart_columns_have_both_boundaries_and_the_error_rates_mean_effect(sc):
    ev = _last(sc, sc.undecided)
    g = gated(decode_check(ev))
    assert g[P90]["method"] == "sequential" and (g[P90]["ship"], g[P90]["threshold"]) == (0.1, 0.25)
    assert g[P90]["eta_s"] > 0 and g[P90]["windows"] >= 6 and g[P90]["jumps"] == 0   # lognormal windows: one mode
    err = next(r for r in ev["verdict"]["results"] if r["check"] == "error_rate")
    assert g["error_rate"]["delta"] == err["delta_rel"]            # the sequence's centre, not this step's rates
    assert "ship" not in gated(decode_check(_last(sc, sc.fixed)))[P90]


def test_the_series_api_sends_the_boundaries_the_charts_draw(client, sc):
    s = client.get(f"/api/v1/rollouts/{sc.undecided}/series", headers=auth("viewer")).get_json()
    col = s["gated"][P90]
    assert col["method"] == "sequential" and col["ship"] == 0.1 and col["threshold"] == 0.25
    assert len(col["delta"]) == len(s["t"]) and col["windows"] >= 6
    f = client.get(f"/api/v1/rollouts/{sc.fixed}/series", headers=auth("viewer")).get_json()
    assert "ship" not in f["gated"][P90] and "method" not in f["gated"][P90]
    checks = client.get(f"/api/v1/rollouts/{sc.undecided}/checks?view=compact&last=1",
                        headers=auth("viewer")).get_json()["checks"]
    assert checks[0]["replica"] and checks[0]["results"][0]["method"] == "sequential"
    rows = client.get("/api/v1/rollouts", headers=auth("viewer")).get_json()["rollouts"]
    last = next(r for r in rows if r["id"] == sc.undecided)["last_check"]
    assert last["method"] == "sequential" and last["ship"] is not None and last["eta_s"] is not None


def test_the_series_say_which_gated_checks_decided_each_check(client, sc):
    """The charts ring the checks that decided (detail.js decides): the server's CheckView.deciding, not the page's."""
    s = client.get(f"/api/v1/rollouts/{sc.slow}/series", headers=auth("viewer")).get_json()
    assert len(s["decided_by"]) == len(s["t"]) and s["decision"][-1] == "rollback"
    last = _last(sc, sc.slow)
    failing = {r["check"] for r in last["verdict"]["results"] if r["outcome"] == "fail"}
    assert failing and set(s["decided_by"][-1]) == failing
    assert all(set(d) <= set(s["gated"]) for d in s["decided_by"])
