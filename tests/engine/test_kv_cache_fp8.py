"""`kv_cache_dtype="fp8"` (`--kv-cache-dtype fp8`) on the tiny model, CPU, torch set: the cache holds ~2x the tokens
of a bf16 one in the same memory and says so at start-up; the logits stay within a stated bound of the model-dtype
cache's and greedy agreement is measured; the flag on both command lines, and the kernel-set check."""
import logging

import pytest
import torch

from sits.engine import LLM, EngineConfig, LLMEngine, SamplingParams
from sits.engine.cli import main as cli_main
from sits.engine.errors import InvalidRequestError
from sits.engine.execution.kv_cache import KVCacheLayout
from sits.engine.execution.model_runner import CPU_KV_CACHE_BYTES
from sits.engine.server.main import ServerConfig, build_parser
from sits.engine.server.main import main as serve_main

# fp32 compute, so that only the cache differs. Measured here on the random-weight tiny model, whose logits are nearly
# flat (|logit| <= ~1.2, std ~0.32: near-ties everywhere, so one flipped token ends a common prefix early): max |logit
# error| 0.040, greedy common prefix 106/168 tokens, teacher-forced top-1 agreement 811/861 (94.2 %). For scale, bf16
# compute and cache against fp32 on the same prompts: 0.016 and 144/168. The bounds leave ~2x room.
LOGIT_TOL = 0.08          # max |fp8 - auto| over every compared step's logits
MIN_TOP1_AGREEMENT = 0.85  # teacher-forced: the same argmax at every position of the same token sequences

# the built-in sets that take --kv-cache-dtype fp8
FP8_SETS = "torch, triton-v1.3, triton-v1.4, triton-v1.5, triton-v1.6, triton-v1.7, triton-v1.8"


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in (1, 7, 63, 64, 65, 200, 300)]


def _engine(kv_cache_dtype: str, **kw) -> LLMEngine:
    # 96-token steps: prompts longer than that prefill in chunks, each chunk attending to the pages the last wrote
    return LLMEngine(EngineConfig(model="tiny", kernels="torch", device="cpu", dtype="float32", num_kv_blocks=64,
                                  max_num_batched_tokens=96, kv_cache_dtype=kv_cache_dtype, **kw))


def _greedy(kv_cache_dtype: str, prompts: list[list[int]], steps: int, static: bool = False) -> list[tuple[list, list]]:
    """Per prompt: (logits [vocab] of every step, greedy tokens); static: through the CUDA graphs' code paths (their
    static buffers, eagerly on CPU)."""
    engine = _engine(kv_cache_dtype)
    if static:
        engine.model_runner.use_static_buffers()
    engine.model_runner.capture_logits = True
    for i, ids in enumerate(prompts):
        engine.add_request(str(i), ids, SamplingParams(max_tokens=steps, temperature=0.0, ignore_eos=True))
    out = [([], []) for _ in prompts]
    while engine.has_unfinished_requests():
        for o in engine.step():
            out[int(o.request_id)][1].extend(o.new_token_ids)
        for row, rid in enumerate(engine.model_runner.last_logits_seqs):
            out[int(rid)][0].append(engine.model_runner.last_logits[row])
        engine.model_runner.last_logits_seqs = []
    return out


def _top1(kv_cache_dtype: str, seqs: list[list[int]]) -> list[list[int]]:
    """Teacher forcing: the argmax after every prefix of each sequence (prompt scoring, all positions prefilled)."""
    llm = LLM(model="tiny", kernels="torch", device="cpu", dtype="float32", num_kv_blocks=64,
              max_num_batched_tokens=96, kv_cache_dtype=kv_cache_dtype)
    out = llm.generate(seqs, SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1), use_tqdm=False)
    return [[e["top_logprobs"][0][0] for e in r.prompt_logprobs] for r in out]


def test_fp8_logits_stay_within_the_bound_and_greedy_agreement_is_measured():
    prompts = _prompts()
    auto, fp8 = _greedy("auto", prompts, 24), _greedy("fp8", prompts, 24)
    worst, agreed, total = 0.0, 0, 0
    for (la, ta), (lb, tb) in zip(auto, fp8):
        n = next((i for i, (a, b) in enumerate(zip(ta, tb)) if a != b), len(ta))
        agreed, total = agreed + n, total + len(ta)
        # up to and including the first differing token, both saw the same inputs: those logits are comparable
        worst = max(worst, max(float((a - b).abs().max()) for a, b in zip(la[:n + 1], lb[:n + 1])))
    print(f"fp8 KV vs auto: max |logit error| {worst:.4f}, greedy common prefix {agreed}/{total}")
    assert 0.0 < worst <= LOGIT_TOL   # > 0: the cache really is FP8
    assert agreed >= 0.5 * total, (agreed, total)
    seqs = [p + t for p, (_, t) in zip(prompts, auto)]
    a, b = _top1("auto", seqs), _top1("fp8", seqs)
    same = sum(x == y for ra, rb in zip(a, b) for x, y in zip(ra, rb))
    n = sum(len(r) for r in a)
    print(f"fp8 KV vs auto: teacher-forced top-1 agreement {same}/{n} = {same / n:.3f}")
    assert same / n >= MIN_TOP1_AGREEMENT


def test_fp8_pages_through_the_graphs_static_buffers():
    # decode steps through DecodeGraphs and prefill steps through PiecewiseGraphs read and write the same FP8 pages
    prompts = _prompts()[:5]
    eager, graphs = _greedy("fp8", prompts, 8), _greedy("fp8", prompts, 8, static=True)
    for (la, ta), (lb, tb) in zip(eager, graphs):
        assert ta == tb
        assert max(float((a - b).abs().max()) for a, b in zip(la, lb)) < 1e-4


def test_fp8_pages_hold_about_twice_the_tokens_in_the_same_memory(caplog):
    caplog.set_level(logging.INFO, logger="sits.engine")
    bf16 = LLMEngine(EngineConfig(model="tiny", device="cpu", dtype="bfloat16"))
    fp8 = LLMEngine(EngineConfig(model="tiny", device="cpu", dtype="bfloat16", kv_cache_dtype="fp8"))
    a, b = bf16.model_runner, fp8.model_runner
    # tiny: 4 layers x 2 kv heads x head_dim 64, K and V: 2 x 4 x 2 x 64 x 2 bytes in bf16; e4m3 + a 4-byte scale
    assert a.block_bytes() == 64 * 2048 and b.block_bytes() == 64 * 2 * 4 * 2 * (64 + 4)
    assert (a.num_blocks, b.num_blocks) == (CPU_KV_CACHE_BYTES // a.block_bytes(), CPU_KV_CACHE_BYTES // b.block_bytes())
    assert b.num_blocks / a.num_blocks == pytest.approx(2 * 64 / (64 + 4), rel=1e-3)   # 1.88x at head_dim 64
    assert fp8.block_manager.num_total_blocks == b.num_blocks
    assert a.kv_scales is None and a.kv_cache.dtype == torch.bfloat16
    assert b.kv_cache.dtype == torch.float8_e4m3fn and b.kv_scales.dtype == torch.float32
    assert b.kv_cache.nbytes + b.kv_scales.nbytes == b.num_blocks * b.block_bytes() <= CPU_KV_CACHE_BYTES
    assert f"KV cache: {b.num_blocks} blocks of 64 tokens = {b.num_blocks * 64} tokens (fp8" in caplog.text
    assert f"KV cache: {a.num_blocks} blocks of 64 tokens = {a.num_blocks * 64} tokens (bfloat16" in caplog.text
    # at llama3-8b's shape (32 layers, 8 kv heads, head_dim 128): 1.94x
    big = [KVCacheLayout(32, 64, 8, 128, torch.bfloat16, kind).bytes_per_token() for kind in ("auto", "fp8")]
    assert big == [131072, 67584]


def test_fp8_needs_a_kernel_set_that_takes_it():
    with pytest.raises(InvalidRequestError, match="kv_cache_dtype") as e:
        EngineConfig(kv_cache_dtype="int4")
    assert e.value.param == "kv_cache_dtype"
    with pytest.raises(InvalidRequestError) as e:
        LLMEngine(EngineConfig(model="tiny", kernels="triton-v1.2", device="cpu", kv_cache_dtype="fp8"))
    assert e.value.param == "kv_cache_dtype"
    assert "'triton-v1.2' takes auto only" in str(e.value) and f"take 'fp8': {FP8_SETS}" in str(e.value)


def test_the_flag_on_both_command_lines(capsys):
    args = build_parser().parse_args(["--kv-cache-dtype", "fp8"])
    assert ServerConfig(**vars(args)).engine_config().kv_cache_dtype == "fp8"
    assert build_parser().parse_args([]).kv_cache_dtype == "auto"
    # a set that cannot take it fails before the port opens, in one line
    assert serve_main(["--kernels", "triton-v1", "--kv-cache-dtype", "fp8"]) == 2
    err = capsys.readouterr().err
    assert f"take 'fp8': {FP8_SETS}" in err and "Traceback" not in err
    assert cli_main(["generate", "--device", "cpu", "--kv-cache-dtype", "fp8", "--max-tokens", "3", "hi"]) == 0
    assert capsys.readouterr().out.strip()
    assert cli_main(["generate", "--kernels", "triton-v1", "--kv-cache-dtype", "fp8", "hi"]) == 2
    assert "kv_cache_dtype 'fp8' needs a kernel set" in capsys.readouterr().err
