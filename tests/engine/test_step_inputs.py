"""engine/execution/step_inputs.py: an eager step's inputs packed into two staging buffers equal, field by field, what
plain per-field lists give; every segment 64-byte aligned (Triton's pointer specialization); padding and warm-up
rows."""
import random

import pytest
import torch

from sits.engine.sampling_params import SamplingParams
from sits.engine.scheduling.sequence import Sequence
from sits.engine.execution.step_inputs import build_step_inputs

BS, W = 4, 6   # block size, block-table width


def _seq(rng, n_tokens, computed):
    s = Sequence(f"r{rng.random()}", [rng.randrange(1000) for _ in range(n_tokens)], SamplingParams(max_tokens=4))
    s.num_computed_tokens = computed
    s.block_table = rng.sample(range(100), -(-(n_tokens) // BS))
    return s


def _reference(prefill, decode, pad, write_kv):
    """The same fields built the obvious way, as lists."""
    ids, pos, slots, rows, seqs = [], [], [], [], []
    for s, n in prefill + [(s, 1) for s in decode]:
        a = s.num_computed_tokens
        ids += s.token_ids[a:a + n]
        pos += range(a, a + n)
        slots += [s.block_table[p // BS] * BS + p % BS if write_kv else -1 for p in range(a, a + n)]
        if a + n == len(s.token_ids):
            rows.append(len(ids) - 1)
            seqs.append(s)
    ids, pos, slots = ids + [0] * pad, pos + [0] * pad, slots + [-1] * pad
    table = lambda ss, extra=0: [bt + [0] * (W - len(bt)) for bt in (s.block_table for s in ss)] + [[0] * W] * extra
    cu = [0]
    for _, n in prefill:
        cu.append(cu[-1] + n)
    return dict(ids=ids, pos=pos, slots=slots, rows=rows, seqs=seqs, cu=cu,
                pctx=[s.num_computed_tokens + n for s, n in prefill], ptab=table([s for s, _ in prefill]),
                dctx=[s.num_computed_tokens + 1 for s in decode] + [1] * pad, dtab=table(decode, pad))


@pytest.mark.parametrize("n_prefill,n_decode,pad,write_kv", [(2, 3, 1, True), (0, 5, 3, True), (3, 0, 0, True),
                                                             (1, 2, 2, False), (0, 1, 0, True)])
def test_packed_inputs_equal_the_plain_lists(n_prefill, n_decode, pad, write_kv):
    rng = random.Random(n_prefill * 10 + n_decode)
    prefill = []
    for _ in range(n_prefill):
        total = rng.randrange(5, W * BS)
        done = rng.randrange(0, total - 2)
        n = rng.choice([total - done, rng.randrange(2, total - done + 1)])   # a last chunk, or a middle one
        prefill.append((_seq(rng, total, done), n))
    decode = []
    for _ in range(n_decode):
        total = rng.randrange(2, W * BS)
        decode.append(_seq(rng, total, total - 1))
    x = build_step_inputs(prefill, decode, pad, block_size=BS, max_blocks=W, device=torch.device("cpu"),
                          write_kv=write_kv)
    ref = _reference(prefill, decode, pad, write_kv)
    m = x.meta
    assert x.input_ids.tolist() == ref["ids"] and x.positions.tolist() == ref["pos"]
    assert m.slot_mapping.tolist() == ref["slots"] and m.slot_mapping.dtype == torch.int64
    assert x.sample_rows.tolist() == ref["rows"] and x.sample_seqs == ref["seqs"]
    assert m.num_prefill_tokens == sum(n for _, n in prefill)
    if prefill:
        assert m.cu_seqlens_q.tolist() == ref["cu"] and m.prefill_context_lens.tolist() == ref["pctx"]
        assert m.prefill_block_tables.tolist() == ref["ptab"] and m.prefill_block_tables.dtype == torch.int32
    else:
        assert m.cu_seqlens_q is None and m.prefill_block_tables is None and m.prefill_context_lens is None
    if decode:
        assert m.decode_context_lens.tolist() == ref["dctx"] and m.decode_block_tables.tolist() == ref["dtab"]
        assert m.decode_block_tables.shape == (n_decode + pad, W)
    else:
        assert m.decode_context_lens is None and m.decode_block_tables is None
    for t in (x.input_ids, x.positions, x.sample_rows, m.slot_mapping, m.cu_seqlens_q, m.prefill_context_lens,
              m.prefill_block_tables, m.decode_context_lens, m.decode_block_tables):
        if t is not None:
            assert t.is_contiguous() and t.data_ptr() % 64 == 0, t


def test_each_step_gets_its_own_buffers():
    # the staging buffers are new every step: a step's tensors never change under it when the next one is built
    rng = random.Random(7)
    a = _seq(rng, 9, 8)
    first = build_step_inputs([], [a], 0, block_size=BS, max_blocks=W, device=torch.device("cpu"))
    before = first.input_ids.tolist(), first.meta.decode_block_tables.tolist()
    b = _seq(rng, 13, 12)
    build_step_inputs([], [b], 1, block_size=BS, max_blocks=W, device=torch.device("cpu"))
    assert (first.input_ids.tolist(), first.meta.decode_block_tables.tolist()) == before
