"""sits.control_plane.service.format: the text views the CLI, the demo and the UI share, on evidence made by the real analysis."""
from sits.control_plane.analysis import ERROR_RATE, REQUEST_LATENCY, TTFT, MetricCheck, Policy, VariantData, assess
from sits.control_plane.service.format import format_check, format_deltas, rollout_report, rollout_table
from sits.control_plane.rollout import Check, Decision, Rollout
from sits.control_plane.store.db import Store
from sits.control_plane.store.codec import check_to_dict
from sits.control_plane.view import decode_check
from sits.control_plane.view.names import series_label, terse_label
from tests.control_plane.helpers import lat, sequential_check

ROUTE = REQUEST_LATENCY + '{route="/v1/completions"}'
POLICY = Policy(statistics="fixed", checks=(MetricCheck(REQUEST_LATENCY, quantile=0.9, max_rel_delta=0.1),
                        MetricCheck(ERROR_RATE, max_abs_delta=0.01)))


def evidence(scale: float) -> dict:
    data = {role: VariantData({ROUTE: lat(20000, scale if role == "canary" else 1.0), TTFT: lat(20000)}, 20000.0,
                              100.0 if role == "canary" else 60.0) for role in ("canary", "baseline", "production")}
    verdict = assess(data, POLICY)
    check = Check(3, 100.0, 1, 10, 40.0, 100.0, "scrape", {}, data, verdict,
                  Decision.ROLLBACK if scale > 1 else Decision.ADVANCE)
    return decode_check(check_to_dict("r1", check))


def test_labels_come_from_the_metric_names():
    assert series_label(f"{REQUEST_LATENCY}:p99", ROUTE) == "request latency p99 /v1/completions"
    assert series_label(f"{TTFT}:p99_9", TTFT) == "TTFT p99.9"
    assert series_label(ERROR_RATE, ERROR_RATE) == "error rate"
    assert series_label("my_metric:p50", "my_metric") == "my_metric p50"
    # the demo's one line per check: request latency unnamed, a fractional quantile with its dot
    assert terse_label(f"{REQUEST_LATENCY}:p99") == "P99"
    assert terse_label("sits_inter_token_latency_seconds:p99_9") == "ITL P99.9"
    assert terse_label("my_metric:p50") == "my_metric P50"


def test_a_failed_check_and_its_deltas():
    lines = format_check(evidence(1.3), steps=(5, 10, 100))
    assert lines[0] == ("check 3 · step 2/3 · canary at 10 %, 60.0 s of data · requests canary 20000 / baseline "
                        "20000 · FAIL -> rollback")
    header, latency, errors = lines[1].split(), lines[2], lines[3]
    assert header == ["metric", "canary", "baseline", "delta", "CI", "of", "delta", "threshold", "verdict"]
    assert latency.split()[:4] == ["request", "latency", "p90", "/v1/completions"]
    assert "+30.0 %" in latency and "<= +10.0 %" in latency and latency.endswith("FAIL")
    assert errors.split()[:4] == ["error", "rate", "0.50", "%"] and "0.30 %" in errors and "+0.20 pt" in errors
    assert "<= +1.00 pt" in errors and lines[-1].startswith("    reason: ")
    deltas = format_deltas(evidence(1.3))
    assert deltas[0].split() == ["series", "canary", "baseline", "production", "vs", "baseline", "vs", "production"]
    rows = [line.split() for line in deltas[1:]]
    assert ["request", "latency", "p90", "/v1/completions", "123.5", "ms", "95.0", "ms", "95.0", "ms", "+30.0", "%",
            "+30.0", "%"] in rows
    assert ["TTFT", "p99", "160.0", "ms", "160.0", "ms", "160.0", "ms", "+0.0", "%", "+0.0", "%"] in rows
    assert ["error", "rate", "0.50", "%", "0.30", "%", "0.30", "%", "+0.20", "pt", "+0.20", "pt"] in rows


def test_rollout_list_and_report():
    assert rollout_table([]) == ["no rollouts"]
    with Store(":memory:") as s:
        s.create(Rollout("r1", "chat", "triton-v1", "torch", created_at=0.0))
        table = rollout_table(s.list())
        assert table[1].split() == ["r1", "chat", "pending", "-", "0%", "0", "1970-01-01", "00:00:00"]
        report = rollout_report(s, "r1")
        assert report[0] == "rollout r1  service chat  canary triton-v1  production torch"
        assert report[2:] == ["events:", "checks:"]


def test_a_sequential_check_shows_its_sequence_boundaries_windows_and_replica_offset():
    _, stored = sequential_check()
    ev = decode_check(stored)
    lines = format_check(ev, (50, 100))
    text = "\n".join(lines)
    assert lines[1].split()[:9] == ["metric", "canary", "baseline", "effect", "sequence", "ship", "/", "limit",
                                    "windows"]
    row = next(line for line in lines if line.lstrip().startswith("request latency p90"))
    assert "+18.0 %" in row and "+12.5 % / +25.0 %" in row and " 8 " in row and "INCONCLUSIVE" in row
    assert "~" in row and " s " in row                                           # the time to decide
    assert "replica offset (production vs baseline, same kernels) request latency p90 /v1/completions: +0.0 %" in text
    assert "decides in about" in text
