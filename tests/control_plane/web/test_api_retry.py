"""Retry in place through the API (issue 40): POST /api/v1/rollouts with retry_of starts a new rollout linked to an
ended one that did not succeed, with the old one's spec and policy under whatever the body changes; the link shows
both ways in GET /rollouts/<id>."""
from __future__ import annotations

import pytest

from sits.control_plane.adapters.deploy.spec import DeploySpec
from sits.control_plane.analysis import ERROR_RATE, REQUEST_LATENCY, MetricCheck
from sits.control_plane.rollout import Command, Phase
from sits.control_plane.service.rollouts import send_command

from tests.control_plane.helpers import latency_policy

from .conftest import auth, drive, new_rollout, snapshot

POLICY = latency_policy(steps=(5, 20, 100), check_interval_s=15, warmup_s=3, min_samples=77,
                        checks=(MetricCheck(REQUEST_LATENCY, quantile=0.99, max_rel_delta=0.3),
                                MetricCheck(ERROR_RATE, max_abs_delta=0.02)))


def aborted(store, service="chat", now=0.0):
    """A rollout of `service` aborted by otto at its first step: ROLLED_BACK, with a spec of its own."""
    ro = new_rollout(store, service, now=now, policy=POLICY,
                     spec=DeploySpec(model="tiny", replicas=2, canary_args=("--max-num-seqs", "8")))
    t = drive(store, ro.id, 3, t0=now)
    send_command(store, ro.id, Command.ABORT, "otto")
    drive(store, ro.id, 3, t0=t)
    assert store.get(ro.id).phase is Phase.ROLLED_BACK
    return ro.id


def test_a_retry_takes_the_old_spec_and_policy_and_links_both_ways(client, store):
    old = aborted(store)
    r = client.post("/api/v1/rollouts", json={"retry_of": old}, headers=auth("operator"))
    assert r.status_code == 201, r.get_json()
    new = r.get_json()
    assert new["retry_of"] == old and new["service"] == "chat" and new["kernels"] == "triton-v1.1"
    assert new["production_kernels"] == "triton-v1"   # what chat runs now (the abort left production as it was)
    assert new["spec"]["replicas"] == 2 and new["spec"]["canary_args"] == ["--max-num-seqs", "8"]
    assert new["policy"]["steps"] == [5, 20, 100] and new["policy"]["min_samples"] == 77
    assert [c["metric"] for c in new["policy"]["checks"]] == [REQUEST_LATENCY, ERROR_RATE]
    back = client.get(f"/api/v1/rollouts/{old}", headers=auth("viewer")).get_json()
    assert back["retried_as"] == [new["id"]] and back["retry_of"] is None and back["retryable"] is True
    events = client.get(f"/api/v1/rollouts/{new['id']}/events", headers=auth("viewer")).get_json()["events"]
    assert events[0]["message"] == f"created by otto as a retry of {old}" and events[0]["actor"] == "otto"
    listed = client.get("/api/v1/rollouts?service=chat", headers=auth("viewer")).get_json()["rollouts"]
    assert {x["id"]: x["retry_of"] for x in listed} == {new["id"]: old, old: None}


def test_what_the_body_gives_wins_over_the_old_rollout(client, store):
    old = aborted(store)
    body = {"retry_of": old, "kernels": "triton-v1.2", "replicas": 1,
            "policy": {"steps": [10, 100], "correctness": {"enabled": False}}}
    r = client.post("/api/v1/rollouts", json=body, headers=auth("operator"))
    assert r.status_code == 201, r.get_json()
    new = r.get_json()
    assert new["kernels"] == "triton-v1.2" and new["spec"]["replicas"] == 1
    assert new["policy"]["steps"] == [10, 100] and new["policy"]["correctness"]["enabled"] is False
    assert new["policy"]["min_samples"] == 77 and new["policy"]["check_interval_s"] == 15   # the rest: the old one's
    assert new["spec"]["canary_args"] == ["--max-num-seqs", "8"]


@pytest.mark.parametrize("case,field", [("unknown", "retry_of"), ("active", "retry_of"), ("succeeded", "retry_of"),
                                        ("other-service", "service"), ("not-a-string", "retry_of")])
def test_a_retry_of_what_cannot_be_retried_is_422_and_changes_nothing(client, store, case, field):
    old = aborted(store, "chat")
    if case == "active":
        target = new_rollout(store, "embed", now=500.0).id
    elif case == "succeeded":
        target = new_rollout(store, "rank", now=600.0, policy=latency_policy(steps=(50, 100), check_interval_s=10,
                                                                            warmup_s=5)).id
        drive(store, target, 60, t0=600.0)
        assert store.get(target).phase is Phase.SUCCEEDED
    else:
        target = {"unknown": "no-such-rollout", "other-service": old, "not-a-string": 7}[case]
    body = {"retry_of": target, **({"service": "search"} if case == "other-service" else {})}
    before = snapshot(store)
    r = client.post("/api/v1/rollouts", json=body, headers=auth("operator"))
    assert r.status_code == 422, r.get_json()
    err = r.get_json()["error"]
    assert err["field"] == field, err
    if case == "succeeded":
        assert "succeeded" in err["message"] and "start a new canary" in err["message"]
    if case == "active":
        assert "only an ended rollout can be retried" in err["message"]
    assert snapshot(store) == before


def test_a_viewer_cannot_retry(client, store):
    old = aborted(store)
    before = snapshot(store)
    assert client.post("/api/v1/rollouts", json={"retry_of": old}, headers=auth("viewer")).status_code == 403
    assert snapshot(store) == before


def test_the_openapi_doc_describes_retry_and_engines(client):
    spec = client.get("/api/v1/openapi.json").get_json()
    assert "retry_of" in spec["components"]["schemas"]["NewRollout"]["properties"]
    ro = spec["components"]["schemas"]["Rollout"]["properties"]
    assert {"retry_of", "retried_as", "retryable"} <= set(ro)
    assert "/rollouts/{rollout_id}/engines" in spec["paths"]
    assert set(spec["components"]["schemas"]["Engine"]["properties"]) == {
        "role", "name", "ready", "restarts", "state", "last_log_line", "log_error", "address"}
