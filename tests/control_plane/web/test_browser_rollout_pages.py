"""Issue 27 in a real browser (Debian Chromium via Playwright), at 390 and 1440 px, console errors failing the test:
one app server and one browser for the module, over rollouts built by the real worker and analysis
(ui_scenarios.py). Screenshots go to artifacts/browser/ ($SITS_ARTIFACTS)."""
from __future__ import annotations

import re

from sits.control_plane.analysis import CorrectnessVerdict, Outcome
from sits.control_plane.analysis.conformance import ConformanceVerdict
from sits.control_plane.rollout import Observation, reconcile
from sits.control_plane.service.rollouts import start_rollout
from tests.control_plane.test_rollout import window

from . import ui_scenarios
from .browser_support import BOTH, BROWSER_TESTS, shot
from .conftest import GATED_POLICY

pytestmark = BROWSER_TESTS
# the op-level conformance of triton-v1.13 against v1.9 as the GPU demo stored it: six judged ops, long names
JUDGED = ("rms_norm", "fused_add_rms_norm", "rope_and_cache", "paged_decode_attention", "linear", "linear_silu_and_mul")
CONFORMANCE = ConformanceVerdict(Outcome.PASS, "op-level conformance: within tolerance", kernel_set="triton-v1.13",
                                 reference="torch", device="cuda", dtype="bfloat16", judged_ops=JUDGED,
                                 unchanged_ops=("silu_and_mul", "prefill_attention"), cases=48, seconds=2.0, k=4.0)
PASS = CorrectnessVerdict(Outcome.PASS, "float32 tolerances: every prompt identical", prompts=32,
                          identical_fraction=1.0, top1_agreement=1.0, drift_mean=0.0, drift_max=0.0, failed=(),
                          dtype="float32", evidence=(), diverged=0, tokens=1024, requests=64, seconds=1.5,
                          conformance=CONFORMANCE)


def with_a_passed_gate(path: str) -> ui_scenarios.Scenario:
    """ui_scenarios' rollouts and one whose correctness gate passed before traffic (stored as the worker does)."""
    s = ui_scenarios.build(path)
    r = start_rollout(s.store, "vision", "torch", "torch", GATED_POLICY, now=s.clock, actor="otto")
    r = s.store.save(*reconcile(r, Observation(0.0, 10.0, {}, source="scrape"), s.clock + 10))
    r = s.store.save(*reconcile(r, Observation(10.0, 20.0, window(), source="scrape", correctness=PASS),
                                s.clock + 20))
    s.gated = r.id
    return s


SCENARIO = with_a_passed_gate
APP_CONFIG = {"REPLICA_LIMIT": {"per_variant": 1, "why": "4 engines fit on this machine in all"},
              "GRAFANA_URL": "http://grafana.example:3000/"}


def _box(page, selector):
    return page.locator(selector).first.bounding_box()


# 1 ---------------------------------------------------------------------------------------------------------------
@BOTH
def test_a_passing_correctness_card_has_no_null_text(browser, sc, width):
    with browser.page("viewer", width) as page:
        page.goto(f"{browser.url}/rollouts/{sc.gated}")
        page.locator("#correctness .verdict-head .badge").wait_for()
        text = page.locator("#correctness").inner_text()
        assert "✓ pass" in text and "null" not in text
        assert "History · 1 run" in text
        # the conformance card's op lists: each op a code element of its own, none broken across two lines
        ops = page.locator("#conformance dd.ops").first.locator("code")
        assert ops.all_inner_texts() == list(JUDGED)
        lines = ops.evaluate_all("els => els.map(e => e.getClientRects().length)")
        assert lines == [1] * len(JUDGED), lines
        assert page.evaluate("document.documentElement.scrollWidth") <= width


# 2 ---------------------------------------------------------------------------------------------------------------
@BOTH
def test_every_gated_metric_has_a_chart_with_the_tables_numbers(browser, sc, width):
    with browser.page("viewer", width) as page:
        page.goto(f"{browser.url}/rollouts/{sc.slow}")
        page.locator("#checks tbody tr").first.wait_for()
        newest = page.locator("#checks tbody tr").first
        names = ("http_request_duration_seconds:p99", "http_request_duration_seconds:p90", "error_rate")
        for name in names:
            fig = page.locator(f'figure.chart.delta[data-check="{name}"]')
            fig.wait_for()
            cell = newest.locator(f'.delta[data-check="{name}"]').inner_text()
            assert fig.locator(".cap .val").inner_text() == cell, name
            assert "null" not in fig.locator(".cap").inner_text()
            assert fig.locator("canvas").count() >= 1
            box = fig.bounding_box()
            assert box["width"] > 250 and box["x"] >= 0 and box["x"] + box["width"] <= width + 1
        p90 = page.locator('figure[data-check="http_request_duration_seconds:p90"]')
        assert int(p90.get_attribute("data-fails")) >= 1 and int(p90.get_attribute("data-band")) >= 1
        last = page.locator("#checks tbody tr").first.get_attribute("data-seq")
        assert p90.get_attribute("data-decided") == last          # the deciding check is ringed
        assert "decided: rollback" in p90.locator(".cap").inner_text()
        p99 = page.locator('figure[data-check="http_request_duration_seconds:p99"]')
        assert p99.locator(".cap .val").inner_text().startswith("–")   # inconclusive, no delta: as in the table
        assert "inconclusive" in p99.locator(".cap").inner_text() and p99.get_attribute("data-decided") == ""
        shot(page, "detail-rolled-back-p90")


# 3 ---------------------------------------------------------------------------------------------------------------
def test_checks_table_scrolls_instead_of_clipping_at_390(browser, sc):
    with browser.page("viewer", 390) as page:
        page.goto(f"{browser.url}/rollouts/{sc.slow}")
        page.locator("#checks tbody tr .need, #checks tbody tr .delta").first.wait_for()
        clipped = page.evaluate("""() => {
          const wrap = document.querySelector('#checks').closest('.table-wrap');
          const w = wrap.getBoundingClientRect();
          const reach = w.left + wrap.scrollWidth;   // what the wrapper can show by scrolling
          const bad = [];
          for (const e of document.querySelectorAll('#checks tbody tr:not([hidden]) *')) {
            const r = e.getBoundingClientRect();
            if (r.width && r.right > reach + 1) bad.push(e.textContent.slice(0, 40));
          }
          const table = document.querySelector('#checks');
          if (getComputedStyle(table).overflowX === 'hidden' && table.scrollWidth > table.clientWidth + 1) bad.push('table clips');
          return {bad, overflow: getComputedStyle(wrap).overflowX};
        }""")
        assert clipped["overflow"] == "auto" and clipped["bad"] == []
        need = page.locator("#checks tbody tr").first.locator(".need, .delta").first
        need.scroll_into_view_if_needed()
        assert need.is_visible()


# 4, 5, 6, 7 -----------------------------------------------------------------------------------------------------
@BOTH
def test_new_canary_form_checks_in_the_users_terms(browser, sc, width):
    with browser.page("operator", width, allow_status=(409,)) as page:   # console errors (the old `pattern`) fail it
        page.goto(f"{browser.url}/rollouts/new")
        page.fill("#service", "Bad_Name")
        assert page.evaluate("document.querySelector('#service').validity.patternMismatch") is True
        page.fill("#service", "chat-2")
        assert page.evaluate("document.querySelector('#service').validity.valid") is True
        # replicas: what fits here is said, and more is refused before the request
        assert page.locator("#replicas-help").inner_text() == ("At most 1 per variant here (4 engines fit on this "
                                                              "machine in all).")
        page.fill("#replicas", "2")
        page.click("#start")
        err = page.locator("#err-replicas")
        err.wait_for(state="visible")
        assert "1 is the only choice here" in err.inner_text() and "from 1 to 1" not in err.inner_text()
        page.fill("#replicas", "1")
        # a threshold in percent: the error speaks percent
        page.fill("#thr-0", "-5")
        page.click("#start")
        e0 = page.locator("#thr-0-err")
        e0.wait_for(state="visible")
        assert e0.inner_text() == ("Request latency P99: the threshold must be between +0.01 % and +10000 %; "
                                   "you typed -5 %.")
        assert "max_rel_delta" not in e0.inner_text()
        page.fill("#thr-0", "50")
        # a service with an active rollout: which one, linked
        page.fill("#service", "rank")
        page.select_option("#kernels", "triton-v1.1")
        page.click("#start")
        fe = page.locator("#form-error")
        fe.wait_for(state="visible")
        assert "UNIQUE" not in fe.inner_text() and fe.inner_text().startswith("rank already has an active rollout")
        assert page.get_attribute("#active-rollout", "href") == f"/rollouts/{sc.running}"
        box = _box(page, "#form-error")
        assert box["x"] >= 0 and box["x"] + box["width"] <= width
        shot(page, "new-canary-errors")
        page.click("#active-rollout")
        page.wait_for_url(re.compile(re.escape(sc.running)))


def test_the_server_speaks_percent_too(browser):
    """The server's own 422 (the form's check bypassed) names the threshold in percent."""
    with browser.page("operator", 1440) as page:
        r = page.request.post(f"{browser.url}/api/v1/rollouts", headers={
            "X-CSRF-Token": _csrf(page, browser)}, data={"service": "fresh", "kernels": "torch", "policy": {
                "checks": [{"metric": "http_request_duration_seconds", "quantile": 0.99, "max_rel_delta": -0.05}]}})
        assert r.status == 422
        assert "between +0.01 % and +10000 %" in r.json()["error"]["message"]
        assert "got -5 %" in r.json()["error"]["message"]


def _csrf(page, browser):
    page.goto(browser.url + "/")
    return page.get_attribute('meta[name="csrf-token"]', "content")


# 8 ---------------------------------------------------------------------------------------------------------------
@BOTH
def test_ended_rows_say_why_each_ended(browser, sc, width):
    with browser.page("viewer", width) as page:
        page.goto(browser.url + "/")
        page.locator(f'#rows tr[data-id="{sc.slow}"] .ending').wait_for()
        why = {rid: page.locator(f'#rows tr[data-id="{rid}"] .c-check').inner_text()
               for rid in (sc.slow, sc.aborted, sc.deploy_failed, sc.promoted)}
        assert why[sc.slow].startswith("✗ latency check failed: p90 request latency +")
        assert re.search(r"\[\+\d+\.\d %, \+\d+\.\d %\] > \+25\.0 %$", why[sc.slow])
        assert why[sc.aborted] == "■ aborted by otto"
        assert why[sc.deploy_failed].startswith("⚠ deploy of the canary (triton-v1.1) failed: ")
        assert "image pull failed" in why[sc.deploy_failed]
        assert why[sc.promoted] == "✓ promoted: every step passed"
        assert "needs about" not in page.locator(f'#rows tr[data-id="{sc.aborted}"]').inner_text()
        for rid in (sc.slow, sc.deploy_failed):
            box = _box(page, f'#rows tr[data-id="{rid}"] .ending')
            assert box["x"] + box["width"] <= width + 1
        shot(page, "rollouts")


# 9 ---------------------------------------------------------------------------------------------------------------
@BOTH
def test_links_to_metrics_openapi_and_health_work(browser, width):
    with browser.page("viewer", width) as page:
        page.goto(browser.url + "/")
        nav = page.locator("nav[aria-label=Main]")
        assert nav.locator("a", has_text="API").get_attribute("href") == "/api"
        assert nav.locator("a", has_text="Metrics").get_attribute("href") == "/metrics"
        for name in ("Rollouts", "Kernels", "Services", "API") + (("Metrics",) if width > 700 else ()):
            box = nav.locator("a", has_text=name).first.bounding_box()   # on screen, not in a scrolled strip
            assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width, name
        assert page.locator("text=Log out").bounding_box()["x"] + 10 <= width
        for href in ("/metrics", "/api/v1/openapi.json", "/healthz", "/api"):
            link = page.locator(f'footer a[href="{href}"]')
            assert link.count() == 1, href
            assert page.request.get(browser.url + href).status == 200, href


# 10 --------------------------------------------------------------------------------------------------------------
@BOTH
def test_small_wording_items(browser, sc, width):
    with browser.page("viewer", width) as page:
        page.goto(browser.url + "/")
        btn = page.locator("#new-canary-disabled")
        assert btn.is_disabled() and page.locator("a.button", has_text="+ New canary").count() == 0
        page.goto(browser.url + "/rollouts/new")
        assert "You are signed in as a viewer" in page.locator(".flash.warn").inner_text()
        page.goto(browser.url + "/services")
        chat = page.locator("tr", has_text="chat").first
        assert "● ready" in chat.locator("td.ready").inner_text()
        assert "no rollout watches it now" in chat.locator("td.ready").inner_text()
    with browser.page("operator", width) as page:
        page.goto(browser.url + "/rollouts/new")
        page.click("#start")
        assert page.locator("#err-service").inner_text() == "Enter the service to release the canary to, e.g. chat."


def test_a_pending_rollout_without_a_worker_says_so_and_logout_says_signed_out(browser, sc):
    from sits.control_plane.service.rollouts import start_rollout
    r = start_rollout(sc.store, "idle", "torch", "torch", ui_scenarios.POLICY, now=sc.clock, actor="otto")
    with browser.page("admin", 1440) as page:
        page.goto(f"{browser.url}/rollouts/{r.id}")
        page.locator("#no-worker-warning").wait_for()
        reason = page.locator("#reason").inner_text()
        assert reason.startswith("Waiting for the worker to deploy the canary and baseline. No worker")
        assert ".." not in reason and page.locator("#no-worker").is_visible()
        page.click("text=Log out")
        page.wait_for_url(re.compile(r"/login"))
        assert page.locator("#signed-out").inner_text() == "You are signed out."
        browser.forget("admin")


def test_a_polls_401_during_logout_does_not_cancel_the_logouts_redirect(browser, sc):
    """The rollout page polls the API; a poll answered 401 after Log out was pressed but before its redirect arrived
    used to send the browser to /login?next=... over the logout's own navigation (seen once in CI). Held here on
    purpose: the logout POST waits in the browser while the page's next poll is answered 401."""
    from sits.control_plane.service.rollouts import start_rollout
    r = start_rollout(sc.store, "quiet", "torch", "torch", ui_scenarios.POLICY, now=sc.clock, actor="otto")
    with browser.page("admin", 1440, allow_status=(401,)) as page:
        page.goto(f"{browser.url}/rollouts/{r.id}")
        page.locator("#no-worker-warning").wait_for()
        held, refused = [], []

        def unauthorized(route):
            refused.append(route.request.url)
            route.fulfill(status=401, content_type="application/json", body='{"error": "signed out"}')
        page.route("**/logout", lambda route: held.append(route))
        page.route("**/api/v1/**", unauthorized)
        page.click("text=Log out", no_wait_after=True)
        for _ in range(200):   # the page polls every 1.5 s
            if held and refused:
                break
            page.wait_for_timeout(50)
        assert held and refused, (held, refused)
        page.wait_for_timeout(300)   # time for the poll's answer to be handled
        held[0].continue_()
        page.wait_for_url(re.compile(r"/login\?signed_out=1$"))
        assert page.locator("#signed-out").inner_text() == "You are signed out."
    browser.forget("admin")


# verdict summary -------------------------------------------------------------------------------------------------
@BOTH
def test_verdict_summary_names_the_deciding_metric(browser, sc, width):
    with browser.page("viewer", width) as page:
        page.goto(f"{browser.url}/rollouts/{sc.slow}")
        page.locator("#summary-rows tr.decided").wait_for()
        rows = page.locator("#summary-rows tr")
        assert rows.count() == 3
        p90 = page.locator('#summary-rows tr[data-check="http_request_duration_seconds:p90"]')
        assert "◀ decided" in p90.inner_text() and "✗ fail" in p90.inner_text() and "≤ +25 %" in p90.inner_text()
        newest = page.locator("#checks tbody tr").first
        cell = newest.locator('.delta[data-check="http_request_duration_seconds:p90"]').inner_text()
        assert p90.locator("td").nth(0).inner_text() == cell.split(" ≤ ")[0]
        p99 = page.locator('#summary-rows tr[data-check="http_request_duration_seconds:p99"]')
        assert "inconclusive" in p99.inner_text() and "decided" not in p99.inner_text()
        overall = page.locator("#overall").inner_text()
        assert overall.startswith("Rolled back by the latency check: p90 request latency +")
        assert overall.endswith("(deciding metric: Request latency P90).")
        box = _box(page, "#verdict-summary")
        assert box["y"] < _box(page, "#stepper")["y"] and box["x"] + box["width"] <= width + 1
    with browser.page("viewer", width) as page:
        page.goto(f"{browser.url}/rollouts/{sc.running}")
        page.locator("#summary-rows tr td .verdict-pass, #summary-rows tr td .verdict-inconclusive").first.wait_for()
        assert page.locator("#overall").inner_text().startswith("Running at 20 %: last check #")
        shot(page, "detail-running")


# service history -------------------------------------------------------------------------------------------------
@BOTH
def test_service_history_lists_versions_and_prefills_a_retry(browser, sc, width):
    with browser.page("operator", width) as page:
        page.goto(browser.url + "/services")
        page.click('a[href="/services/chat"] >> nth=0')
        page.wait_for_url(browser.url + "/services/chat")
        versions = page.locator("#versions li")
        assert [versions.nth(i).get_attribute("data-kernels") for i in range(versions.count())] == ["triton-v1",
                                                                                                   "torch"]
        assert re.search(r"running now \((\d+ s|\d+ m \d\d s) so far\)", versions.nth(0).inner_text())
        assert "until" in versions.nth(1).inner_text()
        rows = page.locator("#history tbody tr")
        assert rows.count() == 2
        slow = page.locator(f'#history tr[data-id="{sc.slow}"]')
        slow.locator('.ending[data-kind="latency"]').wait_for()
        assert "p90 request latency" in slow.inner_text() and "rolled back" in slow.inner_text()
        assert re.search(r"\d+ m \d\d s|\d+ s", slow.locator('td[data-label="Took"]').inner_text())
        assert slow.locator("a.again").inner_text() == "Retry"
        assert page.locator(f'#history tr[data-id="{sc.promoted}"] a.again').inner_text() == "Canary this version again"
        for i in range(rows.count()):
            b = rows.nth(i).bounding_box()
            assert b["x"] >= 0 and b["x"] + b["width"] <= width + 1
        shot(page, "service-history")
        slow.locator("a.again").click()
        page.wait_for_url(re.compile(r"/rollouts/new\?"))
        assert page.input_value("#service") == "chat"
        assert page.input_value("#kernels") == "torch-slow-attn"
        assert page.input_value("#production_kernels") == "triton-v1"
        assert page.locator("#retry-banner").is_visible()   # a retry in place, linked to the rolled-back one
        page.goto(browser.url + "/services/chat")
        page.locator(f'#history tr[data-id="{sc.promoted}"] a.again').click()
        page.wait_for_url(re.compile(r"/rollouts/new\?"))
        assert page.input_value("#kernels") == "triton-v1"            # again, against what production runs now:
        assert page.input_value("#production_kernels") == "triton-v1"   # triton-v1 itself (a control experiment)


# API reference ---------------------------------------------------------------------------------------------------
@BOTH
def test_api_reference_renders_the_openapi_document(browser, server, width):
    doc = server.app.test_client().get("/api/v1/openapi.json").get_json()
    n = sum(1 for item in doc["paths"].values() for m in ("get", "post", "put", "patch", "delete") if m in item)
    with browser.page("viewer", width) as page:
        page.goto(browser.url + "/")
        page.click("nav[aria-label=Main] >> text=API")
        page.wait_for_url(browser.url + "/api")
        page.locator(".api-op").first.wait_for()
        assert page.locator(".api-op").count() == n
        post = page.locator('.api-op[data-path="/rollouts"][data-method="post"]')
        assert "/api/v1/rollouts" in post.inner_text() and "422" in post.inner_text()
        assert page.locator("#schema-Rollout").count() == 1
        assert f"{n} operations" in page.locator("#api-toc").inner_text()
        assert page.evaluate("document.documentElement.scrollWidth") <= width + 1
        shot(page, "api-reference")


# --grafana-url ---------------------------------------------------------------------------------------------------
@BOTH
def test_grafana_links_carry_the_service_and_time_range(browser, sc, width):
    r = sc.store.get(sc.slow)
    with browser.page("viewer", width) as page:
        page.goto(f"{browser.url}/rollouts/{sc.slow}")
        links = page.locator("#grafana a")
        assert [links.nth(i).inner_text() for i in range(links.count())] == ["Canary", "Engine", "Control plane"]
        want = (f"?var-service=chat&from={int(r.created_at * 1000) - 60000}"
                f"&to={int(r.phase_since * 1000) + 60000}")
        assert links.nth(0).get_attribute("href") == "http://grafana.example:3000/d/sits-canary" + want
        box = page.locator("#grafana").bounding_box()
        assert box["x"] + box["width"] <= width + 1
