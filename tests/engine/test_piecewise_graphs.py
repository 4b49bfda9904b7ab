"""Steps with prefill tokens replayed piecewise (engine/execution/piecewise_graphs.py).

On CPU the pieces run eagerly through the same static buffers (PiecewiseGraphs(capture=False)) and must give what
the model's own forward gives: mixed prefill + decode steps, chunked prompts, padding to a size, steps too large for
any size. On a GPU the captured pieces must too, and compile nothing after warm-up."""

import pytest
import torch

from sits.engine import EngineConfig, LLMEngine, SamplingParams
from sits.engine.errors import InvalidRequestError
from sits.engine.execution.piecewise_graphs import SIZES, PiecewiseGraphs, piecewise_sizes
from sits.engine.server.main import ServerConfig, build_parser

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# arrivals among decoding streams: each prompt joins while the earlier ones decode; 130 is chunked at a 64 budget
ARRIVALS = ((5, 12), (63, 9), (130, 6), (1, 8), (64, 4), (17, 10))


def test_sizes_stop_at_the_step_budget_and_512():
    assert piecewise_sizes(2048) == SIZES and SIZES[-1] == 512
    assert piecewise_sizes(512) == SIZES
    assert piecewise_sizes(100) == (16, 32, 64, 96, 100)
    assert piecewise_sizes(16) == (16,)
    pw = PiecewiseGraphs(None, [], max_tokens=100, device=torch.device("cpu"), capture=False)
    assert [pw.size_for(n) for n in (1, 16, 17, 97, 100, 101)] == [16, 16, 32, 100, 100, None]


def run(engine, pw: PiecewiseGraphs | None = None) -> tuple[dict, dict]:
    """Greedy tokens and per-step logits of ARRIVALS (one new prompt every second step); with `pw`, the eager steps
    that fit one of its sizes go through it (counted by size)."""
    runner = engine.model_runner
    used: dict[int, int] = {}
    if pw is not None:
        runner.piecewise = pw
        inner = pw.forward

        def counting(ids, positions, meta):
            size = pw.size_for(ids.shape[0])
            used[size] = used.get(size, 0) + 1
            return inner(ids, positions, meta)
        pw.forward = counting
    runner.capture_logits = True
    g = torch.Generator().manual_seed(5)
    out: dict = {f"r{i}": ([], []) for i in range(len(ARRIVALS))}
    pending = list(enumerate(ARRIVALS))
    while pending or engine.has_unfinished_requests():
        if pending:
            i, (n, steps) = pending.pop(0)
            engine.add_request(f"r{i}", torch.randint(3, 250, (n,), generator=g).tolist(),
                               SamplingParams(max_tokens=steps, temperature=0.0, ignore_eos=True))
        for _ in range(2):
            for o in engine.step():
                out[o.request_id][0].extend(o.new_token_ids)
            for row, rid in enumerate(runner.last_logits_seqs):
                out[rid][1].append(runner.last_logits[row].float().cpu())
            runner.last_logits_seqs = []
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_total_blocks
    return out, used


def assert_same(ref: dict, got: dict, atol: float) -> None:
    for rid, (tokens, logits) in ref.items():
        assert got[rid][0] == tokens and len(tokens) == ARRIVALS[int(rid[1:])][1], rid
        assert len(got[rid][1]) == len(logits)
        for step, (a, b) in enumerate(zip(logits, got[rid][1])):
            assert (a - b).abs().max() < atol, (rid, step, float((a - b).abs().max()))


def tiny(**kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model="tiny", num_kv_blocks=32, max_num_seqs=8, max_num_batched_tokens=64, **kw))


def test_pieces_through_static_buffers_match_the_forward_on_cpu():
    ref, _ = run(tiny(device="cpu"))
    engine = tiny(device="cpu", piecewise_graphs=True)
    runner = engine.model_runner
    assert runner.piecewise is None   # captured graphs only on CUDA with a graph-safe set
    pw = PiecewiseGraphs(runner.model, runner.kv_caches, max_tokens=32, device=runner.device, capture=False)
    got, used = run(engine, pw)
    assert_same(ref, got, atol=1e-4)
    # decode-only steps (eager on CPU) and mixed ones of up to 32 rows took the pieces, padded to 16 or 32; the
    # 63-, 130- and 64-token prompts' steps did not fit and ran the model's forward
    assert set(used) == {16, 32} and used[16] >= 10 and used[32] >= 1, used


def test_the_flag_is_validated_on_by_default_and_turned_off_from_the_server():
    assert EngineConfig(model="tiny").piecewise_graphs is True
    with pytest.raises(InvalidRequestError, match="piecewise_graphs must be a boolean"):
        EngineConfig(model="tiny", piecewise_graphs="yes")
    parse = build_parser().parse_args
    assert ServerConfig(**vars(parse(["--model", "tiny"]))).engine_config().piecewise_graphs is True
    assert ServerConfig(**vars(parse(["--model", "tiny", "--no-piecewise-graphs"]))).engine_config() \
        .piecewise_graphs is False
    # without decode graphs (CPU) there are no pieces to replay: steps with prefill run the model's forward
    assert tiny(device="cpu").model_runner.piecewise is None


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("quantization", [None, "int8"])
def test_captured_pieces_match_the_eager_steps(quantization):
    kw = dict(device="cuda", dtype="float32", kernels="triton-v1.1", quantization=quantization)
    ref, _ = run(tiny(**kw))
    engine = tiny(piecewise_graphs=True, **kw)
    pw = engine.model_runner.piecewise
    assert pw is not None and pw.capture
    got, used = run(engine, pw)
    assert pw.failed is None and used, used
    assert_same(ref, got, atol=2e-3)
    again, _ = run(engine)   # replayed again, every size already captured
    assert_same(ref, again, atol=2e-3)


@gpu
@pytest.mark.gpu
def test_warmup_captures_every_size():
    engine = tiny(device="cuda", kernels="triton-v1.1", piecewise_graphs=True)
    engine.warmup()
    pw = engine.model_runner.piecewise
    assert pw.failed is None and set(pw._pieces) == set(pw.sizes) == {16, 32, 64}
    assert all(len(p.graphs) == len(engine.model_runner.model.layers) + 1 for p in pw._pieces.values())


class _Piece:
    """A stand-in for one captured piece on CPU (no CUDA graphs there): replay() runs the piece eagerly, then `fault`
    on the buffers it wrote."""

    def __init__(self, pw, p, i, fault=None):
        self.pw, self.p, self.i, self.fault = pw, p, i, fault

    def replay(self):
        self.pw._piece(self.p, self.i)
        if self.fault is not None:
            self.fault(self.p)


def test_a_piece_that_disagrees_with_the_eager_piece_turns_piecewise_graphs_off(caplog):
    """After the warm-up's captures each piece is replayed on seeded inputs and compared with the same piece run
    eagerly on the same buffers (a decode graph that had recorded a freed buffer answered wrong; BENCHMARKS.md "Fused
    decode layers"): pieces within rounding pass, a wrong or non-finite one turns piecewise graphs off (steps with
    prefill run the model's forward) with the reason logged."""
    import logging

    runner = tiny(device="cpu").model_runner
    n = len(runner.model.layers) + 1

    def graphs_with(fault_at=None, fault=None):
        pw = PiecewiseGraphs(runner.model, runner.kv_caches, max_tokens=32, device=runner.device, capture=False)
        for size in pw.sizes:
            pw._prepare(size)
            p = pw._pieces[size]
            p.graphs = [_Piece(pw, p, i, fault if (size, i) == fault_at else None) for i in range(n)]
        pw.capture = True   # as after capture_all on a GPU
        return pw

    def rounding(p):
        p.qkv.mul_(1.01)
        p.res.mul_(1.01)

    pw = graphs_with((32, 1), rounding)
    assert pw.verify() is None and pw.failed is None and pw.size_for(20) == 32
    for where, fault, what in (((32, 1), lambda p: p.res.zero_(), "res"),
                               ((16, n - 1), lambda p: p.out.fill_(float("nan")), "out"),
                               ((16, 0), lambda p: p.qkv.add_(3.0), "qkv")):
        pw = graphs_with(where, fault)
        with caplog.at_level(logging.ERROR, logger="sits.engine"):
            why = pw.verify()
        assert why and f"piece {where[1]} of the {where[0]}-token piecewise graphs disagrees" in why, why
        assert f"({what}:" in why and pw.failed == why and pw.size_for(20) is None
        assert "steps with prefill run eagerly from now on" in caplog.text


@gpu
@pytest.mark.gpu
def test_captured_pieces_verify_against_the_eager_pieces_after_warmup():
    engine = tiny(device="cuda", kernels="triton-v1.5", quantization="int8", piecewise_graphs=True)
    engine.warmup()
    pw = engine.model_runner.piecewise
    assert pw.failed is None and set(pw._pieces) == set(pw.sizes)
    assert pw.verify() is None   # again, after the warm-up
