"""The example releases in kernels/sets.py: torch-slow-attn computes what torch computes, torch-wrong-rope does not
(it is exactly RoPE with base 10000 and no scaling), and both are listed like any other set."""
import pytest
import torch

from sits.engine import LLM, SamplingParams
from sits.engine.cli import main as engine_cli
from sits.engine.model.layers.rotary_embedding import rope_cos_sin
from sits.engine.model.presets import preset
from sits.kernels import get_kernel_set, list_kernel_sets
from tests.engine.helpers import assert_set_is_what_it_claims
from tests.kernels.helpers import assert_verbose_allclose, make_paged_kv, rope_tables

REF = get_kernel_set("torch")
SLOW = get_kernel_set("torch-slow-attn")
WRONG = get_kernel_set("torch-wrong-rope")


def test_example_sets_derive_from_torch_and_replace_one_kind_of_op(capsys):
    assert SLOW.devices == WRONG.devices == ("cpu", "cuda")
    assert SLOW.prefill_attention is not REF.prefill_attention and SLOW.rope_and_cache is REF.rope_and_cache
    assert SLOW.paged_decode_attention is not REF.paged_decode_attention and SLOW.linear is REF.linear
    assert WRONG.rope_and_cache is not REF.rope_and_cache and WRONG.prefill_attention is REF.prefill_attention
    assert engine_cli(["kernels"]) == 0
    out = capsys.readouterr().out
    assert "torch-wrong-rope" in out and "torch-slow-attn" in out and "WRONG" in out and "SLOW" in out


@pytest.mark.parametrize("dtype, atol, rtol", [(torch.float32, 1e-6, 1e-5), (torch.bfloat16, 1e-2, 1e-2)])
def test_slow_attention_equals_the_reference(dtype, atol, rtol):
    ctx, qlens, hq, hkv, d, bs = [1, 63, 64, 65, 1000], [1, 5, 64, 2, 123], 4, 2, 64, 16
    k_cache, v_cache, tables, _, _ = make_paged_kv(ctx, hkv, d, bs, dtype, "cpu", seed=3)
    g = torch.Generator().manual_seed(4)
    lens = torch.tensor(ctx, dtype=torch.int32)
    q = torch.randn(len(ctx), hq, d, generator=g).to(dtype)
    assert_verbose_allclose(SLOW.paged_decode_attention(q, k_cache, v_cache, tables, lens, d ** -0.5),
                            REF.paged_decode_attention(q, k_cache, v_cache, tables, lens, d ** -0.5), atol, rtol)
    q = torch.randn(sum(qlens), hq, d, generator=g).to(dtype)
    cu = torch.tensor([0] + list(torch.tensor(qlens).cumsum(0)), dtype=torch.int32)
    assert_verbose_allclose(SLOW.prefill_attention(q, k_cache, v_cache, tables, cu, lens, d ** -0.5),
                            REF.prefill_attention(q, k_cache, v_cache, tables, cu, lens, d ** -0.5), atol, rtol)


def test_wrong_rope_is_base_10000_without_scaling():
    cfg = preset("tiny")
    t, hq, hkv, d = 7, 4, 2, cfg.head_dim
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(t, h, d, generator=g) for h in (hq, hkv, hkv))
    positions = torch.tensor([0, 1, 63, 64, 65, 1000, 3000])
    slots = torch.arange(t)
    cos, sin = rope_cos_sin(d, 4096, cfg.rope_theta, cfg.rope_scaling)   # what the engine passes
    caches = [torch.zeros(4, 2, hkv, d) for _ in range(4)]
    wrong_q, wrong_k = WRONG.rope_and_cache(q, k, v, positions, cos, sin, caches[0], caches[1], slots)
    right_q, _ = REF.rope_and_cache(q, k, v, positions, cos, sin, caches[2], caches[3], slots)
    assert (wrong_q[0] - right_q[0]).abs().max() == 0   # position 0: no rotation either way
    assert (wrong_q[1:] - right_q[1:]).abs().amax(dim=(1, 2)).min() > 1e-2   # every later position is off
    c10k, s10k = rope_tables(4096, d, theta=10000.0)
    base_q, base_k = REF.rope_and_cache(q, k, v, positions, c10k, s10k, caches[2], caches[3], slots)
    # fp32 angles vs the fp64 tables: ~2e-4 apart at position 3000
    assert_verbose_allclose(wrong_q, base_q, 5e-4, 1e-4)
    assert_verbose_allclose(wrong_k, base_k, 5e-4, 1e-4)
    assert_verbose_allclose(caches[0].view(-1, hkv, d)[:t], wrong_k, 0, 0)   # the cache holds the wrong keys


def test_on_the_tiny_model_wrong_rope_changes_answers_and_slow_attention_does_not():
    prompts = ["The quick brown fox jumps over the lazy dog. " * 8, "Hello", "1, 2, 3, 4, 5,"]
    sp = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, logprobs=0)
    runs = {ks: LLM(model="tiny", kernels=ks).generate(prompts, sp, use_tqdm=False)
            for ks in ("torch", "torch-slow-attn", "torch-wrong-rope")}
    base = runs["torch"]
    assert [r.token_ids for r in runs["torch-slow-attn"]] == [r.token_ids for r in base]
    drift = max(abs(a["logprob"] - b["logprob"]) for r, s in zip(runs["torch-slow-attn"], base)
                for a, b in zip(r.logprobs, s.logprobs))
    assert drift < 1e-5
    wrong = runs["torch-wrong-rope"]
    assert any(r.token_ids != s.token_ids for r, s in zip(wrong, base))


def _torch_only(name: str) -> bool:
    """Every op is a torch implementation (`<op>..._ref`, the kernels/ convention); Triton ones would run the whole
    tiny model through the interpreter here (minutes): test_triton_example_sets.py checks those op by op."""
    return all(fn.__name__.endswith("_ref") for fn in get_kernel_set(name).ops().values())


@pytest.mark.parametrize("name", [n for n in list_kernel_sets()
                                  if get_kernel_set(n).regression is not None and _torch_only(n)])
def test_every_flagged_example_set_is_what_its_flag_says(name):
    """Every torch-based set flagged as an example regression, on CPU: "slow" gives torch's answers, "wrong" is
    caught."""
    assert_set_is_what_it_claims(name, "cpu")
