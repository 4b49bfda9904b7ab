"""Issue 42 in a real browser (Debian Chromium via Playwright), at 1440 and 390 px: where each variant's engines run
on GPUs -- its own GPUs or shared, in the engines list and on the variant cards -- and the new-canary form's GPUs per
engine (tensor parallel), checked on the client and reaching the rollout. Screenshots go to artifacts/browser/."""
from __future__ import annotations

from . import ui_scenarios_engines
from .browser_support import BOTH, BROWSER_TESTS, artifacts_dir, shot

pytestmark = BROWSER_TESTS
SCENARIO = ui_scenarios_engines.build


@BOTH
def test_each_variant_says_which_gpus_its_engines_run_on(browser, sc, width):
    with browser.page("viewer", width) as page:
        page.goto(f"{browser.url}/rollouts/{sc.gpus}")
        page.locator("#engines-rows tr").first.wait_for()
        cells = page.locator("#engines-rows td.gpus")
        held = "GPUs {}, given to no other variant, but shared: 1 engine of other variants runs on every GPU"
        assert [cells.nth(i).inner_text() for i in range(3)] == [
            held.format("0,1"), held.format("2,3"), ui_scenarios_engines.GPU_SHARED_NOTE]
        for role in ("production", "baseline", "canary"):   # sharing stands out, where it is held too
            assert page.locator(f'#engines-rows tr[data-role="{role}"] td.gpus .warn').count() == 1
        # the variant cards say it too, with the GPUs each engine spans
        page.wait_for_function("document.querySelector('[data-gpus=canary]').textContent.length > 0")
        assert page.locator("[data-gpus=production]").inner_text() == held.format("0,1")
        assert page.locator("[data-gpus=canary]").inner_text() == ui_scenarios_engines.GPU_SHARED_NOTE
        assert page.locator(".variant.canary .tp").inner_text() == "2 GPUs per engine (tensor parallel)"
        assert page.evaluate("document.scrollingElement.scrollWidth") <= width
        page.locator("#engines-h").scroll_into_view_if_needed()
        shot(page, "detail-gpus")
        for what, sel in (("engines", "section.engines-section"), ("variants", "#variants")):
            page.locator(sel).screenshot(path=str(artifacts_dir() / f"detail-gpus-{what}-{width}.png"))
        # a CPU rollout: no GPU line on its cards, a dash in the list
        page.goto(f"{browser.url}/rollouts/{sc.pods}")
        page.locator("#engines-rows tr").first.wait_for()
        assert page.locator("#engines-rows td.gpus").first.inner_text() == "—"
        assert not page.locator("[data-gpus=production]").is_visible() and page.locator(".variant .tp").count() == 0


def test_the_form_takes_gpus_per_engine(browser, sc):
    with browser.page("operator", 1440) as page:
        page.goto(f"{browser.url}/rollouts/new")
        page.fill("#service", "fresh-tp")
        assert page.locator("#tensor_parallel_size").input_value() == "1"
        page.fill("#tensor_parallel_size", "9")
        page.click("#start")
        err = page.locator("#err-tensor_parallel_size")
        err.wait_for(state="visible")
        assert err.inner_text() == "GPUs per engine: a whole number from 1 to 8; you typed 9."
        page.fill("#tensor_parallel_size", "4")
        page.click("#start")
        page.wait_for_url(f"{browser.url}/rollouts/fresh-tp-*")
        rid = page.url.rsplit("/", 1)[1]
        assert sc.store.spec(rid).tensor_parallel_size == 4
        page.locator(".variant.canary .tp").wait_for()
        assert page.locator(".variant.canary .tp").inner_text() == "4 GPUs per engine (tensor parallel)"
