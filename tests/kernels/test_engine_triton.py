"""The engine on the tiny model with triton-v1 (and v1.1, and v1.3 with an FP8 KV cache) gives what it gives with the
torch reference set."""
import functools

import pytest
import torch

from sits.engine import LLM, SamplingParams
from tests.kernels.conftest import triton_device

PROMPTS = ["The kernel set under test", "a", "Gray release of a new attention kernel: step one, shift ten percent"]


def _run(kernels, device, max_tokens, **kw):
    llm = LLM(model="tiny", kernels=kernels, device=device, **kw)
    assert llm.engine.kernel_set.name == kernels
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=2)
    return llm.generate(PROMPTS, params, use_tqdm=False)


def _assert_same(a, b, logprob_tol):
    assert len(a) == len(b) == len(PROMPTS), (len(a), len(b))   # one result per prompt on both sides
    for ra, rb in zip(a, b):
        assert ra.prompt == rb.prompt
        assert ra.token_ids == rb.token_ids and ra.token_ids, (ra.prompt, ra.token_ids, rb.token_ids)
        la = [e["logprob"] for e in ra.logprobs]
        lb = [e["logprob"] for e in rb.logprobs]
        assert len(la) == len(lb) == len(ra.token_ids), (len(la), len(lb), len(ra.token_ids))
        assert max(abs(x - y) for x, y in zip(la, lb)) <= logprob_tol, (la, lb)


@pytest.mark.skipif(triton_device() != "cpu", reason="needs Triton's interpreter (CPU, TRITON_INTERPRET=1)")
def test_interpreter_runs_the_tiny_model_on_cpu():
    # one prefill step (three prompts in one varlen launch) and one decode step, every op through Triton
    torch.manual_seed(0)
    ref = _run("torch", "cpu", 2)
    got = _run("triton-v1", "cpu", 2)
    _assert_same(ref, got, 1e-3)


@pytest.mark.skipif(triton_device() != "cpu", reason="needs Triton's interpreter (CPU, TRITON_INTERPRET=1)")
def test_interpreter_runs_the_tiny_model_with_an_fp8_kv_cache_on_cpu():
    # triton-v1.3's quantizing KV write and its FP8 prefill and decode kernels against the torch set's, same pages
    torch.manual_seed(0)
    ref = _run("torch", "cpu", 2, kv_cache_dtype="fp8")
    got = _run("triton-v1.3", "cpu", 2, kv_cache_dtype="fp8")
    _assert_same(ref, got, 1e-3)


@functools.cache   # triton-v1.9's answer, once per test process (under the interpreter each engine takes seconds)
def _one_prompt_int8(kernels: str) -> list:
    llm = LLM(model="tiny", kernels=kernels, device="cpu", quantization="int8")
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=2)
    return llm.generate(PROMPTS[:1], params, use_tqdm=False)


@pytest.mark.skipif(triton_device() != "cpu", reason="needs Triton's interpreter (CPU, TRITON_INTERPRET=1)")
# (triton-v1.13 runs every op of v1.12 as well; v1.12's own ops are held to v1.9's bits in test_pdl.py)
@pytest.mark.parametrize("kernels", ["triton-v1.10", "triton-v1.11", "triton-v1.13"])
def test_interpreter_runs_v19s_batch_1_gemv_variants_as_v19_on_cpu(kernels):
    # triton-v1.10 folds the norms into the q/k/v and gate/up GEMVs at one row, triton-v1.11 loads x as broadcast
    # tiles, triton-v1.12 and v1.13 launch v1.9's kernels with PDL on sm_90+ (here v1.9's launches): one prompt
    # decoding (int8 weights, float32) answers as triton-v1.9, to float32 rounding
    ref, got = _one_prompt_int8("triton-v1.9"), _one_prompt_int8(kernels)
    assert len(ref) == len(got) == 1 and ref[0].token_ids == got[0].token_ids and len(got[0].token_ids) == 4
    assert max(abs(a["logprob"] - b["logprob"]) for a, b in zip(ref[0].logprobs, got[0].logprobs)) <= 1e-4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_triton_v1_3_matches_torch_greedy_on_gpu(kv_cache_dtype):
    ref = _run("torch", "cuda", 24, dtype="float32", kv_cache_dtype=kv_cache_dtype)
    got = _run("triton-v1.3", "cuda", 24, dtype="float32", kv_cache_dtype=kv_cache_dtype)
    _assert_same(ref, got, 1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("quantization", [None, "int8"])
def test_triton_set_matches_torch_greedy_on_gpu(quantization):
    # fp32 so that both sets agree to ~1e-6 and greedy ties can't flip a token
    ref = _run("torch", "cuda", 24, dtype="float32", quantization=quantization)
    got = _run("triton-v1", "cuda", 24, dtype="float32", quantization=quantization)
    _assert_same(ref, got, 1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kernels", ["triton-v1", "triton-v1.1"])  # v1.1: the TMA prefill on sm_90+
def test_triton_set_runs_bf16_on_gpu(kernels):
    # bf16 rounding differs between the sets, so only the first token (one prefill) must agree exactly
    ref = _run("torch", "cuda", 8, dtype="bfloat16")
    got = _run(kernels, "cuda", 8, dtype="bfloat16")
    assert len(ref) == len(got) == len(PROMPTS)
    for ra, rb in zip(ref, got):
        assert ra.token_ids[0] == rb.token_ids[0]
        assert len(rb.token_ids) == 8
