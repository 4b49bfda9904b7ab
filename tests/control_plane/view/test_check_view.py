"""control_plane/view/check.py: a stored check decoded once into a typed view, for checks as the analysis writes them
now (fixed and sequential statistics, the correctness gate) and as older stores hold them (keys missing, the store's
"NaN" strings)."""
from sits.control_plane.analysis import ERROR_RATE, REQUEST_LATENCY
from sits.control_plane.numbers import ABS, REL
from sits.control_plane.view import ResultView, decode_check
from tests.control_plane.helpers import sequential_check

# a check as a store written before sequential statistics, low-traffic counts and the correctness gate holds it
OLD = {"rollout_id": "r1", "seq": 2, "at": 1013.0, "step": 0, "weight": 10, "window_start": 1002, "window_end": 1013,
       "source": "", "queries": {}, "decision": "advance",
       "verdict": {"outcome": "pass", "reason": "every check passed with confidence", "compare_to": "baseline",
                   "guard": None, "need_more": None,
                   "results": [{"check": f"{REQUEST_LATENCY}:p99", "series": REQUEST_LATENCY, "outcome": "pass",
                                "reason": "p99 +1.0 %", "threshold": 0.1, "n_canary": 1100.0, "n_target": 1100.0,
                                "canary": 0.1, "target": 0.099, "delta_abs": 0.001, "delta_rel": 0.0101,
                                "ci_low": -0.05, "ci_high": 0.06, "need_more": None, "vs_production": None},
                               {"check": ERROR_RATE, "series": ERROR_RATE, "outcome": "pass", "reason": "ok",
                                "threshold": 0.01, "canary": 0.0, "target": 0.0, "delta_abs": 0.0,
                                "delta_rel": "NaN", "ci_low": -0.004, "ci_high": 0.004}],
                   "deltas": []},
       "variants": {"canary": {"histograms": {}, "requests": 1100.0, "errors": 0.0, "ready": True,
                               "crashing": False}}}


def test_an_old_fixed_check_decodes_with_defaults_for_what_it_lacks():
    v = decode_check(OLD)
    assert (v.seq, v.step, v.weight, v.decision, v.outcome, v.compare_to) == (2, 0, 10, "advance", "pass", "baseline")
    assert v.window_s == 11.0 and v.replica == () and v.correctness is None and not v.sequential
    p99, err = v.results
    assert (p99.method, p99.windows, p99.block, p99.ship, p99.low_traffic) == ("fixed", 0, 1, None, False)
    assert (p99.kind, p99.effect, p99.quantile, p99.label) == (REL, 0.0101, 99.0, "p99 request latency")
    # the error rate's effect is its points; the store's "NaN" is None
    assert (err.kind, err.effect, err.delta_rel, err.quantile) == (ABS, 0.0, None, 0.0)
    assert v.variants["canary"].requests == 1100.0 and v.variants["canary"].replayed == 0.0
    assert v.deciding == {p99.check, ERROR_RATE}


def test_a_sequential_check_from_the_analysis_keeps_its_sequence_boundaries_and_replica_offset():
    verdict, stored = sequential_check()
    v = decode_check(stored)
    (r,) = v.results
    want = verdict.results[0]
    assert v.sequential and r.sequential and r.windows == 8 and r.ship == 0.125 and r.threshold == 0.25
    assert r.effect == want.delta_rel and (r.ci_low, r.ci_high) == (want.ci_low, want.ci_high)
    assert r.outcome == want.outcome.value == "inconclusive" and r.eta_s == want.eta_s > 0
    assert r.series_label == "request latency p90 /v1/completions"
    (o,) = v.replica
    assert o.windows == 8 and o.ci_low < o.delta < o.ci_high and o.kind == REL
    assert [d.series_label for d in v.deltas][:2] == ["request latency p90 /v1/completions",
                                                     "request latency p99 /v1/completions"]


def test_a_sequential_error_rate_reads_its_mean_effect_not_this_steps_rates():
    r = ResultView(ERROR_RATE, ERROR_RATE, "fail", delta_abs=0.5, delta_rel=0.031, method="sequential")
    assert r.effect == 0.031 and ResultView(ERROR_RATE, ERROR_RATE, "fail", delta_abs=0.5).effect == 0.5


def test_a_correctness_check_decodes_its_summary_conformance_and_prompts():
    ev = {"seq": 1, "at": 5.0, "step": -1, "weight": 0, "decision": "rollback", "source": "correctness",
          "verdict": {"outcome": "fail", "reason": "correctness: bad", "results": [],
                      "correctness": {"outcome": "fail", "reason": "bad", "prompts": 50, "diverged": 11,
                                      "identical_fraction": 0.78, "top1_agreement": None,
                                      "conformance": {"outcome": "fail", "judged_ops": ["rope"],
                                                      "failures": [{"op": "rope", "case": "n=5", "error": 0.031,
                                                                    "allowed": 0.002, "reference_error": 0.001},
                                                                   {"op": "attn", "case": "n=1", "error": None,
                                                                    "allowed": 0.1, "exception": "boom"}]},
                                      "evidence": [{"index": 3, "prompt": "hi", "first_divergence": 2,
                                                    "baseline_tokens": [1, 2], "canary_tokens": [1, 3]}]}}}
    cv = decode_check(ev).correctness
    assert (cv.outcome, cv.prompts, cv.diverged, cv.identical_fraction, cv.top1_agreement) == ("fail", 50, 11, 0.78,
                                                                                               None)
    assert [f.problem for f in cv.conformance.failures] == ["error 0.031 > allowed 0.002", "boom"]
    assert cv.evidence[0].first_divergence == 2 and cv.evidence[0].canary_tokens == (1, 3)
    assert cv.requests == 0 and cv.seconds is None   # older gate checks: no cost recorded
