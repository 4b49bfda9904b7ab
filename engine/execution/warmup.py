"""Which batch shapes `LLMEngine.warmup()` runs so that no request later waits for a Triton compile or autotune.

A Triton kernel is compiled once per *specialization* of its arguments (an int's value 1 and divisibility by 16, a
tensor's dtype and alignment) and autotuned once per autotune key (kernels/*.py bucket the token or batch count by
powers of two, and the int8 linear picks its tile family by rows: <= 16, <= 32, <= 64, more). The engine keeps
everything else fixed:
- block tables always have the full width (max_model_len / block_size), so no stride or width varies;
- the decode rows of every step are padded to a decode CUDA-graph batch size (engine/execution/cuda_graphs.py), so eager
  (mixed) steps launch decode attention with exactly the shapes the graph captures compiled.
What is left is the number of prefill tokens in a step (t), the number of prefilling sequences (b) and whether
decodes ride along. `warmup_plan` covers every power-of-two bucket of the prefill count up to the step's token budget with
both residues mod 16 (the linear's tile families are such buckets too), b in {1, 2, 16} (value 1, neither, a
multiple of 16), with and without one decode; and, when decode steps don't replay graphs, one decode-only step of
every padded batch size. The GPU test tests/engine/test_gpu.py::test_no_compilation_after_warmup counts the
compilations after warm-up over a mixed workload.
"""
from __future__ import annotations

from dataclasses import dataclass

PREFILL_SEQS = (1, 2, 16)


@dataclass(frozen=True, slots=True)
class WarmupStep:
    prefill_lens: tuple[int, ...]  # new tokens of each prefilling sequence (each >= 2)
    num_decodes: int  # decoding sequences in the same step (before padding)

    @property
    def num_tokens(self) -> int:
        return sum(self.prefill_lens) + self.num_decodes


def prefill_token_counts(budget: int) -> list[int]:
    """For every power-of-two bucket (p/2, p] up to the budget: its top (p, or the budget), the count below it and
    the largest multiple of 16 in it, so each bucket is seen with both residues mod 16; ascending, all >= 2."""
    counts: set[int] = set()
    p = 2
    while p // 2 < budget:
        hi, lo = min(p, budget), p // 2 + 1
        counts |= {c for c in (hi, hi - 1, hi - hi % 16) if c >= max(lo, 2)}
        p *= 2
    return sorted(counts)


def split(total: int, parts: int) -> tuple[int, ...]:
    """`total` tokens over `parts` sequences as evenly as possible (the first ones take the remainder)."""
    q, r = divmod(total, parts)
    return tuple(q + (i < r) for i in range(parts))


def warmup_plan(max_num_batched_tokens: int, max_num_seqs: int, decode_sizes: tuple[int, ...],
                decode_graphs: bool) -> list[WarmupStep]:
    """The steps warm-up runs (see the module docstring); each fits the token budget and the sequence limit."""
    steps: list[WarmupStep] = []
    for t in prefill_token_counts(max_num_batched_tokens):
        for b in PREFILL_SEQS:
            if b <= max_num_seqs and 2 * b <= t:
                steps.append(WarmupStep(split(t, b), 0))
        if max_num_seqs >= 2 and t + 1 <= max_num_batched_tokens:
            steps.append(WarmupStep((t,), 1))
    if not decode_graphs:
        steps += [WarmupStep((), n) for n in decode_sizes if n <= max_num_batched_tokens]
    return steps
