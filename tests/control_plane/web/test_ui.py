"""The server-rendered pages through Flask's test client: login redirects, roles, what each page carries, headers,
and the vendored assets."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from .accounts import TOKENS
from .conftest import drive, new_rollout
from .test_auth import login

STATIC = Path(__file__).resolve().parents[3] / "control_plane" / "web" / "static"


@pytest.mark.parametrize("path", ["/", "/rollouts/new", "/rollouts/x", "/kernels", "/services", "/services/chat",
                                  "/api"])
def test_pages_redirect_to_login_when_signed_out(client, path):
    r = client.get(path)
    assert r.status_code == 302 and r.headers["Location"].startswith("/login?next=")


def test_every_page_renders_for_a_viewer(client, store):
    ro = new_rollout(store)
    drive(store, ro.id, 6)
    login(client, TOKENS["viewer"])
    for path in ("/", "/rollouts/new", f"/rollouts/{ro.id}", "/kernels", "/services"):
        r = client.get(path)
        assert r.status_code == 200, path
        html = r.get_data(as_text=True)
        assert 'name="csrf-token"' in html and "vera" in html
        assert r.headers["X-Frame-Options"] == "DENY" and "default-src 'self'" in r.headers["Content-Security-Policy"]
        assert not re.search(r'(src|href)="(https?:)?//', html), path   # no CDN: every asset is ours


def test_new_canary_page_offers_the_catalogue_and_defaults(client):
    login(client, TOKENS["operator"])
    html = client.get("/rollouts/new").get_data(as_text=True)
    assert '<option value="triton-v1.1"' in html and '<option value="torch"' in html
    defaults = json.loads(re.search(r'id="policy-defaults">(.*?)</script>', html, re.S).group(1))
    assert defaults["steps"] == [5, 10, 25, 50, 100]
    assert 'id="start"' in html and 'id="start" disabled' not in html


def test_new_canary_page_tells_a_viewer_they_cannot_start(client):
    login(client, TOKENS["viewer"])
    html = client.get("/rollouts/new").get_data(as_text=True)
    assert "needs the operator role" in html and 'id="start" disabled' in html


def test_detail_page_embeds_the_rollout_and_the_ops_that_differ(client, store):
    ro = new_rollout(store, canary="triton-v1.1", production="triton-v1")
    login(client, TOKENS["viewer"])
    html = client.get(f"/rollouts/{ro.id}").get_data(as_text=True)
    data = json.loads(re.search(r'id="rollout-data">(.*?)</script>', html, re.S).group(1))
    assert data["id"] == ro.id and data["phase"] == "pending"
    assert "prefill_attention" in html and "1.1.0" in html
    assert json.loads(re.search(r'id="can-act">(.*?)</script>', html, re.S).group(1)) is False


@pytest.mark.parametrize("canary,production", [("triton-v1.6", "triton-v1.5"), ("triton-v1.5", "triton-v1.6")])
def test_a_fused_op_one_side_has_is_an_op_that_differs(client, store, canary, production):
    # triton-v1.6 adds the fused op silu_and_mul_linear; going back to v1.5 removes it: both ways it differs
    ro = new_rollout(store, canary=canary, production=production)
    login(client, TOKENS["viewer"])
    html = client.get(f"/rollouts/{ro.id}").get_data(as_text=True)
    shown = re.search(r"Ops that differ: (.*?)</p>", html, re.S).group(1)
    assert re.findall(r'<code class="op">(.*?)</code>', shown) == ["silu_and_mul_linear"]


def test_an_engine_flag_release_shows_the_flags_it_changes(client, store):
    # production's own set with an FP8 KV cache on the canary: no op differs, the flag does, and the page says so
    ro = new_rollout(store, canary="triton-v1.8", production="triton-v1.8",
                     spec={"production_args": ["--quantization", "fp8"],
                           "canary_args": ["--quantization", "fp8", "--kv-cache-dtype", "fp8"]})
    login(client, TOKENS["viewer"])
    html = client.get(f"/rollouts/{ro.id}").get_data(as_text=True)
    assert "Ops that differ: none (same implementations)" in html
    flags = re.search(r'id="flags">Engine flags that differ \(canary\):\s*(.*?)</p>', html, re.S).group(1)
    assert re.findall(r'<code class="op">(.*?)</code>', flags) == ["--kv-cache-dtype fp8"]
    plain = new_rollout(store, service="other")   # the same flags on both sides: no line
    assert 'id="flags"' not in client.get(f"/rollouts/{plain.id}").get_data(as_text=True)


def test_unknown_rollout_page_is_a_404_page(client):
    login(client, TOKENS["viewer"])
    r = client.get("/rollouts/nope")
    assert r.status_code == 404 and "text/html" in r.content_type and b"no rollout" in r.data


def test_kernels_and_services_pages(client, store):
    ro = new_rollout(store)
    drive(store, ro.id, 3)
    login(client, TOKENS["viewer"])
    k = client.get("/kernels").get_data(as_text=True)
    assert 'id="k-triton-v1.1"' in k and "prefill_attention" in k
    s = client.get("/services").get_data(as_text=True)
    assert ">chat<" in s and "triton-v1" in s


def test_vendored_assets_are_served_with_their_licence_and_pinned_version(client):
    r = client.get("/static/vendor/uplot/uPlot.iife.min.js")
    assert r.status_code == 200 and b"uPlot" in r.data[:2000]
    assert (STATIC / "vendor" / "uplot" / "LICENSE").read_text().startswith("The MIT License")
    assert "1.6.32" in (STATIC / "vendor" / "README.md").read_text()
    for js in ("common.js", "rollouts.js", "detail.js", "new.js", "charts.js", "history.js", "apiref.js"):
        assert client.get(f"/static/js/{js}").status_code == 200



def test_pages_give_their_scripts_the_roles_phases_and_metric_names_defined_in_python(client):
    import json
    import re
    from sits.control_plane.rollout import ROLES, Phase
    page = client.get("/", follow_redirects=True).get_data(as_text=True)
    vocab = json.loads(re.search(r'<script type="application/json" id="sits-vocabulary">(.*?)</script>', page).group(1))
    from sits.control_plane.view.names import SHORT_NAMES
    assert vocab == {"roles": list(ROLES), "phases": {p.name: p.value for p in Phase}, "metrics": SHORT_NAMES}
    # the scripts compare against SITS.ROLES / SITS.PHASE, never a list of their own
    for js in (STATIC / "js").glob("*.js"):
        text = js.read_text()
        assert '"production", "baseline", "canary"' not in text, js.name
        assert not re.search(r'"(rolled_back|rolling_back|succeeded|initializing|promoting)"', text), js.name

# ---- issue 27: why each rollout ended, the service history, the gated-check chart columns, what fits ------------
def test_list_says_why_each_rollout_ended(client, store):
    from tests.control_plane.worker.support import InMemoryDeployer
    from sits.control_plane.rollout import Command
    from sits.control_plane.service.rollouts import send_command
    slow = new_rollout(store, "chat")
    drive(store, slow.id, 40, scale=3.0)
    aborted = new_rollout(store, "embed")
    t = drive(store, aborted.id, 3)
    send_command(store, aborted.id, Command.ABORT, "otto")
    drive(store, aborted.id, 3, t0=t)
    d = InMemoryDeployer()
    d.fail.add(("search", "canary"))
    failed = new_rollout(store, "search")
    drive(store, failed.id, 10, deployer=d)
    running = new_rollout(store, "rank")
    drive(store, running.id, 3)
    login(client, TOKENS["viewer"])
    rows = {r["id"]: r for r in client.get("/api/v1/rollouts").get_json()["rollouts"]}
    assert rows[slow.id]["phase"] == "rolled_back" and rows[slow.id]["ended"]["kind"] == "latency"
    assert re.fullmatch(r"p\d+ request latency \+\d+\.\d % \[\+\d+\.\d %, \+\d+\.\d %\] > \+\d+\.\d %",
                        rows[slow.id]["ended"]["text"]), rows[slow.id]["ended"]
    assert rows[aborted.id]["ended"] == {"kind": "aborted", "text": "aborted by otto"}
    assert rows[failed.id]["ended"]["kind"] == "deploy" and "image pull failed" in rows[failed.id]["ended"]["text"]
    assert "ended" not in rows[running.id] or rows[running.id]["ended"] is None


def test_service_history_page_lists_each_rollout_and_the_versions(client, store):
    first = new_rollout(store, "chat", canary="triton-v1", production="torch")
    t = drive(store, first.id, 60)
    assert store.get(first.id).phase.value == "succeeded"
    second = new_rollout(store, "chat", now=t + 1, canary="torch-slow-attn", production="triton-v1")
    drive(store, second.id, 40, scale=3.0, t0=t + 1)
    login(client, TOKENS["operator"])
    html = client.get("/services/chat").get_data(as_text=True)
    assert html.index(f'data-id="{second.id}"') < html.index(f'data-id="{first.id}"')   # newest first
    assert re.findall(r'<li data-kernels="([^"]+)"', html) == ["triton-v1", "torch"]
    assert "Canary this version again" in html and "Retry" in html
    assert f"/rollouts/new?retry_of={second.id}" in html   # a retry in place, linked to the rolled-back one
    assert client.get("/services/nope").status_code == 404


def test_series_carry_one_column_per_gated_check_with_the_tables_numbers(client, store):
    ro = new_rollout(store)
    drive(store, ro.id, 12, scale=1.5)
    login(client, TOKENS["viewer"])
    s = client.get(f"/api/v1/rollouts/{ro.id}/series").get_json()
    checks = client.get(f"/api/v1/rollouts/{ro.id}/checks?view=compact").get_json()["checks"]
    assert set(s["gated"]) == {c["check"] for c in checks[-1]["results"]}
    for i, seq in enumerate(s["seq"]):
        c = next(c for c in checks if c["seq"] == seq)
        for r in c["results"]:
            col = s["gated"][r["check"]]
            want = r["delta_abs"] if r["check"] == "error_rate" else r["delta_rel"]
            assert col["outcome"][i] == r["outcome"] and col["threshold"] == r["threshold"]
            assert (col["delta"][i] is None) == (want is None)
            if want is not None:
                assert col["delta"][i] == pytest.approx(want, rel=1e-3)
        assert s["decision"][i] == c["decision"]


def test_new_canary_says_how_many_replicas_fit(store, users, login_clock):
    """The local deployer's own limit (4 engines: production, baseline and canary get one each), as `serve` and the
    demo put it into the app's config; the view reads only that."""
    import dataclasses
    from sits.control_plane.web import create_app
    from sits.control_plane.adapters.deploy.local.deployer import LocalDeployer
    from sits.control_plane.adapters.deploy.local.config import LocalConfig
    deployer = LocalDeployer(LocalConfig(max_replicas=4))
    try:
        app = create_app({"TESTING": True, "STORE": store, "SITS_USERS": users, "SECRET_KEY": "k",
                          "REPLICA_LIMIT": dataclasses.asdict(deployer.replica_limit())})
        client = app.test_client()
        login(client, TOKENS["operator"])
        html = client.get("/rollouts/new").get_data(as_text=True)
        assert 'max="1"' in html and "4 engines fit on this machine in all" in html
    finally:
        deployer.close()


def test_grafana_links_name_the_generated_dashboards():
    import json as _json
    from sits.dashboards.generate import render_all
    from sits.control_plane.web.ui import DASHBOARDS
    uids = {_json.loads(text)["uid"] for text in render_all().values()}
    assert {uid for _, uid in DASHBOARDS} == uids


def test_role_errors_use_the_right_article(client):
    login(client, TOKENS["operator"])
    r = client.get("/api/v1/config")
    assert r.status_code == 403 and r.get_json()["error"]["message"] == ("otto is an operator; this needs the admin "
                                                                         "role")


@pytest.mark.parametrize("last,kind,text", [
    ({"decision": "rollback", "source": "correctness", "reason": "correctness: float32 tolerances: 78% identical"},
     "correctness", "float32 tolerances: 78% identical"),
    ({"decision": "rollback", "source": "metrics", "guard": "crashing", "reason": "canary is crashing (restarts)"},
     "guard", "canary is crashing (restarts)"),
])
def test_why_it_ended_does_not_repeat_the_kind_the_list_writes_before_it(last, kind, text):
    from sits.control_plane.rollout import Rollout
    from sits.control_plane.view import Headline
    from sits.control_plane.web.present import ending
    # rollouts.js writes "correctness gate failed: <text>" and "guard: <text>"
    assert ending(Rollout("r", "chat", "v2", "v1"), Headline.from_dict(last), [], []) == {"kind": kind, "text": text}
