import pytest

from sits.engine.model.loader import write_tiny


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    """The `tiny` preset written as a Hugging Face style checkpoint directory."""
    return write_tiny(tmp_path_factory.mktemp("tiny"))
