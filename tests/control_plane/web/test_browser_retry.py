"""Retry in place in a real browser (Debian Chromium via Playwright), at 1440 and 390 px: an operator retries an
ended rollout that did not succeed from its page; the new-canary form comes prefilled with its kernel set, spec and
policy, editable; the new rollout links back ("retry of") and the old one forward ("retried as"). Viewers see no
Retry button; a promoted or running rollout offers none. Screenshots go to artifacts/browser/."""
from __future__ import annotations

from . import ui_scenarios_engines
from .browser_support import BOTH, BROWSER_TESTS, shot

pytestmark = BROWSER_TESTS
SCENARIO = ui_scenarios_engines.build
APP_CONFIG = {"REPLICA_LIMIT": {"per_variant": 4, "why": "12 engines fit on this machine in all"}}


@BOTH
def test_an_operator_retries_an_ended_rollout_with_its_spec_and_policy_prefilled(browser, sc, width):
    # one old rollout per width: a retry is active (pending) until a worker takes it, one per service at a time
    old = sc.aborted if width == 1440 else sc.deploy_failed
    r = sc.store.get(old)
    spec = sc.store.spec(old)
    with browser.page("operator", width) as page:
        page.goto(f"{browser.url}/rollouts/{old}")
        retry = page.locator("#retry")
        retry.wait_for()
        assert retry.is_visible() and retry.inner_text() == "Retry…"
        shot(page, f"detail-retry-offered-{r.service}")
        retry.click()
        page.wait_for_url(f"{browser.url}/rollouts/new?retry_of={old}")
        assert page.locator("h1").inner_text() == f"Retry {r.service}"
        assert page.locator("#retry-banner a").inner_text() == old
        assert page.locator("#service").input_value() == r.service
        assert page.locator("#kernels").input_value() == r.canary_kernels
        assert page.locator("#replicas").input_value() == str(spec.replicas)
        assert page.locator("#steps").input_value() == ", ".join(str(s) for s in r.policy.steps)
        assert page.locator("#check_interval_s").input_value() == f"{r.policy.check_interval_s:g}"
        assert page.locator("#min_samples").input_value() == str(r.policy.min_samples)
        assert not page.locator("#correctness").is_checked()   # the old policy had the gate off
        p99 = page.locator("#thr-0")   # request latency P99: +50 % in the old policy (the default is +10 %)
        assert page.locator("#thr-0-on").is_checked() and p99.input_value() == "50"
        assert not page.locator("#thr-2-on").is_checked()   # TTFT: not in the old policy
        assert page.locator("#steps-chips .chip").count() == len(r.policy.steps)
        shot(page, f"new-retry-prefilled-{r.service}")
        # editable before it starts: fewer steps, a tighter P99
        page.fill("#steps", "10, 100")
        p99.fill("30")
        page.click("#start")
        page.wait_for_url(f"{browser.url}/rollouts/{r.service}-*")
        new_id = page.url.rsplit("/", 1)[1]
        page.locator("#retry-of a").wait_for()
        assert page.locator("#retry-of").inner_text() == f"↻ Retry of {old}"
        assert not page.locator("#retry").is_visible()   # pending: nothing to retry yet
        new = sc.store.get(new_id)
        assert new.retry_of == old and new.policy.steps == (10, 100)
        assert [c.max_rel_delta for c in new.policy.checks if c.quantile == 0.99] == [0.3]
        assert new.policy.min_samples == r.policy.min_samples and sc.store.spec(new_id).replicas == spec.replicas
        shot(page, f"detail-retry-of-{r.service}")
        page.click("#retry-of a")
        page.wait_for_url(f"{browser.url}/rollouts/{old}")
        page.locator("#retried-as a").wait_for()
        assert page.locator("#retried-as").inner_text() == f"Retried as {new_id}"
        assert page.evaluate("document.scrollingElement.scrollWidth") <= width
        shot(page, f"detail-retried-as-{r.service}")


@BOTH
def test_viewers_see_no_retry_and_only_ended_unpromoted_rollouts_offer_one(browser, sc, width):
    with browser.page("viewer", width) as page:
        page.goto(f"{browser.url}/rollouts/{sc.slow}")
        page.locator("#engines-note").wait_for()
        page.wait_for_function("document.getElementById('phase').textContent.length > 0")
        assert page.locator("#retry").count() == 0   # not even a disabled one
        page.goto(f"{browser.url}/rollouts/new?retry_of={sc.slow}")
        assert page.locator("#start").is_disabled()   # the form may be looked at; starting needs an operator
    with browser.page("operator", width) as page:
        for rid in (sc.promoted, sc.running):
            page.goto(f"{browser.url}/rollouts/{rid}")
            page.wait_for_function("document.getElementById('phase').textContent.length > 0")
            page.wait_for_timeout(300)
            assert page.locator("#retry").count() == 1 and not page.locator("#retry").is_visible(), rid
        page.goto(f"{browser.url}/rollouts/new?retry_of={sc.promoted}")
        warning = page.locator("#retry-error")
        assert "succeeded: its canary is production now" in warning.inner_text()
        assert page.locator("h1").inner_text() == "New canary"
        page.goto(f"{browser.url}/rollouts/new?retry_of=no-such-rollout")
        assert "no rollout 'no-such-rollout'" in page.locator("#retry-error").inner_text()
        shot(page, "new-retry-refused")
