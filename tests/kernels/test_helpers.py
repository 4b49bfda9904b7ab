"""The kernel tests' own checks (tests/kernels/helpers.py) report where they fail."""
import pytest
import torch

from tests.kernels.helpers import assert_verbose_allclose


def test_verbose_check_reports_indices():
    a = torch.zeros(3, 4)
    b = a.clone()
    b[1, 2] = 1.0
    with pytest.raises(AssertionError, match=r"\(1, 2\)"):
        assert_verbose_allclose(a, b, 1e-3, 0.0)
