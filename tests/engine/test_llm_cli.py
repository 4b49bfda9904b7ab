"""The offline LLM API and the sits-engine CLI (generate, kernels, write-tiny)."""

import pytest
import torch

from sits.engine import LLM, InvalidRequestError, SamplingParams
from sits.engine.cli import main

GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    return LLM(model="tiny", kernels="torch", device="cpu", num_kv_blocks=32)


def test_generate_returns_one_result_per_prompt_in_order(llm):
    prompts = [f"prompt number {i} " * (i % 3 + 1) for i in range(9)]
    batch = llm.generate(prompts, GREEDY)
    assert [r.prompt for r in batch] == prompts
    for prompt, r in zip(prompts, batch):
        (alone,) = llm.generate(prompt, GREEDY)
        assert r.token_ids == alone.token_ids and r.text == alone.text
        assert len(r.token_ids) == 10 and r.finish_reason == "length"
        assert r.text == llm.tokenizer.decode(r.token_ids)
    ids = llm.tokenizer.encode(prompts[0])
    (from_ids,) = llm.generate([ids], GREEDY)
    assert from_ids.token_ids == batch[0].token_ids


def test_progress_bar_for_long_batches(llm, capsys):
    llm.generate(["a", "b"], SamplingParams(max_tokens=2))
    assert "generate" not in capsys.readouterr().err
    llm.generate(["x"] * 8, SamplingParams(max_tokens=2))
    assert "generate" in capsys.readouterr().err


def test_per_prompt_params_and_mismatch(llm):
    a, b = llm.generate(["p", "q"], [SamplingParams(max_tokens=3, ignore_eos=True),
                                     SamplingParams(max_tokens=5, ignore_eos=True)])
    assert (len(a.token_ids), len(b.token_ids)) == (3, 5)
    with pytest.raises(InvalidRequestError, match="2 SamplingParams for 3 prompts"):
        llm.generate(["p", "q", "r"], [GREEDY, GREEDY])


@pytest.mark.parametrize("kind,tol", [("int8", 0.04), ("fp8", 0.15)])  # relative L2 error of the logits
def test_weight_only_quantization_stays_close(kind, tol):
    plain = LLM(model="tiny", device="cpu", num_kv_blocks=8)
    quant = LLM(model="tiny", device="cpu", num_kv_blocks=8, quantization=kind)
    logits = []
    for llm in (plain, quant):
        llm.engine.model_runner.capture_logits = True
        llm.generate("quantize me", SamplingParams(max_tokens=1))
        logits.append(llm.engine.model_runner.last_logits[0])
    err = ((logits[0] - logits[1]).norm() / logits[0].norm()).item()
    assert 0 < err < tol


def test_cli_kernels_lists_the_torch_set(capsys):
    assert main(["kernels"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["name", "version", "devices"]
    assert any(line.split()[:3] == ["torch", "1.0.0", "cpu,cuda"] for line in out)


def test_cli_write_tiny_then_generate(tmp_path, capsys):
    assert main(["write-tiny", str(tmp_path / "ckpt"), "--shards", "2"]) == 0
    assert len(list((tmp_path / "ckpt").glob("model-*.safetensors"))) == 2
    capsys.readouterr()
    assert main(["generate", "--model", str(tmp_path / "ckpt"), "--device", "cpu", "--max-tokens", "8",
                 "--ignore-eos", "Hello CLI"]) == 0
    printed = capsys.readouterr().out
    (expected,) = LLM(model="tiny", device="cpu", num_kv_blocks=4).generate(
        "Hello CLI", SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    assert printed == expected.text + "\n"


def test_cli_errors_are_one_line(capsys):
    assert main(["generate", "--model", "no-such-model", "hi"]) == 2
    err = capsys.readouterr().err
    assert "unknown model 'no-such-model'" in err and "Traceback" not in err
    assert main(["generate", "--max-tokens", "0", "hi"]) == 2
    assert "max_tokens" in capsys.readouterr().err


def test_auto_kv_cache_size_on_cpu():
    from sits.engine import EngineConfig, LLMEngine

    small = LLMEngine(EngineConfig(model="tiny", device="cpu", max_num_seqs=2))
    assert small.stats().num_total_blocks == 2 * small.max_model_len // 64  # 2 full-length sequences
    big = LLMEngine(EngineConfig(model="tiny", device="cpu", max_model_len=512))
    per_block = 2 * 4 * 64 * 2 * 64 * 4  # K+V, 4 layers, 64 tokens, 2 kv heads, head_dim 64, fp32
    assert big.stats().num_total_blocks == 256 * 2**20 // per_block  # the CPU budget
