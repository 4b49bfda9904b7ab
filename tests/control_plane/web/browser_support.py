"""One app server (waitress in a thread, over a store of rollouts built by ui_scenarios) and one headless Chromium
per test module; pages signed in as a role, at a width, with console errors and page errors collected. The fixtures
over them (`sc`, `server`, `browser`) are in conftest.py; a browser test module starts with
`pytestmark = BROWSER_TESTS`."""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import pytest

from sits.control_plane.web import create_app
from tests.waitress_thread import ThreadedWaitress

from .accounts import TOKENS, app_users

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[3]
WIDTHS = {1440: 900, 390: 844}


def artifacts_dir() -> Path:
    d = Path(os.environ.get("SITS_ARTIFACTS", ROOT / "artifacts")) / "browser"
    d.mkdir(parents=True, exist_ok=True)
    return d


class Server(ThreadedWaitress):
    def __init__(self, store, **config) -> None:
        self.app = create_app({"STORE": store, "SITS_USERS": app_users(), "SECRET_KEY": "browser-test", **config})
        super().__init__(self.app, threads=4, ident="sits")


class Browser:
    def __init__(self, sync_api, url: str) -> None:
        self._pw = sync_api.sync_playwright().start()
        self.browser = self._pw.chromium.launch(executable_path=CHROMIUM,
                                                args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        self.url = url
        self._sessions: dict[str, list] = {}   # role -> storage state (cookies) after one login

    @contextmanager
    def page(self, role: str = "operator", width: int = 1440, allow_status: tuple[int, ...] = ()):
        """A page signed in as `role` at `width` px; fails the test on a console error or an uncaught exception
        (Chromium logs every 4xx fetch as one: the statuses in `allow_status` are the test's expected answers)."""
        ctx = self.browser.new_context(viewport={"width": width, "height": WIDTHS.get(width, 900)},
                                       storage_state=self._sessions.get(role))
        page = ctx.new_page()
        errors: list[str] = []
        expected = tuple(f"status of {code} " for code in allow_status)

        def console(m):
            if m.type == "error" and not (m.text.startswith("Failed to load resource") and any(
                    e in m.text for e in expected)):
                errors.append(f"console {m.type}: {m.text}")
        page.on("console", console)
        page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
        if role not in self._sessions:
            page.goto(self.url + "/login")
            page.fill("#token", TOKENS[role])
            page.click("button[type=submit]")
            page.wait_for_url(self.url + "/")
            self._sessions[role] = ctx.storage_state()
        try:
            yield page
            assert not errors, errors
        finally:
            ctx.close()

    def forget(self, role: str) -> None:
        """The next page of `role` signs in afresh (after a test logged that session out)."""
        self._sessions.pop(role, None)

    def close(self) -> None:
        self.browser.close()
        self._pw.stop()


def shot(page, name: str) -> None:
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(artifacts_dir() / f"{name}-{page.viewport_size['width']}.png"), full_page=True)


def live_box(locator) -> dict:
    """locator's bounding box (x, y, width, height) read in one call in the page: pages that poll (a rollout's every
    1.5 s) replace their nodes, and Playwright's bounding_box() answers None for a node replaced between its lookup
    and its measure."""
    return locator.evaluate("e => { const r = e.getBoundingClientRect(); "
                            "return { x: r.x, y: r.y, width: r.width, height: r.height }; }")


def open_newest_evidence(page, url: str):
    """Open a rollout's page at `url` and its newest check's evidence: that check's row, and the checks table's width
    before it opened."""
    page.goto(url)
    row = page.locator("#checks tbody tr").first
    row.wait_for()
    before = page.locator("#checks").bounding_box()["width"]
    row.locator("button", has_text="Evidence").click()
    return row, before


def needs_chromium():
    return pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian chromium (.ci/install-browser.sh)")


BROWSER_TESTS = [needs_chromium(), pytest.mark.timeout(300)]   # a browser test module's pytestmark
BOTH = pytest.mark.parametrize("width", [1440, 390])            # a phone's width and a desktop's
