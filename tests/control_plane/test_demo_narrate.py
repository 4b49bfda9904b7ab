"""The demo's one-line check summary names every latency gate of the policy, in the policy's order."""
from sits.control_plane.demo.narrate import check_line as _check_line
from sits.control_plane.view import decode_check

REQ = 'http_request_duration_seconds{route="/v1/completions"}'


def check_line(ev: dict, steps: int) -> str:
    return _check_line(decode_check(ev), steps)


def result(check: str, series: str, delta=None, lo=None, hi=None, thr=0.5, outcome="inconclusive") -> dict:
    return {"check": check, "series": series, "delta_rel": delta, "ci_low": lo, "ci_high": hi, "threshold": thr,
            "outcome": outcome}


def evidence(results, outcome="fail", decision="hold") -> dict:
    return {"seq": 4, "step": 0, "weight": 50, "verdict": {"outcome": outcome, "results": results},
            "variants": {"canary": {"requests": 263.0, "replayed": 260.0}}, "decision": decision}


def test_the_line_shows_request_latency_unnamed_and_other_gates_by_name():
    ev = evidence([result("http_request_duration_seconds:p99", REQ),
                   result("http_request_duration_seconds:p90", 'http_request_duration_seconds{route="/v1/chat"}',
                          0.1, 0.0, 0.2, 0.25),
                   result("http_request_duration_seconds:p90", REQ, 1.951, 1.677, 2.038, 0.25, "fail"),
                   result("error_rate", REQ, 0.0, -0.01, 0.003, 0.02, "pass"),
                   result("sits_inter_token_latency_seconds:p99", "sits_inter_token_latency_seconds",
                          2.303, 1.599, 2.446, 0.5, "fail")])
    assert check_line(ev, 2) == (
        "check  4 · step 1/2 at  50 % · P99 not yet (too few requests) · P90 +195.1 % [+167.7, +203.8] (<= +25 %) · "
        "ITL P99 +230.3 % [+159.9, +244.6] (<= +50 %) · 263 canary req (260 replayed) · FAIL -> hold")


def test_an_itl_gate_without_enough_tokens_says_so():
    ev = evidence([result("sits_inter_token_latency_seconds:p90", "sits_inter_token_latency_seconds")],
                  outcome="inconclusive")
    assert "ITL P90 not yet (too few tokens)" in check_line(ev, 2)


def test_a_correctness_check_is_one_verdict():
    ev = evidence([], outcome="pass", decision="pass")
    ev["verdict"]["correctness"] = {"outcome": "pass"}
    assert check_line(ev, 2).endswith("correctness gate: PASS -> pass")


def test_a_sequential_check_line_shows_both_boundaries_and_its_windows():
    seq = dict(result("http_request_duration_seconds:p99", REQ, 5.927, 1.659, 17.043, 1.5, "fail"),
               method="sequential", ship=0.5, windows=7)
    early = dict(result("http_request_duration_seconds:p99", REQ), method="sequential", ship=0.5, windows=3,
                 ci_low=None, ci_high=None)
    assert "P99 +592.7 % [+165.9, +1704.3] (ship +50 % / limit +150 %, 7 windows)" in check_line(evidence([seq]), 2)
    assert "P99 not yet (3 windows)" in check_line(evidence([early]), 2)
