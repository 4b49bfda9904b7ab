"""Sequential statistics on the web UI (issue 38, issue 40's last bullet) in a real browser (Debian Chromium via
Playwright), at 1440 and 390 px: the checks table, the expanded evidence, the charts, the verdict card's replica
offset, the list's last check and the new-canary form show the sequence's bounds, both boundaries, the windows and the
time to decide, the same things the CLI's text shows (service/format.py sequential_rows, replica_lines); fixed-method
evidence keeps its columns. Rollouts from ui_scenarios_sequence (the real worker, state machine and analysis).
Screenshots go to artifacts/browser/ ($SITS_ARTIFACTS)."""
from __future__ import annotations

import re

from sits.control_plane.service.format import replica_lines, sequential_rows
from sits.control_plane.view import decode_check, decode_result

from . import ui_scenarios_sequence
from .browser_support import BOTH, BROWSER_TESTS, open_newest_evidence, shot

pytestmark = BROWSER_TESTS
SCENARIO = ui_scenarios_sequence.build
P90 = "http_request_duration_seconds:p90"
P99 = "http_request_duration_seconds:p99"


def _same(text: str) -> str:
    """The CLI's and the page's spelling of one value, made comparable: the page writes a minus sign and whole
    boundaries without ".0" ("+25 %"), the CLI a hyphen and one decimal ("+25.0 %")."""
    return re.sub(r"\.0 ", " ", text.replace("−", "-").replace("–", "-").replace("\xa0", " ")).strip()


def _last(sc, rid):
    return sc.store.check(rid, sc.store.get(rid).checks)


def _fits(page, width):
    assert page.evaluate("document.documentElement.scrollWidth") <= width + 1


@BOTH
def test_the_checks_table_shows_effect_sequence_both_boundaries_windows_and_time_to_decide(browser, sc, width):
    ev = _last(sc, sc.undecided)
    p90 = next(r for r in ev["verdict"]["results"] if r["check"] == P90)
    assert p90["outcome"] == "inconclusive" and p90["eta_s"] > 0
    with browser.page("viewer", width) as page:
        page.goto(f"{browser.url}/rollouts/{sc.undecided}")
        row = page.locator(f'#checks tbody tr[data-seq="{ev["seq"]}"]')
        cell = row.locator(f'.delta.seq[data-check="{P90}"]')
        cell.wait_for()
        assert _same(cell.locator(".eff").inner_text()) == \
            _same(f"{p90['delta_rel'] * 100:+.1f} % [{p90['ci_low'] * 100:+.1f} %, {p90['ci_high'] * 100:+.1f} %]")
        assert cell.locator(".bounds").inner_text() == "ship +10 % / limit +25 %"
        assert cell.locator(".windows").inner_text() == f"{p90['windows']} windows"
        assert cell.locator(".eta").inner_text() == f"decides in ~{p90['eta_s']:.0f} s"
        # a passed series has no time to decide; the error rate's boundaries in points
        err = row.locator('.delta.seq[data-check="error_rate"]')
        assert err.locator(".bounds").inner_text() == "ship +0.50 pt / limit +1.00 pt"
        assert page.locator("#summary-threshold-h").text_content() == "Boundaries"
        summary = page.locator(f'#summary-rows tr[data-check="{P90}"]')
        assert "ship +10 % / limit +25 %" in summary.inner_text()
        assert f"decides in ~{p90['eta_s']:.0f} s" in summary.inner_text()
        _fits(page, width)
        page.locator("#checks").scroll_into_view_if_needed()
        shot(page, "seq-detail-undecided")


@BOTH
def test_an_undecided_p99_between_two_modes_says_so_in_the_verdict_and_the_checks_table(browser, sc, width):
    ev = _last(sc, sc.tail)
    p99 = next(r for r in ev["verdict"]["results"] if r["check"] == P99)
    hint = f"{p99['jumps']} of {p99['windows']} windows jump 2x: two modes?"
    assert p99["outcome"] == "inconclusive" and p99["jumps"] >= 2
    with browser.page("viewer", width) as page:
        page.goto(f"{browser.url}/rollouts/{sc.tail}")
        summary = page.locator(f'#summary-rows tr[data-check="{P99}"] .modes')
        summary.wait_for()
        assert summary.inner_text() == hint and "slower mode" in summary.get_attribute("title")
        assert "may sit between two modes of the latency" in page.locator("#reason").inner_text()   # the headline
        cell = page.locator(f'#checks tbody tr[data-seq="{ev["seq"]}"] .delta.seq[data-check="{P99}"] .modes')
        assert cell.inner_text() == hint
        # the series that decided say nothing of the kind
        assert page.locator(f'#summary-rows tr[data-check="{P90}"] .modes').count() == 0
        _fits(page, width)
        page.locator("#summary-h").scroll_into_view_if_needed()
        shot(page, "seq-detail-two-modes")


@BOTH
def test_the_evidence_shows_the_clis_sequential_rows_and_replica_offset(browser, sc, width):
    ev = _last(sc, sc.undecided)
    view = decode_check(ev)
    rows = sequential_rows(view.results, "baseline")[1:]
    replica = ev["verdict"]["replica"]
    assert replica and len(replica_lines(view.replica)) == len(replica)
    with browser.page("viewer", width) as page:
        _, before = open_newest_evidence(page, f"{browser.url}/rollouts/{sc.undecided}")
        table = page.locator("#checks tr.evidence .seq-table")
        table.wait_for()
        got = table.locator("tbody tr")
        assert got.count() == len(rows)
        for i, want in enumerate(rows):
            cells = [c.inner_text() for c in got.nth(i).locator("th, td").all()]
            # effect, sequence, ship / limit, windows, decides in: as the CLI writes them; the verdict in a word
            assert [_same(c) for c in cells[3:8]] == [_same(c) for c in want[3:8]], (cells, want)
            assert cells[8].split()[-1] == want[8].lower()
        lines = page.locator("#checks tr.evidence .replica-lines li")
        assert lines.count() == len(replica)
        for o, line in zip(replica, lines.all()):
            text = _same(line.inner_text())
            assert _same(f"{o['delta'] * 100:+.1f} % [{o['ci_low'] * 100:+.1f} %, {o['ci_high'] * 100:+.1f} %]") \
                in text or o["check"] == "error_rate", text
            assert text.endswith(f"over {o['windows']} windows")
        # the evidence scrolls inside its box: the table keeps its width, the page does not scroll sideways
        assert page.locator("#checks").bounding_box()["width"] <= before + 1
        box = page.locator("#checks tr.evidence .evidence-box").bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= width + 1
        _fits(page, width)
        page.locator("#checks tr.evidence").scroll_into_view_if_needed()
        page.screenshot(path=str(_art(f"seq-evidence-open-{width}.png")))


def _art(name):
    from .browser_support import artifacts_dir
    return artifacts_dir() / name


@BOTH
def test_the_verdict_card_shows_the_live_aa_one_line_per_series(browser, sc, width):
    replica = _last(sc, sc.undecided)["verdict"]["replica"]
    with browser.page("viewer", width) as page:
        page.goto(f"{browser.url}/rollouts/{sc.undecided}")
        lines = page.locator("#replica .replica-lines li")
        lines.first.wait_for()
        assert lines.count() == len(replica)
        assert "production vs baseline" in page.locator("#replica .replica-head").inner_text()
        for line in lines.all():
            b = line.bounding_box()
            assert b["x"] >= 0 and b["x"] + b["width"] <= width + 1 and b["height"] < 60   # one short line (two on a phone)


@BOTH
def test_the_chart_draws_both_boundaries_and_the_band_is_the_sequence(browser, sc, width):
    with browser.page("viewer", width) as page:
        page.goto(f"{browser.url}/rollouts/{sc.undecided}")
        fig = page.locator(f'figure.chart.delta[data-check="{P90}"]')
        fig.locator(".u-legend").wait_for()
        assert fig.get_attribute("data-method") == "sequential"
        assert "ship +10 % / limit +25 %" in fig.locator("h3").inner_text()
        legend = [t.strip() for t in fig.locator(".u-legend .u-series .u-label").all_inner_texts()]
        assert "limit" in legend and "ship" in legend and "threshold" not in legend, legend
        cap = fig.locator(".cap").inner_text()
        assert "ship +10 % / limit +25 %" in cap and "windows" in cap and "decides in ~" in cap, cap
        assert int(fig.get_attribute("data-band")) > 0
        fig.scroll_into_view_if_needed()
        page.screenshot(path=str(_art(f"seq-chart-{width}.png")))
        _fits(page, width)


@BOTH
def test_fixed_statistics_keep_todays_columns(browser, sc, width):
    with browser.page("viewer", width) as page:
        page.goto(f"{browser.url}/rollouts/{sc.fixed}")
        row = page.locator("#checks tbody tr").first
        row.locator(f'.delta[data-check="{P90}"]').wait_for()
        assert row.locator(".delta.seq").count() == 0
        assert row.locator(f'.delta[data-check="{P90}"]').inner_text().endswith("≤ +25 %")
        fig = page.locator(f'figure.chart.delta[data-check="{P90}"]')
        fig.locator(".u-legend").wait_for()
        assert fig.get_attribute("data-method") == "fixed" and "threshold +25 %" in fig.locator("h3").inner_text()
        assert "ship" not in [t.strip() for t in fig.locator(".u-legend .u-label").all_inner_texts()]
        assert page.locator("#summary-threshold-h").text_content() == "Threshold"
        row.locator("button", has_text="Evidence").click()
        page.locator("#checks tr.evidence pre").wait_for()
        assert page.locator("#checks tr.evidence .seq-table").count() == 0
        assert page.locator("#replica li").count() == 0


@BOTH
def test_the_list_shows_ship_and_limit_for_sequential_checks(browser, sc, width):
    with browser.page("viewer", width) as page:
        page.goto(browser.url + "/")
        line = page.locator(f'#rows tr[data-id="{sc.undecided}"] .lastcheck')
        line.wait_for()
        assert line.get_attribute("data-method") == "sequential"
        want = {P90: "ship +10 % / limit +25 %", "http_request_duration_seconds:p99": "ship +25 % / limit +50 %"}
        assert line.locator(".seqline .bounds").inner_text() == want[line.get_attribute("data-check")]
        assert "decides in ~" in line.locator(".seqline").inner_text()
        ending = page.locator(f'#rows tr[data-id="{sc.slow}"] .ending')
        assert "> ship +10.0 %" in ending.inner_text()
        fixed = page.locator(f'#rows tr[data-id="{sc.fixed}"] .ending')
        assert "> +25.0 %" in fixed.inner_text()
        _fits(page, width)
        shot(page, "seq-list")


@BOTH
def test_the_new_canary_form_takes_a_ship_boundary_per_latency_check(browser, sc, width):
    with browser.page("operator", width) as page:
        page.goto(browser.url + "/rollouts/new")
        assert page.locator("#thresholds-help").is_visible()
        ships = page.locator("#thresholds input[id$=-ship]")
        assert ships.count() == 4                                    # one per latency row, none for the error rate
        limit = page.input_value("#thr-1")
        assert page.get_attribute("#thr-1-ship", "placeholder") == str(float(limit) / 2).removesuffix(".0")
        page.fill("#thr-1", "20")
        assert page.get_attribute("#thr-1-ship", "placeholder") == "10"
        page.fill("#service", f"seqform{width}")
        page.fill("#thr-1-ship", "20")
        page.click("#start")
        err = page.locator("#thr-1-ship-err")
        err.wait_for(state="visible")
        assert err.inner_text() == ("Request latency P90: the ship boundary must be from +0 % up to below the limit "
                                    "(+20 %), or empty for half the limit; you typed 20 %.")
        assert page.get_attribute("#thr-1-ship", "aria-invalid") == "true"
        _fits(page, width)
        page.locator("#thresholds").scroll_into_view_if_needed()
        page.screenshot(path=str(_art(f"seq-new-canary-error-{width}.png")))
        page.fill("#thr-1-ship", "7.5")
        page.click("#start")
        page.wait_for_url(re.compile(r".*/rollouts/(?!new)[^/]+$"))
        rid = page.url.rsplit("/", 1)[1]
        checks = page.request.get(f"{browser.url}/api/v1/rollouts/{rid}").json()["policy"]["checks"]
        p90 = next(c for c in checks if c.get("quantile") == 0.9)
        p99 = next(c for c in checks if c.get("quantile") == 0.99 and c["metric"] == "http_request_duration_seconds")
        assert p90["ship_rel_delta"] == 0.075 and "ship_rel_delta" not in p99     # empty: half the limit


def test_a_retry_prefills_the_ship_boundaries_and_a_422_on_one_shows_next_to_it(browser, sc):
    import json
    with browser.page("operator", 1440, allow_status=(422,)) as page:
        page.goto(f"{browser.url}/rollouts/new?retry_of={sc.slow}")
        page.locator("#retry-banner").wait_for()
        assert page.input_value("#thr-1") == "25" and page.input_value("#thr-1-ship") == "10"   # as the policy set it
        assert page.input_value("#thr-0-ship") == "" and page.get_attribute("#thr-0-ship", "placeholder") == "25"

        def tamper(route):   # past the form's own check: the server's 422 names policy.checks[1].ship_rel_delta
            body = json.loads(route.request.post_data)
            body["policy"]["checks"][1]["ship_rel_delta"] = 0.3
            route.continue_(post_data=json.dumps(body))
        page.route("**/api/v1/rollouts", tamper)
        page.click("#start")
        err = page.locator("#thr-1-ship-err")
        err.wait_for(state="visible")
        assert err.inner_text().startswith("Request latency P90 ship boundary: "), err.inner_text()
        assert err.inner_text() == "Request latency P90 ship boundary: must be from 0 up to the limit (+25 %), got +30 %"
        assert page.get_attribute("#thr-1-ship", "aria-invalid") == "true"
        page.locator("#thresholds").screenshot(path=str(_art("seq-new-canary-422-1440.png")))


def test_blocks_of_correlated_windows_read_x2_as_the_cli_writes_them(browser, sc):
    """No scenario here has correlated windows: the rendering of a result with block 2, against sequential_rows."""
    ev = _last(sc, sc.undecided)
    r = dict(next(x for x in ev["verdict"]["results"] if x["check"] == P90), windows=12, block=2, lag1=0.41,
             label="p90 request latency")
    want = sequential_rows([decode_result(r)], "baseline")[1]
    with browser.page("viewer", 1440) as page:
        page.goto(f"{browser.url}/rollouts/{sc.undecided}")
        page.locator("#checks tbody tr").first.wait_for()
        got = page.evaluate("""(r) => { const c = Sequence.deltaCell(r), t = Sequence.table([r], "baseline");
            return { windows: c.querySelector(".windows").textContent, tip: c.querySelector(".windows").title,
                     cell: t.querySelector("tbody td:nth-of-type(6)").textContent }; }""", r)
        assert got["windows"] == "12 windows (x2)" and got["cell"] == want[6] == "12 (x2)"
        assert "blocks of 2" in got["tip"] and "0.41" in got["tip"]
