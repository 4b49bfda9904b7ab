"""The Triton example releases (kernels/decode_attention_regressions.py): triton-v1-unsplit's decode attention is
triton-v1's to rounding, triton-v1-floor-pages' is exactly attention over whole KV pages -- off wherever the last
page is partly filled -- and on the tiny model the one keeps torch's tokens while the other changes them. CPU:
Triton's interpreter, tiny shapes; GPU: compiled."""
import pytest
import torch

from sits.kernels import get_kernel_set, register_kernel_set, unregister_kernel_set
from tests.engine.helpers import LOGIT_TOL, greedy_logits
from tests.kernels.helpers import ATOL, DTYPES, args_to, assert_close_to_fp64, check_op, decode_args

REF = get_kernel_set("torch")
V1 = get_kernel_set("triton-v1")
SLOW = get_kernel_set("triton-v1-unsplit")
WRONG = get_kernel_set("triton-v1-floor-pages")
PAGE = 64
CTX = [1, 15, 16, 17, 63, 64, 65, 127, 130, 200]


def test_both_derive_from_triton_v1_replace_decode_attention_only_and_are_flagged():
    for ks, flag in ((SLOW, "slow"), (WRONG, "wrong")):
        assert ks.parent == "triton-v1" and ks.overrides == ("paged_decode_attention",) and ks.regression == flag
        assert ks.graph_safe and set(ks.devices) == {"cuda", "cpu"}
        assert ks.prefill_attention is V1.prefill_attention and ks.linear is V1.linear
        assert ks.paged_decode_attention is not V1.paged_decode_attention


@pytest.mark.parametrize("dtype", DTYPES)
def test_unsplit_decode_attention_is_correct(dev, dtype):
    check_op("paged_decode_attention", decode_args(CTX, 8, 2, 64, dtype, seed=40), dtype, dev, kernel_set=SLOW)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_floor_pages_attends_over_whole_pages_only(dev, dtype):
    q, k, v, tables, lens, scale = decode_args(CTX, 8, 2, 64, dtype, seed=41)
    got = WRONG.paged_decode_attention(*args_to((q, k, v, tables, lens, scale), device=dev)).cpu()
    # what it computes: the reference over ctx // PAGE * PAGE tokens once there is a full page
    floored = torch.tensor([n // PAGE * PAGE if n > PAGE else n for n in CTX], dtype=torch.int32)
    same = REF.paged_decode_attention(q, k, v, tables, floored, scale)
    ref64 = REF.paged_decode_attention(*args_to((q, k, v, tables, floored, scale), dtype=torch.float64))
    assert_close_to_fp64(got, same, ref64, ATOL[dtype])
    # against the right answer: exact where no page is partly filled, far off everywhere else
    right = REF.paged_decode_attention(*args_to((q, k, v, tables, lens, scale), dtype=torch.float64))
    err = (got.double() - right).abs().amax(dim=(1, 2))
    for n, e in zip(CTX, err.tolist()):
        if n <= PAGE or n % PAGE == 0:
            assert e < 2 * ATOL[dtype], (n, e)
        else:   # one of 65 tokens dropped moves bf16 outputs by ~0.07, rounding by < 0.005
            assert e > 4 * ATOL[dtype], (n, e)


def test_launch_grids_one_program_per_sequence_and_split_kv_as_triton_v1(dev, monkeypatch):
    """What makes one slow and the other as fast: the unsplit kernel runs one program per sequence, the floor-pages
    one triton-v1's (seqs x kv heads x splits) grid. The interpreter's launches are recorded (no timing here:
    bench/gpu_demo.sh times them on the GPU)."""
    if dev != "cpu":
        pytest.skip("records the interpreter's launches")
    import sits.kernels.decode_attention_regressions as bad
    grids = {}

    class Recorder:
        def __init__(self, name):
            self.name, self.kernel = name, getattr(bad, name)

        def __getitem__(self, grid):
            grids[self.name] = tuple(grid)
            return self.kernel[grid]
    for name in ("_paged_decode_attention_per_seq_kernel", "_paged_decode_attention_floor_pages_kernel"):
        monkeypatch.setattr(bad, name, Recorder(name))
    q, k, v, tables, lens, scale = decode_args([300, 300, 300], 8, 2, 64, torch.float32, seed=42)
    SLOW.paged_decode_attention(q, k, v, tables, lens, scale)
    WRONG.paged_decode_attention(q, k, v, tables, lens, scale)
    assert grids == {"_paged_decode_attention_per_seq_kernel": (3,),
                     "_paged_decode_attention_floor_pages_kernel": (3, 2, 2)}


@pytest.mark.parametrize("name", ["triton-v1-unsplit", "triton-v1-floor-pages"])
def test_on_the_tiny_model_the_op_each_replaces_is_what_its_flag_says(dev, name):
    """Greedy fp32 decoding of the tiny model, torch everywhere but the set's own decode attention (Triton, here in
    the interpreter: all of triton-v1 there would take minutes): "slow" keeps torch's logits, "wrong" does not."""
    ks = get_kernel_set(name)
    probe = REF.derive(f"{name}-probe", "0.0.1", regression=ks.regression,
                       paged_decode_attention=ks.paged_decode_attention)
    register_kernel_set(probe)
    try:
        g = torch.Generator().manual_seed(0)
        prompts = {f"p{n}": torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 70, 130)}
        ref = greedy_logits("torch", prompts, dev, steps=4)
        got = greedy_logits(probe.name, prompts, dev, steps=4)
    finally:
        unregister_kernel_set(probe.name)
    # decode steps only (the first logits come from the prefill, which is torch's in both)
    worst = {rid: max(float((a - b).abs().max()) for a, b in zip(ref[rid][0][1:], got[rid][0][1:]))
             for rid in prompts}
    if ks.regression == "slow":
        assert max(worst.values()) < LOGIT_TOL, worst
        assert [ref[r][1] for r in prompts] == [got[r][1] for r in prompts]
    else:
        assert worst["p5"] < LOGIT_TOL, worst                 # one partly filled page: exact
        assert worst["p70"] > LOGIT_TOL and worst["p130"] > LOGIT_TOL, worst   # random weights: 0.13 and 0.04
