"""compare_replays: table tests over literal replays (no engine), and the correctness policy's validation."""
import json
import math

import pytest

from control_plane.analysis import (Continuation, CorrectnessPolicy, CorrectnessVerdict, Outcome, Policy,
                                    PolicyError, PromptReplay, TokenLogprob, compare_replays)
from control_plane.analysis.correctness import compare_prompt
from control_plane.analysis.prompts import DEFAULT_PROMPTS

POLICY = CorrectnessPolicy(max_tokens=4, compare_tokens=4)


def cont(ids, lps, tops=None, text=None):
    """A continuation; tops[i] = [(token, logprob), ...] (default: the token itself, then token+100 at lp - 2)."""
    tops = tops or [[(t, lp), (t + 100, lp - 2.0)] for t, lp in zip(ids, lps)]
    return Continuation(tuple(ids), text if text is not None else "".join(chr(97 + t % 26) for t in ids),
                        tuple(TokenLogprob(t, lp, tuple(top)) for t, lp, top in zip(ids, lps, tops)))


BASE = cont([1, 2, 3, 4], [-0.5, -0.6, -0.7, -0.8])


def replay(canary=BASE, baseline=BASE, forced=None, prompt="p"):
    return PromptReplay(prompt, baseline, canary, forced if forced is not None else baseline)


def many(r, n=8):
    return [r] * n


def test_identical_replays_pass_with_no_evidence():
    v = compare_replays(many(replay()), POLICY)
    assert v.outcome is Outcome.PASS and v.failed == () and v.evidence == ()
    assert (v.prompts, v.identical_fraction, v.top1_agreement, v.drift_max, v.diverged) == (8, 1.0, 1.0, 0.0, 0)
    assert v.tokens == 64


def test_a_late_divergence_on_a_near_tie_passes_in_bf16_and_is_shown():
    tie = [[(3, -0.70), (9, -0.71)]]
    base = cont([1, 2, 3, 4], [-0.5, -0.6, -0.70, -0.8], tops=[[(1, -0.5)], [(2, -0.6)], *tie, [(4, -0.8)]])
    can = cont([1, 2, 9, 5], [-0.5, -0.6, -0.70, -0.9], tops=[[(1, -0.5)], [(2, -0.6)], [(9, -0.70), (3, -0.705)],
                                                              [(5, -0.9)]])
    rows = [replay()] * 7 + [replay(can, base, forced=base)]
    v = compare_replays(rows, POLICY, "bfloat16")
    assert v.outcome is Outcome.PASS, v.reason
    assert v.diverged == 1 and v.identical_fraction == 7 / 8
    (e,) = v.evidence
    assert (e.index, e.first_divergence) == (7, 2)
    assert e.baseline_margin == pytest.approx(0.01) and e.canary_margin == pytest.approx(0.005)
    assert e.baseline_tokens == (1, 2, 3, 4) and e.canary_tokens == (1, 2, 9, 5) and e.canary_text == "bcjf"


def test_a_divergence_the_baseline_was_sure_about_fails_with_both_continuations():
    can = cont([1, 7, 7, 7], [-0.5, -3.0, -1.0, -1.0], tops=[[(1, -0.5)], [(7, -3.0), (2, -3.1)], [(7, -1.0)],
                                                            [(7, -1.0)]])
    base = cont([1, 2, 3, 4], [-0.5, -0.6, -0.7, -0.8], tops=[[(1, -0.5)], [(2, -0.6), (7, -3.0)], [(3, -0.7)],
                                                             [(4, -0.8)]])
    v = compare_replays([replay()] * 7 + [replay(can, base, prompt="the sure one")], POLICY, "bfloat16")
    assert v.outcome is Outcome.FAIL and "flip_margin" in v.failed
    (e,) = v.evidence
    assert e.prompt == "the sure one" and e.first_divergence == 1
    assert e.baseline_margin == pytest.approx(2.4) and e.canary_margin == pytest.approx(0.1)
    assert (e.baseline_tokens, e.canary_tokens) == ((1, 2, 3, 4), (1, 7, 7, 7))
    assert "prompt 7 at token 1" in v.reason


def test_the_margin_is_a_lower_bound_when_the_other_token_is_not_in_the_top_list():
    base = cont([1, 2], [-0.1, -0.2], tops=[[(1, -0.1)], [(2, -0.2), (5, -4.0)]])
    can = cont([1, 9], [-0.1, -0.3])
    row = compare_prompt(0, replay(can, base), compare_tokens=2)
    assert row.first_divergence == 1 and row.baseline_margin == pytest.approx(3.8)


@pytest.mark.parametrize("dtype, outcome, failed", [
    ("bfloat16", Outcome.PASS, ()),
    ("float32", Outcome.FAIL, ("drift_mean", "drift_max")),
    ("int4-unknown", Outcome.PASS, ()),   # no tolerances for it: the loosest (bfloat16) apply
])
def test_logprob_drift_is_judged_by_the_dtype_tolerances(dtype, outcome, failed):
    drifted = cont([1, 2, 3, 4], [-0.5001, -0.6003, -0.7, -0.8])
    v = compare_replays(many(replay(drifted)), POLICY, dtype)
    assert (v.outcome, v.failed) == (outcome, failed)
    assert v.drift_max == pytest.approx(3e-4) and v.drift_mean == pytest.approx(1e-4)
    assert v.dtype == dtype


def test_teacher_forcing_catches_disagreement_after_an_early_divergence():
    # greedy diverges at token 0 (a near-tie, so no drift is measured before it), but fed the baseline's tokens the
    # canary prefers other tokens at most positions: top-1 agreement shows it
    base = cont([1, 2, 3, 4], [-0.5, -0.6, -0.7, -0.8], tops=[[(1, -0.5), (6, -0.5001)], [(2, -0.6)], [(3, -0.7)],
                                                             [(4, -0.8)]])
    can = cont([6, 2, 3, 4], [-0.5, -0.6, -0.7, -0.8], tops=[[(6, -0.5), (1, -0.5001)], [(2, -0.6)], [(3, -0.7)],
                                                            [(4, -0.8)]])
    forced = cont([1, 2, 3, 4], [-0.5001, -0.9, -0.9, -0.9], tops=[[(6, -0.5), (1, -0.5001)], [(8, -0.3)],
                                                                   [(8, -0.3)], [(8, -0.3)]])
    v = compare_replays([replay()] * 6 + [replay(can, base, forced)] * 2, POLICY, "bfloat16")
    assert v.outcome is Outcome.FAIL and v.failed == ("top1_agreement",)   # 6/8 identical is still allowed
    assert v.top1_agreement == pytest.approx(24 / 32) and v.identical_fraction == 0.75
    assert v.drift_max == pytest.approx(0.3)   # from teacher forcing: greedy diverged before any drift


def test_a_canary_that_stops_early_diverges_where_it_stopped():
    short = cont([1, 2], [-0.5, -0.6])
    row = compare_prompt(0, replay(short), compare_tokens=4)
    assert (row.first_divergence, row.compared, row.identical_k) == (2, 2, False)
    assert row.baseline_margin is None   # no token of the canary's to compare at position 2


@pytest.mark.parametrize("errors, outcome", [(0, Outcome.PASS), (2, Outcome.PASS), (3, Outcome.INCONCLUSIVE),
                                             (8, Outcome.INCONCLUSIVE)])
def test_replay_errors_make_the_verdict_inconclusive_never_a_pass(errors, outcome):
    failed = replay(Continuation(error="HTTP 503: the model is still loading"))
    v = compare_replays([failed] * errors + [replay()] * (8 - errors), POLICY)
    assert v.outcome is outcome and v.errors == errors
    if outcome is Outcome.INCONCLUSIVE:
        assert "503" in v.reason and f"{errors}/8" in v.reason


def test_no_prompts_is_inconclusive():
    assert compare_replays([], POLICY).outcome is Outcome.INCONCLUSIVE


def test_the_verdict_round_trips_through_json():
    can = cont([1, 7, 7, 7], [-0.5, -3.0, -1.0, -1.0])
    v = compare_replays([replay()] * 7 + [replay(can)], POLICY, "float32")
    d = json.loads(json.dumps(v.to_dict()))
    back = CorrectnessVerdict.from_dict(d)
    assert back == v
    nan = compare_replays([replay(Continuation(error="x"))], POLICY)
    assert math.isnan(CorrectnessVerdict.from_dict(json.loads(json.dumps(nan.to_dict()))).drift_max)


def test_the_default_prompt_set_mixes_lengths_past_block_boundaries():
    lengths = sorted(len(p.encode()) + 1 for p in DEFAULT_PROMPTS)   # byte tokenizer + BOS
    assert len(DEFAULT_PROMPTS) == 32 and len(set(DEFAULT_PROMPTS)) == 32
    assert lengths[0] < 16 and any(60 <= n <= 64 for n in lengths) and any(64 < n <= 70 for n in lengths)
    assert sum(n > 128 for n in lengths) >= 5 and lengths[-1] > 1000


# ---- policy ----------------------------------------------------------------------------------------------------------
def test_correctness_is_on_by_default_and_round_trips():
    p = Policy()
    assert p.correctness.enabled and p.correctness.prompt_set == "default"
    d = json.loads(json.dumps(p.to_dict()))
    assert Policy.from_dict(d) == p
    assert set(d["correctness"]["tolerances"]) >= {"float32", "bfloat16"}
    off = Policy.from_dict({"correctness": {"enabled": False}})
    assert not off.correctness.enabled and Policy.from_dict(off.to_dict()) == off


def test_tolerance_overrides_merge_over_the_dtype_defaults():
    p = Policy.from_dict({"correctness": {"tolerances": {"float32": {"max_logprob_drift": 1e-5},
                                                         "float8": {"max_flip_margin": 1.0}}}})
    t = p.correctness.tolerances
    assert t["float32"].max_logprob_drift == 1e-5 and t["float32"].max_mean_logprob_drift == 1e-5
    assert t["bfloat16"] == CorrectnessPolicy().tolerances["bfloat16"]
    assert t["float8"].max_flip_margin == 1.0 and t["float8"].min_top1_agreement == t["bfloat16"].min_top1_agreement
    assert p.correctness.tolerances_for("float8") is t["float8"]


@pytest.mark.parametrize("d, msg", [
    ({"enabled": "yes"}, "enabled"), ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": 10_000}, "max_tokens"),
    ({"max_tokens": 4, "compare_tokens": 8}, "compare_tokens"), ({"top_logprobs": 21}, "top_logprobs"),
    ({"interval_s": -1}, "interval_s"), ({"request_timeout_s": 0}, "request_timeout_s"),
    ({"prompt_set": ""}, "prompt_set"), ({"concurrency": 0}, "concurrency"), ({"nope": 1}, "nope"),
    ({"tolerances": {"float32": {"max_logprob_drift": -1}}}, "max_logprob_drift"),
    ({"tolerances": {"float32": {"min_top1_agreement": 1.5}}}, "min_top1_agreement"),
    ({"tolerances": {"float32": {"typo": 1}}}, "typo"), ({"tolerances": []}, "tolerances"),
    ({"max_error_fraction": float("nan")}, "max_error_fraction"),
])
def test_invalid_correctness_policy(d, msg):
    with pytest.raises(PolicyError, match=msg):
        Policy.from_dict({"correctness": d})
    with pytest.raises(PolicyError, match="correctness"):
        Policy.from_dict({"correctness": "on"})
