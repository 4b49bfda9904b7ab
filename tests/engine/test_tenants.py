"""Multi-tenancy: per-tenant KV block limits stop one tenant from starving another; priority-weighted prefix-cache
eviction keeps a high-priority tenant's cached prefix under pressure that evicts a low-priority tenant's."""

import pytest
import torch

from sits.engine import EngineConfig, InvalidRequestError, LLMEngine, SamplingParams
from sits.engine.scheduling.sequence import Sequence
from tests.engine.helpers import run_to_completion


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def make_engine(clock=None, **kw) -> LLMEngine:
    kw = {"model": "tiny", "device": "cpu", "dtype": "float32", **kw}
    return LLMEngine(EngineConfig(**kw), **({"clock": clock} if clock else {}))


@pytest.mark.parametrize("limit", [6, None], ids=["tenant-limit", "no-limit"])
def test_a_busy_high_priority_tenant_cannot_starve_another(limit):
    engine = make_engine(num_kv_blocks=16, max_blocks_per_tenant=limit)
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    for i in range(10):  # each needs 2 blocks: without a limit, 8 of them fit at once
        engine.add_request(f"big-{i}", prompt(100, i), params, tenant="big", priority=3)
    engine.add_request("small", prompt(30, 99), params, tenant="small", priority=0)
    order = []
    max_big_blocks = 0
    while engine.has_unfinished_requests():
        order += [o.request_id for o in engine.step() if o.finished]
        max_big_blocks = max(max_big_blocks, engine.block_manager.tenant_usage("big"))
    if limit is None:
        assert order.index("small") >= 8  # strict priority: the small tenant waits for most of the big one's work
    else:
        assert max_big_blocks <= limit
        assert order.index("small") <= 3  # admitted beside the big tenant's first requests
    assert len(order) == 11


def test_requests_larger_than_the_tenant_limit_are_rejected():
    engine = make_engine(num_kv_blocks=16, max_blocks_per_tenant=2)
    with pytest.raises(InvalidRequestError) as e:
        engine.add_request("r", prompt(100, 0), SamplingParams(max_tokens=40), tenant="t")
    assert e.value.param == "max_tokens" and "per-tenant" in str(e.value)


@pytest.mark.parametrize("gold_priority,survivor", [(3, "gold"), (0, "free")])
def test_priority_weighted_prefix_cache_eviction(gold_priority, survivor):
    clock = Clock()
    engine = make_engine(clock, num_kv_blocks=8)
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    prompts = {"gold": prompt(130, 1), "free": prompt(130, 2)}  # 2 full blocks each end up cached
    clock.t = 10.0
    engine.add_request("g1", prompts["gold"], params, tenant="gold", priority=gold_priority)
    run_to_completion(engine)  # released at t=10: score 10 * (1 + 0.2 * priority) = 16 for priority 3
    clock.t = 12.0
    engine.add_request("f1", prompts["free"], params, tenant="free", priority=0)
    run_to_completion(engine)  # released at t=12: score 12
    assert engine.block_manager.num_cached_blocks == 4
    clock.t = 13.0  # cache pressure: 6 blocks needed, 4 uncached free -> 2 cached blocks evicted
    engine.add_request("big", prompt(370, 3), SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True),
                       tenant="other")
    run_to_completion(engine)
    loser = "free" if survivor == "gold" else "gold"
    peek = {t: len(engine.block_manager.match_prefix(Sequence("peek", ids, params))) for t, ids in prompts.items()}
    assert peek == {survivor: 2, loser: 0}
    engine.add_request("again", prompts[survivor], params, tenant=survivor)
    assert run_to_completion(engine)["again"]["outputs"][-1].num_cached_tokens == 128
