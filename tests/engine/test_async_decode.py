"""Decode steps launched one ahead (engine/execution/async_decode.py) must give exactly what synchronous steps give.

On CPU the graphs' static-buffer path runs eagerly (DecodeGraphs(capture=False)), so the same code runs as on a GPU:
input tokens gathered on the device from the previous step's tokens, blocks taken a step ahead, rows of sequences
that ended on a stop token dropped after the fact."""

import torch

from sits.engine import EngineConfig, LLMEngine, SamplingParams
from sits.engine.execution.cuda_graphs import DecodeGraphs


def engine(pipeline: bool, num_kv_blocks: int = 48) -> LLMEngine:
    e = LLMEngine(EngineConfig(model="tiny", device="cpu", num_kv_blocks=num_kv_blocks, max_num_seqs=8))
    r = e.model_runner
    r.decode_graphs = DecodeGraphs(r.model, r.kv_caches, max_num_seqs=8, max_blocks_per_seq=r.max_blocks,
                                   block_size=64, device=r.device, capture=False)
    e._pipeline.enabled = pipeline
    launched = e.launched_ahead = []
    inner = r.launch_decode

    def counting(seqs, ids_from=None):
        if ids_from is not None:
            launched.append(len(seqs))
        return inner(seqs, ids_from)
    r.launch_decode = counting
    return e


def prompt(n: int, seed: int) -> list[int]:
    return torch.randint(3, 250, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def drive(e: LLMEngine, requests: dict, late: dict, abort_at: tuple[int, str] | None = None) -> dict:
    """Run to completion: `requests` at once, `late` after the 3rd step, an abort at step abort_at[0]."""
    for rid, (p, params) in requests.items():
        e.add_request(rid, p, params)
    out = {rid: [[], None] for rid in {**requests, **late}}
    steps = 0
    while e.has_unfinished_requests() or steps < 4:
        for o in e.step():
            out[o.request_id][0] += o.new_token_ids
            if o.finished:
                out[o.request_id][1] = o.finish_reason
        steps += 1
        if steps == 3:
            for rid, (p, params) in late.items():
                e.add_request(rid, p, params)
        if abort_at and steps == abort_at[0]:
            e.abort_request(abort_at[1])
    assert e.block_manager.num_free_blocks == e.block_manager.num_total_blocks
    return out


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, **kw)


def test_pipelined_decode_gives_the_synchronous_tokens():
    requests = {"a": (prompt(62, 1), greedy(20)), "b": (prompt(5, 2), greedy(7)), "c": (prompt(130, 3), greedy(25)),
                "s": (prompt(40, 4), SamplingParams(max_tokens=18, temperature=0.9, top_k=20, seed=11,
                                                    ignore_eos=True))}
    late = {"d": (prompt(63, 5), greedy(12))}
    ref = drive(engine(False), requests, late)
    # a stop token that the synchronous run emits in the middle of "c" and "a": those end early, one step ahead
    requests["c"] = (requests["c"][0], greedy(25, stop_token_ids=[ref["c"][0][9]]))
    requests["a"] = (requests["a"][0], greedy(20, stop_token_ids=[ref["a"][0][14]]))
    ref = drive(engine(False), requests, late)
    assert ref["c"][1] == "stop" and len(ref["c"][0]) <= 10 and ref["b"][1] == "length"
    e = engine(True)
    got = drive(e, requests, late)
    assert got == ref
    assert len(e.launched_ahead) >= 10, e.launched_ahead  # most decode steps went one ahead


def test_abort_and_block_shortage_drain_to_the_scheduler():
    requests = {f"r{i}": (prompt(60 + i, 10 + i), greedy(30)) for i in range(5)}
    ref = drive(engine(False, num_kv_blocks=8), requests, {}, abort_at=(6, "r1"))
    e = engine(True, num_kv_blocks=8)  # 5 sequences crossing into their 2nd block with 8 blocks: preemption
    got = drive(e, requests, {}, abort_at=(6, "r1"))
    assert got == ref and got["r1"][1] == "abort"
    assert e.scheduler.num_preemptions > 0 and e.launched_ahead
