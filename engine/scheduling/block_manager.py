"""Paged KV-cache bookkeeping (torch-free): block allocation, reference counts, prefix caching, tenant limits.

A block holds `block_size` consecutive tokens of one or more sequences (shared when their prefixes match). Full,
computed blocks are registered under a hash chain h_i = hash((h_{i-1}, tokens of block i)); a new sequence reuses
every leading block whose hash (and tokens) match. A block whose reference count drops to 0 stays cached until it is
needed for new data; then the cached block with the lowest score `last_access * (1 + 0.2 * priority)` (seconds since
start) is evicted first, so a high-priority tenant's prefix survives pressure that evicts a low-priority one's.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import Counter, deque

from sits.engine.scheduling.sequence import Sequence

NO_FREE_BLOCKS = "no_free_blocks"
TENANT_LIMIT = "tenant_limit"
_ROOT_HASH = -1


class Block:
    __slots__ = ("block_id", "ref_count", "hash", "token_ids", "depth", "priority", "last_access", "heap_tag")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash: int | None = None  # set while the block is registered in the prefix cache
        self.token_ids: tuple[int, ...] | None = None
        self.depth = 0  # index of the block inside its sequence (deeper blocks are evicted first on ties)
        self.priority = 0
        self.last_access = 0.0
        self.heap_tag = -1  # matches the live entry in the eviction heap


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True,
                 max_blocks_per_tenant: int | None = None, clock=time.monotonic):
        assert num_blocks > 0 and block_size > 0
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.enable_prefix_caching = enable_prefix_caching
        self.max_blocks_per_tenant = max_blocks_per_tenant
        self._clock = clock
        self._t0 = clock()
        self._free_uncached: deque[int] = deque(range(num_blocks))
        self._evictable: list[tuple[float, int, int, int]] = []  # (score, -depth, tag, block_id)
        self._num_evictable = 0
        self._tags = itertools.count()
        self.hash_to_block: dict[int, int] = {}
        self._tenant_refs: dict[str, Counter] = {}
        self.prefix_cache_queries = 0  # prompt tokens looked up at admission
        self.prefix_cache_hits = 0  # of those, tokens found in the cache
        self.num_evictions = 0

    # ---- capacity -------------------------------------------------------------------------------------------
    @property
    def num_total_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        """Blocks with no reference (never used, or cached and evictable)."""
        return len(self._free_uncached) + self._num_evictable

    @property
    def num_cached_blocks(self) -> int:
        return len(self.hash_to_block)

    def tenant_usage(self, tenant: str) -> int:
        """Distinct blocks referenced by the tenant's sequences."""
        refs = self._tenant_refs.get(tenant)
        return len(refs) if refs else 0

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ---- prefix cache ---------------------------------------------------------------------------------------
    def _hashes(self, seq: Sequence, num_full_blocks: int) -> list[int]:
        bs = self.block_size
        hashes = seq.block_hashes
        while len(hashes) < num_full_blocks:
            i = len(hashes)
            parent = hashes[-1] if hashes else _ROOT_HASH
            hashes.append(hash((parent, tuple(seq.token_ids[i * bs:(i + 1) * bs]))))
        return hashes

    def match_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks holding a prefix of seq; at least one token is always left to compute (for its logits)."""
        if not self.enable_prefix_caching:
            return []
        bs = self.block_size
        n = (len(seq.token_ids) - 1) // bs
        hits: list[int] = []
        for i, h in enumerate(self._hashes(seq, n)[:n]):
            bid = self.hash_to_block.get(h)
            if bid is None or self.blocks[bid].token_ids != tuple(seq.token_ids[i * bs:(i + 1) * bs]):
                break
            hits.append(bid)
        return hits

    def commit(self, seq: Sequence) -> None:
        """Register the seq's full blocks whose K/V are computed (call after each step that wrote them)."""
        if not self.enable_prefix_caching:
            return
        n = min(seq.num_computed_tokens // self.block_size, len(seq.block_table))
        hashes = self._hashes(seq, n)
        for i in range(seq.num_committed_blocks, n):
            h, block = hashes[i], self.blocks[seq.block_table[i]]
            if block.hash is not None or h in self.hash_to_block:
                continue  # already registered (possibly an identical block computed by another sequence)
            block.hash = h
            block.token_ids = tuple(seq.token_ids[i * self.block_size:(i + 1) * self.block_size])
            self.hash_to_block[h] = block.block_id
        seq.num_committed_blocks = max(seq.num_committed_blocks, n)

    # ---- allocation -----------------------------------------------------------------------------------------
    def can_allocate(self, seq: Sequence, cached: list[int], num_new_tokens: int) -> str | None:
        """None if seq (waiting, no blocks) can take `cached` plus blocks for num_new_tokens more; else why not."""
        new = self.blocks_needed(len(cached) * self.block_size + num_new_tokens) - len(cached)
        revived = sum(1 for b in cached if self.blocks[b].ref_count == 0)
        if new + revived > self.num_free_blocks:
            return NO_FREE_BLOCKS
        if self.max_blocks_per_tenant is not None:
            refs = self._tenant_refs.get(seq.tenant) or {}
            extra = new + sum(1 for b in cached if b not in refs)
            if self.tenant_usage(seq.tenant) + extra > self.max_blocks_per_tenant:
                return TENANT_LIMIT
        return None

    def allocate(self, seq: Sequence, cached: list[int], num_new_tokens: int) -> None:
        assert not seq.block_table and self.can_allocate(seq, cached, num_new_tokens) is None
        for depth, bid in enumerate(cached):
            self._acquire(self.blocks[bid], seq, depth)
        seq.block_table = list(cached)
        seq.num_computed_tokens = len(cached) * self.block_size
        self.prefix_cache_queries += len(seq.token_ids)
        self.prefix_cache_hits += seq.num_computed_tokens
        self._grow(seq, seq.num_computed_tokens + num_new_tokens)

    def can_append(self, seq: Sequence, num_new_tokens: int) -> str | None:
        new = self.blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        if new <= 0:
            return None
        if new > self.num_free_blocks:
            return NO_FREE_BLOCKS
        if self.max_blocks_per_tenant is not None and \
                self.tenant_usage(seq.tenant) + new > self.max_blocks_per_tenant:
            return TENANT_LIMIT
        return None

    def append(self, seq: Sequence, num_new_tokens: int) -> None:
        assert self.can_append(seq, num_new_tokens) is None
        self._grow(seq, seq.num_computed_tokens + num_new_tokens)

    def free(self, seq: Sequence) -> None:
        """Drop seq's references (deepest block first); cached blocks stay reusable until evicted."""
        for bid in reversed(seq.block_table):
            self._release(self.blocks[bid], seq)
        seq.block_table = []
        seq.num_committed_blocks = 0

    # ---- internals ------------------------------------------------------------------------------------------
    def _grow(self, seq: Sequence, num_tokens: int) -> None:
        while len(seq.block_table) < self.blocks_needed(num_tokens):
            block = self._take_free_block()
            self._acquire(block, seq, len(seq.block_table))
            seq.block_table.append(block.block_id)

    def _take_free_block(self) -> Block:
        if self._free_uncached:
            return self.blocks[self._free_uncached.popleft()]
        while self._evictable:
            _, _, tag, bid = heapq.heappop(self._evictable)
            block = self.blocks[bid]
            if block.heap_tag == tag and block.ref_count == 0:
                self._num_evictable -= 1
                del self.hash_to_block[block.hash]
                block.hash = block.token_ids = None
                block.heap_tag = -1
                self.num_evictions += 1
                return block
        raise AssertionError("no free KV block (callers check can_allocate/can_append first)")

    def _acquire(self, block: Block, seq: Sequence, depth: int) -> None:
        if block.ref_count == 0:
            if block.hash is not None:  # revived from the cache
                self._num_evictable -= 1
                block.heap_tag = -1
            block.priority = seq.priority
            block.depth = depth
        else:
            block.priority = max(block.priority, seq.priority)
        block.ref_count += 1
        self._tenant_refs.setdefault(seq.tenant, Counter())[block.block_id] += 1

    def _release(self, block: Block, seq: Sequence) -> None:
        assert block.ref_count > 0, f"double free of block {block.block_id}"
        block.ref_count -= 1
        refs = self._tenant_refs[seq.tenant]
        refs[block.block_id] -= 1
        if refs[block.block_id] == 0:
            del refs[block.block_id]
            if not refs:
                del self._tenant_refs[seq.tenant]
        if block.ref_count:
            return
        block.last_access = self._clock() - self._t0
        if block.hash is None:
            self._free_uncached.append(block.block_id)
            return
        tag = next(self._tags)
        block.heap_tag = tag
        self._num_evictable += 1
        score = block.last_access * (1.0 + 0.2 * block.priority)
        heapq.heappush(self._evictable, (score, -block.depth, tag, block.block_id))
        if len(self._evictable) > 2 * len(self.blocks) + 64:  # drop stale entries of revived blocks
            self._evictable = [e for e in self._evictable
                               if self.blocks[e[3]].heap_tag == e[2] and self.blocks[e[3]].ref_count == 0]
            heapq.heapify(self._evictable)
