"""The JSON API through Flask's test client on a real store: every route's success, 401, 403, 404/409/422 and "a
rejected request changes nothing"."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from sits.control_plane.adapters.deploy.spec import DeploySpec

from sits.control_plane.web import create_app
from sits.control_plane.rollout import Phase

from .accounts import NAMES
from .conftest import auth, drive, new_rollout, snapshot


def test_list_is_newest_first_filtered_and_paginated(client, store):
    drive(store, new_rollout(store, "chat", now=100.0).id, 1)   # chat: pending -> initializing
    new_rollout(store, "embed", now=101.0)
    new_rollout(store, "code", now=102.0)
    r = client.get("/api/v1/rollouts", headers=auth("viewer"))
    assert r.status_code == 200
    body = r.get_json()
    assert [x["service"] for x in body["rollouts"]] == ["code", "embed", "chat"]
    assert body["total"] == 3
    first = body["rollouts"][2]
    assert first["phase"] == "initializing" and first["kernels"] == "triton-v1.1"
    assert first["production_kernels"] == "triton-v1" and first["steps"] == [10, 50, 100]
    assert set(first["allowed_actions"]) == {"abort", "pause"}
    page = client.get("/api/v1/rollouts?limit=1&offset=1", headers=auth("viewer")).get_json()
    assert [x["service"] for x in page["rollouts"]] == ["embed"] and page["total"] == 3
    only = client.get("/api/v1/rollouts?phase=initializing", headers=auth("viewer")).get_json()
    assert [x["service"] for x in only["rollouts"]] == ["chat"] and only["total"] == 1
    svc = client.get("/api/v1/rollouts?service=embed", headers=auth("viewer")).get_json()
    assert [x["service"] for x in svc["rollouts"]] == ["embed"]


@pytest.mark.parametrize("query,field", [("phase=nope", "phase"), ("limit=0", "limit"), ("limit=x", "limit"),
                                         ("offset=-1", "offset"), ("active=maybe", "active")])
def test_list_rejects_bad_filters(client, query, field):
    r = client.get(f"/api/v1/rollouts?{query}", headers=auth("viewer"))
    assert r.status_code == 422
    assert r.get_json()["error"]["field"] == field


def test_detail_has_step_weights_variants_policy_and_last_verdict(client, store):
    ro = new_rollout(store)
    drive(store, ro.id, 8)
    d = client.get(f"/api/v1/rollouts/{ro.id}", headers=auth("viewer")).get_json()
    assert d["id"] == ro.id and d["phase"] == "progressing" and d["checks"] >= 1
    assert d["step"] >= 0 and d["weight"] == d["steps"][d["step"]]
    assert d["weights"]["canary"] == d["weight"] and sum(d["weights"].values()) == 100
    assert d["variants"]["canary"]["kernels"] == "triton-v1.1" and d["variants"]["canary"]["ready"] is True
    assert d["variants"]["baseline"]["kernels"] == "triton-v1"
    assert d["policy"]["steps"] == [10, 50, 100] and d["policy"]["check_interval_s"] == 10
    lv = d["last_verdict"]
    assert lv["seq"] == d["checks"] and lv["outcome"] in ("pass", "inconclusive", "fail")
    assert lv["variants"]["canary"]["requests"] > 0 and lv["results"]
    assert all("canary" in x and "ci_low" in x and "threshold" in x for x in lv["results"])
    assert d["last_check"]["seq"] == d["checks"] and d["last_check"]["label"].startswith("p")
    assert d["lease"]["owner"] == "test-worker"
    timeline = d["steps_timeline"]
    assert [s["weight"] for s in timeline] == [10, 50, 100] and timeline[d["step"]]["state"] == "current"
    assert timeline[0]["entered_at"] is not None


def test_unknown_rollout_is_404_json(client):
    for path in ("", "/checks", "/events", "/series", "/checks/1"):
        r = client.get(f"/api/v1/rollouts/nope{path}", headers=auth("viewer"))
        assert r.status_code == 404, path
        assert r.get_json()["error"]["code"] == "not_found"
    r = client.post("/api/v1/rollouts/nope/abort", headers=auth("operator"))
    assert r.status_code == 404
    assert client.get("/api/v1/nothing-here", headers=auth("viewer")).status_code == 404


def test_checks_carry_full_evidence_and_compact_view_drops_buckets(client, store):
    ro = new_rollout(store)
    drive(store, ro.id, 8)
    full = client.get(f"/api/v1/rollouts/{ro.id}/checks", headers=auth("viewer")).get_json()["checks"]
    assert [c["seq"] for c in full] == list(range(1, len(full) + 1)) and full
    hist = full[0]["variants"]["canary"]["histograms"]
    assert any(h["counts"] for h in hist.values()) and full[0]["queries"]
    later = client.get(f"/api/v1/rollouts/{ro.id}/checks?since_seq=1", headers=auth("viewer")).get_json()["checks"]
    assert [c["seq"] for c in later] == [c["seq"] for c in full[1:]]
    compact = client.get(f"/api/v1/rollouts/{ro.id}/checks?view=compact", headers=auth("viewer")).get_json()
    c0 = compact["checks"][0]
    assert "histograms" not in json.dumps(c0) and c0["variants"]["canary"]["requests"] > 0
    newest = client.get(f"/api/v1/rollouts/{ro.id}/checks?last=2", headers=auth("viewer")).get_json()["checks"]
    assert [c["seq"] for c in newest] == [c["seq"] for c in full[-2:]]
    one = client.get(f"/api/v1/rollouts/{ro.id}/checks/1", headers=auth("viewer")).get_json()
    assert one == full[0]


def test_create_returns_201_with_location_and_records_the_actor(client, store):
    body = {"service": "chat", "kernels": "triton-v1.1", "production_kernels": "triton-v1", "model": "tiny",
            "replicas": 2, "policy": {"steps": [5, 25, 100]}, "args": ["--seed", "3"]}
    r = client.post("/api/v1/rollouts", json=body, headers=auth("operator"))
    assert r.status_code == 201, r.get_json()
    d = r.get_json()
    assert r.headers["Location"] == f"/api/v1/rollouts/{d['id']}"
    assert d["phase"] == "pending" and d["steps"] == [5, 25, 100] and d["spec"]["replicas"] == 2
    assert client.get(r.headers["Location"], headers=auth("viewer")).get_json()["id"] == d["id"]
    assert store.spec(d["id"]).canary_args == ("--seed", "3")
    events = client.get(f"/api/v1/rollouts/{d['id']}/events", headers=auth("viewer")).get_json()["events"]
    assert [(e["actor"], e["message"]) for e in events] == [(NAMES["operator"], f"created by {NAMES['operator']}")]


def test_create_defaults_production_to_what_the_service_runs_now(client, store):
    ro = new_rollout(store, canary="triton-v1.1", production="triton-v1")
    drive(store, ro.id, 40)
    assert store.get(ro.id).phase is Phase.SUCCEEDED
    r = client.post("/api/v1/rollouts", json={"service": "chat", "kernels": "torch"}, headers=auth("operator"))
    assert r.status_code == 201
    assert r.get_json()["production_kernels"] == "triton-v1.1"


def test_create_defaults_both_variants_flags_to_what_production_runs_after_a_promoted_flag_release(client, store):
    # a promoted engine-flag release (production's set with an FP8 KV cache on the canary) leaves production running
    # those flags: a later canary that names none must be compared with a baseline that has them, and runs them
    # itself (it changes only what it names); given flags are kept, an explicit empty list too
    kv = ["--kv-cache-dtype", "fp8"]
    ro = new_rollout(store, canary="triton-v1.5", production="triton-v1.5",
                     spec={"production_args": ["--max-num-seqs", "64"], "canary_args": ["--max-num-seqs", "64", *kv]})
    drive(store, ro.id, 40)
    assert store.get(ro.id).phase is Phase.SUCCEEDED
    svc = {s["service"]: s for s in client.get("/api/v1/services", headers=auth("viewer")).get_json()["services"]}
    assert svc["chat"]["production_kernels"] == "triton-v1.5"
    assert svc["chat"]["production_args"] == ["--max-num-seqs", "64", *kv]
    r = client.post("/api/v1/rollouts", json={"service": "chat", "kernels": "triton-v1.8"}, headers=auth("operator"))
    assert r.status_code == 201, r.get_json()
    spec = store.spec(r.get_json()["id"])
    assert spec.production_args == spec.canary_args == ("--max-num-seqs", "64", *kv)
    assert r.get_json()["flags"] == []    # nothing differs: the canary changes its kernels alone
    client.post(f"/api/v1/rollouts/{r.get_json()['id']}/abort", headers=auth("operator"))
    drive(store, r.get_json()["id"], 5)
    r = client.post("/api/v1/rollouts", json={"service": "chat", "kernels": "triton-v1.8", "args": [],
                                              "production_args": ["--max-num-seqs", "32"]}, headers=auth("operator"))
    assert r.status_code == 201, r.get_json()
    spec = store.spec(r.get_json()["id"])
    assert spec.production_args == ("--max-num-seqs", "32") and spec.canary_args == ()


def test_duplicate_active_rollout_is_409_and_changes_nothing(client, store):
    new_rollout(store)
    before = snapshot(store)
    r = client.post("/api/v1/rollouts", json={"service": "chat", "kernels": "triton-v1.1"}, headers=auth("operator"))
    assert r.status_code == 409 and r.get_json()["error"]["code"] == "conflict"
    assert snapshot(store) == before


BAD_BODIES = [
    ({"service": "chat", "kernels": "no-such-set"}, "kernels"),
    ({"service": "chat", "kernels": "triton-v1.1", "production_kernels": "nope"}, "production_kernels"),
    ({"service": "Bad_Name", "kernels": "triton-v1.1"}, "service"),
    ({"service": 7, "kernels": "triton-v1.1"}, "service"),
    ({"kernels": "triton-v1.1"}, "service"),
    ({"service": "chat"}, "kernels"),
    ({"service": "chat", "kernels": "triton-v1.1", "replicas": "2"}, "replicas"),
    ({"service": "chat", "kernels": "triton-v1.1", "replicas": 0}, "replicas"),
    ({"service": "chat", "kernels": "triton-v1.1", "args": "--seed 3"}, "args"),
    ({"service": "chat", "kernels": "triton-v1.1", "colour": "red"}, "colour"),
    ({"service": "chat", "kernels": "triton-v1.1", "policy": [1]}, "policy"),
    ({"service": "chat", "kernels": "triton-v1.1", "policy": {"steps": [0, 50]}}, "policy.steps"),
    ({"service": "chat", "kernels": "triton-v1.1", "policy": {"steps": [5, 150]}}, "policy.steps"),
    ({"service": "chat", "kernels": "triton-v1.1", "policy": {"steps": [50, 10]}}, "policy.steps"),
    ({"service": "chat", "kernels": "triton-v1.1", "policy": {"steps": "5,10"}}, "policy.steps"),
    ({"service": "chat", "kernels": "triton-v1.1", "policy": {"check_interval_s": 0}}, "policy.check_interval_s"),
    ({"service": "chat", "kernels": "triton-v1.1", "policy": {"compare_to": "prod"}}, "policy.compare_to"),
    ({"service": "chat", "kernels": "triton-v1.1", "policy": {"bogus": 1}}, "policy.bogus"),
    ({"service": "chat", "kernels": "triton-v1.1", "policy": {"checks": [
        {"metric": "http_request_duration_seconds", "quantile": 0.99, "max_rel_delta": 0.1},
        {"metric": "http_request_duration_seconds", "quantile": 0.9, "max_rel_delta": 0}]}},
     "policy.checks[1].max_rel_delta"),
    ({"service": "chat", "kernels": "triton-v1.1", "policy": {"checks": [
        {"metric": "http_request_duration_seconds", "quantile": 1.5, "max_rel_delta": 0.1}]}},
     "policy.checks[0].quantile"),
    ({"service": "chat", "kernels": "triton-v1.1", "policy": {"checks": [
        {"metric": "error_rate", "max_abs_delta": -0.01}]}}, "policy.checks[0].max_abs_delta"),
    ({"service": "chat", "kernels": "triton-v1.1", "policy": {"checks": []}}, "policy.checks"),
]


@pytest.mark.parametrize("body,field", BAD_BODIES, ids=[f"{b[1]}-{i}" for i, b in enumerate(BAD_BODIES)])
def test_create_422_names_the_field_and_changes_nothing(client, store, body, field):
    new_rollout(store, "other")
    before = snapshot(store)
    r = client.post("/api/v1/rollouts", json=body, headers=auth("operator"))
    assert r.status_code == 422, r.get_json()
    err = r.get_json()["error"]
    assert err["code"] == "invalid" and err["field"] == field and err["message"]
    assert snapshot(store) == before


@pytest.mark.parametrize("data,ctype", [(b"{not json", "application/json"), (b"[1, 2]", "application/json"),
                                        (b"service=chat", "application/x-www-form-urlencoded")])
def test_malformed_json_is_422_and_changes_nothing(client, store, data, ctype):
    before = snapshot(store)
    r = client.post("/api/v1/rollouts", data=data, headers={**auth("operator"), "Content-Type": ctype})
    assert r.status_code == 422 and r.get_json()["error"]["code"] == "invalid"
    assert snapshot(store) == before


@pytest.mark.parametrize("data,field", [
    (r'{"service": "chat", "kernels": "torch", "model": "\ud800"}', "model"),
    (r'{"service": "chat", "kernels": "torch", "model": "ti\u0000ny"}', "model"),
    (r'{"service": "chat", "kernels": "torch", "args": ["--max-num-seqs", "4\u0000"]}', "args[1]"),
    (r'{"service": "chat", "kernels": "torch", "production_args": ["\udc00"]}', "production_args[0]"),
    (r'{"service": "chat", "kernels": "torch", "policy": {"correctness": {"prompt_set": "a\ud800"}}}',
     "policy.correctness.prompt_set"),
    (r'{"service": "ch\u0000at", "kernels": "torch"}', "service"),
])
def test_nul_and_lone_surrogates_are_422_naming_the_field(client, store, caplog, data, field):
    """Issue 26 row 9: such a string was stored (201) and then broke GET /services for everyone."""
    before = snapshot(store)
    r = client.post("/api/v1/rollouts", data=data.encode(),
                    headers={**auth("operator"), "Content-Type": "application/json"})
    assert r.status_code == 422, r.get_json()
    err = r.get_json()["error"]
    assert err["code"] == "invalid" and err["field"] == field and field in err["message"]
    assert snapshot(store) == before
    assert client.get("/api/v1/services", headers=auth("viewer")).status_code == 200
    assert "Traceback" not in caplog.text


def test_services_never_500_on_odd_stored_data(client, store, caplog):
    """Issue 26 row 9: a model with a lone surrogate or NUL that reached the store another way (an older version,
    the operator's CLI) is shown escaped, never a 500 for every user."""
    odd = DeploySpec()
    object.__setattr__(odd, "model", "\ud800x\x00")   # as an older version stored it (refused at creation now)
    new_rollout(store, "odd", spec=odd)
    r = client.get("/api/v1/services", headers=auth("viewer"))
    assert r.status_code == 200, r.get_data(as_text=True)[:300]
    (svc,) = r.get_json()["services"]
    assert svc["service"] == "odd" and svc["model"] == "\ud800x\x00"   # as stored, escaped on the wire
    assert client.get("/api/v1/rollouts", headers=auth("viewer")).status_code == 200
    page = client.get("/services", headers=auth("viewer"))   # the UI page was the 500: UTF-8 cannot encode it
    assert page.status_code == 200 and "\\ud800x" in page.get_data(as_text=True)
    assert "Traceback" not in caplog.text


@pytest.mark.parametrize("data", [b"[" * 30000, b"{\"a\":" * 10000, b'{"service": ' + b"[" * 40 + b"]" * 40 + b"}"])
def test_deep_json_is_422_without_a_traceback(client, store, caplog, data):
    """Issue 26 row 10: `[` x 30000 was a RecursionError, a 500 and a traceback in the log."""
    before = snapshot(store)
    r = client.post("/api/v1/rollouts", data=data, headers={**auth("operator"), "Content-Type": "application/json"})
    assert r.status_code == 422, r.get_data(as_text=True)[:300]
    assert "deeper than 32" in r.get_json()["error"]["message"]
    assert snapshot(store) == before and "Traceback" not in caplog.text and "RecursionError" not in caplog.text


def test_json_nesting_inside_strings_does_not_count(client):
    body = {"service": "[" * 100 + '"{\\', "kernels": "triton-v1.1"}   # brackets and an escaped quote in a string
    r = client.post("/api/v1/rollouts", json=body, headers=auth("operator"))
    assert r.status_code == 422 and r.get_json()["error"]["field"] == "service", r.get_json()


def test_oversized_body_is_413_and_changes_nothing(client, store):
    before = snapshot(store)
    body = {"service": "chat", "kernels": "triton-v1.1", "args": ["x" * 100] * 1000}
    r = client.post("/api/v1/rollouts", json=body, headers=auth("operator"))
    assert r.status_code == 413 and r.get_json()["error"]["code"] == "too_large"
    assert snapshot(store) == before


def test_actions_are_202_idempotent_409_when_not_allowed_and_recorded_with_the_actor(client, store):
    ro = new_rollout(store)
    t = drive(store, ro.id, 3)
    assert store.get(ro.id).phase is Phase.PROGRESSING
    url = f"/api/v1/rollouts/{ro.id}"
    r1 = client.post(url + "/pause", headers=auth("operator"))
    r2 = client.post(url + "/pause", headers=auth("operator"))
    assert r1.status_code == r2.status_code == 202
    assert r1.get_json()["command_id"] == r2.get_json()["command_id"]
    assert [c["command"] for c in store.commands.pending(ro.id)] == ["pause"]
    assert client.get(url, headers=auth("viewer")).get_json()["pending_commands"][0]["actor"] == NAMES["operator"]
    before = snapshot(store)
    r = client.post(url + "/resume", headers=auth("operator"))   # not paused yet
    assert r.status_code == 409 and "resume" in r.get_json()["error"]["message"]
    assert snapshot(store) == before
    t = drive(store, ro.id, 1, t0=t)
    assert store.get(ro.id).phase is Phase.PAUSED and not store.commands.pending(ro.id)
    assert client.post(url + "/resume", headers=auth("operator")).status_code == 202
    t = drive(store, ro.id, 1, t0=t)
    assert store.get(ro.id).phase is Phase.PROGRESSING
    assert client.post(url + "/abort", headers=auth("admin")).status_code == 202
    drive(store, ro.id, 3, t0=t)
    assert store.get(ro.id).phase is Phase.ROLLED_BACK
    body = client.get(url + "/events", headers=auth("viewer")).get_json()
    events = body["events"]
    actors = {e["actor"] for e in events if e["kind"] != "check"}
    acts = {(a["kind"], a["status"]) for a in body["actions"]}
    assert {("deploy", "done"), ("set_weights", "done"), ("rollback", "done")} <= acts
    assert any(a["what"] == "deploy canary (triton-v1.1)" for a in body["actions"])
    since = client.get(url + f"/events?since_id={events[-2]['id']}", headers=auth("viewer")).get_json()["events"]
    assert [e["id"] for e in since] == [events[-1]["id"]]
    assert {NAMES["operator"], NAMES["admin"]} <= actors
    before = snapshot(store)
    for c in ("promote", "pause", "resume", "abort"):
        r = client.post(f"{url}/{c}", headers=auth("operator"))
        assert r.status_code == 409, c
    assert snapshot(store) == before


ROUTES = [("GET", "/api/v1/rollouts"), ("POST", "/api/v1/rollouts"), ("GET", "/api/v1/rollouts/R"),
          ("GET", "/api/v1/rollouts/R/checks"), ("GET", "/api/v1/rollouts/R/checks/1"),
          ("GET", "/api/v1/rollouts/R/events"), ("GET", "/api/v1/rollouts/R/series"),
          ("POST", "/api/v1/rollouts/R/promote"), ("POST", "/api/v1/rollouts/R/pause"),
          ("POST", "/api/v1/rollouts/R/resume"), ("POST", "/api/v1/rollouts/R/abort"), ("GET", "/api/v1/kernels"),
          ("GET", "/api/v1/services"), ("GET", "/api/v1/config"), ("GET", "/api/v1/me")]


@pytest.mark.parametrize("method,path", ROUTES)
def test_every_route_is_401_without_or_with_a_wrong_token(client, store, method, path):
    ro = new_rollout(store)
    path = path.replace("/R", f"/{ro.id}")
    before = snapshot(store)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic dXNlcjpwYXNz"}):
        r = client.open(path, method=method, headers=headers, json={"service": "x", "kernels": "torch"}
                        if method == "POST" else None)
        assert r.status_code == 401, (path, headers)
        assert r.get_json()["error"]["code"] == "unauthorized"
        assert r.headers["WWW-Authenticate"].startswith("Bearer")
    assert snapshot(store) == before


@pytest.mark.parametrize("method,path", [x for x in ROUTES if x[0] == "POST"])
def test_viewer_acting_is_403_and_changes_nothing(client, store, method, path):
    ro = new_rollout(store)
    drive(store, ro.id, 3)
    path = path.replace("/R", f"/{ro.id}")
    before = snapshot(store)
    r = client.post(path, headers=auth("viewer"), json={"service": "new", "kernels": "torch"})
    assert r.status_code == 403 and r.get_json()["error"]["code"] == "forbidden"
    assert snapshot(store) == before


def test_config_is_admin_only_and_holds_no_secrets(client):
    assert client.get("/api/v1/config", headers=auth("operator")).status_code == 403
    r = client.get("/api/v1/config", headers=auth("admin"))
    assert r.status_code == 200
    cfg = r.get_json()
    assert cfg["policy_defaults"]["steps"] == [5, 10, 25, 50, 100] and cfg["auth"]["enabled"] is True
    roles = {u["name"]: u["role"] for u in cfg["auth"]["users"]}
    assert roles == {"vera": "viewer", "otto": "operator", "ada": "admin"}
    text = r.get_data(as_text=True)
    assert "token_sha256" not in text and "token-0123456789" not in text


def test_me(client):
    assert client.get("/api/v1/me", headers=auth("operator")).get_json() == {"name": "otto", "role": "operator"}


def test_kernels_catalogue_names_parents_and_overridden_ops(client):
    ks = {k["name"]: k for k in client.get("/api/v1/kernels", headers=auth("viewer")).get_json()["kernels"]}
    assert {"torch", "triton-v1", "triton-v1.1"} <= set(ks)
    v11 = ks["triton-v1.1"]
    assert v11["version"] == "1.1.0" and v11["parent"] == "triton-v1" and v11["overrides"] == ["prefill_attention"]
    assert v11["cuda_graphs"] is True and set(v11["devices"]) == {"cpu", "cuda"}
    assert ks["torch"]["cuda_graphs"] is False and ks["torch"]["parent"] is None


def test_services_show_each_production(client, store):
    ro = new_rollout(store, "chat")
    drive(store, ro.id, 6)
    new_rollout(store, "embed", canary="torch", production="triton-v1", now=50.0)
    svcs = {s["service"]: s for s in client.get("/api/v1/services", headers=auth("viewer")).get_json()["services"]}
    assert svcs["chat"]["production_kernels"] == "triton-v1" and svcs["chat"]["ready"] is True
    assert svcs["chat"]["active_rollout"] == ro.id and svcs["chat"]["model"] == "tiny"
    assert svcs["embed"]["latest_rollout"]["phase"] == "pending" and svcs["embed"]["ready"] is None


def test_openapi_describes_every_route(app, client):
    spec = client.get("/api/v1/openapi.json").get_json()
    assert spec["openapi"].startswith("3.")
    described = {(m.upper(), "/api/v1" + p) for p, ops in spec["paths"].items() for m in ops}
    for rule in app.url_map.iter_rules():
        if not rule.rule.startswith("/api/v1/") or "<path:" in rule.rule:
            continue
        path = rule.rule.replace("<int:seq>", "{seq}").replace("<rollout_id>", "{rollout_id}")
        if "<any(" in path:
            paths = [path.split("<any(")[0] + c for c in ("promote", "pause", "resume", "abort")]
        else:
            paths = [path]
        for p in paths:
            for m in rule.methods - {"HEAD", "OPTIONS"}:
                assert (m, p) in described, (m, p)


def test_the_list_and_the_rollout_say_which_engine_flags_the_canary_changes(client, store):
    # a release of an engine flag: production's own set, an FP8 KV cache on the canary only
    flag = new_rollout(store, "kv", canary="triton-v1.8", production="triton-v1.8",
                       spec={"production_args": ["--quantization", "fp8"],
                             "canary_args": ["--quantization", "fp8", "--kv-cache-dtype", "fp8"]})
    new_rollout(store, "chat", now=1.0)
    listed = {x["service"]: x for x in client.get("/api/v1/rollouts", headers=auth("viewer")).get_json()["rollouts"]}
    assert listed["kv"]["flags"] == ["--kv-cache-dtype fp8"] and listed["chat"]["flags"] == []
    one = client.get(f"/api/v1/rollouts/{flag.id}", headers=auth("viewer")).get_json()
    assert one["flags"] == ["--kv-cache-dtype fp8"]
    assert set(store.specs([flag.id, "nope"])) == {flag.id}   # one query for a page of rollouts


def test_list_summaries_are_list_without_the_step_data(store):
    ro = new_rollout(store)
    drive(store, ro.id, 8)
    new_rollout(store, "embed", now=10.0)
    full, light = store.list(), store.list_summaries()
    assert full[1].data and not light[1].data
    assert [replace(r, data={}) for r in full] == light
    assert store.list_summaries(service="embed", limit=1, offset=0)[0].service == "embed"


def test_new_rollouts_start_from_the_service_policy_defaults(store, users):
    app = create_app({"TESTING": True, "STORE": store, "SITS_USERS": users,
                      "POLICY_DEFAULTS": {"steps": [1, 2, 100], "check_interval_s": 7}})
    c = app.test_client()
    r = c.post("/api/v1/rollouts", json={"service": "chat", "kernels": "torch"}, headers=auth("operator"))
    assert r.get_json()["steps"] == [1, 2, 100] and r.get_json()["policy"]["check_interval_s"] == 7
    r = c.post("/api/v1/rollouts", json={"service": "embed", "kernels": "torch", "policy": {"steps": [5, 100]}},
               headers=auth("operator"))
    assert r.get_json()["steps"] == [5, 100] and r.get_json()["policy"]["check_interval_s"] == 7
    assert c.get("/api/v1/config", headers=auth("admin")).get_json()["policy_defaults"]["steps"] == [1, 2, 100]


def test_checks_without_buckets_are_checks_minus_the_histograms(store):
    ro = new_rollout(store)
    drive(store, ro.id, 8)
    full, light = store.checks(ro.id), store.checks_without_buckets(ro.id)
    for c in full:
        for v in c["variants"].values():
            del v["histograms"]
    assert full == light and light


def test_services_show_the_router_the_worker_deployed_from_the_store_alone(client, store):
    """The view reads the store, never a deployer: the app here has no worker at all, and the URL is what the
    worker wrote after deploying production (here the real worker, on the in-memory deployer)."""
    r = new_rollout(store, "chat")
    drive(store, r.id, passes=1)
    (svc,) = client.get("/api/v1/services", headers=auth("viewer")).get_json()["services"]
    assert svc["service"] == "chat" and svc["router_url"] == "mem://chat"
    store.services.set_router("chat", "http://127.0.0.1:9")   # a restarted router on another port: the store says
    assert client.get("/api/v1/services", headers=auth("viewer")).get_json()["services"][0]["router_url"] == \
        "http://127.0.0.1:9"


def test_the_printed_api_url_answers_with_where_to_go(client):
    # `sits-control serve` prints "API http://.../api/v1/": it is an index, not a 404
    r = client.get("/api/v1/")
    assert r.status_code == 200
    body = r.get_json()
    assert body["openapi"] == "/api/v1/openapi.json" and body["resources"]["rollouts"] == "/api/v1/rollouts"
    for path in (body["openapi"], *body["resources"].values()):
        assert client.get(path).status_code != 404, path
