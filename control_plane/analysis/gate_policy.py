"""The correctness gate's policy: `CorrectnessPolicy` (what is replayed, how often) and the `Tolerances` per dtype
that analysis/correctness.py judges the replays by, and `ConformancePolicy`, how analysis/conformance.py judges the
engines' op-level conformance reports. Part of `Policy` (`policy.correctness`)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Collection, Mapping

from .policy_error import PolicyError, _name, _num, _short
from .prompts import prompt_set_problem


@dataclass(slots=True, frozen=True)
class Tolerances:
    """How far a canary may be from the baseline and still compute the same model (analysis/correctness.py).
    Drifts and margins are in nats (natural-log probability)."""
    min_identical_fraction: float   # prompts whose first K greedy tokens are identical
    min_top1_agreement: float       # teacher forcing: positions where the baseline's token is the canary's top-1
    max_mean_logprob_drift: float   # mean |canary - baseline| of the chosen tokens' logprobs
    max_logprob_drift: float        # max of the same (greedy prefix and teacher forcing)
    max_flip_margin: float          # a divergence where the baseline preferred its token by more is a real change
    # Margin-aware rules (half precision): > 0 turns them on. A position is "confident" when the baseline preferred
    # its token over the runner-up by more than confident_margin nats: rounding cannot flip it there, so the drift
    # rules and min_confident_top1 count only such positions, and with fewer than min_confident_positions of them
    # (a flat, e.g. random-weight, model) a replay that found nothing wrong is INCONCLUSIVE, never a pass.
    confident_margin: float = 0.0
    min_confident_positions: int = 0
    min_confident_top1: float = 0.0   # teacher forcing, confident positions: the canary's top-1 is the baseline's

    def __post_init__(self) -> None:
        if isinstance(self.min_confident_positions, bool) or not isinstance(self.min_confident_positions, int) \
                or not 0 <= self.min_confident_positions <= 100_000:
            raise PolicyError("min_confident_positions", "must be an integer from 0 to 100000, got "
                              f"{_short(self.min_confident_positions)}")
        for name in ("min_identical_fraction", "min_top1_agreement", "min_confident_top1"):
            v = getattr(self, name)
            if not _num(v) or not 0 <= v <= 1:
                raise PolicyError(name, f"must be a fraction from 0 to 1, got {_short(v)}")
        for name in ("max_mean_logprob_drift", "max_logprob_drift", "max_flip_margin", "confident_margin"):
            v = getattr(self, name)
            if not _num(v) or not 0 <= v <= 100:
                raise PolicyError(name, f"must be a number of nats from 0 to 100, got {_short(v)}")


# Measured (docs/control-loop.md "Correctness gate", BENCHMARKS.md "Correctness gate"): fp32 is the torch set against
# itself with other batch compositions on CPU (max drift 9.5e-7 over 100 replays); the half-precision ones are
# margin-aware, from a trained tiny checkpoint in bf16 (equivalent sets flip only below a 0.06-nat margin, drift at
# confident positions <= 0.048) and the H200's random-weight figures (flips below 0.31 nats, drift <= 0.22).
_HALF = Tolerances(min_identical_fraction=0.0, min_top1_agreement=0.8, max_mean_logprob_drift=0.1,
                   max_logprob_drift=1.0, max_flip_margin=1.0, confident_margin=1.0, min_confident_positions=20,
                   min_confident_top1=0.98)
# A canary that quantizes what its baseline does not (an FP8 KV cache, int8/fp8 weights: a release of engine flags)
# moves its answers by that rounding, whatever the compute dtype, and engines that round activations to e4m3 (fp8
# weights) move theirs with each step's rows: judged by these, margin-aware like half precision with e4m3's margins.
# Measured on the trained tiny model (BENCHMARKS.md "FP8 KV cache"): FP8 pages move single logprobs by at most
# 0.37-0.44 nats and top-1 by ~1 point, fp8 W8A8 weights by 0.35 and 1.2 points; bf16 compute itself by 0.16. Both
# engines on fp8 weights + FP8 pages (BENCHMARKS.md "The correctness gate on fp8 engines", bench/correctness_gate.py
# margins, triton-v1.24 against itself in other batches): llama3-8b with random weights flips tokens its baseline
# preferred by up to 1.28 nats and drifts 0.87 at margins over 1 (half precision's rules fail that A/A); the trained
# tiny model drifts at most 0.037 at margins over 3, where torch-wrong-rope's RoPE drifts 0.97 on average and flips
# tokens preferred by 4.4 nats.
QUANTIZED = "quantized"
# What an engine reports quantizing (adapters/inference/correctness.py `describe`) that rounds its activations to e4m3
# in some steps and not others: fp8 weights run W8A8 from 33 rows (kernels/linear_w8a8.py). Engines that serve it are
# judged by the QUANTIZED tolerances even when canary and baseline run the same flags (`tolerances_key`).
ROUNDS_ACTIVATIONS = frozenset({"fp8 weights"})
_QUANTIZED = replace(_HALF, max_flip_margin=3.0, confident_margin=3.0)
DEFAULT_TOLERANCES: dict[str, Tolerances] = {
    "float32": Tolerances(min_identical_fraction=0.9, min_top1_agreement=0.98, max_mean_logprob_drift=1e-5,
                          max_logprob_drift=1e-4, max_flip_margin=1e-3),
    "bfloat16": _HALF,
    "float16": _HALF,
    QUANTIZED: _QUANTIZED,
}
LOOSEST_DTYPE = "bfloat16"   # used for a dtype the policy has no tolerances for


def quantized_by(quantization: object, kv_cache_dtype: object) -> frozenset[str]:
    """What an engine serving these flags quantizes, in tolerances_key's words: "int8 weights" / "fp8 weights" for
    --quantization, "fp8 KV pages" for --kv-cache-dtype other than auto; values that are not strings say nothing."""
    out = {f"{quantization} weights"} if isinstance(quantization, str) and quantization else set()
    if isinstance(kv_cache_dtype, str) and kv_cache_dtype not in ("", "auto"):
        out.add(f"{kv_cache_dtype} KV pages")
    return frozenset(out)


def tolerances_key(dtype: str, canary_quantized: Collection[str], baseline_quantized: Collection[str]) -> str:
    """Whose tolerances judge a replay: the canary's compute dtype, or QUANTIZED when the canary quantizes other
    than its baseline ("fp8 KV pages", "int8 weights", ...: a release of engine flags moves the answers by that
    rounding, which the dtype's tolerances -- float32's on a CPU -- would call a bug), or when either engine rounds
    its activations to e4m3 (ROUNDS_ACTIVATIONS: fp8 weights run W8A8 from 33 rows, so which rows share a step
    decides whether a prompt's activations are rounded, and a kernel set that moves a product by a bf16 ulp moves
    which e4m3 value the next layer reads: both engines' answers move by e4m3's rounding, not bf16's)."""
    c, b = set(canary_quantized), set(baseline_quantized)
    return QUANTIZED if c != b or (c | b) & ROUNDS_ACTIVATIONS else dtype


_DEFAULT_ATOL = {"float32": 1e-5, "float16": 1e-3, "bfloat16": 1e-2}   # the kernel tests' (tests/kernels/)


def _default_atol() -> dict[str, float]:
    return dict(_DEFAULT_ATOL)


@dataclass(slots=True, frozen=True)
class ConformancePolicy:
    """`policy.correctness.conformance`: judge the canary engine's op-level conformance report."""
    enabled: bool = True
    k: float = 4.0              # times the reference's own error in the serving precision
    atol: Mapping[str, float] = field(default_factory=_default_atol)   # dtype -> absolute slack (times max(1, |ref|))

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise PolicyError("enabled", f"must be true or false, got {_short(self.enabled)}")
        if not _num(self.k) or not 1 <= self.k <= 1000:
            raise PolicyError("k", f"must be a number from 1 to 1000 (times the reference's own error), got "
                              f"{_short(self.k)}")
        if not isinstance(self.atol, Mapping) or not self.atol:
            raise PolicyError("atol", "must map dtypes (float32, bfloat16, ...) to an absolute tolerance")
        for dtype, v in self.atol.items():
            if not isinstance(dtype, str) or not _num(v) or not 0 <= v <= 1:
                raise PolicyError(f"atol.{dtype}", f"must be a number from 0 to 1, got {_short(v)}")
        object.__setattr__(self, "atol", {**_DEFAULT_ATOL, **self.atol})

    def atol_for(self, dtype: str) -> float:
        return self.atol.get(dtype, self.atol.get(LOOSEST_DTYPE, _DEFAULT_ATOL[LOOSEST_DTYPE]))

    def to_dict(self) -> dict:
        return {"enabled": self.enabled, "k": self.k, "atol": dict(self.atol)}

    @classmethod
    def from_dict(cls, d) -> "ConformancePolicy":
        if isinstance(d, ConformancePolicy):
            return d
        if not isinstance(d, Mapping):
            raise PolicyError("", "must be an object, e.g. {\"k\": 4}")
        unknown = sorted(str(k) for k in set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise PolicyError(unknown[0], f"is not a conformance field; fields are "
                              f"{', '.join(f.name for f in fields(cls))}")
        return cls(**d)


def _default_tolerances() -> dict[str, Tolerances]:
    return dict(DEFAULT_TOLERANCES)


@dataclass(slots=True, frozen=True)
class CorrectnessPolicy:
    """The kernel-correctness gate (analysis/correctness.py): before the first traffic step and at every step (plus
    every interval_s when > 0) the prompt set is replayed greedily against canary and baseline, and compared with
    the tolerances of the engines' dtype."""
    enabled: bool = True
    prompt_set: str | tuple[str, ...] = "default"   # "default", a set name or the prompts (analysis/prompts.py)
    max_tokens: int = 16                 # greedy tokens generated per prompt
    compare_tokens: int = 8              # K: "identical" means identical over the first K tokens
    top_logprobs: int = 5                # alternatives per position (for the margins at a divergence)
    interval_s: float = 0.0              # 0: once per step; > 0: also every interval_s within a step
    max_error_fraction: float = 0.25     # more prompts failing to replay: inconclusive
    request_timeout_s: float = 60.0
    concurrency: int = 4                 # replay requests in flight per variant
    tolerances: Mapping[str, Tolerances] = field(default_factory=_default_tolerances)   # dtype -> tolerances
    # op-level conformance of the canary engine's kernels at the served shapes (analysis/conformance.py)
    conformance: ConformancePolicy = field(default_factory=ConformancePolicy)

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise PolicyError("enabled", f"must be true or false, got {_short(self.enabled)}")
        if why := prompt_set_problem(self.prompt_set):
            raise PolicyError("prompt_set", why)
        object.__setattr__(self, "prompt_set", p if isinstance(p := self.prompt_set, str) else tuple(p))
        for name, lo, hi in (("max_tokens", 1, 256), ("compare_tokens", 1, 256), ("top_logprobs", 1, 20),
                             ("concurrency", 1, 64)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise PolicyError(name, f"must be an integer from {lo} to {hi}, got {_short(v)}")
        if self.compare_tokens > self.max_tokens:
            raise PolicyError("compare_tokens", f"({self.compare_tokens}) must be at most max_tokens "
                              f"({self.max_tokens})")
        if not _num(self.max_error_fraction) or not 0 <= self.max_error_fraction <= 1:
            raise PolicyError("max_error_fraction", f"must be a fraction from 0 to 1, got "
                              f"{_short(self.max_error_fraction)}")
        if not _num(self.interval_s) or self.interval_s < 0:
            raise PolicyError("interval_s", f"must be >= 0 seconds (0 = once per step), got {_short(self.interval_s)}")
        if not _num(self.request_timeout_s) or not 0 < self.request_timeout_s <= 3600:
            raise PolicyError("request_timeout_s", "must be more than 0 and at most 3600 seconds, got "
                              f"{_short(self.request_timeout_s)}")
        if not isinstance(self.tolerances, Mapping) or not self.tolerances:
            raise PolicyError("tolerances", "must map dtypes (float32, bfloat16, ...) to tolerances")
        tol = {}
        for dtype, t in self.tolerances.items():
            if not isinstance(dtype, str) or not dtype:
                raise PolicyError("tolerances", "keys must be dtype names such as 'bfloat16'")
            tol[dtype] = t if isinstance(t, Tolerances) else _tolerances(dtype, t)
        object.__setattr__(self, "tolerances", tol)
        try:
            object.__setattr__(self, "conformance", ConformancePolicy.from_dict(self.conformance))
        except PolicyError as e:
            raise e.under("conformance") from None

    def tolerances_for(self, dtype: str) -> Tolerances:
        return self.tolerances.get(dtype) or self.tolerances.get(LOOSEST_DTYPE) or next(iter(self.tolerances.values()))

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("tolerances", "conformance")}
        d["tolerances"] = {k: asdict(t) for k, t in self.tolerances.items()}
        d["conformance"] = self.conformance.to_dict()
        return d

    @classmethod
    def from_dict(cls, d) -> "CorrectnessPolicy":
        """Plain dict -> policy; `tolerances` entries are merged field by field over the defaults of that dtype."""
        if isinstance(d, CorrectnessPolicy):
            return d
        if not isinstance(d, Mapping):
            raise PolicyError("", "must be an object, e.g. {\"enabled\": false}")
        unknown = sorted(str(k) for k in set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise PolicyError(_name(unknown[0]), f"is not a correctness field; fields are "
                              f"{', '.join(f.name for f in fields(cls))}")
        d = dict(d)
        if "tolerances" in d:
            if not isinstance(d["tolerances"], Mapping):
                raise PolicyError("tolerances", "must map dtypes (float32, bfloat16, ...) to tolerances")
            d["tolerances"] = {**DEFAULT_TOLERANCES, **{k: _tolerances(k, v) for k, v in d["tolerances"].items()}}
        return cls(**d)


def _tolerances(dtype: str, t) -> Tolerances:
    if isinstance(t, Tolerances):
        return t
    if not isinstance(t, Mapping):
        raise PolicyError(f"tolerances.{dtype}", "must be an object")
    base = DEFAULT_TOLERANCES.get(dtype, DEFAULT_TOLERANCES[LOOSEST_DTYPE])
    unknown = sorted(str(k) for k in set(t) - {f.name for f in fields(Tolerances)})
    if unknown:
        raise PolicyError(f"tolerances.{_name(dtype)}.{_name(unknown[0])}", "is not a tolerance field")
    try:
        return Tolerances(**{**asdict(base), **t})
    except PolicyError as e:
        raise e.under(f"tolerances.{dtype}") from None
