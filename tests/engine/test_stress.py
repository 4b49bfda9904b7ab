"""Randomized arrivals, priorities, tenants and aborts on a tiny KV cache: invariants hold after every step and every
completed request has exactly the tokens it has when run alone."""

import random

import torch

from sits.engine import EngineConfig, LLMEngine, SamplingParams
from tests.engine.helpers import run_to_completion


def make_engine(**kw):
    return LLMEngine(EngineConfig(model="tiny", device="cpu", dtype="float32", **kw))


def check_invariants(engine):
    sched, bm = engine.scheduler, engine.block_manager
    live = sched.running + sched.waiting
    assert len({s.seq_id for s in live}) == len(live)
    refs = {}
    for s in live:
        if s in sched.waiting:
            assert not s.block_table and s.num_computed_tokens == 0
        else:
            assert len(s.block_table) * bm.block_size >= s.num_computed_tokens
        for b in s.block_table:
            refs[b] = refs.get(b, 0) + 1
    assert all(block.ref_count == refs.get(block.block_id, 0) for block in bm.blocks)
    assert bm.num_free_blocks == bm.num_total_blocks - len(refs)
    for tenant in {s.tenant for s in live}:
        assert bm.tenant_usage(tenant) <= 7


def test_random_workload_keeps_invariants_and_outputs():
    rng = random.Random(1)
    gen = torch.Generator().manual_seed(1)
    shared = torch.randint(0, 256, (70,), generator=gen).tolist()
    requests = {}
    for i in range(24):
        n = rng.choice([3, 20, 64, 90, 150])
        ids = (shared if rng.random() < 0.4 else []) + torch.randint(0, 256, (n,), generator=gen).tolist()
        requests[f"q{i}"] = (ids, SamplingParams(max_tokens=rng.randint(1, 25), temperature=0.0, ignore_eos=True),
                             f"t{rng.randrange(3)}", rng.randrange(4))
    engine = make_engine(num_kv_blocks=12, max_blocks_per_tenant=7, max_num_batched_tokens=rng.choice([48, 100]),
                         max_num_seqs=6)
    pending = list(requests)
    tokens, finished, aborted = {}, {}, set()
    steps = 0
    while pending or engine.has_unfinished_requests():
        for _ in range(rng.randrange(0, 3)):
            if pending:
                rid = pending.pop(0)
                ids, params, tenant, prio = requests[rid]
                engine.add_request(rid, ids, params, tenant=tenant, priority=prio)
        if rng.random() < 0.04 and tokens:
            victim = rng.choice(sorted(tokens))
            engine.abort_request(victim)
            aborted.add(victim)
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.finished:
                assert out.request_id not in finished
                finished[out.request_id] = out.finish_reason
        check_invariants(engine)
        steps += 1
        assert steps < 3000
    assert set(finished) == set(requests)
    assert engine.stats().num_preemptions > 0 and engine.stats().prefix_cache_hits > 0
    assert engine.stats().num_free_blocks == engine.stats().num_total_blocks
    alone = make_engine(num_kv_blocks=12)
    for rid, reason in finished.items():
        if reason == "abort":
            assert rid in aborted
            continue
        ids, params, _, _ = requests[rid]
        alone.add_request(rid, ids, params)
        assert run_to_completion(alone)[rid]["tokens"] == tokens[rid], rid
