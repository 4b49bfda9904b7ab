"""One request's state inside the engine (torch-free)."""

from __future__ import annotations

import itertools
from enum import Enum, auto

from sits.engine.sampling_params import SamplingParams


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


class Sequence:
    _counter = itertools.count()

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, *,
                 tenant: str = "default", priority: int = 0, arrival_time: float = 0.0):
        self.seq_id = next(Sequence._counter)  # arrival order, breaks FCFS ties
        self.request_id = request_id
        self.token_ids: list[int] = list(prompt_token_ids)  # prompt + generated
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.tenant = tenant
        self.priority = priority
        self.arrival_time = arrival_time
        self.status = SequenceStatus.WAITING
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []  # hash chain over the full blocks of token_ids (prefix caching)
        self.num_committed_blocks = 0  # leading blocks of block_table already offered to the prefix cache
        # tokens whose K/V are in the cache; a step computes token_ids[num_computed_tokens:...]
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prefix-cache hit at first admission
        self.admitted = False
        self.num_preemptions = 0
        self.finish_reason: str | None = None
        # params.prompt_logprobs: one entry per prompt token after the first, filled as its chunks are computed
        self.prompt_logprobs: list[dict] = []
        self.sampler_state = None  # the model runner's per-request RNG (opaque here)
        # incremental detokenization / stop strings (engine-owned)
        self.output_text = ""
        self.detokenize = True  # False: the caller turns tokens into text (the API server does, engine/core/)
        self.emitted_text_len = 0
        self.prefix_offset = 0
        self.read_offset = 0

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def needs_prompt_logprobs(self) -> bool:
        return self.params.prompt_logprobs is not None and len(self.prompt_logprobs) < self.num_prompt_tokens - 1

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def sort_key(self) -> tuple[int, int]:
        """Scheduling order: higher priority first, then arrival (FCFS)."""
        return (-self.priority, self.seq_id)

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id!r}, len={len(self)}, computed={self.num_computed_tokens}, "
                f"blocks={len(self.block_table)}, {self.status.name})")
