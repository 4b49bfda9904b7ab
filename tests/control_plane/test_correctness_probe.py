"""The correctness gate's replay requests (adapters/inference/correctness.py) against two fake OpenAI endpoints: per
prompt the baseline's greedy completion, the canary's, the canary's scoring of the baseline's tokens and the
baseline's own scoring of them -- so an engine whose prefill rounds otherwise than its decode (fp8 weights) is
compared like with like, and an A/A of it passes."""
import threading

from sits.control_plane.adapters.inference.correctness import CorrectnessProbe
from sits.control_plane.analysis import CorrectnessPolicy, Outcome, compare_replays
from sits.control_plane.analysis.gate_policy import Tolerances

PROMPT_IDS = [11, 12, 13]
CONT = [21, 22, 23, 24]
SURE_LP = -0.01          # every decoded token at a 3-nat margin over its runner-up
PREFILL_SHIFT = 0.5      # the scoring pass (one prefill) rounds 0.5 nats lower, and picks token 99 at position 1


def _lp(tokens, lps, tops):
    return {"tokens": [f"token_id:{t}" for t in tokens], "token_logprobs": lps,
            "top_logprobs": [{f"token_id:{k}": v for k, v in top} for top in tops]}


class FakeEngine:
    def __init__(self, fail_scoring=False):
        self.calls = []
        self.fail_scoring = fail_scoring
        self.lock = threading.Lock()

    def choice(self, body):
        with self.lock:
            self.calls.append(body)
        if body.get("max_tokens") == 0:   # echo: score prompt + continuation
            if self.fail_scoring:
                return None
            toks = list(body["prompt"])
            lps, tops = [], []
            for i, t in enumerate(toks):
                lp = SURE_LP - PREFILL_SHIFT
                top = [(t, lp), (t + 100, lp - 3.0)]
                if i == len(PROMPT_IDS) + 1:
                    top = [(99, lp + 0.2)] + top
                lps.append(lp)
                tops.append(top)
            return {"text": "", "logprobs": _lp(toks, lps, tops)}
        return {"prompt_token_ids": PROMPT_IDS, "token_ids": CONT, "text": "abcd",
                "logprobs": _lp(CONT, [SURE_LP] * 4, [[(t, SURE_LP), (t + 100, SURE_LP - 3.0)] for t in CONT])}


class Resp:
    def __init__(self, choice):
        self.status_code = 200 if choice is not None else 500
        self._choice = choice
        self.text = "boom"

    def json(self):
        if self._choice is None:
            return {"error": {"message": "scoring failed"}}
        return {"choices": [self._choice]}


class Session:
    def __init__(self, engines):
        self.engines = engines

    def post(self, url, json, headers, timeout):
        return Resp(self.engines[url.split("/v1/")[0]].choice(json))


POLICY = CorrectnessPolicy(max_tokens=4, compare_tokens=4, concurrency=2, tolerances={"bfloat16": Tolerances(
    min_identical_fraction=0.0, min_top1_agreement=0.8, max_mean_logprob_drift=0.1, max_logprob_drift=1.0,
    max_flip_margin=1.0, confident_margin=1.0, min_confident_positions=4, min_confident_top1=0.98)})


def test_the_baseline_scores_its_own_tokens_and_an_aa_of_a_prefill_that_rounds_otherwise_passes():
    base, can = FakeEngine(), FakeEngine()
    probe = CorrectnessProbe(session_factory=lambda: Session({"http://b": base, "http://c": can}))
    replays, tokens, sent = probe.replay("http://c", "http://b", POLICY, "m", ("p1", "p2"))
    assert sent == 8   # four requests a prompt
    assert [c.get("max_tokens") for c in base.calls].count(0) == 2 and [c.get("max_tokens") for c in can.calls].count(0) == 2
    scoring = next(c for c in base.calls if c.get("max_tokens") == 0)
    assert scoring["prompt"] == PROMPT_IDS + CONT and scoring["echo"] is True
    r = replays[0]
    assert r.forced_baseline.token_ids == tuple(CONT) and r.forced_baseline.logprobs == r.forced.logprobs
    v = compare_replays(replays, POLICY, "bfloat16")
    assert v.outcome is Outcome.PASS, v.reason
    assert v.top1_agreement == 1.0 and v.confident_positions == 6   # position 1 is not sure on the scoring path


def test_a_failed_baseline_scoring_marks_the_prompt_failed_never_passed():
    base, can = FakeEngine(fail_scoring=True), FakeEngine()
    probe = CorrectnessProbe(session_factory=lambda: Session({"http://b": base, "http://c": can}))
    replays, _, sent = probe.replay("http://c", "http://b", POLICY, "m", ("p1",))
    assert sent == 4
    assert "scoring its own continuation: HTTP 500: scoring failed" in replays[0].baseline.error
    v = compare_replays(replays, POLICY, "bfloat16")
    assert v.outcome is Outcome.INCONCLUSIVE and "could not be replayed" in v.reason
