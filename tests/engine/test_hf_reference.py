"""Logits of the engine (paged KV cache, GQA, llama3 rope scaling) vs transformers' LlamaForCausalLM, CPU fp32."""

import dataclasses

import pytest
import torch

from sits.engine import EngineConfig, LLMEngine, SamplingParams
from sits.engine.model.loader import write_tiny
from tests.engine.helpers import run_to_completion

transformers = pytest.importorskip("transformers")

ATOL = 2e-4  # fp32; logits are O(1)
DECODE_STEPS = 24


def hf_logits(path, token_ids: list[int]) -> torch.Tensor:
    model = transformers.LlamaForCausalLM.from_pretrained(str(path), attn_implementation="eager")
    model = model.float().eval()
    with torch.no_grad():
        return model(input_ids=torch.tensor([token_ids])).logits[0].float()


def engine_logits(path, prompts: dict[str, list[int]], *, budget: int, late: dict[str, list[int]] = {}):
    """Greedy-decode every prompt; `late` prompts are added once the first ones finished (prefix-cache hits).
    Returns ({rid: [logits per generated token]}, {rid: generated ids}, engine)."""
    engine = LLMEngine(EngineConfig(model=str(path), device="cpu", dtype="float32", num_kv_blocks=24,
                                    max_num_batched_tokens=budget))
    engine.model_runner.capture_logits = True
    params = SamplingParams(max_tokens=DECODE_STEPS, temperature=0.0, ignore_eos=True)
    captured: dict[str, list[torch.Tensor]] = {}
    tokens: dict[str, list[int]] = {}
    for wave in (prompts, late):
        for rid, ids in wave.items():
            engine.add_request(rid, ids, params)
        while engine.has_unfinished_requests():
            outs = engine.step()
            for row, rid in enumerate(engine.model_runner.last_logits_seqs if outs else []):
                captured.setdefault(rid, []).append(engine.model_runner.last_logits[row])
            for out in outs:
                tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            engine.model_runner.last_logits_seqs = []
    return captured, tokens, engine


def random_prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), generator=g).tolist()


@pytest.mark.parametrize("tied,budget", [(False, 4096), (True, 40)], ids=["untied-oneshot", "tied-chunked"])
def test_logits_match_transformers(tmp_path, tied, budget):
    ckpt = write_tiny(tmp_path / "ckpt", tie_word_embeddings=tied)
    a, b = random_prompt(100, 1), random_prompt(37, 2)
    c = a[:70] + random_prompt(9, 3)  # shares one full 64-token block with `a`: a prefix-cache hit
    captured, tokens, engine = engine_logits(ckpt, {"a": a, "b": b}, budget=budget, late={"c": c})
    assert engine.model_config.num_key_value_heads < engine.model_config.num_attention_heads  # GQA on
    assert engine.model_config.rope_scaling["rope_type"] == "llama3"
    assert engine.stats().prefix_cache_hits == 64
    worst = 0.0
    for rid, prompt in {"a": a, "b": b, "c": c}.items():
        assert len(tokens[rid]) == DECODE_STEPS and len(captured[rid]) == DECODE_STEPS
        full = prompt + tokens[rid][:-1]
        ref = hf_logits(ckpt, full)[len(prompt) - 1:]  # logits that predicted each generated token
        ours = torch.stack(captured[rid])
        err = (ours - ref).abs().max().item()
        worst = max(worst, err)
        assert err < ATOL, f"request {rid}: max |logit diff| {err:.3g} (prefill + {DECODE_STEPS - 1} decode steps)"
        # greedy: each generated token is the argmax of HF's logits too
        assert ref.argmax(-1).tolist() == tokens[rid]
    # the comparison is sharp enough to see the rope scaling: without it HF disagrees far beyond the tolerance
    no_scaling = write_tiny(tmp_path / "noscale", tie_word_embeddings=tied, rope_scaling=None)
    ref_plain = hf_logits(no_scaling, a + tokens["a"][:-1])[len(a) - 1:]
    gap = (torch.stack(captured["a"]) - ref_plain).abs().max().item()
    print(f"worst {worst:.3g}, without rope scaling {gap:.3g}")
    assert gap > 50 * max(worst, 1e-6)
