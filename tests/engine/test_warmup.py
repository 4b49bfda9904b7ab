"""Warm-up shape plan (engine/execution/warmup.py) and the fixed shapes the runner gives kernels (CPU)."""

import pytest
import torch

from sits import kernels
from sits.engine import EngineConfig, LLMEngine, SamplingParams
from sits.engine.execution.cuda_graphs import graph_batch_sizes
from sits.engine.execution.warmup import WarmupStep, prefill_token_counts, split, warmup_plan


def family(t: int) -> tuple:
    """What a Triton kernel's compile / autotune key can see of a token count: value 1, divisibility by 16, the
    power-of-two bucket, and the int8 linear's tile family by rows."""
    bucket = 1 << max(0, t - 1).bit_length()
    rows = 16 if t <= 16 else 32 if t <= 32 else 64 if t <= 64 else "large"
    return t == 1, t % 16 == 0, bucket, rows


@pytest.mark.parametrize("budget", [2048, 512, 100, 17])
def test_token_counts_cover_every_family_a_step_can_have(budget):
    counts = prefill_token_counts(budget)
    assert counts == sorted(set(counts)) and counts[0] >= 2 and counts[-1] == budget
    covered = {family(t) for t in counts}
    missing = [t for t in range(2, budget + 1) if family(t) not in covered]
    assert not missing, missing[:10]


def test_plan_fits_the_limits_and_varies_the_prefill_count():
    sizes = graph_batch_sizes(256)
    plan = warmup_plan(2048, 256, sizes, decode_graphs=True)
    assert all(s.num_tokens <= 2048 and len(s.prefill_lens) + s.num_decodes <= 256 for s in plan)
    assert all(n >= 2 for s in plan for n in s.prefill_lens)
    assert {len(s.prefill_lens) for s in plan} == {1, 2, 16}
    assert WarmupStep((2048,), 0) in plan and WarmupStep((2047,), 1) in plan and WarmupStep((15,), 1) in plan
    # decode-only steps replay graphs (captured separately): none in the plan; without graphs every padded size
    assert not any(s.num_decodes and not s.prefill_lens for s in plan)
    eager = warmup_plan(2048, 256, sizes, decode_graphs=False)
    assert [s.num_decodes for s in eager if not s.prefill_lens] == list(sizes)
    one = warmup_plan(64, 1, graph_batch_sizes(1), decode_graphs=True)
    assert all(len(s.prefill_lens) == 1 and s.num_decodes == 0 for s in one)


def test_split_is_even_and_exact():
    assert split(2047, 16) == (128,) * 15 + (127,)
    assert sum(split(33, 2)) == 33 and max(split(33, 2)) - min(split(33, 2)) <= 1


def recording_set(calls: list):
    base = kernels.get_kernel_set("torch")

    def decode(q, k_cache, v_cache, block_tables, context_lens, scale):
        calls.append(("decode", q.shape[0], tuple(block_tables.shape), context_lens.tolist()))
        return base.paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale)

    def prefill(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale):
        calls.append(("prefill", q.shape[0], tuple(block_tables.shape), context_lens.tolist()))
        return base.prefill_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale)

    name = f"torch-recording-{id(calls)}"
    kernels.register_kernel_set(base.derive(name, "0.0.1", paged_decode_attention=decode, prefill_attention=prefill))
    return name


def test_eager_steps_pad_decodes_to_a_graph_size_with_full_width_tables():
    calls: list = []
    engine = LLMEngine(EngineConfig(model="tiny", device="cpu", kernels=recording_set(calls), max_num_seqs=8,
                                    max_num_batched_tokens=40, num_kv_blocks=64, max_model_len=640))
    greedy = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    for i in range(3):
        engine.add_request(f"d{i}", [5 + i] * 3, greedy)
    engine.step()  # three prefills
    engine.add_request("p", list(range(30, 60)), greedy)
    engine.step()  # mixed: three decodes (padded to 4) + a 30-token prefill chunk
    width = 640 // 64
    decodes = [c for c in calls if c[0] == "decode"]
    prefills = [c for c in calls if c[0] == "prefill"]
    assert decodes and all(c[1] == 4 and c[2] == (4, width) for c in decodes)
    assert all(c[3] == [4, 4, 4, 1] for c in decodes)  # padding rows attend to one token
    assert all(c[2][1] == width for c in prefills)


def test_warmup_steps_write_no_kv_and_change_no_result():
    cfg = dict(model="tiny", device="cpu", max_num_seqs=4, max_num_batched_tokens=48, num_kv_blocks=32)
    prompt, greedy = list(range(40, 90)), SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    ref = LLMEngine(EngineConfig(**cfg))
    ref.add_request("r", prompt, greedy)
    want = []
    while ref.has_unfinished_requests():
        want += [o.new_token_ids for o in ref.step()]
    engine = LLMEngine(EngineConfig(**cfg))
    runner = engine.model_runner
    with torch.inference_mode():
        runner.kv_cache.normal_()  # whatever a previous request left there
    before = runner.kv_cache.clone()
    plan = warmup_plan(48, 4, runner.decode_sizes, decode_graphs=False)
    runner.warmup(plan)
    assert torch.equal(runner.kv_cache, before)
    engine.add_request("r", prompt, greedy)
    got = []
    while engine.has_unfinished_requests():
        got += [o.new_token_ids for o in engine.step()]
    assert got == want
    assert engine.stats().num_free_blocks == 32  # warm-up took no blocks
