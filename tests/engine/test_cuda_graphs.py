"""Decode steps through static buffers and CUDA graphs (engine/execution/cuda_graphs.py).

On CPU the padded, static-buffer path runs eagerly (DecodeGraphs(capture=False)) and must give what the normal
eager path gives; on a GPU the captured graphs must too."""

import logging
from types import SimpleNamespace

import pytest
import torch

from sits import kernels
from sits.engine import EngineConfig, LLMEngine, SamplingParams
from sits.engine.execution.cuda_graphs import GRAPH_BATCH_SIZES, DecodeGraphs, graph_batch_sizes, padded_batch_size
from sits.engine.errors import InvalidRequestError

# prompt lengths around the 64-token block edges; each its own number of new tokens, so the batch shrinks
PROMPTS = {f"p{n}": (n, steps) for n, steps in ((1, 9), (63, 5), (64, 12), (65, 3), (130, 7))}


def test_batch_sizes_cover_every_batch_up_to_the_limit():
    assert graph_batch_sizes(256) == GRAPH_BATCH_SIZES
    assert graph_batch_sizes(5) == (1, 2, 4, 5)
    assert graph_batch_sizes(1) == (1,)
    assert graph_batch_sizes(1000)[-1] == 256
    sizes = graph_batch_sizes(40)
    assert [padded_batch_size(n, sizes) for n in (1, 3, 5, 9, 17, 33, 40)] == [1, 4, 8, 16, 24, 40, 40]
    assert padded_batch_size(41, sizes) is None


def run(engine, graphs: DecodeGraphs | None = None) -> tuple[dict, dict]:
    """Greedy tokens and per-step logits of PROMPTS; with `graphs`, decode steps go through it (counted by size)."""
    runner = engine.model_runner
    used: dict[int, int] = {}
    if graphs is not None:
        runner.decode_graphs = graphs
        inner = graphs.replay   # the model runner plans a step, then replays it (DecodeGraphs.run is both)

        def counting_replay(step, ids=None):
            used[step.b] = used.get(step.b, 0) + 1
            return inner(step, ids)
        graphs.replay = counting_replay
    runner.capture_logits = True
    g = torch.Generator().manual_seed(1)
    for rid, (n, steps) in PROMPTS.items():
        engine.add_request(rid, torch.randint(0, 256, (n,), generator=g).tolist(),
                           SamplingParams(max_tokens=steps, temperature=0.0, ignore_eos=True))
    out: dict = {rid: ([], []) for rid in PROMPTS}
    while engine.has_unfinished_requests():
        for o in engine.step():
            out[o.request_id][0].extend(o.new_token_ids)
        for row, rid in enumerate(runner.last_logits_seqs):
            out[rid][1].append(runner.last_logits[row].float().cpu())
        runner.last_logits_seqs = []
    return out, used


def assert_same(ref: dict, got: dict, atol: float) -> None:
    for rid in PROMPTS:
        assert got[rid][0] == ref[rid][0], rid
        assert len(got[rid][1]) == len(ref[rid][1]) == PROMPTS[rid][1]
        for step, (a, b) in enumerate(zip(ref[rid][1], got[rid][1])):
            assert (a - b).abs().max() < atol, (rid, step, float((a - b).abs().max()))


def tiny(**kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model="tiny", num_kv_blocks=32, max_num_seqs=8, **kw))


def test_padded_static_buffer_decode_matches_the_eager_path_on_cpu():
    ref, _ = run(tiny(device="cpu"))
    engine = tiny(device="cpu")
    runner = engine.model_runner
    assert runner.decode_graphs is None  # no graphs on CPU
    graphs = DecodeGraphs(runner.model, runner.kv_caches, max_num_seqs=8, max_blocks_per_seq=engine.max_model_len // 64,
                          block_size=64, device=runner.device, capture=False)
    got, used = run(engine, graphs)
    assert_same(ref, got, atol=1e-4)
    # 5 sequences pad to 8, then 4, 2 (after p65 and p63 finish) ...; every decode step went through the buffers
    assert used[8] >= 2 and used[4] >= 1 and used[1] >= 1, used
    assert sum(used.values()) == max(steps for _, steps in PROMPTS.values()) - 1


def test_mid_prompt_chunks_and_overlong_tables_stay_eager():
    graphs = DecodeGraphs(None, [], max_num_seqs=4, max_blocks_per_seq=2, block_size=64, device=torch.device("cpu"),
                          capture=False)
    last = SimpleNamespace(num_computed_tokens=9, token_ids=[1] * 10, block_table=[0])
    assert graphs.usable([last])
    assert not graphs.usable([last, SimpleNamespace(num_computed_tokens=3, token_ids=[1] * 10, block_table=[0])])
    assert not graphs.usable([SimpleNamespace(num_computed_tokens=200, token_ids=[1] * 201, block_table=[0, 1, 2])])
    assert not graphs.usable([last] * 5)  # more sequences than the largest size
    graphs.failed = "capture failed"
    assert not graphs.usable([last])


def test_enforce_eager_is_validated_and_sets_declare_graph_safety():
    with pytest.raises(InvalidRequestError, match="enforce_eager"):
        EngineConfig(enforce_eager="yes")
    assert not kernels.get_kernel_set("torch").graph_safe
    assert kernels.get_kernel_set("triton-v1").graph_safe and kernels.get_kernel_set("triton-v1.1").graph_safe
    base = kernels.get_kernel_set("triton-v1.1")
    assert base.derive("x", "1.0.0").graph_safe
    assert not base.derive("x", "1.0.0", graph_safe=False).graph_safe


# ---- on a GPU: captured graphs ----

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("quantization", [None, "int8"])
def test_captured_graphs_match_eager_decode(quantization):
    kw = dict(device="cuda", dtype="float32", kernels="triton-v1.1", quantization=quantization)
    ref, _ = run(tiny(enforce_eager=True, **kw))
    assert tiny(enforce_eager=True, **kw).model_runner.decode_graphs is None
    engine = tiny(**kw)
    graphs = engine.model_runner.decode_graphs
    assert graphs is not None and graphs.capture
    got, used = run(engine, graphs)
    assert graphs.failed is None
    assert set(graphs.graphs) == set(used) and {8, 4, 1} <= set(used), used
    assert_same(ref, got, atol=2e-3)
    # replaying again (graphs already captured) gives the same again
    again, _ = run(engine)
    assert_same(ref, again, atol=2e-3)


def test_warmup_captures_nothing_without_graphs():
    engine = tiny(device="cpu")
    engine.warmup()
    assert engine.model_runner.capture_decode_graphs() == 0


@gpu
@pytest.mark.gpu
def test_warmup_captures_every_size_and_decode_reuses_them(caplog):
    engine = tiny(device="cuda", dtype="float32", kernels="triton-v1.1")
    with caplog.at_level("INFO", logger="sits.engine"):
        engine.warmup()
    graphs = engine.model_runner.decode_graphs
    assert sorted(graphs.graphs) == [1, 2, 4, 8] and "captured 4 decode CUDA graphs" in caplog.text
    captured = dict(graphs.graphs)
    ref, _ = run(tiny(device="cuda", dtype="float32", kernels="triton-v1.1", enforce_eager=True))
    got, used = run(engine)
    assert_same(ref, got, atol=2e-3)
    assert all(graphs.graphs[b] is captured[b] for b in captured)  # replayed, never captured again


@gpu
@pytest.mark.gpu
def test_torch_set_is_never_captured():
    assert tiny(device="cuda", kernels="torch").model_runner.decode_graphs is None


@gpu
@pytest.mark.gpu
def test_a_set_that_cannot_be_captured_falls_back_to_eager(caplog):
    base = kernels.get_kernel_set("triton-v1.1")

    def syncing_silu_and_mul(x):  # reads a value back to the host: not capturable
        if float(x.abs().max()) < 0:
            raise AssertionError
        return base.silu_and_mul(x)
    bad = base.derive("graph-unsafe-test", "1.0.0", silu_and_mul=syncing_silu_and_mul)
    assert bad.graph_safe  # inherited: the wrong declaration this test is about
    kernels.register_kernel_set(bad, replace=True)
    try:
        ref, _ = run(tiny(device="cuda", dtype="float32", kernels="triton-v1.1", enforce_eager=True))
        engine = tiny(device="cuda", dtype="float32", kernels="graph-unsafe-test")
        with caplog.at_level("WARNING", logger="sits.engine"):
            got, _ = run(engine)
        assert engine.model_runner.decode_graphs.failed
        assert "decode runs eagerly" in caplog.text
        assert_same(ref, got, atol=2e-3)
    finally:
        kernels.unregister_kernel_set("graph-unsafe-test")


def test_persistent_tables_follow_appends_departures_and_replaced_tables():
    """The static path keeps one table row per sequence and sends only changed entries: the tables the model sees
    must equal every sequence's block table, padded with zeros, whatever happened to the rows before."""
    seen = []

    class Model:
        def forward(self, ids, pos, kv, meta):
            seen.append((meta.decode_block_tables.clone(), meta.decode_context_lens.clone()))
            return torch.zeros(ids.shape[0], 2)

    g = DecodeGraphs(Model(), None, max_num_seqs=4, max_blocks_per_seq=5, block_size=4, device=torch.device("cpu"),
                     capture=False)

    def seq(sid, table, n_tokens):
        return SimpleNamespace(seq_id=sid, block_table=table, token_ids=[1] * n_tokens, num_computed_tokens=n_tokens - 1)

    def step(*seqs):
        g.run(list(seqs))
        tables, lens = seen[-1]
        for i, s in enumerate(seqs):
            assert tables[i].tolist() == s.block_table + [0] * (5 - len(s.block_table)), (i, tables[i])
            assert lens[i] == s.num_computed_tokens + 1
        assert (tables[len(seqs):] == 0).all()

    a, b = seq(0, [7, 8], 6), seq(1, [3, 4, 5], 10)
    step(a, b)
    a.block_table.append(9)  # grows in place
    a.token_ids += [1] * 3
    a.num_computed_tokens += 3
    step(a, b)
    c = seq(2, [11], 2)  # b leaves; c takes its row, whose old entries must not show
    step(a, c)
    a.block_table = [1]  # preempted and readmitted: a new, shorter table
    a.token_ids, a.num_computed_tokens = [1] * 3, 2
    step(c, a)
    step(seq(3, [2, 2, 2, 2, 2], 20), c, a, b)


def test_kernels_are_tuned_at_real_lengths_on_blocks_of_their_own():
    """The eager forward before a capture compiles and autotunes the step's kernels: each row must be a context as long
    as the cache holds for the batch (at most the table width), on blocks no other row reads (one-token dummies tuned
    decode attention to a config 1.4-2x slower at real lengths), writing nothing; the live rows come back after."""
    seen = []

    class Model:
        def forward(self, ids, pos, kv, meta):
            seen.append((meta.decode_block_tables.clone(), meta.decode_context_lens.clone(), meta.slot_mapping.clone()))
            return torch.zeros(ids.shape[0], 2)

    g = DecodeGraphs(Model(), None, max_num_seqs=4, max_blocks_per_seq=5, block_size=4, device=torch.device("cpu"),
                     capture=False, num_blocks=14)
    assert g.tuning_inputs(2) == 5 * 4   # 14 blocks hold 7 per row; the tables take 5
    g._forward(2)
    tables, lens, slots = seen[-1]
    assert tables.tolist() == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]] and lens.tolist() == [20, 20]
    assert (slots == -1).all()
    assert g.tuning_inputs(4) == 3 * 4   # 14 // 4 = 3 blocks each
    g._forward(4)
    tables, lens, _ = seen[-1]
    assert len({blk for row in tables[:, :3].tolist() for blk in row}) == 12 and (tables[:, 3:] == 0).all()
    assert lens.tolist() == [12] * 4
    assert DecodeGraphs(Model(), None, max_num_seqs=4, max_blocks_per_seq=5, block_size=4, device=torch.device("cpu"),
                        capture=False).tuning_inputs(4) == 1   # no block count: one-token dummies, as before


@gpu
@pytest.mark.gpu
def test_a_capture_while_serving_leaves_the_live_rows_as_they_were():
    g = DecodeGraphs(_CaptureModel(), None, max_num_seqs=4, max_blocks_per_seq=5, block_size=4,
                     device=torch.device("cuda"), num_blocks=40)
    g.table_rows[:2, :2] = torch.tensor([[3, 4], [5, 6]], dtype=torch.int32, device="cuda")
    rows = g.table_rows.clone()
    g._capture(2)
    assert torch.equal(g.table_rows, rows) and 2 in g.graphs


class _CaptureModel:
    def forward(self, ids, pos, kv, meta):
        return (meta.decode_block_tables.float().sum(1, keepdim=True) + meta.decode_context_lens[:, None]).expand(-1, 2)


class _ReplayInto:
    """A stand-in for a captured graph on CPU (no CUDA graphs there): replay() writes `compute()` into the output."""

    def __init__(self, out, compute):
        self.out, self.compute = out, compute

    def replay(self):
        self.out.copy_(self.compute())


def test_a_graph_that_disagrees_with_the_eager_forward_turns_graphs_off(caplog):
    """After the warm-up's captures every graph is replayed on its tuning inputs and compared with the eager forward
    of the same static buffers (a graph that had recorded a freed buffer answered wrong; BENCHMARKS.md "Fused decode
    layers"): a graph within rounding passes, a wrong one turns graphs off (decode runs eagerly) with the reason
    logged, and the live rows and inputs come back as they were either way."""
    class Model:
        def forward(self, ids, pos, kv, meta):
            return (meta.decode_block_tables.float().sum(1, keepdim=True) + meta.decode_context_lens[:, None]).expand(
                -1, 3).clone()

    def graphs_with(fault):
        g = DecodeGraphs(Model(), None, max_num_seqs=4, max_blocks_per_seq=5, block_size=4,
                         device=torch.device("cpu"), capture=False, num_blocks=14)
        g.capture = True   # as after capture_all on a GPU: graphs of sizes 1 and 4
        for b in (1, 4):
            out = torch.zeros(b, 3)
            g.graphs[b] = (_ReplayInto(out, (lambda b=b: fault(g._forward(b)) if b == 4 else g._forward(b))), out)
        g.table_rows[:2, :2] = torch.tensor([[3, 4], [5, 6]], dtype=torch.int32)
        g.stage[:20] = torch.arange(20)
        return g

    g = graphs_with(lambda y: y * 1.01)   # rounding-size differences: fine
    rows, stage = g.table_rows.clone(), g.stage.clone()
    assert g.verify() is None and g.failed is None
    assert torch.equal(g.table_rows, rows) and torch.equal(g.stage, stage)
    seqs = [SimpleNamespace(seq_id=0, block_table=[1], token_ids=[1, 2], num_computed_tokens=1)]
    assert g.usable(seqs)
    for fault in (lambda y: y * 0 + 7.0, lambda y: y.masked_fill(y > 0, float("nan"))):
        g = graphs_with(fault)
        rows = g.table_rows.clone()
        with caplog.at_level(logging.ERROR, logger="sits.engine"):
            why = g.verify()
        assert why and "batch size 4 disagrees" in why and g.failed == why and not g.usable(seqs)
        assert torch.equal(g.table_rows, rows)
        assert "decode runs eagerly from now on" in caplog.text


@gpu
@pytest.mark.gpu
def test_captured_graphs_verify_against_the_eager_forward_after_warmup():
    engine = LLMEngine(EngineConfig(model="tiny", kernels="triton-v1.5", quantization="int8", num_kv_blocks=64,
                                    max_num_seqs=32))
    engine.warmup()
    graphs = engine.model_runner.decode_graphs
    assert graphs.failed is None and len(graphs.graphs) == len(graphs.sizes)
    assert graphs.verify() is None   # again, on what the warm-up's request left in the cache
