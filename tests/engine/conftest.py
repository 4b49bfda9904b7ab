import pytest
import torch

from engine.loader import write_tiny

# The tiny model's ops are microseconds long; intra-op threads only add contention on the shared 2-core box.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    """The `tiny` preset written as a Hugging Face style checkpoint directory."""
    return write_tiny(tmp_path_factory.mktemp("tiny"))
