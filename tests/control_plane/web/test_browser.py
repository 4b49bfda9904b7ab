"""A real browser (Debian Chromium driven by Playwright) against a real `sits-control serve` process whose worker
deploys tiny `sits-engine` processes with the local deployer: log in, start a canary through the form (after the
server's 422 is shown next to the field), watch it progress with data in the charts, abort it, see it rolled back.
Screenshots of every page at 1440x900 and 390x844 go to artifacts/browser/ (or $SITS_ARTIFACTS)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from sits.control_plane.demo.loadgen import LoadGenerator
from sits.control_plane.web.users import token_sha256
from tests.waiting import wait_for

sync_api = pytest.importorskip("playwright.sync_api")
CHROMIUM = "/usr/bin/chromium"
pytestmark = [pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian chromium (.ci/install-browser.sh)"),
              pytest.mark.timeout(240)]
TOKEN = "browser-operator-token-42"
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def artifacts() -> Path:
    d = Path(os.environ.get("SITS_ARTIFACTS", ROOT / "artifacts")) / "browser"
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture
def service(tmp_path):
    auth = tmp_path / "users.json"
    auth.write_text(f'{{"users": [{{"name": "otto", "role": "operator", "token_sha256": "{token_sha256(TOKEN)}"}}]}}')
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "sits.control_plane.cli", "serve", "--port", "0", "--auth-file",
                             str(auth),
                             "--store", str(tmp_path / "sits.db"), "--interval", "0.5", "--workdir",
                             str(tmp_path / "variants"), "--cpu-threads", "1"],
                            stdout=subprocess.PIPE, stderr=open(tmp_path / "serve.log", "w"), text=True, env=env)
    try:
        url = re.search(r"(http://127\.0\.0\.1:\d+)/", proc.stdout.readline()).group(1)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)   # the worker stops, the deployer stops every engine
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise


def _router(url: str, timeout: float) -> str:
    """The service's router address, once the worker has deployed production."""
    def deployed() -> str | None:
        svcs = httpx.get(url + "/api/v1/services", headers={"Authorization": f"Bearer {TOKEN}"}).json()["services"]
        return svcs[0]["router_url"] if svcs and svcs[0]["router_url"] else None
    return wait_for("production to be deployed", deployed, timeout, 0.3, retry_on=())


def test_start_watch_and_abort_a_canary_in_a_real_browser(service, artifacts):
    url = service

    def shot(page, name):
        page.evaluate("window.scrollTo(0, 0)")   # the sticky top bar stays at the top of a full-page shot
        page.screenshot(path=str(artifacts / f"{name}.png"), full_page=True)
    load = None
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url + "/")
            assert "/login" in page.url
            shot(page, "login-1440")
            page.fill("#token", "wrong")
            page.click("button[type=submit]")
            assert page.locator("#login-error").inner_text() == "That token is not valid."
            page.fill("#token", TOKEN)
            page.click("button[type=submit]")
            page.wait_for_selector("#empty", state="visible")   # no rollouts yet
            assert page.locator(".user").inner_text().startswith("otto")

            page.click("text=+ New canary")
            page.fill("#service", "chat")
            page.select_option("#kernels", "torch")
            page.select_option("#production_kernels", "torch")
            page.fill("#steps", "20, 50, 100")
            page.fill("#check_interval_s", "2")
            page.fill("#warmup_s", "1")
            page.fill("#min_samples", "20")
            page.fill("#thr-0", "0")   # request latency P99 <= +0 %: the server refuses it
            page.click("#start")
            err = page.locator("#thr-0-err")
            err.wait_for(state="visible")
            assert "between +0.01 % and +10000 %" in err.inner_text()   # in percent, as typed (issue 27)
            assert page.get_attribute("#thr-0", "aria-invalid") == "true"
            shot(page, "new-canary-422-1440")
            page.fill("#thr-0", "50")
            page.fill("#thr-1", "30")
            page.click("#start")
            page.wait_for_url(re.compile(r"/rollouts/chat-"))
            rollout_id = page.url.rsplit("/", 1)[1]

            load = LoadGenerator(_router(url, 120), rate=12.0, threads=4, max_tokens=2).start()
            page.wait_for_selector("#phase.phase-progressing", timeout=120_000)
            # at least two checks drawn in the request-latency charts, and the checks table holding them
            page.wait_for_selector('.chart-row[data-metric="http_request_duration_seconds"][data-points]',
                                   timeout=60_000)
            page.wait_for_function("() => Number(document.querySelector('.chart-row').dataset.points) >= 2",
                                   timeout=60_000)
            page.wait_for_function("() => document.querySelectorAll('#checks tbody tr').length >= 2", timeout=10_000)
            # the correctness gate ran before traffic (torch against torch: identical) and its verdict is shown
            assert page.locator("#correctness .verdict-head .badge").inner_text().strip() == "✓ pass"
            assert page.locator("#correctness .history li").count() >= 1
            assert page.locator("#stepper li.current .w").inner_text() == "20 %"
            assert page.locator("#live").inner_text() == "live"
            shot(page, "detail-progressing-1440")
            page.set_viewport_size({"width": 390, "height": 844})
            page.wait_for_timeout(300)
            shot(page, "detail-progressing-390")
            page.set_viewport_size({"width": 1440, "height": 900})

            page.click('button[data-command="abort"]')
            page.wait_for_selector("dialog#confirm[open]")
            page.click("#confirm-ok")
            page.wait_for_selector("#phase.phase-rolled_back", timeout=60_000)
            assert page.locator("#phase").inner_text() == "rolled back"
            page.wait_for_function("() => [...document.querySelectorAll('#events .actor')]"
                                   ".some((e) => e.textContent === 'otto')", timeout=10_000)
            assert page.locator('button[data-command="abort"]').is_disabled()
            shot(page, "detail-rolled-back-1440")

            for path, name in (("/", "rollouts"), ("/rollouts/new", "new-canary"), ("/kernels", "kernels"),
                               ("/services", "services"), (f"/rollouts/{rollout_id}", "detail-rolled-back")):
                for w, h in ((1440, 900), (390, 844)):
                    page.set_viewport_size({"width": w, "height": h})
                    page.goto(url + path)
                    page.wait_for_timeout(400 if path != "/" else 900)
                    shot(page, f"{name}-{w}")
                    if path == "/":
                        assert page.locator("#rows tr").first.locator(".badge").inner_text() == "rolled back"
            assert not errors, errors
        finally:
            if load is not None:
                load.stop()
            browser.close()
