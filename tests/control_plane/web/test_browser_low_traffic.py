"""Low-traffic mode on the rollout page in a real browser (Debian Chromium via Playwright, console errors fail the
test): a rollout driven by the real worker with thin canned traffic whose engines report half of it replayed shows
replayed vs live counts under the variants, in the low-traffic line and per check. Screenshots go to
artifacts/browser/ ($SITS_ARTIFACTS)."""
from __future__ import annotations

import re

import pytest

from sits.control_plane.store.db import Store
from tests.control_plane.worker.test_replay_worker import ThinSource, _passes, _setup

from .browser_support import Browser, Server, needs_chromium, shot

sync_api = pytest.importorskip("playwright.sync_api")
pytestmark = [needs_chromium(), pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def rollout(tmp_path_factory):
    store = Store(str(tmp_path_factory.mktemp("lt") / "sits.db"))
    ro, t, _sender, w = _setup(store, ThinSource)
    try:
        _passes(w, t, 8)
    finally:
        w.stop()
    yield store, store.get(ro.id)
    store.close()


@pytest.fixture(scope="module")
def browser(rollout):
    srv = Server(rollout[0])
    b = Browser(sync_api, srv.url)
    yield b
    b.close()
    srv.close()


@pytest.mark.parametrize("width", [1440, 390])
def test_rollout_page_shows_replayed_and_live_counts(browser, rollout, width):
    _store, r = rollout
    canary = r.data["canary"]
    with browser.page("viewer", width) as page:
        page.goto(f"{browser.url}/rollouts/{r.id}")
        line = page.locator("#low-traffic")
        line.wait_for(state="visible")
        text = line.inner_text()
        assert "Low-traffic mode on" in text
        assert f"{round(canary.replayed)} requests this step ({round(canary.live)} live canary requests)" in text
        assert f"{round(r.replayed_requests)} in this rollout" in text
        card = page.locator(".variant.canary").inner_text()
        assert re.search(rf"{round(canary.requests)} requests this step \({round(canary.live)} live, "
                         rf"{round(canary.replayed)} replayed\)", card), card
        # the checks table fills after the header (its own fetch): wait for it rather than read it at once
        sync_api.expect(page.locator("#checks tbody")).to_contain_text(re.compile(r"\d+ \(\d+ replayed\)"))
        shot(page, "rollout-low-traffic")
