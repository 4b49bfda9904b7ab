"""Issue 40 (the web UI, round 3) in a real browser (Debian Chromium via Playwright), at 1440 and 390 px, console
errors and uncaught exceptions failing the test: one app server and one browser for the module, over rollouts built
by the real worker, state machine and analysis (ui_scenarios.py, ui_scenarios_states.py). Screenshots go to
artifacts/browser/ ($SITS_ARTIFACTS)."""
from __future__ import annotations

from . import ui_scenarios_states
from .browser_support import BOTH, BROWSER_TESTS, live_box, open_newest_evidence, shot

pytestmark = BROWSER_TESTS
SCENARIO = ui_scenarios_states.build
APP_CONFIG = {"REPLICA_LIMIT": {"per_variant": 1, "why": "4 engines fit on this machine in all"}}


def _polls(page, n: int = 2) -> None:
    """Let the page's 1.5 s poll run `n` more times."""
    page.wait_for_timeout(1500 * n + 300)


# major: live refresh with no checks yet --------------------------------------------------------------------------
@BOTH
def test_a_rollout_without_checks_refreshes_live(browser, sc, width):
    for rid, first in ((sc.pending, "Waiting for the worker"), (sc.deploy_failed, "Rolled back: deploy of the canary")):
        with browser.page("operator", width) as page:
            warnings = []
            page.on("console", lambda m: warnings.append(m.text) if m.type == "warning" else None)
            page.goto(f"{browser.url}/rollouts/{rid}")
            _polls(page)
            assert not [w for w in warnings if "poll failed" in w], warnings
            assert page.locator("#live").inner_text() == "live"
            assert page.locator("#overall").inner_text().startswith(first)
            assert page.locator("#events li").count() >= 1          # the events the API has are drawn
            if rid == sc.deploy_failed:
                assert page.locator("#outbox li", has_text="deploy canary").count() >= 1
            else:
                assert page.locator('button[data-command="abort"]').is_enabled()
            shot(page, f"detail-no-checks-{'pending' if rid == sc.pending else 'deploy-failed'}")


# major: a failed promote is not a rollback -----------------------------------------------------------------------
@BOTH
def test_a_failed_promote_shows_where_traffic_still_goes(browser, sc, width):
    with browser.page("operator", width) as page:
        page.goto(browser.url + "/")
        row = page.locator(f'#rows tr[data-id="{sc.failed_promote}"]')
        row.locator(".ending").wait_for()
        assert row.locator(".badge").inner_text() == "failed"
        assert row.locator(".ending").inner_text().startswith("⚠ promote failed: ")
        assert row.locator(".weight .pct").inner_text() == "50 %"   # the router still sends the canary its share
        page.goto(f"{browser.url}/rollouts/{sc.failed_promote}")
        page.locator("#failed-help").wait_for()
        overall = page.locator("#overall").inner_text()
        assert overall.startswith("Failed: promote failed: service ads: router refused the new table")
        assert "Rolled back" not in overall and "canary 0 %" not in overall
        assert "(canary 50 %, baseline 50 %, production 0 %)" in page.locator("#failed-help").inner_text()
        for role in ("canary", "baseline"):
            v = page.locator(f"#variants .variant.{role}").inner_text()
            assert "still deployed" in v and "removed" not in v and v.split("·")[1].strip() == "50 %", v
        tip = page.locator('#actions .tip:has(button[data-command="promote"])').get_attribute("data-tip")
        assert tip.startswith("the rollout failed")
        shot(page, "detail-failed-promote")


# major: the real cause of a deploy that never got ready, not the engine's log ---------------------------------------
@BOTH
def test_a_deploy_that_never_got_ready_says_why_in_one_line(browser, sc, width):
    with browser.page("viewer", width) as page:
        page.goto(browser.url + "/")
        cell = page.locator(f'#rows tr[data-id="{sc.unknown_model}"] .c-check')
        cell.locator(".ending").wait_for()
        text = cell.inner_text()
        assert "unknown model 'llama3-70b'" in text
        assert "GET /readyz" not in text and ui_scenarios_states.LOG_PATH not in text and "NotReadyError" not in text
        assert cell.bounding_box()["height"] < 120
        page.goto(f"{browser.url}/rollouts/{sc.unknown_model}")
        err = page.locator("#outbox details.err").first
        err.wait_for()
        assert "unknown model" in err.locator("summary").inner_text()
        assert not err.locator("pre").is_visible()                  # the log tail is folded away
        err.locator("summary").click()
        assert ui_scenarios_states.LOG_PATH in err.locator("pre").inner_text()
        _polls(page, 1)
        assert page.locator("#outbox details.err").first.locator("pre").is_visible()   # a refresh keeps it open
        assert page.evaluate("document.documentElement.scrollWidth") <= width + 1
        shot(page, "detail-unknown-model")


# the evidence row does not widen the checks table -------------------------------------------------------------------
@BOTH
def test_opening_evidence_keeps_the_checks_table_width(browser, sc, width):
    with browser.page("viewer", width) as page:
        row, before = open_newest_evidence(page, f"{browser.url}/rollouts/{sc.slow}")
        page.locator("#checks tr.evidence pre").wait_for()
        assert page.locator("#checks").bounding_box()["width"] <= before + 1
        btn = row.locator("button", has_text="Evidence").bounding_box()
        assert btn["x"] + btn["width"] <= width
        assert page.locator("#checks tr.evidence pre").bounding_box()["width"] <= width
        shot(page, "detail-evidence-open")


# action errors stay until read -------------------------------------------------------------------------------------
def test_an_action_error_survives_the_refresh(browser, sc):
    with browser.page("viewer", 1440, allow_status=(403,)) as page:
        page.goto(f"{browser.url}/rollouts/{sc.running}")
        page.locator("#summary-rows tr").first.wait_for()
        # a viewer's buttons are disabled; enabled by hand, the server still refuses (403)
        page.evaluate("() => { const b = document.querySelector('button[data-command=pause]'); b.disabled = false; "
                      "b.click(); }")
        err = page.locator("#action-error")
        err.wait_for(state="visible")
        _polls(page, 2)
        assert err.is_visible() and err.inner_text().startswith("Pause refused: ")
        page.click("#action-error-close")
        assert not err.is_visible()


# the list's last check pairs a metric with its own verdict -----------------------------------------------------------
@BOTH
def test_the_last_check_column_pairs_metric_and_verdict(browser, sc, width):
    last = sc.store.check(sc.running, sc.store.get(sc.running).checks)
    outcomes = {r["check"]: r["outcome"] for r in last["verdict"]["results"]}
    with browser.page("viewer", width) as page:
        page.goto(browser.url + "/")
        line = page.locator(f'#rows tr[data-id="{sc.running}"] .lastcheck')
        line.wait_for()
        check = line.get_attribute("data-check")
        shown = line.locator("[class^=verdict-]").get_attribute("class").removeprefix("verdict-")
        assert shown == outcomes[check] == last["verdict"]["outcome"], (check, shown, outcomes)


# the new-canary form ---------------------------------------------------------------------------------------------
@BOTH
def test_new_canary_preselects_a_real_release_and_refuses_an_unknown_prefill(browser, sc, width):
    with browser.page("operator", width) as page:
        page.goto(browser.url + "/rollouts/new")
        kernels = {k["name"]: k for k in page.request.get(browser.url + "/api/v1/kernels").json()["kernels"]}
        chosen = page.input_value("#kernels")
        assert chosen and kernels[chosen]["regression"] is None and chosen != page.input_value("#production_kernels")
        assert "(example wrong release)" in page.locator('#kernels option[value="triton-v1-floor-pages"]').inner_text()
        page.goto(f"{browser.url}/rollouts/new?service=chat&kernels=triton-v9&from={sc.slow}")
        assert page.input_value("#kernels") == ""
        err = page.locator("#kernels-err")
        assert err.is_visible() and "triton-v9" in err.inner_text()
        assert "triton-v9" in page.locator("#prefilled").inner_text()
        assert not page.locator("#changes").is_visible()            # no empty box for a set it does not know
        page.click("#start")
        assert page.locator("#kernels-err").inner_text() == "Choose a kernel set."
        page.select_option("#kernels", "triton-v1.1")
        assert page.locator("#changes").is_visible() and not page.locator("#kernels-err").is_visible()
        shot(page, "new-canary-unknown-prefill")


def test_a_422_names_the_field_as_the_form_does(browser, sc):
    with browser.page("operator", 1440, allow_status=(422,)) as page:
        page.goto(browser.url + "/rollouts/new")
        page.fill("#service", "fresh-422")
        page.fill("#min_samples", "0")
        page.click("#start")
        err = page.locator("#err-min_samples")
        err.wait_for(state="visible")
        text = err.inner_text()
        assert text.startswith("Requests per variant before a latency check decides: ")
        assert "policy." not in text and "min_samples" not in text and "e+" not in text


# verdict card, stepper -------------------------------------------------------------------------------------------
@BOTH
def test_verdict_card_paused_and_promoted(browser, sc, width):
    with browser.page("viewer", width) as page:
        page.goto(f"{browser.url}/rollouts/{sc.paused}")
        page.locator("#summary-rows tr").first.wait_for()
        _polls(page, 1)
        assert page.locator("#overall").inner_text().startswith("Paused at 20 % (paused by otto): last check #")
        page.goto(f"{browser.url}/rollouts/{sc.promoted}")
        page.locator("#summary-rows tr.decided").first.wait_for()
        rows = page.locator("#summary-rows tr.decided")
        assert rows.count() == 3
        for i in range(rows.count()):
            assert "◀ passed" in rows.nth(i).inner_text() and "decided" not in rows.nth(i).inner_text()
            colour = rows.nth(i).evaluate("e => getComputedStyle(e).outlineColor")
            assert colour == page.evaluate("c => { const d = document.createElement('div'); d.style.color = c; "
                                           "document.body.append(d); const v = getComputedStyle(d).color; d.remove();"
                                           " return v; }", "var(--ok)"), colour
        shot(page, "detail-promoted")


@BOTH
def test_the_stepper_shows_where_the_gate_stopped(browser, sc, width):
    with browser.page("viewer", width) as page:
        page.goto(f"{browser.url}/rollouts/{sc.gate_failed}")
        gate = page.locator("#gate-stop")
        gate.wait_for()
        assert gate.get_attribute("data-state") == "failed" and "failed (check #1)" in gate.inner_text()
        assert gate.get_attribute("aria-current") == "step"
        assert page.locator("#stepper li.done").count() == 0
        box = live_box(gate)
        assert box["x"] >= 0 and box["x"] + box["width"] <= width
        shot(page, "detail-gate-failed")
        page.goto(f"{browser.url}/rollouts/{sc.promoted}")   # the gate off: no stop for it
        page.locator("#stepper li").first.wait_for()
        assert page.locator("#gate-stop").count() == 0
        # a promoted rollout's steps are all done: each shows its time, the 100 % one (promotion) says so, none
        # reads as still running
        times = page.locator("#stepper li.done .t").all_inner_texts()
        assert times and "…" not in times and times[-1] == "promoted", times
        # the production the promotion replaced: not "ready" at 100 %, but replaced by the canary's kernels
        prod, canary = (page.locator(f"#variants .variant.{role}").inner_text() for role in ("production", "canary"))
        assert "promoted to production" in canary and "● ready" not in prod, prod
        assert "torch · replaced by triton-v1, which serves production's 100 % now" in prod, prod


# services --------------------------------------------------------------------------------------------------------
def test_services_say_where_traffic_enters_for_a_production_deployed_before(browser, sc):
    with browser.page("viewer", 1440) as page:
        page.goto(browser.url + "/services")
        row = page.locator("tr", has=page.locator('a[href="/services/fresh"]'))
        assert row.locator('td[data-label="Traffic to"]').inner_text() == "mem://fresh"


@BOTH
def test_after_a_promoted_flag_release_production_shows_its_flags_and_the_form_says_who_gets_them(browser, sc,
                                                                                                   width):
    with browser.page("operator", width) as page:
        page.goto(browser.url + "/services")
        row = page.locator("tr", has=page.locator('a[href="/services/kv"]'))
        assert "--kv-cache-dtype fp8" in row.locator('td[data-label="Production"]').inner_text()
        page.goto(browser.url + "/rollouts/new?service=kv")
        note = page.locator("#production-flags")
        note.wait_for()
        assert note.is_visible() and page.locator("#production-flags-value").inner_text() == "--kv-cache-dtype fp8"
        assert page.locator("#args").get_attribute("placeholder") == "--kv-cache-dtype fp8"
        assert page.locator("#production_kernels").input_value() == "triton-v1.5"
        shot(page, "new-canary-production-flags")
        page.locator("#service").fill("brand-new")   # a service with no production yet: no note
        page.locator("#service").dispatch_event("input")
        assert not note.is_visible()


# cosmetic --------------------------------------------------------------------------------------------------------
CONTRAST = """(sel) => {
  const lum = (c) => { const [r, g, b] = c.match(/[\\d.]+/g).slice(0, 3).map((x) => { x = x / 255;
      return x <= 0.03928 ? x / 12.92 : ((x + 0.055) / 1.055) ** 2.4; }); return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
  const bg = (e) => { for (; e; e = e.parentElement) { const c = getComputedStyle(e).backgroundColor;
      if (!c.startsWith('rgba(0, 0, 0, 0)') && c !== 'transparent') return c; } return 'rgb(255, 255, 255)'; };
  return [...document.querySelectorAll(sel)].map((e) => { const a = lum(getComputedStyle(e).color), b = lum(bg(e));
      return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05); });
}"""


def test_contrast_of_green_and_method_tags_is_aa(browser, sc):
    with browser.page("viewer", 1440) as page:
        page.goto(browser.url + "/")
        page.locator(".badge.phase-succeeded").first.wait_for()
        for sel in (".badge.phase-succeeded", ".end-promoted"):
            ratios = page.evaluate(CONTRAST, sel)
            assert ratios and min(ratios) >= 4.5, (sel, ratios)
        page.goto(f"{browser.url}/rollouts/{sc.promoted}")
        page.locator("#summary-rows .verdict-pass").first.wait_for()
        assert min(page.evaluate(CONTRAST, ".verdict-pass")) >= 4.5
        page.goto(browser.url + "/api")
        page.locator(".method").first.wait_for()
        for sel in (".m-get", ".m-post"):
            ratios = page.evaluate(CONTRAST, sel)
            assert ratios and min(ratios) >= 4.5, (sel, ratios)


def test_phone_keeps_words_whole_and_shows_who_is_signed_in(browser, sc):
    with browser.page("operator", 390) as page:
        page.goto(f"{browser.url}/rollouts/{sc.running}")
        page.locator("#checks .results .verdict-inconclusive").first.wait_for()
        lines = page.evaluate("[...document.querySelectorAll('#checks [class^=verdict-]')]"
                              ".map((e) => e.firstChild && e.firstChild.nodeType === 3 ? (() => { const r = "
                              "document.createRange(); r.selectNodeContents(e.firstChild); return r.getClientRects()"
                              ".length; })() : 1)")
        assert lines and max(lines) == 1, lines
        who = page.locator(".who .user")
        assert who.is_visible() and "otto" in who.inner_text() and "operator" in who.inner_text()
        b = who.bounding_box()
        assert b["x"] >= 0 and b["x"] + b["width"] <= 390


def test_the_login_page_shows_no_navigation(browser):
    with browser.page("viewer", 1440) as page:
        page.context.clear_cookies()
        page.goto(browser.url + "/login")
        assert page.locator("nav[aria-label=Main] a").count() == 1        # the brand alone
        assert page.locator("nav[aria-label=Main] a", has_text="Kernels").count() == 0
    browser.forget("viewer")


@BOTH
def test_the_left_chart_card_has_no_blank_area(browser, sc, width):
    with browser.page("viewer", width) as page:
        page.goto(f"{browser.url}/rollouts/{sc.slow}")
        fig = page.locator('.chart-row[data-metric="http_request_duration_seconds"] .chart.latency')
        fig.wait_for()
        page.locator('.chart-row[data-metric="http_request_duration_seconds"] figure.chart.delta').nth(1).wait_for()
        fig.locator(".dist svg").wait_for()
        # the card ends with its content: the percentiles, then the distribution under them
        box, last = fig.bounding_box(), fig.locator(".dist").bounding_box()
        assert box["y"] + box["height"] - (last["y"] + last["height"]) < 40, (box, last)


# new view: the distribution behind the percentiles -----------------------------------------------------------------
@BOTH
def test_the_latency_card_shows_the_newest_checks_distribution(browser, sc, width):
    with browser.page("viewer", width) as page:
        page.goto(f"{browser.url}/rollouts/{sc.slow}")
        box = page.locator('.dist[data-metric="http_request_duration_seconds"]')
        box.locator("svg").wait_for()
        assert box.get_attribute("data-seq") == page.locator("#checks tbody tr").first.get_attribute("data-seq")
        svg = box.locator("svg")
        assert svg.locator("path.area.canary").count() == 1 and svg.locator("path.area.target").count() == 1
        assert svg.locator("rect.bin").count() == int(box.get_attribute("data-bins")) > 1
        assert any(t.endswith(" ms") for t in svg.locator("text.tick").all_text_contents())
        # the slow canary's P99 tick sits right of the baseline's (a log axis shared by both)
        x = {cls: float(svg.locator(f"line.q.{cls}:not([stroke-dasharray])").get_attribute("x1"))
             for cls in ("canary", "target")}
        assert x["canary"] > x["target"], x
        assert "canary P99" in svg.get_attribute("aria-label")
        b = svg.bounding_box()
        assert b["x"] >= 0 and b["x"] + b["width"] <= width + 1 and b["height"] > 100
        shot(page, "detail-distribution")
