"""compare_replays: table tests over literal replays (no engine), and the correctness policy's validation."""
import dataclasses
import json
import math

import pytest

from sits.control_plane.analysis import (Continuation, CorrectnessPolicy, CorrectnessVerdict, Outcome, Policy,
                                    PolicyError, PromptReplay, TokenLogprob, compare_replays)
from sits.control_plane.analysis.correctness import compare_prompt, runner_up_margin
from sits.control_plane.analysis.gate_policy import (DEFAULT_TOLERANCES, QUANTIZED, Tolerances, quantized_by,
                                                    tolerances_key)
from sits.control_plane.analysis.prompts import DEFAULT_PROMPTS

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
    ({"tolerances": {"bfloat16": {"confident_margin": -1}}}, "confident_margin"),
    ({"tolerances": {"bfloat16": {"min_confident_positions": 2.5}}}, "min_confident_positions"),
    ({"tolerances": {"bfloat16": {"min_confident_positions": True}}}, "min_confident_positions"),
    ({"tolerances": {"bfloat16": {"min_confident_top1": 2}}}, "min_confident_top1"),
])
def test_invalid_correctness_policy(d, msg):
    with pytest.raises(PolicyError, match=msg):
        Policy.from_dict({"correctness": d})
    with pytest.raises(PolicyError, match="correctness"):
        Policy.from_dict({"correctness": "on"})


# ---- margin-aware (half-precision) rules -------------------------------------------------------------------------
AWARE = Tolerances(min_identical_fraction=0.0, min_top1_agreement=0.0, max_mean_logprob_drift=0.05,
                   max_logprob_drift=0.5, max_flip_margin=1.0, confident_margin=1.0, min_confident_positions=8,
                   min_confident_top1=0.95)
AWARE_POLICY = CorrectnessPolicy(max_tokens=4, compare_tokens=4, tolerances={"bfloat16": AWARE})


def peaked(ids, lps, margins):
    """A continuation whose runner-up at position i is token+100 at lp - margins[i]."""
    return cont(ids, lps, tops=[[(t, lp), (t + 100, lp - m)] for t, lp, m in zip(ids, lps, margins)])


SURE = peaked([1, 2, 3, 4], [-0.01, -0.02, -0.01, -0.03], [4.0, 3.0, 5.0, 2.5])       # confident everywhere
FLAT = peaked([1, 2, 3, 4], [-6.2, -6.2, -6.2, -6.2], [0.05, 0.3, 0.01, 0.2])         # a random-weight model


def test_runner_up_margin_is_the_gap_to_the_best_other_token_or_unknown():
    assert runner_up_margin(TokenLogprob(1, -0.1, ((1, -0.1), (2, -1.6)))) == pytest.approx(1.5)
    assert runner_up_margin(TokenLogprob(1, -2.0, ((2, -0.5), (3, -1.0)))) == pytest.approx(-1.5)   # not the top-1
    assert runner_up_margin(TokenLogprob(1, -0.1, ((1, -0.1),))) is None
    assert runner_up_margin(TokenLogprob(1, -0.1)) is None


def test_only_positions_where_the_baseline_was_sure_count_as_confident():
    base = peaked([1, 2, 3, 4], [-0.1, -0.5, -0.1, -0.7], [1.5, 0.4, 1.01, 1.0])   # 1.0 is not > 1.0
    row = compare_prompt(0, replay(baseline=base, canary=base, forced=base), 4, confident_margin=1.0)
    assert row.confident_positions == 2
    assert compare_prompt(0, replay(baseline=base, canary=base, forced=base), 4).confident_positions == 0   # off


def test_a_teacher_forced_flip_fails_only_where_the_baseline_was_sure():
    # the canary prefers token 9 at position 2; the baseline's margin there decides whether that is a bug
    def forced_flip(base):
        tops = [list(t.top) for t in base.logprobs]
        tops[2] = [(9, base.logprobs[2].logprob + 0.1), (3, base.logprobs[2].logprob)]
        return Continuation(base.token_ids, base.text, tuple(TokenLogprob(t.token_id, t.logprob, tuple(top))
                                                              for t, top in zip(base.logprobs, tops)))
    near_tie = peaked([1, 2, 3, 4], [-0.01, -0.02, -0.7, -0.03], [4.0, 3.0, 0.2, 2.5])
    ok = compare_replays([replay(SURE, SURE)] * 6 + [replay(near_tie, near_tie, forced_flip(near_tie))] * 2,
                         AWARE_POLICY, "bfloat16")
    assert ok.outcome is Outcome.PASS, ok.reason
    assert ok.top1_agreement < 1 and ok.confident_top1 == 1.0 and ok.confident_positions == 30
    bad = compare_replays([replay(SURE, SURE)] * 6 + [replay(SURE, SURE, forced_flip(SURE))] * 2,
                          AWARE_POLICY, "bfloat16")
    assert bad.outcome is Outcome.FAIL and bad.failed == ("confident_top1",)
    assert bad.confident_top1 == pytest.approx(30 / 32) and "2 of 32 positions" in bad.reason
    assert [e.confident_disagreements for e in bad.evidence] == [1, 1]


def test_drift_counts_only_at_confident_positions_in_half_precision():
    # a large drift where the baseline was unsure is bf16 noise; the same drift where it was sure is a bug
    unsure = peaked([1, 2, 3, 4], [-0.01, -0.02, -0.7, -0.03], [4.0, 3.0, 0.2, 2.5])
    def drift_at(base, i, d):   # the canary's logprob of the baseline's token at position i is d lower
        def moved(t, d):
            return TokenLogprob(t.token_id, t.logprob - d, tuple((k, lp - d if k == t.token_id else lp)
                                                                  for k, lp in t.top))
        return Continuation(base.token_ids, base.text, tuple(moved(t, d if j == i else 0.0)
                                                             for j, t in enumerate(base.logprobs)))
    ok = compare_replays([replay(unsure, unsure, drift_at(unsure, 2, 0.6))] * 8, AWARE_POLICY, "bfloat16")
    assert ok.outcome is Outcome.PASS, ok.reason
    assert ok.drift_max == pytest.approx(0.6) and ok.confident_drift_max == 0.0
    one = compare_replays([replay(SURE, SURE, drift_at(SURE, 0, 0.6))] + [replay(SURE, SURE)] * 7, AWARE_POLICY,
                          "bfloat16")
    assert one.outcome is Outcome.FAIL and one.failed == ("confident_drift_max",)
    assert one.confident_drift_max == pytest.approx(0.6) and one.evidence[0].index == 0
    every = compare_replays([replay(SURE, SURE, drift_at(SURE, i % 4, 0.3)) for i in range(8)], AWARE_POLICY,
                            "bfloat16")
    assert every.failed == ("confident_drift_mean",) and every.confident_drift_mean == pytest.approx(0.3 / 4)


def test_a_flat_model_is_inconclusive_never_failed_nor_passed():
    # random weights: every position is a near-tie, greedy tokens flip everywhere under other rounding; like
    # llama3-8b on an H200 (47 % identical, top-1 93 %, flips at margins <= 0.31, drift max 0.22)
    flipped = peaked([1, 9, 9, 9], [-6.2, -6.2, -6.2, -6.2], [0.05, 0.1, 0.01, 0.2])
    forced = Continuation(FLAT.token_ids, FLAT.text, tuple(
        TokenLogprob(t.token_id, t.logprob - 0.22, ((7, t.logprob),)) if i == 1 else t
        for i, t in enumerate(FLAT.logprobs)))
    rows = [replay(FLAT, FLAT)] * 4 + [replay(flipped, FLAT, forced)] * 4
    v = compare_replays(rows, dataclasses.replace(AWARE_POLICY, tolerances={"bfloat16": dataclasses.replace(
        AWARE, min_identical_fraction=0.75, min_top1_agreement=0.9)}), "bfloat16")
    assert v.outcome is Outcome.INCONCLUSIVE and v.failed == ()
    assert v.identical_fraction == 0.5 and v.top1_agreement == pytest.approx(28 / 32)   # below both minima
    assert v.confident_positions == 0 and "too few confident positions" in v.reason and "0 of 32" in v.reason


def test_a_sure_divergence_fails_even_on_a_mostly_flat_model():
    wrong = peaked([7, 7, 7, 7], [-0.01, -0.02, -0.01, -0.03], [4.0, 3.0, 5.0, 2.5])
    sure_then_flat = peaked([1, 2, 3, 4], [-0.01, -6.2, -6.2, -6.2], [3.0, 0.05, 0.1, 0.05])
    v = compare_replays([replay(FLAT, FLAT)] * 7 + [replay(wrong, sure_then_flat)], AWARE_POLICY, "bfloat16")
    assert v.confident_positions == 1 < AWARE.min_confident_positions
    assert v.outcome is Outcome.FAIL and v.failed == ("flip_margin",)


def test_enough_confident_positions_make_the_global_rules_apply_again():
    # two prompts whose baseline margins are unknown (top lists without a runner-up), where the canary fed the
    # baseline's tokens prefers token 8 everywhere: only the global top-1 rule sees them
    unknown = cont(SURE.token_ids, [t.logprob for t in SURE.logprobs], tops=[[(t.token_id, t.logprob)]
                                                                             for t in SURE.logprobs])
    off = Continuation(SURE.token_ids, SURE.text, tuple(TokenLogprob(t.token_id, t.logprob, ((8, t.logprob + 0.01),))
                                                        for t in SURE.logprobs))
    rows = [replay(SURE, SURE)] * 6 + [replay(unknown, unknown, off)] * 2

    def verdict(min_positions):
        tol = dataclasses.replace(AWARE, min_top1_agreement=0.9, min_confident_positions=min_positions)
        return compare_replays(rows, dataclasses.replace(AWARE_POLICY, tolerances={"bfloat16": tol}), "bfloat16")
    v = verdict(24)
    assert v.confident_positions == 24 and v.confident_top1 == 1.0
    assert v.outcome is Outcome.FAIL and v.failed == ("top1_agreement",) and v.top1_agreement == 0.75
    assert verdict(25).outcome is Outcome.INCONCLUSIVE   # too few to judge: the global rules are not applied


def test_half_precision_defaults_are_margin_aware_and_float32_is_unchanged():
    t = CorrectnessPolicy().tolerances
    assert t["float32"] == Tolerances(min_identical_fraction=0.9, min_top1_agreement=0.98,
                                      max_mean_logprob_drift=1e-5, max_logprob_drift=1e-4, max_flip_margin=1e-3)
    assert t["float32"].confident_margin == 0
    for dtype in ("bfloat16", "float16"):
        assert t[dtype].confident_margin > 0 and t[dtype].min_confident_positions > 0
        assert t[dtype].max_flip_margin >= t[dtype].confident_margin   # a flip below it is a near-tie
    flat = compare_replays([replay(FLAT, FLAT)] * 32, CorrectnessPolicy(max_tokens=4, compare_tokens=4), "bfloat16")
    assert flat.outcome is Outcome.INCONCLUSIVE


def test_the_confident_statistics_round_trip_through_json():
    v = compare_replays([replay(SURE, SURE)] * 8, AWARE_POLICY, "bfloat16")
    assert v.outcome is Outcome.PASS and v.confident_positions == 32 and v.positions == 32
    assert CorrectnessVerdict.from_dict(json.loads(json.dumps(v.to_dict()))) == v


def test_rollout_show_prints_the_confident_positions_and_where_the_canary_disagreed():
    from sits.control_plane.service.format import format_correctness
    forced = Continuation(SURE.token_ids, SURE.text, tuple(
        TokenLogprob(t.token_id, t.logprob, ((9, t.logprob + 0.1),) if i == 2 else t.top)
        for i, t in enumerate(SURE.logprobs)))
    v = compare_replays([replay(SURE, SURE)] * 6 + [replay(SURE, SURE, forced)] * 2, AWARE_POLICY, "bfloat16")
    from sits.control_plane.view import decode_check
    lines = format_correctness(decode_check({"verdict": {"correctness": json.loads(json.dumps(v.to_dict()))},
                                             "decision": "rollback", "step": -1, "seq": 1, "weight": 0}))
    assert "at the 32 of 32 positions where the baseline was sure: top-1 agreement 93.8%" in lines[2]
    assert sum("top-1 differed at 1 position(s) where the baseline was sure" in line for line in lines) == 2


def test_a_canary_that_quantizes_other_than_its_baseline_gets_the_quantized_tolerances():
    assert tolerances_key("float32", {"fp8 KV pages"}, set()) == QUANTIZED          # a flag release, either way
    assert tolerances_key("bfloat16", set(), {"int8 weights"}) == QUANTIZED
    assert tolerances_key("bfloat16", {"fp8 weights"}, {"int8 weights"}) == QUANTIZED
    assert tolerances_key("float32", {"fp8 KV pages"}, {"fp8 KV pages"}) == "float32"   # both alike: the dtype's
    assert tolerances_key("bfloat16", {"int8 weights"}, {"int8 weights"}) == "bfloat16"
    assert tolerances_key("bfloat16", (), ()) == "bfloat16"
    assert DEFAULT_TOLERANCES[QUANTIZED].confident_margin > 0   # margin-aware, like half precision


def test_engines_that_round_activations_to_e4m3_get_the_quantized_tolerances_even_when_alike():
    # fp8 weights run W8A8 from 33 rows: both engines' answers move with how prompts share steps
    assert quantized_by("fp8", "fp8") == {"fp8 weights", "fp8 KV pages"}   # an engine's /version, in the key's words
    assert quantized_by(None, "auto") == quantized_by("", 3) == frozenset()
    assert tolerances_key("bfloat16", {"fp8 weights"}, {"fp8 weights"}) == QUANTIZED
    assert tolerances_key("bfloat16", {"fp8 weights", "fp8 KV pages"}, {"fp8 weights", "fp8 KV pages"}) == QUANTIZED
    q, half = DEFAULT_TOLERANCES[QUANTIZED], DEFAULT_TOLERANCES["bfloat16"]
    assert q.confident_margin == q.max_flip_margin == 3.0 > half.confident_margin
    assert (q.max_mean_logprob_drift, q.max_logprob_drift, q.min_confident_top1) == \
        (half.max_mean_logprob_drift, half.max_logprob_drift, half.min_confident_top1)


def _margin(m: float, by: float = 0.0) -> Continuation:
    """BASE with its runner-up `m` nats below every chosen token, all logprobs `by` nats lower."""
    return cont(BASE.token_ids, [lp - by for lp in (-0.5, -0.6, -0.7, -0.8)],
                tops=[[(t, lp - by), (t + 100, lp - by - m)] for t, lp in zip(BASE.token_ids, (-0.5, -0.6, -0.7,
                                                                                               -0.8))])


def test_the_quantized_tolerances_pass_an_fp8_a_a_and_fail_a_wrong_kernel():
    policy = CorrectnessPolicy(max_tokens=4, compare_tokens=4)
    # an A/A of fp8 engines as measured on random llama3-8b (BENCHMARKS.md "The correctness gate on fp8 engines"):
    # drift 0.8 nats where the baseline preferred its token by 2 nats, and a greedy divergence where it was sure by
    # 1.28; half precision's rules call that a bug
    sure2 = _margin(2.0)
    flipped = cont([1, 9, 9, 9], [-0.5, -0.6, -0.6, -0.6], tops=[[(1, -0.5)], [(9, -0.6), (2, -0.62)], [(9, -0.6)],
                                                                 [(9, -0.6)]])
    base = cont([1, 2, 3, 4], [-0.5, -0.6, -0.7, -0.8], tops=[[(1, -0.5)], [(2, -0.6), (9, -1.88)], [(3, -0.7)],
                                                             [(4, -0.8)]])
    aa = many(PromptReplay("p", sure2, sure2, _margin(2.0, by=0.8), sure2), 7) + [replay(flipped, base)]
    assert compare_replays(aa, policy, "bfloat16").outcome is Outcome.FAIL
    v = compare_replays(aa, policy, QUANTIZED)
    assert v.outcome is Outcome.INCONCLUSIVE and not v.judgeable and v.failed == (), v.reason
    # a wrong kernel on a peaked model: tokens its baseline preferred by 4.4 nats flip, 1 nat of drift where sure
    sure = _margin(4.4)
    wrong = cont([1, 9, 9, 9], [-0.5, -0.6, -0.6, -0.6], tops=[[(1, -0.5)], [(9, -0.6), (2, -5.0)], [(9, -0.6)],
                                                               [(9, -0.6)]])
    rows = many(PromptReplay("p", sure, sure, _margin(4.4, by=1.0), sure), 7) + [replay(wrong, sure)]
    v = compare_replays(rows, policy, QUANTIZED)
    assert v.outcome is Outcome.FAIL and {"flip_margin", "confident_drift_mean"} <= set(v.failed), v.reason
    # and that model's own A/A (drift 0.037 at most where sure, as measured on the trained tiny model) passes
    v = compare_replays(many(PromptReplay("p", sure, sure, _margin(4.4, by=0.037), sure)), policy, QUANTIZED)
    assert v.outcome is Outcome.PASS, v.reason


def _shifted(c: Continuation, by: float, flip_at: int | None = None) -> Continuation:
    """c's logprobs `by` nats lower everywhere (another numerical path), and at `flip_at` a runner-up 0.2 nats
    above the scored token (that path's top-1 differs there)."""
    out = []
    for i, t in enumerate(c.logprobs):
        top = [(k, lp - by) for k, lp in t.top]
        if i == flip_at:
            top = [(t.token_id + 50, t.logprob - by + 0.2)] + top
        out.append(TokenLogprob(t.token_id, t.logprob - by, tuple(top)))
    return Continuation(c.token_ids, c.text, tuple(out))


def test_teacher_forcing_compares_like_with_like_when_the_baseline_scored_its_own_tokens():
    # An A/A of an engine whose prefill rounds otherwise than its decode (fp8 weights: e4m3 activations): both sides
    # score the baseline's tokens 0.5 nats lower than the baseline decoded them, and pick another top-1 at position 1
    # where the decode was sure. Against the decode steps that reads as a confident flip and drift: a false FAIL;
    # against the baseline's own scoring, the same path, it is identical: PASS.
    scored = _shifted(SURE, 0.5, flip_at=1)
    old = compare_replays([replay(SURE, SURE, scored)] * 8, AWARE_POLICY, "bfloat16")
    assert old.outcome is Outcome.FAIL and "confident_top1" in old.failed and "confident_drift_mean" in old.failed
    aa = [PromptReplay("p", SURE, SURE, scored, scored)] * 8
    v = compare_replays(aa, AWARE_POLICY, "bfloat16")
    assert v.outcome is Outcome.PASS, v.reason
    assert (v.top1_agreement, v.confident_drift_max) == (1.0, 0.0)
    assert v.confident_positions == 24   # position 1 is not confident on the scoring path (its top-1 is another)


def test_a_canary_that_scores_otherwise_than_the_baselines_own_scoring_still_fails():
    scored = _shifted(SURE, 0.0)
    wrong = _shifted(SURE, 0.0, flip_at=2)   # the canary's top-1 differs where the baseline's scoring was sure
    bad = compare_replays([PromptReplay("p", SURE, SURE, scored, scored)] * 6
                          + [PromptReplay("p", SURE, SURE, wrong, scored)] * 2, AWARE_POLICY, "bfloat16")
    assert bad.outcome is Outcome.FAIL and bad.failed == ("confident_top1",)
    assert bad.confident_top1 == pytest.approx(30 / 32)
    drifted = _shifted(SURE, 1.5)   # 1.5 nats off the baseline's own scoring at every confident position
    worse = compare_replays([PromptReplay("p", SURE, SURE, drifted, scored)] * 8, AWARE_POLICY, "bfloat16")
    assert worse.outcome is Outcome.FAIL and {"confident_drift_mean", "confident_drift_max"} <= set(worse.failed)
