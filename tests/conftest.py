import importlib.util
import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _exists(mod: str) -> bool:
    try:
        return importlib.util.find_spec(mod) is not None
    except ModuleNotFoundError:
        return False


# Shared fixtures that start real servers (see tests/fixtures/).
pytest_plugins = [m for m in ("tests.fixtures.prometheus", "tests.fixtures.kube") if _exists(m)]
