"""Block manager invariants: allocation, reference counts, prefix-cache hash chain, priority-weighted eviction,
tenant limits. Torch-free, with a frozen clock."""

import random

from sits.engine.scheduling.block_manager import NO_FREE_BLOCKS, TENANT_LIMIT, BlockManager
from sits.engine.sampling_params import SamplingParams
from sits.engine.scheduling.sequence import Sequence

BS = 4


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def seq(tokens, tenant="default", priority=0):
    return Sequence(f"r{random.random()}", list(tokens), SamplingParams(), tenant=tenant, priority=priority)


def admit(bm, s):
    """Allocate blocks for all of s's tokens (after prefix hits) and mark them computed + committed."""
    cached = bm.match_prefix(s)
    new = len(s) - len(cached) * bm.block_size
    assert bm.can_allocate(s, cached, new) is None
    bm.allocate(s, cached, new)
    s.num_computed_tokens = len(s)
    bm.commit(s)
    return len(cached)


def check_refcounts(bm, live):
    expected = {}
    for s in live:
        for b in s.block_table:
            expected[b] = expected.get(b, 0) + 1
    for block in bm.blocks:
        assert block.ref_count == expected.get(block.block_id, 0), block.block_id
    assert bm.num_free_blocks == bm.num_total_blocks - len(expected)


def test_shared_prefix_is_reference_counted_and_everything_is_freed():
    bm = BlockManager(8, BS)
    a = seq(range(10))  # 2 full blocks + 2 tokens
    admit(bm, a)
    assert len(a.block_table) == 3 and bm.num_free_blocks == 5
    b = seq(list(range(8)) + [99, 98, 97])
    assert admit(bm, b) == 2  # both full blocks of `a` reused
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert [bm.blocks[i].ref_count for i in a.block_table] == [2, 2, 1]
    check_refcounts(bm, [a, b])
    bm.free(a)
    check_refcounts(bm, [b])
    bm.free(b)
    check_refcounts(bm, [])
    assert bm.num_free_blocks == 8 and bm.num_cached_blocks == 2  # free, but its full blocks stay reusable
    assert bm.prefix_cache_queries == 21 and bm.prefix_cache_hits == 8


def test_at_least_one_token_is_recomputed_and_chain_breaks_on_mismatch():
    bm = BlockManager(8, BS)
    admit(bm, seq(range(8)))  # exactly 2 full blocks
    again = seq(range(8))
    assert len(bm.match_prefix(again)) == 1  # the last block is recomputed to get logits for the last token
    # same second block after a different first block: the hash chain must not match it
    assert bm.match_prefix(seq([7, 7, 7, 7] + list(range(4, 8)) + [1])) == []
    # same first block, different second: only the first matches
    assert len(bm.match_prefix(seq(list(range(4)) + [9, 9, 9, 9, 1]))) == 1


def test_prefix_caching_off_shares_nothing():
    bm = BlockManager(8, BS, enable_prefix_caching=False)
    admit(bm, seq(range(9)))
    assert bm.match_prefix(seq(range(9))) == [] and bm.num_cached_blocks == 0


def test_append_grows_one_block_at_a_time_and_reports_exhaustion():
    bm = BlockManager(3, BS)
    s = seq(range(4))
    admit(bm, s)
    assert len(s.block_table) == 1
    assert bm.can_append(s, 1) is None
    bm.append(s, 1)
    assert len(s.block_table) == 2
    s.num_computed_tokens = 5
    bm.append(s, 3)  # positions 5..7 fit in block 2
    assert len(s.block_table) == 2
    s.num_computed_tokens = 8
    bm.append(s, 4)
    s.num_computed_tokens = 12
    assert bm.can_append(s, 1) == NO_FREE_BLOCKS
    bm.free(s)
    assert bm.num_free_blocks == 3


def test_high_priority_prefix_survives_pressure_that_evicts_low_priority():
    for prio_a, survivor in ((3, "a"), (0, "b")):
        clock = Clock()
        bm = BlockManager(6, BS, clock=clock)
        a = seq([1] * 8 + [5], tenant="gold", priority=prio_a)
        b = seq([2] * 8 + [5], tenant="free", priority=0)
        clock.t = 10.0
        admit(bm, a)
        bm.free(a)  # score 10 * (1 + 0.2 * prio_a): 16 for priority 3
        clock.t = 12.0
        admit(bm, b)
        bm.free(b)  # score 12: more recent, but lower priority
        assert bm.num_cached_blocks == 4
        # pressure: a new 4-block sequence needs 2 cached blocks evicted
        clock.t = 13.0
        admit(bm, seq([3] * 16))
        hits_a = len(bm.match_prefix(seq([1] * 8 + [5])))
        hits_b = len(bm.match_prefix(seq([2] * 8 + [5])))
        assert (hits_a, hits_b) == ((2, 0) if survivor == "a" else (0, 2)), (prio_a, hits_a, hits_b)


def test_eviction_takes_the_deepest_block_of_a_chain_first():
    clock = Clock()
    bm = BlockManager(4, BS, clock=clock)
    a = seq([1] * 12 + [2])
    admit(bm, a)
    bm.free(a)  # 3 cached full blocks + 1 uncached, all released at the same instant
    admit(bm, seq([9] * 8))  # takes the uncached block, then evicts one cached block
    assert len(bm.match_prefix(seq([1] * 12 + [2]))) == 2  # the chain's head survives


def test_tenant_limit_counts_distinct_blocks():
    bm = BlockManager(16, BS, max_blocks_per_tenant=4)
    a = seq(range(9), tenant="t1")
    admit(bm, a)  # 3 blocks
    assert bm.tenant_usage("t1") == 3
    b = seq(list(range(8)) + [50], tenant="t1")
    assert admit(bm, b) == 2  # shares 2 blocks: tenant uses 4 distinct blocks, not 6
    assert bm.tenant_usage("t1") == 4
    c = seq(range(100, 105), tenant="t1")
    assert bm.can_allocate(c, [], 5) == TENANT_LIMIT
    assert bm.can_append(b, 4) == TENANT_LIMIT
    other = seq(range(100, 105), tenant="t2")
    assert bm.can_allocate(other, [], 5) is None  # the other tenant is unaffected
    bm.free(a)
    bm.free(b)
    assert bm.tenant_usage("t1") == 0


def test_random_operations_keep_refcounts_exact():
    rng = random.Random(0)
    bm = BlockManager(24, BS, max_blocks_per_tenant=14, clock=Clock())
    live = []
    prefixes = [[rng.randrange(50) for _ in range(8)] for _ in range(3)]
    for _ in range(400):
        op = rng.random()
        if op < 0.45:
            tokens = rng.choice(prefixes)[: rng.randrange(1, 9)] + [rng.randrange(50) for _ in range(rng.randrange(0, 9))]
            s = seq(tokens, tenant=rng.choice("xy"), priority=rng.randrange(4))
            cached = bm.match_prefix(s)
            if bm.can_allocate(s, cached, len(s) - len(cached) * BS) is None:
                admit(bm, s)
                live.append(s)
        elif op < 0.75 and live:
            s = rng.choice(live)
            n = rng.randrange(1, 6)
            if bm.can_append(s, n) is None:
                bm.append(s, n)
                s.token_ids += [rng.randrange(50) for _ in range(n)]
                s.num_computed_tokens += n
                bm.commit(s)
        elif live:
            s = live.pop(rng.randrange(len(live)))
            bm.free(s)
        check_refcounts(bm, live)
        for t in "xy":
            assert bm.tenant_usage(t) <= 14
            assert bm.tenant_usage(t) == len({b for s in live if s.tenant == t for b in s.block_table})
        for h, bid in bm.hash_to_block.items():
            assert bm.blocks[bid].hash == h
    for s in live:
        bm.free(s)
    check_refcounts(bm, [])
    assert bm.num_free_blocks == 24


def test_scheduler_and_block_manager_are_torch_free():
    import subprocess
    import sys

    code = ("import sys, sits.engine.scheduling.scheduler, sits.engine.scheduling.block_manager, "
            "sits.engine.scheduling.sequence, sits.engine.sampling_params; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"
