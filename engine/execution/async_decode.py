"""Decode steps launched one ahead, so the host's work of step N runs while the GPU computes step N+1.

In a steady decode phase -- every running sequence decodes through the CUDA graphs, nothing waits, nothing is
aborted -- the engine launches step N+1 before step N's tokens reach the host: N+1's input tokens are N's sampled
tokens, gathered on the GPU (DecodeGraphs.run's `ids_from`), and its blocks were taken before. Then it waits for N's
tokens and turns them into outputs (detokenize, stop checks, finishing) while the GPU runs N+1.
- A sequence whose next token ends it by length (max_tokens, the context) is left out of N+1.
- A sequence that ends on a stop token at N is already in N+1: that row computes one more token, which is dropped
  (it writes its last token's K/V into its own block; the block is freed after, and anything later that takes it
  runs after N+1 on the stream).
- Only for requests decided by tokens alone: no stop strings (they need the text first), no logprobs. Anything
  else -- a new request, an abort, a step that needs the scheduler (no free block: preemption), such a request --
  drains: N is collected, and the engine takes a normal synchronous step.
"""
from __future__ import annotations

from sits.engine.execution.cuda_graphs import padded_batch_size
from sits.engine.outputs import RequestOutput
from sits.engine.scheduling.scheduler import ScheduledBatch
from sits.engine.scheduling.sequence import Sequence


def token_decided(seq: Sequence) -> bool:
    return not seq.params.stop and seq.params.logprobs is None


class DecodePipeline:
    def __init__(self, engine):
        self.engine = engine
        self.enabled = True
        self.inflight = None  # model_runner.InflightDecode

    def can_start(self, batch: ScheduledBatch) -> bool:
        runner = self.engine.model_runner
        graphs = runner.decode_graphs
        return (self.enabled and graphs is not None and not runner.capture_logits and not batch.preempted
                and all(n == 1 for n in batch.num_new_tokens) and graphs.usable(batch.seqs)
                and all(token_decided(s) for s in batch.seqs))

    def start(self, batch: ScheduledBatch) -> None:
        eng = self.engine
        self.inflight = eng.model_runner.launch_decode(batch.seqs)
        eng.num_computed_tokens_total += batch.num_tokens
        eng.scheduler.update_computed(batch)

    def advance(self) -> list[RequestOutput]:
        """Launch the next step behind the one in flight, then collect that one; drains when it cannot."""
        eng = self.engine
        cur = self.inflight
        nxt = self._next_seqs(cur.seqs)
        if nxt is None:
            return self.drain()
        row = {id(s): i for i, s in enumerate(cur.seqs)}
        try:
            new = eng.model_runner.launch_decode(nxt, ids_from=(cur.tokens, [row[id(s)] for s in nxt]))
        except Exception as e:
            self.inflight = None
            eng._abort_step([s for s in cur.seqs if not s.is_finished], e)
        outputs = self._collect(cur)
        live = [s for s in nxt if not s.is_finished]
        self.inflight = new if live else None  # rows all ended: nothing to collect (their work is harmless)
        batch = ScheduledBatch(live, [1] * len(live))
        eng.num_computed_tokens_total += batch.num_tokens
        eng.scheduler.update_computed(batch)
        return outputs

    def drain(self) -> list[RequestOutput]:
        cur, self.inflight = self.inflight, None
        return self._collect(cur) if cur is not None else []

    def _collect(self, cur) -> list[RequestOutput]:
        eng = self.engine
        tokens = eng.model_runner.collect(cur)
        return [eng._append_token(s, t, None) for s, t in zip(cur.seqs, tokens) if not s.is_finished]

    def _next_seqs(self, seqs: list[Sequence]) -> list[Sequence] | None:
        """The sequences of the step after `seqs` (whose tokens are still on the GPU), their blocks taken; None
        when the next step needs the scheduler."""
        eng = self.engine
        sched, bm = eng.scheduler, eng.block_manager
        live = [s for s in seqs if not s.is_finished]
        if not live or sched.waiting or len(sched.running) != len(live):
            return None
        # after the pending token a sequence has num_output_tokens + 1 outputs and len + 1 tokens
        nxt = [s for s in live if s.num_output_tokens + 1 < s.params.max_tokens and len(s) + 1 < eng.max_model_len]
        graphs = eng.model_runner.decode_graphs
        if not nxt or graphs.failed is not None or padded_batch_size(len(nxt), graphs.sizes) is None:
            return None
        for s in nxt:  # one at a time: each append changes what is free (a partial take is kept: needed anyway)
            if bm.can_append(s, 1) is not None:
                return None
            bm.append(s, 1)
        if any(len(s.block_table) > graphs.table_rows.shape[1] for s in nxt):
            return None
        return nxt
