import sys
from pathlib import Path

import pytest

from sits.control_plane.adapters.deploy.local import process
from tests.waiting import wait_http_ok

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory):
    """Three real HTTP upstream processes named after the roles: {role: base_url}."""
    d = tmp_path_factory.mktemp("upstreams")
    procs, urls = [], {}
    try:
        for role in ("production", "baseline", "canary"):
            port = process.free_port()
            p = process.spawn([sys.executable, str(HERE / "upstream_server.py"), "--name", role, "--port", str(port)],
                              log_path=d / f"{role}.log")
            procs.append(p)
            urls[role] = f"http://127.0.0.1:{port}"
        for p, url in zip(procs, urls.values()):
            wait_http_ok(url + "/readyz", 30, p)
        yield urls
    finally:
        for p in procs:
            process.stop(p, 5)
