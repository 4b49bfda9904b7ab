"""The detail page's engines list in a real browser (Debian Chromium via Playwright), at 1440 and 390 px: each
variant's engines (processes or pods) with readiness, restarts, state and the last log line on one line (cut with
an ellipsis, the whole line on hover and focus), as the worker last listed them. Screenshots go to
artifacts/browser/."""
from __future__ import annotations

from . import ui_scenarios_engines
from .browser_support import BOTH, BROWSER_TESTS, artifacts_dir, shot

pytestmark = BROWSER_TESTS
SCENARIO = ui_scenarios_engines.build


@BOTH
def test_each_engine_shows_readiness_restarts_state_and_one_log_line(browser, sc, width):
    with browser.page("viewer", width) as page:
        page.goto(f"{browser.url}/rollouts/{sc.pods}")
        page.locator("#engines-rows tr").first.wait_for()
        rows = page.locator("#engines-rows tr")
        assert rows.count() == 4
        assert [rows.nth(i).get_attribute("data-role") for i in range(4)] == ["production", "production", "baseline",
                                                                              "canary"]
        canary = page.locator('#engines-rows tr[data-role="canary"]')
        assert canary.locator(".name").inner_text() == "pods-canary-6f8d-j7w5r"
        assert canary.locator(".ready").inner_text() == "● not ready"
        assert canary.locator(".restarts").inner_text() == "3"
        assert canary.locator(".state").inner_text() == "CrashLoopBackOff"
        line = canary.locator(".logline")
        assert line.get_attribute("title") == ui_scenarios_engines.CRASH_LINE   # the whole line on hover
        box = line.bounding_box()
        assert box["height"] < 30   # one line, cut by the cell (an ellipsis), not wrapped
        assert line.evaluate("e => e.scrollWidth > e.clientWidth")
        assert page.locator('#engines-rows tr[data-role="production"] .ready').first.inner_text() == "● ready"
        line.click()   # a tap or Enter unfolds the whole line (no hover on a phone)
        assert line.get_attribute("aria-expanded") == "true" and line.bounding_box()["height"] > 30
        line.press("Enter")
        assert line.get_attribute("aria-expanded") == "false" and line.bounding_box()["height"] < 30
        assert page.locator("#engines-note").inner_text().startswith("As the worker saw them")
        # the page never scrolls sideways for a long log line
        assert page.evaluate("document.scrollingElement.scrollWidth") <= width
        page.locator("#engines-h").scroll_into_view_if_needed()
        shot(page, "detail-engines")
        page.locator("section.engines-section").screenshot(
            path=str(artifacts_dir() / f"detail-engines-section-{width}.png"))


@BOTH
def test_an_ended_rollouts_engines_are_its_last_sight(browser, sc, width):
    with browser.page("viewer", width) as page:
        page.goto(f"{browser.url}/rollouts/{sc.slow}")   # rolled back: the worker no longer lists them
        page.locator("#engines-rows tr").first.wait_for()
        assert page.locator("#engines-rows tr").count() == 3
        assert page.locator("#engines-note").inner_text().startswith("As the worker last saw them, at ")
        canary = page.locator('#engines-rows tr[data-role="canary"]')   # rolled back: removed since, not "ready"
        assert canary.locator(".ready").inner_text() == "removed since"
        assert canary.locator(".state").inner_text() == "was running"
        prod = page.locator('#engines-rows tr[data-role="production"]')
        assert prod.locator(".ready").inner_text() == "● ready" and prod.locator(".state").inner_text() == "running"
        shot(page, "detail-engines-ended")
        page.locator("section.engines-section").screenshot(
            path=str(artifacts_dir() / f"detail-engines-ended-section-{width}.png"))
        page.goto(f"{browser.url}/rollouts/{sc.deploy_failed}")   # production only: the canary never deployed
        page.locator("#engines-note").wait_for()
        page.wait_for_function("document.getElementById('engines-note').textContent.length > 0")
        roles = page.locator("#engines-rows tr").evaluate_all("rs => rs.map(r => r.dataset.role)")
        assert "canary" not in roles

