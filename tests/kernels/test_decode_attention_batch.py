"""bench/decode_attention_batch.py, whose GPU run measured which launch config wins FP8 decode attention at each
batch size (and so triton-v1.15's rule): on CPU under Triton's interpreter every swept config, at one split and at
four, gives the torch reference's values, and its split counts stay powers of two within the kernel's 1-64."""
import pytest

from bench import decode_attention_batch as batch
from tests.kernels.conftest import triton_device

pytestmark = pytest.mark.skipif(triton_device() != "cpu", reason="needs Triton's interpreter (CPU, TRITON_INTERPRET=1)")


def test_every_swept_config_computes_the_references_values(capsys):
    assert batch.smoke() == 0, capsys.readouterr().out


@pytest.mark.parametrize("auto, want", [(1, [1, 2, 4, 8]), (2, [1, 2, 4, 8, 16]), (16, [8, 16, 32, 64]),
                                        (64, [32, 64])])
def test_split_counts_surround_the_rules_within_the_kernels_range(auto, want):
    assert batch.split_counts(auto) == want


def test_the_sweep_takes_its_split_factors():
    assert batch.split_counts(4, [1]) == [4]
    assert batch.split_counts(4, [0.5, 2]) == [2, 8]


@pytest.mark.parametrize("arg", [["--configs", "1x"], ["--configs", "1x32x2"], ["--stages", "three"],
                                 ["--split-factors", "x"]])
def test_a_malformed_sweep_is_refused_before_any_work(arg, capsys):
    with pytest.raises(SystemExit) as e:
        batch.main(arg)
    assert e.value.code == 2 and "--configs takes WARPSxBLOCK_N pairs" in capsys.readouterr().err


def test_an_unknown_key_conversion_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        batch.main(["--k-conversion", "staged,fast"])
    assert e.value.code == 2 and "--k-conversion takes staged and/or in-dot" in capsys.readouterr().err
