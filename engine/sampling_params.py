"""Per-request sampling parameters, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass, field

from sits.engine.errors import InvalidRequestError

MAX_LOGPROBS = 20
# stop_token_ids a request may name (a 16 MB list of ids took 145 s instead of 23 s: every new token was compared
# with each of them); eos ids are added by the engine, not counted here
MAX_STOP_TOKEN_IDS = 64


@dataclass(slots=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    seed: int | None = None  # same seed -> same tokens, whatever else is in the batch
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # None = off; N = the sampled token's logprob plus the top N (0..20)
    # None = off; N = each prompt token's logprob given the tokens before it, plus the top N there (0..20): scores a
    # given text (teacher forcing). Such a prompt is computed in full (never served from the prefix cache).
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop is None:
            self.stop = []
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        _check_int(self.max_tokens, "max_tokens", lo=1)
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) \
                or not 0.0 <= float(self.temperature) <= 100.0 or self.temperature != self.temperature:
            raise InvalidRequestError(f"temperature must be a number in [0, 100], got {self.temperature!r}",
                                      "temperature")
        self.temperature = float(self.temperature)
        _check_int(self.top_k, "top_k", lo=0)
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)) \
                or not 0.0 < float(self.top_p) <= 1.0:
            raise InvalidRequestError(f"top_p must be a number in (0, 1], got {self.top_p!r}", "top_p")
        self.top_p = float(self.top_p)
        if self.seed is not None:
            _check_int(self.seed, "seed", lo=0, hi=2**63 - 1)
        if not isinstance(self.stop, (list, tuple)) or not all(isinstance(s, str) and s for s in self.stop):
            raise InvalidRequestError("stop must be a list of non-empty strings", "stop")
        self.stop = list(self.stop)
        if not isinstance(self.stop_token_ids, (list, tuple)):
            raise InvalidRequestError("stop_token_ids must be a list of token ids", "stop_token_ids")
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise InvalidRequestError(f"stop_token_ids has {len(self.stop_token_ids)} ids; at most "
                                      f"{MAX_STOP_TOKEN_IDS} are allowed", "stop_token_ids")
        for t in self.stop_token_ids:
            _check_int(t, "stop_token_ids", lo=0)
        self.stop_token_ids = list(dict.fromkeys(self.stop_token_ids))
        if not isinstance(self.ignore_eos, bool):
            raise InvalidRequestError("ignore_eos must be a boolean", "ignore_eos")
        if self.logprobs is not None:
            _check_int(self.logprobs, "logprobs", lo=0, hi=MAX_LOGPROBS)
        if self.prompt_logprobs is not None:
            _check_int(self.prompt_logprobs, "prompt_logprobs", lo=0, hi=MAX_LOGPROBS)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _check_int(value, name: str, lo: int | None = None, hi: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequestError(f"{name} must be an integer, got {value!r}", name)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise InvalidRequestError(f"{name} must be {bounds}, got {value}", name)
