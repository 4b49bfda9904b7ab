"""The correctness gate in the web UI: a correctness check stored through the pure core (reconcile with an
Observation carrying a CorrectnessVerdict) reaches the detail payload, the compact checks and the page; the New
canary form's switch reaches the stored policy."""
from __future__ import annotations

import json
import re

from sits.control_plane.analysis import CorrectnessVerdict, Outcome, PromptComparison
from sits.control_plane.rollout import Observation, Phase, reconcile
from tests.control_plane.test_rollout import window

from .accounts import TOKENS
from .conftest import GATED_POLICY, auth, new_rollout
from .test_auth import login


def diverged(i: int) -> PromptComparison:
    return PromptComparison(i, f"prompt {i}: The capital of France is", 16, 2, False, 0.01, 0.02, 0.5, 2.1, 16,
                            3.2, 0.4, (464, 3139, 318 + i), (464, 3139, 9 + i), " Paris is", " Paris was")


FAIL = CorrectnessVerdict(Outcome.FAIL, "float32 tolerances: 7 prompt(s) diverged where the baseline was sure",
                          prompts=32, identical_fraction=0.78, top1_agreement=0.91, drift_mean=0.012, drift_max=0.3,
                          failed=("identical_fraction", "flip_margin"), dtype="float32",
                          evidence=tuple(diverged(i) for i in range(7)), diverged=7, tokens=1024, requests=96,
                          seconds=2.5)


def gated_rollout(store, verdict=FAIL):
    """A rollout whose pre-traffic correctness gate ran once and returned `verdict` (stored like the worker does)."""
    r = new_rollout(store, canary="torch-wrong-rope", production="torch", policy=GATED_POLICY)
    r, actions = reconcile(r, Observation(0.0, 10.0, {}, source="scrape"), 10.0)
    r = store.save(r, actions)
    assert r.phase is Phase.INITIALIZING
    r, actions = reconcile(r, Observation(10.0, 20.0, window(), source="scrape", correctness=verdict), 20.0)
    return store.save(r, actions)


def test_detail_payload_carries_the_latest_verdict_capped_divergences_and_history(client, store):
    r = gated_rollout(store)
    assert r.phase is Phase.ROLLING_BACK
    d = client.get(f"/api/v1/rollouts/{r.id}", headers=auth("viewer")).get_json()
    c = d["correctness"]
    assert c["enabled"] is True and c["runs"] == 1
    (line,) = c["history"]
    assert (line["seq"], line["outcome"], line["decision"], line["step"]) == (1, "fail", "rollback", -1)
    assert line["reason"].startswith("float32 tolerances: 7 prompt(s)")   # without the "correctness: " prefix
    L = c["latest"]
    assert (L["outcome"], L["dtype"], L["prompts"], L["identical_fraction"], L["top1_agreement"]) == \
        ("fail", "float32", 32, 0.78, 0.91)
    assert L["failed"] == ["identical_fraction", "flip_margin"] and (L["drift_mean"], L["drift_max"]) == (0.012, 0.3)
    assert L["evidence_total"] == 7 and [e["index"] for e in L["evidence"]] == [0, 1, 2, 3, 4]   # capped at 5
    e = L["evidence"][0]
    assert (e["first_divergence"], e["baseline_tokens"], e["canary_tokens"]) == (2, [464, 3139, 318], [464, 3139, 9])
    assert (e["baseline_margin"], e["canary_margin"], e["canary_text"]) == (3.2, 0.4, " Paris was")
    full = client.get(f"/api/v1/rollouts/{r.id}/checks/{L['seq']}", headers=auth("viewer")).get_json()
    assert len(full["verdict"]["correctness"]["evidence"]) == 7   # "show all" reads them here


def test_compact_checks_mark_a_correctness_check_and_summarise_it_without_evidence(client, store):
    r = gated_rollout(store)
    (c,) = client.get(f"/api/v1/rollouts/{r.id}/checks?view=compact", headers=auth("viewer")).get_json()["checks"]
    assert c["source"] == "correctness" and c["results"] == []
    assert c["correctness"]["identical_fraction"] == 0.78 and "evidence" not in c["correctness"]


def test_a_rollout_without_correctness_checks_has_an_empty_section(client, store):
    r = new_rollout(store)
    c = client.get(f"/api/v1/rollouts/{r.id}", headers=auth("viewer")).get_json()["correctness"]
    assert c["runs"] == 0 and c["history"] == [] and c["latest"] is None


def test_detail_page_has_the_section_and_embeds_the_verdict(client, store):
    r = gated_rollout(store)
    login(client, TOKENS["viewer"])
    html = client.get(f"/rollouts/{r.id}").get_data(as_text=True)
    assert 'id="correctness-h"' in html and 'id="correctness"' in html
    data = json.loads(re.search(r'id="rollout-data">(.*?)</script>', html, re.S).group(1))
    assert data["correctness"]["latest"]["outcome"] == "fail"


def body(**policy):
    return {"service": "chat", "kernels": "torch-wrong-rope", "production_kernels": "torch",
            "policy": {"steps": [10, 100], **policy}}


def test_the_forms_switch_reaches_the_stored_policy(client, store):
    res = client.post("/api/v1/rollouts", json=body(correctness={"enabled": False}), headers=auth("operator"))
    assert res.status_code == 201, res.get_json()
    assert store.get(res.get_json()["id"]).policy.correctness.enabled is False
    assert res.get_json()["correctness"]["enabled"] is False
    res = client.post("/api/v1/rollouts", json=dict(body(), service="chat2"), headers=auth("operator"))
    assert store.get(res.get_json()["id"]).policy.correctness.enabled is True   # on by default


def test_a_bad_switch_value_is_a_422_naming_the_field(client, store):
    res = client.post("/api/v1/rollouts", json=body(correctness={"enabled": "yes"}), headers=auth("operator"))
    assert res.status_code == 422
    assert res.get_json()["error"]["field"] == "policy.correctness.enabled"
    assert store.count() == 0


def test_new_canary_page_has_the_correctness_switch_on_by_default(client):
    login(client, TOKENS["operator"])
    html = client.get("/rollouts/new").get_data(as_text=True)
    tag = re.search(r'<input[^>]*id="correctness"[^>]*>', html).group(0)
    assert 'type="checkbox"' in tag and "checked" in tag and 'data-field="policy.correctness.enabled"' in tag
    assert re.search(r"<label[^>]*for=\"correctness\"", html)
