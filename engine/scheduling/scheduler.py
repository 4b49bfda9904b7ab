"""Continuous batching scheduler (torch-free).

Each step gets a token budget (max_num_batched_tokens). Running sequences go first, in priority-then-arrival order:
decoding sequences (1 token each) before sequences still in (chunked) prefill, which take as many tokens as the
budget and their KV blocks allow. When a running sequence needs a block and none is free, the lowest-priority,
latest-arrived running sequence not yet scheduled this step is preempted (recompute: its blocks are freed, it returns
to the waiting queue and later recomputes its prompt + outputs, mostly from the prefix cache); at a tenant's block
limit the victim comes from the same tenant.
Then waiting sequences are admitted in priority-then-FCFS order while budget, sequence slots and blocks last (a
waiting sequence may preempt running ones of strictly lower priority to get blocks); one whose tenant is at its
block limit is skipped, so a busy tenant never blocks another.

`max_prefill_tokens_while_decoding` (None: no cap) bounds the prefill tokens (running chunks and admissions together)
of a step that also carries decodes, as Sarathi-Serve's stall-free batching does: a step's time grows with its
tokens, and every decoding stream waits for the whole step, so a 2048-token chunk riding along turns one inter-token
gap into a prefill's length. A step without decodes still takes the whole budget.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from sits.engine.scheduling.block_manager import NO_FREE_BLOCKS, TENANT_LIMIT, BlockManager
from sits.engine.scheduling.sequence import Sequence, SequenceStatus


@dataclass(slots=True)
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)  # tokens computed this step, per seq
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def __len__(self) -> int:
        return len(self.seqs)


class Scheduler:
    def __init__(self, block_manager: BlockManager, *, max_num_seqs: int, max_num_batched_tokens: int,
                 max_prefill_tokens_while_decoding: int | None = None):
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_prefill_tokens_while_decoding = max_prefill_tokens_while_decoding
        self.waiting: list[Sequence] = []  # sorted by Sequence.sort_key
        self._waiting_keys: list[tuple[int, int]] = []
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        key = seq.sort_key()
        i = bisect.bisect(self._waiting_keys, key)
        self._waiting_keys.insert(i, key)
        self.waiting.insert(i, seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Finish (or abort) seq wherever it is and free its blocks."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self._remove_waiting(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    def schedule(self) -> ScheduledBatch:
        bm = self.block_manager
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        self.running.sort(key=Sequence.sort_key)
        scheduled: set[int] = set()
        # decodes first (one token each, so inter-token latency does not wait for long prefills), then prefill chunks
        decoding = [s for s in self.running if s.num_uncomputed_tokens == 1]
        prefilling = [s for s in self.running if s.num_uncomputed_tokens > 1]
        # prefill tokens (running chunks and admissions) this step may take; uncapped it never binds before the budget
        cap = self.max_prefill_tokens_while_decoding
        prefill_cap = budget if cap is None or not decoding else min(budget, cap)
        prefill = 0
        for seq in decoding + prefilling:
            is_prefill = seq.num_uncomputed_tokens > 1
            if budget == 0 or (is_prefill and prefill == prefill_cap):
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted as a victim earlier in this step
            n = min(seq.num_uncomputed_tokens, budget, prefill_cap - prefill if is_prefill else budget)
            while True:
                n_fit = min(n, self._fits(seq))
                if n_fit > 0:
                    bm.append(seq, n_fit)
                    batch.seqs.append(seq)
                    batch.num_new_tokens.append(n_fit)
                    scheduled.add(seq.seq_id)
                    budget -= n_fit
                    prefill += n_fit if is_prefill else 0
                    break
                same_tenant = bm.can_append(seq, n) == TENANT_LIMIT
                victim = self._pick_victim(seq, scheduled, seq.tenant if same_tenant else None)
                self._preempt(victim)
                batch.preempted.append(victim)
                if victim is seq:
                    break
        if batch.preempted:
            return batch  # memory is tight: admit nothing new this step
        for seq in list(self.waiting):
            if budget == 0 or prefill == prefill_cap or len(self.running) >= self.max_num_seqs:
                break
            cached = [] if seq.needs_prompt_logprobs else bm.match_prefix(seq)  # scoring needs every row's logits
            num_cached = len(cached) * bm.block_size
            # admit only if the whole remaining prompt fits now (avoids admitting what must be preempted at once)
            why = bm.can_allocate(seq, cached, len(seq) - num_cached)
            while why == NO_FREE_BLOCKS:  # make room by preempting strictly lower-priority running sequences
                victim = next((r for r in reversed(self.running) if r.priority < seq.priority), None)
                if victim is None:
                    break
                returned = self._unschedule(batch, victim)
                budget += returned
                if not any(victim is d for d in decoding):  # a prefill chunk's tokens go back to the allowance
                    prefill -= returned
                self._preempt(victim)
                batch.preempted.append(victim)
                why = bm.can_allocate(seq, cached, len(seq) - num_cached)
            if why == TENANT_LIMIT:
                continue  # this tenant is at its limit; others may still go
            if why == NO_FREE_BLOCKS:
                break  # FCFS within priority: later arrivals don't overtake
            if budget == 0:
                break
            n = min(len(seq) - num_cached, budget, prefill_cap - prefill)
            self._remove_waiting(seq)
            bm.allocate(seq, cached, n)
            if not seq.admitted:
                seq.admitted = True
                seq.num_cached_tokens = num_cached
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(n)
            budget -= n
            prefill += n
        return batch

    def update_computed(self, batch: ScheduledBatch) -> None:
        """After the model ran: the scheduled tokens' K/V are in the cache; register newly full blocks."""
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            seq.num_computed_tokens += n
            self.block_manager.commit(seq)

    # ---- internals ------------------------------------------------------------------------------------------
    def _fits(self, seq: Sequence) -> int:
        """How many more tokens seq can compute with its blocks plus the free blocks it may take."""
        bm = self.block_manager
        free = bm.num_free_blocks
        if bm.max_blocks_per_tenant is not None:
            free = min(free, bm.max_blocks_per_tenant - bm.tenant_usage(seq.tenant))
        return (len(seq.block_table) + max(free, 0)) * bm.block_size - seq.num_computed_tokens

    @staticmethod
    def _unschedule(batch: ScheduledBatch, seq: Sequence) -> int:
        """Take seq out of this step's batch; returns the tokens it had been given."""
        for i, s in enumerate(batch.seqs):
            if s is seq:
                del batch.seqs[i]
                return batch.num_new_tokens.pop(i)
        return 0

    def _pick_victim(self, seq: Sequence, scheduled: set[int], tenant: str | None) -> Sequence:
        """The lowest-ranked (priority, then arrival) running seq not yet scheduled this step that ranks below seq
        (of `tenant` if given); seq itself if there is none."""
        key = seq.sort_key()
        for r in reversed(self.running):
            if r is seq or r.seq_id in scheduled or (tenant is not None and r.tenant != tenant):
                continue
            return r if r.sort_key() > key else seq
        return seq

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.add(seq)

    def _remove_waiting(self, seq: Sequence) -> None:
        i = bisect.bisect_left(self._waiting_keys, seq.sort_key())
        assert self.waiting[i] is seq
        del self.waiting[i]
        del self._waiting_keys[i]
