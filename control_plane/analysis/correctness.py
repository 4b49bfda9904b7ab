"""`compare_replays(replays, policy) -> CorrectnessVerdict`: does the canary still compute the baseline's model?

Input per prompt (gathered by adapters/inference/correctness.py): each variant's greedy continuation with the logprob
of every chosen token and the top-N alternatives, and the canary's logprobs of the BASELINE's continuation (teacher
forcing: the canary is fed the baseline's tokens, so positions after a divergence are still comparable), and the
baseline's own logprobs of that continuation scored the same way (`forced_baseline`). The teacher-forced comparisons
take the baseline's side from that scoring pass where it is present: an engine scores a prompt in one prefill,
which can round differently from its decode steps (fp8 weights: e4m3 activations above 32 rows, weight-only bf16
ones in decode), so the canary's prefill against the baseline's decode would compare two numerical paths, not two
kernel sets -- an A/A of llama3-8b with fp8 weights failed the gate that way (BENCHMARKS.md "A GEMV for batch 1").

Per prompt: the first position where the greedy tokens differ; whether the first K tokens are identical; the drift
|canary - baseline| of the chosen tokens' logprobs up to the first divergence (mean, max); under teacher forcing the
fraction of positions where the baseline's token is also the canary's top-1, and the max drift; at a divergence the
logprob margins (how much each side preferred its own token over the other's). With margin-aware tolerances
(confident_margin > 0, the half-precision defaults) also, under teacher forcing, the CONFIDENT positions -- where the
baseline preferred its token over its runner-up by more than confident_margin nats, so rounding cannot flip it --
with the canary's top-1 disagreements and logprob drift there.

Verdict, in order:
  a replay error on either side for more than policy.max_error_fraction of the prompts -> INCONCLUSIVE;
  FAIL when any holds: a divergence the baseline was sure about (its margin > max_flip_margin: not a near-tie, a
      different answer); with margin-aware tolerances: confident top-1 agreement < min_confident_top1, mean / max
      drift at confident positions > max_mean_logprob_drift / max_logprob_drift; without them: mean / max drift
      over all compared positions; and, for a model with enough confident positions to judge (always without
      margin-aware tolerances), identical-over-K fraction < min_identical_fraction, teacher-forced top-1 agreement
      over all positions < min_top1_agreement;
  margin-aware, nothing failed, fewer than min_confident_positions confident positions -> INCONCLUSIVE: the model's
      distributions are too flat for the dtype's rounding to be told from a bug (random weights); never a pass;
  else PASS.
Then `with_conformance(replay_verdict, conformance_verdict)` joins the op-level conformance (analysis/conformance.py):
  either FAIL -> FAIL (reasons joined; "conformance" among `failed`);
  conformance PASS and the replay INCONCLUSIVE only because the model is too flat to judge -> PASS: every changed op
      was judged at the served shapes, which needs no meaningful weights;
  otherwise the replay's outcome; the conformance verdict rides along in `conformance` either way.
The tolerances are the canary's compute dtype's, or the QUANTIZED ones (margin-aware, like half precision, with e4m3's
wider margins) when the canary's engine quantizes other than the baseline's (gate_policy.py `tolerances_key`: an FP8
KV cache or 8-bit weights switched on by a rollout's engine flags) or either engine rounds activations to e4m3 (fp8
weights).
bf16 kernels legitimately differ in the last bits, so divergences on near-ties are normal: the margins separate them
from real bugs. Evidence keeps every diverged prompt with both continuations (text and ids).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from sits.control_plane.numbers import number

from .conformance import ConformanceVerdict
from .gate_policy import CorrectnessPolicy
from .verdict import Outcome

_MAX_EVIDENCE = 8          # diverged/failing prompts kept in full in a verdict
_PREVIEW = 80              # characters of a prompt kept as its label


@dataclass(slots=True, frozen=True)
class TokenLogprob:
    """One position: the token (chosen, or fed under teacher forcing), its logprob and the top alternatives
    (token id, logprob), best first."""
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()

    def logprob_of(self, token_id: int) -> float | None:
        if token_id == self.token_id:
            return self.logprob
        return next((lp for t, lp in self.top if t == token_id), None)

    @property
    def is_top1(self) -> bool:
        """The token is the distribution's argmax (ties count as agreement)."""
        return not self.top or self.logprob >= self.top[0][1]


@dataclass(slots=True, frozen=True)
class Continuation:
    token_ids: tuple[int, ...] = ()
    text: str = ""
    logprobs: tuple[TokenLogprob, ...] = ()
    error: str = ""            # the request failed: nothing else is meaningful


@dataclass(slots=True, frozen=True)
class PromptReplay:
    prompt: str
    baseline: Continuation
    canary: Continuation
    forced: Continuation = field(default_factory=Continuation)   # canary scoring the baseline's tokens
    forced_baseline: Continuation = field(default_factory=Continuation)   # the baseline scoring them the same way


@dataclass(slots=True, frozen=True)
class PromptComparison:
    index: int
    prompt: str                           # the first _PREVIEW characters
    compared: int                         # positions both sides generated
    first_divergence: int | None          # None: identical over `compared`
    identical_k: bool                     # identical over the first K = policy.compare_tokens
    drift_mean: float                     # |canary - baseline| of chosen-token logprobs before the divergence
    drift_max: float
    forced_top1: float                    # teacher forcing: fraction of positions where baseline's token is top-1
    forced_drift_max: float               # teacher forcing: max |canary - baseline| over the whole continuation
    forced_positions: int = 0             # positions scored under teacher forcing
    baseline_margin: float | None = None  # at the divergence: baseline's lp(its token) - lp(canary's token)
    canary_margin: float | None = None    # ... and the canary's lp(its token) - lp(baseline's token)
    baseline_tokens: tuple[int, ...] = ()
    canary_tokens: tuple[int, ...] = ()
    baseline_text: str = ""
    canary_text: str = ""
    error: str = ""
    confident_positions: int = 0          # teacher forcing: positions where the baseline's margin > confident_margin
    confident_disagreements: int = 0      # ... of which the canary's top-1 was another token
    confident_drift_mean: float = 0.0     # |canary - baseline| logprob of the baseline's token there
    confident_drift_max: float = 0.0

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__slots__}
        d["baseline_tokens"], d["canary_tokens"] = list(self.baseline_tokens), list(self.canary_tokens)
        return {k: _clean(v) for k, v in d.items()}

    @classmethod
    def from_dict(cls, d: Mapping) -> "PromptComparison":
        d = dict(d)
        for k in ("baseline_tokens", "canary_tokens"):
            d[k] = tuple(d.get(k) or ())
        for k in ("drift_mean", "drift_max", "forced_top1", "forced_drift_max"):
            d[k] = math.nan if d.get(k) is None else d[k]
        return cls(**d)


@dataclass(slots=True, frozen=True)
class CorrectnessVerdict:
    outcome: Outcome
    reason: str
    prompts: int = 0                      # compared (answered by both sides)
    errors: int = 0                       # prompts whose replay failed
    identical_fraction: float = math.nan  # prompts identical over the first K tokens
    top1_agreement: float = math.nan      # teacher forcing, over all positions of all prompts
    drift_mean: float = math.nan
    drift_max: float = math.nan
    failed: tuple[str, ...] = ()          # the tolerances that failed, e.g. "identical_fraction"
    dtype: str = ""                       # whose tolerances were applied
    evidence: tuple[PromptComparison, ...] = ()   # diverged or failing prompts (at most _MAX_EVIDENCE)
    diverged: int = 0                     # prompts with any divergence
    tokens: int = 0                       # tokens compared, both sides
    requests: int = 0                     # set by the worker: what the replay cost
    seconds: float = math.nan
    positions: int = 0                    # teacher-forced positions scored
    confident_positions: int = 0          # margin-aware tolerances: those with baseline margin > confident_margin
    confident_top1: float = math.nan      # ... where the canary's top-1 is the baseline's token
    confident_drift_mean: float = math.nan
    confident_drift_max: float = math.nan
    judgeable: bool = True                # False: the replay found nothing wrong but the model was too flat to judge
    conformance: ConformanceVerdict | None = None   # op-level conformance (with_conformance)

    def to_dict(self) -> dict:
        return {"outcome": self.outcome.value, "reason": self.reason, "prompts": self.prompts, "errors": self.errors,
                "identical_fraction": _clean(self.identical_fraction), "top1_agreement": _clean(self.top1_agreement),
                "drift_mean": _clean(self.drift_mean), "drift_max": _clean(self.drift_max),
                "failed": list(self.failed), "dtype": self.dtype, "diverged": self.diverged, "tokens": self.tokens,
                "requests": self.requests, "seconds": _clean(self.seconds), "positions": self.positions,
                "confident_positions": self.confident_positions, "confident_top1": _clean(self.confident_top1),
                "confident_drift_mean": _clean(self.confident_drift_mean),
                "confident_drift_max": _clean(self.confident_drift_max), "judgeable": self.judgeable,
                "conformance": self.conformance.to_dict() if self.conformance else None,
                "evidence": [e.to_dict() for e in self.evidence]}

    @classmethod
    def from_dict(cls, d: Mapping) -> "CorrectnessVerdict":
        nan = lambda k: math.nan if d.get(k) is None else d[k]  # noqa: E731
        return cls(Outcome(d["outcome"]), d.get("reason", ""), d.get("prompts", 0), d.get("errors", 0),
                   nan("identical_fraction"), nan("top1_agreement"), nan("drift_mean"), nan("drift_max"),
                   tuple(d.get("failed", ())), d.get("dtype", ""),
                   tuple(PromptComparison.from_dict(e) for e in d.get("evidence", ())), d.get("diverged", 0),
                   d.get("tokens", 0), d.get("requests", 0), nan("seconds"), d.get("positions", 0),
                   d.get("confident_positions", 0), nan("confident_top1"), nan("confident_drift_mean"),
                   nan("confident_drift_max"), d.get("judgeable", True),
                   ConformanceVerdict.from_dict(d["conformance"]) if d.get("conformance") else None)


def _clean(v):
    return None if isinstance(v, float) and math.isnan(v) else v


def compare_prompt(index: int, replay: PromptReplay, compare_tokens: int,
                   confident_margin: float = 0.0) -> PromptComparison:
    """One prompt's comparison (see the module docstring); confident positions are counted when
    confident_margin > 0."""
    b, c = replay.baseline, replay.canary
    label = replay.prompt[:_PREVIEW]
    if b.error or c.error:
        return PromptComparison(index, label, 0, None, False, math.nan, math.nan, math.nan, math.nan, 0,
                                error=f"baseline: {b.error}" if b.error else f"canary: {c.error}")
    n = min(len(b.token_ids), len(c.token_ids))
    first = next((i for i in range(n) if b.token_ids[i] != c.token_ids[i]), None)
    if first is None and len(b.token_ids) != len(c.token_ids):
        first = n   # one side stopped (EOS) where the other went on
    same = n if first is None else first
    drifts = [abs(c.logprobs[i].logprob - b.logprobs[i].logprob)
              for i in range(min(same, len(b.logprobs), len(c.logprobs)))]
    # the teacher-forced comparisons: the canary's scoring of the baseline's tokens against the baseline's own
    # scoring of them (the same numerical path) where the replay has it, else against the baseline's decode steps
    ref = replay.forced_baseline.logprobs if replay.forced_baseline.logprobs else b.logprobs
    forced = replay.forced.logprobs[:min(len(b.logprobs), len(ref))]
    forced_top1 = sum(_agrees(f, r) for f, r in zip(forced, ref)) / len(forced) if forced else math.nan
    forced_drift = max((abs(f.logprob - r.logprob) for f, r in zip(forced, ref)), default=math.nan)
    margins: tuple[float | None, float | None] = (None, None)
    if first is not None and first < n and first < len(b.logprobs) and first < len(c.logprobs):
        margins = (_margin(b.logprobs[first], c.token_ids[first]), _margin(c.logprobs[first], b.token_ids[first]))
    k = min(compare_tokens, max(len(b.token_ids), len(c.token_ids)))
    identical_k = first is None or first >= k
    sure = [(f, r) for f, r in zip(forced, ref)
            if confident_margin > 0 and (m := runner_up_margin(r)) is not None and m > confident_margin]
    sure_drift = [abs(f.logprob - r.logprob) for f, r in sure]
    return PromptComparison(
        index, label, n, first, identical_k,
        sum(drifts) / len(drifts) if drifts else 0.0, max(drifts, default=0.0), forced_top1, forced_drift,
        len(forced), *margins, tuple(b.token_ids), tuple(c.token_ids), b.text, c.text,
        confident_positions=len(sure), confident_disagreements=sum(not _agrees(f, r) for f, r in sure),
        confident_drift_mean=sum(sure_drift) / len(sure_drift) if sure_drift else 0.0,
        confident_drift_max=max(sure_drift, default=0.0))


def _agrees(pos: TokenLogprob, ref: TokenLogprob) -> bool:
    """The top-1 of `ref`'s distribution is also a top-1 of `pos`'s (both score the same token; ties agree)."""
    best = ref.token_id if ref.is_top1 else ref.top[0][0]
    lp = pos.logprob_of(best)
    return lp is not None and lp >= max(pos.logprob, pos.top[0][1] if pos.top else pos.logprob)


def runner_up_margin(pos: TokenLogprob) -> float | None:
    """How much the distribution preferred `pos.token_id` over the best other token of its top list (negative when
    it was not the top-1); None when the list names no other token (unknown: never counted as confident)."""
    other = next((lp for t, lp in pos.top if t != pos.token_id), None)
    return None if other is None else pos.logprob - other


def _margin(pos: TokenLogprob, other: int) -> float | None:
    """How much `pos` preferred its own token over `other`; a lower bound (vs the last top entry) when `other` is not
    in its top list, None when the list is empty."""
    lp = pos.logprob_of(other)
    if lp is None:
        if not pos.top:
            return None
        lp = pos.top[-1][1]
    return pos.logprob - lp


def compare_replays(replays: Sequence[PromptReplay], policy: CorrectnessPolicy,
                    dtype: str = "float32") -> CorrectnessVerdict:
    """The gate's verdict over one replay of the prompt set with the tolerances of `dtype` (the engines' compute
    dtype; see the module docstring for the rules)."""
    p = policy.tolerances_for(dtype)
    aware = p.confident_margin > 0
    rows = [compare_prompt(i, r, policy.compare_tokens, p.confident_margin) for i, r in enumerate(replays)]
    ok = [r for r in rows if not r.error]
    errors = len(rows) - len(ok)
    if not rows:
        return CorrectnessVerdict(Outcome.INCONCLUSIVE, "no prompts were replayed")
    if not ok or errors / len(rows) > policy.max_error_fraction:
        first = next(r.error for r in rows if r.error)
        return CorrectnessVerdict(Outcome.INCONCLUSIVE, f"{errors}/{len(rows)} prompts could not be replayed "
                                  f"(first: {first})", prompts=len(ok), errors=errors,
                                  evidence=tuple(r for r in rows if r.error)[:_MAX_EVIDENCE])
    identical = sum(r.identical_k for r in ok) / len(ok)
    forced_n = sum(r.forced_positions for r in ok)
    top1 = sum(r.forced_top1 * r.forced_positions for r in ok if r.forced_positions) / forced_n if forced_n \
        else math.nan
    before = sum(r.first_divergence if r.first_divergence is not None else r.compared for r in ok)
    drift_sum = sum(r.drift_mean * (r.first_divergence if r.first_divergence is not None else r.compared)
                    for r in ok)
    drift_mean = drift_sum / before if before else 0.0
    drift_max = max([r.drift_max for r in ok] + [r.forced_drift_max for r in ok if not math.isnan(r.forced_drift_max)])
    sure_n = sum(r.confident_positions for r in ok)
    sure_top1 = 1 - sum(r.confident_disagreements for r in ok) / sure_n if sure_n else math.nan
    sure_mean = sum(r.confident_drift_mean * r.confident_positions for r in ok) / sure_n if sure_n else math.nan
    sure_max = max(r.confident_drift_max for r in ok) if sure_n else math.nan
    judgeable = not aware or sure_n >= p.min_confident_positions
    flips = [r for r in ok if r.baseline_margin is not None and r.baseline_margin > p.max_flip_margin]
    failed: list[str] = []
    why: list[str] = []
    if judgeable and identical < p.min_identical_fraction:
        failed.append("identical_fraction")
        why.append(f"{identical:.0%} of prompts identical over the first {policy.compare_tokens} tokens "
                   f"(< {p.min_identical_fraction:.0%})")
    if judgeable and not math.isnan(top1) and top1 < p.min_top1_agreement:
        failed.append("top1_agreement")
        why.append(f"top-1 agreement {top1:.1%} when fed the baseline's tokens (< {p.min_top1_agreement:.1%})")
    if aware:
        if sure_n and sure_top1 < p.min_confident_top1:
            failed.append("confident_top1")
            why.append(f"the canary's top-1 was another token at {sure_n - round(sure_top1 * sure_n)} of {sure_n} "
                       f"positions where the baseline was sure (margin > {p.confident_margin:g}): top-1 agreement "
                       f"{sure_top1:.1%} (< {p.min_confident_top1:.1%})")
        if sure_n and sure_mean > p.max_mean_logprob_drift:
            failed.append("confident_drift_mean")
            why.append(f"mean logprob drift {sure_mean:.3g} at confident positions (> {p.max_mean_logprob_drift:g})")
        if sure_n and sure_max > p.max_logprob_drift:
            failed.append("confident_drift_max")
            why.append(f"max logprob drift {sure_max:.3g} at confident positions (> {p.max_logprob_drift:g})")
    else:
        if drift_mean > p.max_mean_logprob_drift:
            failed.append("drift_mean")
            why.append(f"mean logprob drift {drift_mean:.3g} (> {p.max_mean_logprob_drift:g})")
        if drift_max > p.max_logprob_drift:
            failed.append("drift_max")
            why.append(f"max logprob drift {drift_max:.3g} (> {p.max_logprob_drift:g})")
    if flips:
        failed.append("flip_margin")
        f = max(flips, key=lambda r: r.baseline_margin)
        why.append(f"{len(flips)} prompt(s) diverged where the baseline was sure (prompt {f.index} at token "
                   f"{f.first_divergence}: margin {f.baseline_margin:.3g} > {p.max_flip_margin:g})")
    diverged = [r for r in ok if r.first_divergence is not None]
    drift_limit = p.max_logprob_drift
    # evidence: failing prompts first (sure flips, confident disagreements, then the earliest divergences, then the
    # largest drifts)
    ranked = sorted(ok, key=lambda r: (r not in flips, not r.confident_disagreements, r.first_divergence is None,
                                       r.first_divergence if r.first_divergence is not None else 0, -r.drift_max))
    evidence = tuple(r for r in ranked if r.first_divergence is not None or r.confident_disagreements
                     or (r.confident_drift_max if aware else r.drift_max) > drift_limit)
    stats = dict(dtype=dtype, prompts=len(ok), errors=errors, identical_fraction=identical, top1_agreement=top1,
                 drift_mean=drift_mean, drift_max=drift_max, diverged=len(diverged),
                 tokens=sum(len(rp.baseline.token_ids) + len(rp.canary.token_ids) for rp in replays),
                 positions=forced_n, confident_positions=sure_n, confident_top1=sure_top1,
                 confident_drift_mean=sure_mean, confident_drift_max=sure_max)
    if failed:
        return CorrectnessVerdict(Outcome.FAIL, f"{dtype} tolerances: " + "; ".join(why), failed=tuple(failed),
                                  evidence=evidence[:_MAX_EVIDENCE], **stats)
    summary = (f"{len(ok)} prompts: {identical:.0%} identical over {policy.compare_tokens} tokens, {len(diverged)} "
               f"diverged{' (all near-ties)' if diverged else ''}, top-1 agreement {number(top1, '.1%')}")
    if not judgeable:
        return CorrectnessVerdict(
            Outcome.INCONCLUSIVE, f"too few confident positions to judge: {sure_n} of {forced_n} had a baseline "
            f"margin > {p.confident_margin:g} nats (the {dtype} tolerances need {p.min_confident_positions}); the "
            f"model's distributions are too flat (random weights?) to tell {dtype} rounding from a bug. Nothing "
            f"failed: {summary}, max logprob drift {drift_max:.2g}", evidence=evidence[:_MAX_EVIDENCE],
            judgeable=False, **stats)
    if aware:
        summary += (f"; at {sure_n} confident positions top-1 agreement {number(sure_top1, '.1%')}, logprob drift mean "
                    f"{sure_mean:.2g} max {sure_max:.2g}")
    else:
        summary += f", max logprob drift {drift_max:.2g}"
    return CorrectnessVerdict(Outcome.PASS, summary, evidence=evidence[:_MAX_EVIDENCE], **stats)


def with_conformance(replay: CorrectnessVerdict, conformance: ConformanceVerdict | None) -> CorrectnessVerdict:
    """The gate's verdict: the replay's joined with the op-level conformance verdict (rules in the module docstring).
    None: conformance is off in the policy."""
    if conformance is None:
        return replay
    joined = dataclasses.replace(replay, conformance=conformance)
    if conformance.outcome is Outcome.FAIL:
        reason = conformance.reason if replay.outcome is not Outcome.FAIL else f"{conformance.reason}; replay: " \
            f"{replay.reason}"
        return dataclasses.replace(joined, outcome=Outcome.FAIL, reason=reason,
                                   failed=("conformance",) + replay.failed)
    if conformance.outcome is Outcome.PASS and replay.outcome is Outcome.INCONCLUSIVE and not replay.judgeable:
        return dataclasses.replace(joined, outcome=Outcome.PASS, reason=f"{conformance.reason}. Replay: nothing "
                                   f"failed, but the model is too flat to judge by its answers ({replay.reason})")
    return joined
