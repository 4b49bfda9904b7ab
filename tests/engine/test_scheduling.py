"""Continuous batching, chunked prefill, prefix caching, preemption, priorities and aborts on the tiny model."""

import pytest
import torch

from sits.engine import EngineConfig, LLMEngine, SamplingParams
from tests.engine.helpers import run_to_completion

GREEDY = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)


def make_engine(**kw) -> LLMEngine:
    kw = {"model": "tiny", "device": "cpu", "dtype": "float32", "num_kv_blocks": 64, **kw}
    return LLMEngine(EngineConfig(**kw))


def prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


PROMPTS = {f"r{i}": prompt(n, i) for i, n in enumerate([5, 70, 130, 33, 64, 200, 1, 90])}


@pytest.fixture(scope="module")
def reference():
    """Greedy tokens of every prompt, each run alone."""
    out = {}
    for rid, ids in PROMPTS.items():
        engine = make_engine()
        engine.add_request(rid, ids, GREEDY)
        out[rid] = run_to_completion(engine)[rid]["tokens"]
        assert len(out[rid]) == 40
    return out


def all_free(engine):
    s = engine.stats()
    return s.num_free_blocks == s.num_total_blocks and s.num_running == 0 and s.num_waiting == 0


def test_same_tokens_alone_and_inside_a_busy_batch(reference):
    engine = make_engine()
    rids = list(PROMPTS)
    for rid in rids[:4]:
        engine.add_request(rid, PROMPTS[rid], GREEDY)
    results = {}
    for step in range(6):  # the batch is busy decoding when the rest arrive (continuous batching)
        for out in engine.step():
            results.setdefault(out.request_id, []).extend(out.new_token_ids)
    assert len(engine.scheduler.running) == 4
    for rid in rids[4:]:
        engine.add_request(rid, PROMPTS[rid], GREEDY)
    for rid, r in run_to_completion(engine).items():
        results.setdefault(rid, []).extend(r["tokens"])
    assert results == reference
    assert all_free(engine)


def record_batches(engine) -> list[list[tuple[int, int]]]:
    """Observe every scheduled batch as [(new tokens, tokens the seq still had to compute), ...]."""
    batches = []
    schedule = engine.scheduler.schedule

    def recording_schedule():
        batch = schedule()
        batches.append([(n, len(s) - s.num_computed_tokens) for s, n in zip(batch.seqs, batch.num_new_tokens)])
        return batch

    engine.scheduler.schedule = recording_schedule
    return batches


def test_chunked_prefill_and_mixed_steps_give_the_same_tokens(reference):
    engine = make_engine(max_num_batched_tokens=24)
    batches = record_batches(engine)
    for rid, ids in PROMPTS.items():
        engine.add_request(rid, ids, GREEDY)
    results = run_to_completion(engine)
    assert {rid: r["tokens"] for rid, r in results.items()} == reference
    assert all(sum(n for n, _ in b) <= 24 for b in batches)  # the per-step token budget
    assert any(n < left for b in batches for n, left in b)  # some prompts were split into chunks
    assert any(any(n == left == 1 for n, left in b) and any(1 < n for n, _ in b) for b in batches)  # mixed steps
    assert all_free(engine)


def test_prefix_cache_hit_computes_only_the_new_tokens():
    engine = make_engine()
    shared = prompt(150, 42)
    engine.add_request("first", shared + [1, 2, 3], GREEDY)
    run_to_completion(engine)
    before, stats_before = engine.num_computed_tokens_total, engine.stats()
    second = shared + prompt(20, 7)
    engine.add_request("second", second, GREEDY)
    res = run_to_completion(engine)["second"]
    cached = 128  # two full 64-token blocks of the shared prefix
    assert res["outputs"][-1].num_cached_tokens == cached
    assert engine.num_computed_tokens_total - before == len(second) - cached + GREEDY.max_tokens - 1
    s = engine.stats()
    assert s.prefix_cache_hits - stats_before.prefix_cache_hits == cached
    assert s.prefix_cache_queries - stats_before.prefix_cache_queries == len(second)
    # identical to the output without prefix caching
    plain = make_engine(enable_prefix_caching=False)
    plain.add_request("second", second, GREEDY)
    assert run_to_completion(plain)["second"]["tokens"] == res["tokens"]


def test_preemption_under_a_tiny_kv_budget_completes_every_request(reference):
    engine = make_engine(num_kv_blocks=8)  # 512 token slots for 8 requests needing ~1100
    for rid, ids in PROMPTS.items():
        engine.add_request(rid, ids, GREEDY)
    results = run_to_completion(engine)
    assert engine.stats().num_preemptions > 0
    assert {rid: r["tokens"] for rid, r in results.items()} == reference
    assert all(r["finish_reason"] == "length" for r in results.values())
    assert all_free(engine)


def test_priority_runs_first_and_fcfs_within_a_priority():
    engine = make_engine(max_num_seqs=1)
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    engine.add_request("low-1", [1, 2, 3], params, priority=0)
    engine.add_request("low-2", [1, 2, 3], params, priority=0)
    engine.add_request("high", [1, 2, 3], params, priority=3)
    finished = []
    while engine.has_unfinished_requests():
        finished += [o.request_id for o in engine.step() if o.finished]
    assert finished == ["high", "low-1", "low-2"]


def test_abort_frees_blocks_of_running_and_waiting_requests():
    engine = make_engine(max_num_seqs=2)
    for i in range(4):
        engine.add_request(f"r{i}", prompt(100, i), GREEDY)
    engine.step()
    engine.step()
    assert engine.stats().num_running == 2 and engine.stats().num_waiting == 2
    engine.abort_request("r0")  # running
    engine.abort_request("r3")  # waiting
    engine.abort_request("no-such-request")  # no-op
    outs = {o.request_id: o for o in engine.step()}
    assert outs["r0"].finished and outs["r0"].finish_reason == "abort"
    assert outs["r3"].finished and outs["r3"].finish_reason == "abort"
    results = run_to_completion(engine)
    assert set(results) == {"r1", "r2"}
    assert all_free(engine)
    engine.add_request("r0", [1, 2], GREEDY)  # a finished request's id can be reused
    assert run_to_completion(engine)["r0"]["finish_reason"] == "length"


def test_high_priority_request_preempts_lower_priority_work_when_blocks_run_out(reference):
    engine = make_engine(num_kv_blocks=8)
    low = ["r2", "r5", "r7"]  # 130, 200 and 90 prompt tokens: 7 blocks at first, 8 while decoding
    for rid in low:
        engine.add_request(rid, PROMPTS[rid], GREEDY, priority=0)
    results = {}
    for _ in range(3):
        for out in engine.step():
            results.setdefault(out.request_id, []).extend(out.new_token_ids)
    assert engine.stats().num_free_blocks <= 1
    engine.add_request("r1", PROMPTS["r1"], GREEDY, priority=2)  # 70 tokens: needs 2 blocks
    outs = engine.step()
    for out in outs:
        results.setdefault(out.request_id, []).extend(out.new_token_ids)
    assert "r1" in {o.request_id for o in outs}  # admitted and prefilled at once
    assert engine.stats().num_preemptions >= 1
    for rid, r in run_to_completion(engine).items():
        results.setdefault(rid, []).extend(r["tokens"])
    for rid in low + ["r1"]:
        assert results[rid] == reference[rid], rid
    assert all_free(engine)


def test_decodes_keep_streaming_while_a_long_prompt_is_prefilled_in_chunks():
    engine = make_engine(max_num_batched_tokens=32)
    engine.add_request("decoder", PROMPTS["r0"], GREEDY, priority=0)
    engine.step()
    engine.add_request("long", prompt(400, 5), GREEDY, priority=3)  # higher priority, 13 chunks of prefill
    per_step = []
    while engine.has_unfinished_requests():
        per_step.append({o.request_id for o in engine.step() if o.new_token_ids})
    decoder_steps = [i for i, ids in enumerate(per_step) if "decoder" in ids]
    assert len(decoder_steps) == GREEDY.max_tokens - 1
    assert decoder_steps == list(range(len(decoder_steps)))  # a token every step, prefill or not
    first_long = next(i for i, ids in enumerate(per_step) if "long" in ids)
    assert first_long >= 12  # ... including the >= 12 steps in which the long prompt was prefilled


def test_prefill_tokens_are_capped_while_decodes_ride_along_and_tokens_stay_the_same(reference):
    """max_prefill_tokens_while_decoding bounds a mixed step's prefill (running chunks and admissions together); a
    step without decodes still takes the whole budget; the tokens are those of each prompt run alone."""
    engine = make_engine(max_num_batched_tokens=96, max_prefill_tokens_while_decoding=16)
    batches = record_batches(engine)
    first = ["r0", "r5"]  # 5 and 200 tokens: the first step has no decodes, so it takes the whole budget
    for rid in first:
        engine.add_request(rid, PROMPTS[rid], GREEDY)
    results = {}
    for _ in range(3):  # r0 decodes before the other prompts arrive
        for out in engine.step():
            results.setdefault(out.request_id, []).extend(out.new_token_ids)
    for rid in PROMPTS:
        if rid not in first:
            engine.add_request(rid, PROMPTS[rid], GREEDY)
    for rid, r in run_to_completion(engine).items():
        results.setdefault(rid, []).extend(r["tokens"])
    assert results == reference
    mixed = [b for b in batches if any(left == 1 for _, left in b) and any(left > 1 for _, left in b)]
    assert mixed, "some steps must carry decodes and prefill together"
    for b in batches:
        prefill = sum(n for n, left in b if left > 1)
        if any(left == 1 for _, left in b):
            assert prefill <= 16, b
        assert sum(n for n, _ in b) <= 96
    assert any(sum(n for n, _ in b) > 16 for b in batches if all(left > 1 for _, left in b)), \
        "a step with no decodes takes more than the cap"
    assert all_free(engine)


def test_the_prefill_cap_must_be_a_positive_integer():
    with pytest.raises(Exception, match="max_prefill_tokens_while_decoding must be a positive integer"):
        EngineConfig(model="tiny", max_prefill_tokens_while_decoding=0)
