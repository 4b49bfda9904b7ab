"""Tensor parallelism (engine/parallel/) on the CPU over gloo: TP=2 computes what TP=1 computes (greedy tokens equal,
logits within float32 rounding), eagerly and through the graphs' static buffers, every rank runs the same forward
passes, bad sizes are refused before any process starts, a worker that cannot start fails the load with its reason,
no worker outlives its engine, and the server with two ranks answers as with one. On two GPUs: NCCL, with the CUDA
graphs captured on every rank."""

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from sits.engine import EngineConfig, LLMEngine, SamplingParams, TensorParallelError
from sits.engine.errors import InvalidRequestError
from sits.engine.execution.conformance import shapes_of
from sits.engine.llm import LLM
from sits.engine.model.presets import preset
from sits.engine.parallel import launch
from sits.engine.parallel.group import check_sizes
from sits.wire.models import LOAD_FAILED
from tests.engine.server.harness import http
from tests.engine.server.processes import ServeProcess, alive
from tests.waiting import wait_for

LOGIT_ATOL = 1e-4   # fp32: the all-reduce sums the two halves of each matmul in another order than one matmul does


def prompts() -> dict[str, list[int]]:
    g = torch.Generator().manual_seed(0)
    return {f"p{n}": torch.randint(0, 256, (n,), generator=g).tolist() for n in (1, 63, 64, 65, 200)}


def tiny(tp: int, **kw) -> LLMEngine:
    # 96-token steps: prompts are chunked, and prefill chunks share steps with decodes
    return LLMEngine(EngineConfig(model="tiny", device="cpu", num_kv_blocks=32, max_num_batched_tokens=96,
                                  max_num_seqs=8, tensor_parallel_size=tp, **kw))


def greedy_run(engine: LLMEngine, steps: int = 10, logits: bool = True) -> dict:
    """{rid: ([logits per sampled step], tokens)} (no logits kept: decode steps may be launched one ahead)."""
    engine.model_runner.capture_logits = logits
    for rid, ids in prompts().items():
        engine.add_request(rid, ids, SamplingParams(max_tokens=steps, temperature=0.0, ignore_eos=True))
    out = {rid: ([], []) for rid in prompts()}
    while engine.has_unfinished_requests():
        for o in engine.step():
            out[o.request_id][1].extend(o.new_token_ids)
        for row, rid in enumerate(engine.model_runner.last_logits_seqs if logits else []):
            out[rid][0].append(engine.model_runner.last_logits[row])
        engine.model_runner.last_logits_seqs = []
    return out


@pytest.fixture(scope="module")
def reference():
    return greedy_run(tiny(1))


@pytest.fixture
def tp2():
    engines = []

    def start(**kw) -> LLMEngine:
        engines.append(tiny(2, **kw))
        return engines[-1]

    yield start
    for e in engines:
        pids = e.parallel.worker_pids()
        e.close()
        assert not any(alive(p) for p in pids), "a worker outlived close()"
    assert not dist.is_initialized()


def assert_same(reference: dict, got: dict) -> None:
    for rid, (ref_logits, ref_tokens) in reference.items():
        logits, tokens = got[rid]
        assert tokens == ref_tokens, rid
        assert len(logits) == len(ref_logits) == len(ref_tokens)
        for step, (a, b) in enumerate(zip(ref_logits, logits)):
            err = float((a - b).abs().max())
            assert err < LOGIT_ATOL, (rid, step, err)


def test_two_ranks_share_an_fp8_kv_cache_by_kv_head(tp2):
    # each rank quantizes and reads its own kv heads' FP8 pages: the same tokens and logits as one rank with FP8 pages
    one = greedy_run(tiny(1, kv_cache_dtype="fp8"))
    e = tp2(kv_cache_dtype="fp8")
    assert e.model_runner.kv_cache.dtype == torch.float8_e4m3fn
    assert e.model_runner.kv_scales.shape[4] == preset("tiny").num_key_value_heads // 2
    assert_same(one, greedy_run(e))


def test_one_rank_takes_todays_path(reference):
    e = tiny(1)
    assert e.parallel is None and e.model_runner.parallel is None
    assert all(layer.tp is None for layer in e.model_runner.model.layers)
    assert e.model_runner.kv_cache.shape[4] == preset("tiny").num_key_value_heads
    assert_same(reference, greedy_run(e))
    assert not dist.is_initialized()


def test_two_ranks_give_one_ranks_tokens_and_logits(tp2, reference):
    e = tp2()
    mc = preset("tiny")
    layer = e.model_runner.model.layers[0]
    assert (layer.hq, layer.hkv, layer.intermediate) == (mc.num_attention_heads // 2, mc.num_key_value_heads // 2,
                                                         mc.intermediate_size // 2)
    assert e.model_runner.kv_cache.shape[4] == mc.num_key_value_heads // 2   # the cache is sharded by KV head
    assert shapes_of(e.model_runner).describe().startswith("heads 2/1 x 64, hidden 256, intermediate 384")
    e.parallel.record_steps()
    e.model_runner.step_log = []
    assert_same(reference, greedy_run(e))
    # every rank ran the same forward passes: prefill chunks of <= 96 tokens, mixed steps, decodes
    ours, (theirs,) = e.model_runner.step_log, e.parallel.step_logs()
    assert theirs == ours
    assert {entry[0] for entry in ours} == {"eager"} and len(ours) >= 10
    assert any(0 < prefill < tokens for _, tokens, prefill, _ in ours)   # a step with prefill and decodes
    # the LLM front: same greedy text through generate()
    with LLM(model="tiny", device="cpu", tensor_parallel_size=1) as one:
        want = one.generate(["Hello there", "x"], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    e.close()
    with LLM(model="tiny", device="cpu", tensor_parallel_size=2) as two:
        got = two.generate(["Hello there", "x"], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
        pids = two.engine.parallel.worker_pids()
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    assert not any(alive(p) for p in pids)


def test_one_tensor_parallel_engine_per_process(tp2, monkeypatch):
    tp2()
    monkeypatch.setattr(launch, "_spawn", lambda spec: pytest.fail("a worker was started"))
    with pytest.raises(TensorParallelError, match="one tensor-parallel engine per process"):
        tiny(2)


def test_graph_paths_and_steps_launched_ahead_match_one_rank(tp2):
    """The decode graphs' and piecewise graphs' static-buffer paths (eager on CPU), with decode steps launched one
    ahead: the sampled tokens reach the other rank through the process group, not the host."""
    want = greedy_run(tiny(1), steps=14, logits=False)
    e = tp2()
    e.model_runner.use_static_buffers()
    e.parallel.record_steps()
    e.model_runner.step_log = []
    got = greedy_run(e, steps=14, logits=False)
    assert {rid: tokens for rid, (_, tokens) in got.items()} == {rid: tokens for rid, (_, tokens) in want.items()}
    ours, (theirs,) = e.model_runner.step_log, e.parallel.step_logs()
    assert theirs == ours
    kinds = {entry[0] for entry in ours}
    assert kinds == {"eager", "decode"}
    assert any(entry[0] == "decode" and entry[3] > 0 for entry in ours), "no decode step was launched one ahead"
    assert any(entry[0] == "eager" and entry[3] is not None for entry in ours), "no step replayed the pieces"


def test_a_checkpoint_with_tied_embeddings_splits_the_same_way(tmp_path):
    """Each rank reads the sharded safetensors and keeps its slice; the tied LM head stays whole on rank 0."""
    from sits.engine.model.loader import write_tiny

    ckpt = str(write_tiny(tmp_path / "ckpt", shards=3, tie_word_embeddings=True, num_attention_heads=8,
                          num_key_value_heads=4, head_dim=32))
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    with LLM(model=ckpt, device="cpu") as one:
        want = [r.token_ids for r in one.generate(list(prompts().values()), greedy)]
    with LLM(model=ckpt, device="cpu", tensor_parallel_size=4, num_kv_blocks=32) as four:
        assert [layer.hq for layer in four.engine.model_runner.model.layers] == [2] * 4
        got = [r.token_ids for r in four.generate(list(prompts().values()), greedy)]
    assert got == want


@pytest.mark.parametrize("size, field, words", [
    (0, "tensor_parallel_size", "positive integer"),
    (True, "tensor_parallel_size", "positive integer"),
    (3, "tensor_parallel_size", "num_attention_heads (4)"),
    (4, "tensor_parallel_size", "num_key_value_heads (2)"),
])
def test_bad_sizes_are_refused_before_any_process_starts(monkeypatch, size, field, words):
    monkeypatch.setattr(launch, "_spawn", lambda spec: pytest.fail("a worker was started"))
    with pytest.raises(InvalidRequestError) as e:
        tiny(size)
    assert e.value.param == field and words in str(e.value)


def test_one_gpu_per_rank_and_no_single_gpu_device(monkeypatch):
    with pytest.raises(InvalidRequestError, match="cuda:r of the visible GPUs") as e:
        EngineConfig(device="cuda:1", tensor_parallel_size=2)
    assert e.value.param == "device"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(InvalidRequestError, match="needs 2 GPUs .* but 1 are visible"):
        check_sizes(2, preset("tiny"), torch.device("cuda"))
    check_sizes(2, preset("tiny"), torch.device("cpu"))


def test_a_worker_that_cannot_start_fails_the_load(monkeypatch):
    monkeypatch.setattr(launch, "WORKER_BOOT", "import sys; sys.exit(7)")
    with pytest.raises(TensorParallelError, match=r"rank 1 \(pid \d+\) exited with code 7 while starting"):
        tiny(2)
    assert not dist.is_initialized()


def test_a_worker_that_cannot_load_its_shard_fails_the_load_with_its_reason(monkeypatch):
    boot = launch.WORKER_BOOT.replace(
        "from sits.engine.parallel.worker import main; ",
        "import sits.engine.parallel.worker as w; from sits.engine.errors import UnknownModelError; "
        "w.resolve_model = lambda *a: (_ for _ in ()).throw(UnknownModelError('shard 2 of 4 is unreadable')); "
        "main = w.main; ")
    monkeypatch.setattr(launch, "WORKER_BOOT", boot)
    with pytest.raises(TensorParallelError, match="rank 1 failed while loading its shard: UnknownModelError: shard 2 "
                                                  "of 4 is unreadable"):
        tiny(2)
    assert not dist.is_initialized()


def test_workers_end_when_rank_0_is_killed(tmp_path):
    script = tmp_path / "rank0.py"
    script.write_text(textwrap.dedent("""
        import sys, time
        from sits.engine import LLM
        llm = LLM(model="tiny", device="cpu", tensor_parallel_size=2)
        print(*llm.engine.parallel.worker_pids(), flush=True)
        time.sleep(600)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 1 and alive(pids[0])
    finally:
        proc.kill()
        proc.wait()
    wait_for("the worker to end after rank 0 was killed", lambda: not alive(pids[0]), timeout=10)


def _children(pid: int) -> list[int]:
    return [int(c) for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()]


def test_served_with_two_ranks_answers_as_one_rank_does_and_stops_cleanly(tmp_path):
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    with LLM(model="tiny", device="cpu") as one:
        want = one.generate(["Hello there"], greedy)[0].text
    s = ServeProcess(tmp_path, "--tensor-parallel-size", "2").wait_ready()
    try:
        status, _, body = http("POST", s.url + "/v1/completions", {"model": "tiny", "prompt": "Hello there",
                                                                    "max_tokens": 8, "temperature": 0,
                                                                    "ignore_eos": True})
        assert status == 200 and json.loads(body)["choices"][0]["text"] == want
        core = s.core_pid()   # rank 0; its worker rank is its child
        workers = [p for p in _children(core)
                   if b"sits.engine.parallel.worker" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert len(workers) == 1
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(60) == 0, s.logs()
        wait_for("the worker rank to end with the server", lambda: not alive(workers[0]) and not alive(core),
                 timeout=10)
    finally:
        s.stop()


def test_serve_refuses_bad_sizes(tmp_path, capsys):
    from sits.engine.server.main import main

    assert main(["--tensor-parallel-size", "0"]) == 2   # before the port opens
    assert "tensor_parallel_size must be a positive integer, got 0" in capsys.readouterr().err
    s = ServeProcess(tmp_path, "--tensor-parallel-size", "3")   # the model's sizes are checked as it loads
    try:
        assert s.proc.wait(60) == 1
        last = s.logs().strip().splitlines()[-1]
        assert last.startswith(LOAD_FAILED) and "tensor_parallel_size 3 must divide the model's num_attention_heads" \
            in last, s.logs()
    finally:
        s.stop()


# ---- on two GPUs: NCCL, CUDA graphs captured on every rank ----

two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")


def assert_close_until_a_flip(reference: dict, got: dict, atol: float) -> None:
    """Logits within atol step by step, up to a near-tie that flips a greedy token (later steps see other inputs);
    at least 4 steps of every prompt compared."""
    for rid, (ref_logits, ref_tokens) in reference.items():
        logits, tokens = got[rid]
        compared = 0
        for step, (a, b) in enumerate(zip(ref_logits, logits)):
            err = float((a - b).abs().max())
            assert err < atol, (rid, step, err)
            compared += 1
            if ref_tokens[step] != tokens[step]:
                break
        assert compared >= 4, (rid, compared)


@two_gpus
@pytest.mark.gpu
def test_two_gpus_match_one_with_graphs_captured_on_every_rank():
    """TP=2 on cuda:0 and cuda:1 (NCCL) with a graph-safe Triton set in fp32: warm-up captures the decode and
    piecewise graphs on both ranks, all-reduces inside; greedy decoding matches TP=1, synchronous or with decode
    steps launched one ahead (the sampled tokens broadcast on the GPU)."""
    def engine(tp: int) -> LLMEngine:
        return LLMEngine(EngineConfig(model="tiny", device="cuda", dtype="float32", kernels="triton-v1.1",
                                      num_kv_blocks=32, max_num_batched_tokens=96, max_num_seqs=8,
                                      tensor_parallel_size=tp))

    one = engine(1)
    one.warmup()
    want = greedy_run(one)
    del one
    two = engine(2)
    try:
        runner = two.model_runner
        assert runner.device == torch.device("cuda", 0)
        two.parallel.record_steps()
        runner.step_log = []
        two.warmup()
        assert runner.decode_graphs is not None and runner.decode_graphs.graphs and runner.decode_graphs.failed is None
        assert runner.piecewise is not None and runner.piecewise.failed is None
        got = greedy_run(two)
        assert_close_until_a_flip(want, got, atol=2e-2)
        launched_ahead = {rid: tokens for rid, (_, tokens) in greedy_run(two, logits=False).items()}
        assert launched_ahead == {rid: tokens for rid, (_, tokens) in got.items()}
        ours, (theirs,) = runner.step_log, two.parallel.step_logs()
        assert theirs == ours
        assert ("capture",) in ours
        assert any(e[0] == "decode" and e[3] > 0 for e in ours), "no decode step was launched one ahead"
    finally:
        two.close()
    assert not dist.is_initialized()
