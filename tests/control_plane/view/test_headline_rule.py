"""The one headline rule (view/headline.py `lead`) on literal results, the headline's API form, and every renderer
naming the same result for the same check: the web list (API `last_check`), `sits-control ... --wait`, a
KernelRollout's status and the charts' gated columns."""
import pytest

from sits.control_plane.crd.status import last_check
from sits.control_plane.cli.client import progress_line
from sits.control_plane.view import Headline, ResultView, decode_check, headline_of, lead
from sits.control_plane.web.series import gated

P99, P90, ERR = "lat:p99", "lat:p90", "error_rate"


def r(check, outcome, delta=None, series="lat", low_traffic=False, **kw):
    return ResultView(check, series if check != ERR else ERR, outcome,
                      delta_rel=delta if check != ERR else None, delta_abs=delta if check == ERR else None,
                      ci_low=None if delta is None else delta - 0.1, ci_high=None if delta is None else delta + 0.1,
                      threshold=0.1, low_traffic=low_traffic, **kw)


@pytest.mark.parametrize("name,results,outcome,want", [
    ("a failed check: its failing result, not a larger passing delta or a higher quantile",
     [r(P99, "pass", 0.30), r(P90, "fail", 0.25)], "fail", 1),
    ("a passed check: the highest quantile", [r(P90, "pass", 0.03), r(P99, "pass", 0.01)], "pass", 1),
    ("an inconclusive check: its inconclusive result, never a passing one beside it",
     [r(P99, "pass", 0.30), r(P90, "inconclusive", 0.02)], "inconclusive", 1),
    ("a series that decided before one skipped for too little traffic",
     [r(P99, "inconclusive", 0.5, low_traffic=True), r(P90, "inconclusive", 0.02)], "inconclusive", 1),
    ("one with a delta before one without", [r(P99, "inconclusive"), r(P90, "inconclusive", 0.02)], "inconclusive",
     1),
    ("two series of one quantile: the larger delta",
     [r(P99, "fail", 0.2, series="a"), r(P99, "fail", 0.4, series="b")], "fail", 1),
    ("the error rate after every latency quantile", [r(ERR, "fail", 0.03), r(P90, "fail", 0.2)], "fail", 1),
    ("no result has the check's outcome (a guard failed it): the worse outcome first",
     [r(P99, "pass", 0.1), r(P90, "inconclusive", 0.1)], "fail", 1),
])
def test_lead(name, results, outcome, want):
    assert lead(results, outcome) is results[want], name


def test_lead_without_an_outcome_takes_the_worst_and_nothing_gives_none():
    rs = [r(P99, "pass", 0.5), r(P90, "fail", 0.1), r(P90, "inconclusive", 0.9)]
    assert lead(rs) is rs[1] and lead([]) is None


def _check(results, outcome, decision="rollback", **verdict):
    return {"seq": 7, "at": 1_780_000_000.0, "step": 1, "weight": 25, "decision": decision, "source": "scrape",
            "verdict": {"outcome": outcome, "reason": "why", "compare_to": "baseline", "results": results,
                        **verdict}}


def _stored(x: ResultView) -> dict:
    d = {k: getattr(x, k) for k in ResultView.__slots__}
    return {k: v for k, v in d.items() if k not in ("vs_production",)}


CASES = {
    "fail": _check([_stored(r(P99, "pass", 0.30)), _stored(r(P90, "fail", 0.25)), _stored(r(ERR, "pass", 0.0))],
                   "fail"),
    "pass": _check([_stored(r(P90, "pass", 0.03)), _stored(r(P99, "pass", 0.01))], "pass", "advance"),
    "inconclusive": _check([_stored(r(P99, "pass", 0.30)), _stored(r(P90, "inconclusive", 0.02))], "inconclusive",
                           "hold", need_more=640),
    "sequential": _check([_stored(r(P90, "inconclusive", 0.18, method="sequential", ship=0.05, windows=8,
                                    eta_s=310.4))], "inconclusive", "hold"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_list_the_cli_the_crd_status_and_the_charts_name_the_same_result(case):
    ev = CASES[case]
    h = headline_of(decode_check(ev))
    api = h.to_dict()
    crd = last_check(ev)
    line = progress_line({"phase": "progressing", "step": 1, "steps": [5, 25, 100], "weight": 25, "last_check": api})
    assert crd["metric"] == api["check"] == h.check
    assert crd["verdict"] == api["outcome"] == ev["verdict"]["outcome"] and api["result"] == api["outcome"]
    assert f"· {api['label']} " in line and crd["delta"] in line and crd["interval"] in line
    assert gated(decode_check(ev))[h.check]["series"] == h.series


def test_the_headline_as_the_api_sends_it_and_as_the_cli_reads_it_back():
    ev = CASES["sequential"]
    api = headline_of(decode_check(ev)).to_dict()
    assert api == {"seq": 7, "at": 1_780_000_000.0, "step": 1, "weight": 25, "outcome": "inconclusive",
                   "decision": "hold", "reason": "why", "guard": None, "need_more": None, "compare_to": "baseline",
                   "source": "scrape", "check": P90, "label": "p90 lat", "series": "lat", "kind": "rel",
                   "delta": 0.18, "ci": [pytest.approx(0.08), pytest.approx(0.28)], "threshold": 0.1,
                   "result": "inconclusive", "method": "sequential", "ship": 0.05, "windows": 8, "eta_s": 310.4}
    assert Headline.from_dict(api).to_dict() == api
    fixed = headline_of(decode_check(CASES["fail"])).to_dict()
    assert "method" not in fixed and "ship" not in fixed and fixed["check"] == P90
    guard = headline_of(decode_check(_check([], "fail", guard="crashing"))).to_dict()
    assert "check" not in guard and guard["guard"] == "crashing"
