"""bench/decode_attention_bound.py's read probe (the FP8 decode kernels' walk, summing what it reads), whose GPU run
says what bounds FP8 decode attention: on CPU under Triton's interpreter its sums equal torch's for the engine's page
layout with scales, head-major pages and plain pages, and a walk that skips a page is told apart."""
import pytest
import torch

from bench import decode_attention_bound as bound
from sits.kernels.kv_fp8 import quantize
from tests.kernels.conftest import triton_device

pytestmark = pytest.mark.skipif(triton_device() != "cpu", reason="needs Triton's interpreter (CPU, TRITON_INTERPRET=1)")


def test_the_read_probe_sums_what_the_kernels_read(capsys):
    assert bound.smoke() == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert out.count(" ok") == 3 and "MISMATCH" not in out


def test_the_read_probe_tells_a_walk_that_misses_a_page():
    torch.manual_seed(1)
    lens = torch.tensor([130], dtype=torch.int32)
    tables = torch.tensor([[2, 0, 1]], dtype=torch.int32)
    k8, ks = quantize(torch.randn(3, bound.PAGE, bound.HKV, bound.D))
    v8, vs = quantize(torch.randn(3, bound.PAGE, bound.HKV, bound.D))
    want = bound.expected_sum(k8, v8, ks, vs, tables, lens)
    got = bound.probe(k8, v8, ks, vs, tables, lens, block_n=64, warps=4, stages=1, splits=2)().double().sum().item()
    assert abs(got - want) <= 1e-3 * abs(want)
    short = torch.tensor([[2, 0, 0]], dtype=torch.int32)   # the last page read from block 0 again
    wrong = bound.probe(k8, v8, ks, vs, short, lens, block_n=64, warps=4, stages=1, splits=2)().double().sum().item()
    assert abs(wrong - want) > 1e-2 * abs(want)
