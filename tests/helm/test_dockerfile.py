"""The image the chart runs (building it needs a container runtime, which this machine lacks): the Dockerfile copies
every package the project installs, has its CUDA and CPU variants, and runs as the user the chart expects."""
import re
import tomllib

import yaml

from tests.helm.support import CHART, ROOT


def test_dockerfile_matches_the_project_and_the_chart():
    text = (ROOT / "Dockerfile").read_text()
    copied = set(re.findall(r"^COPY (\w+) \1$", text, re.M))
    includes = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    assert copied == {p.rstrip("*") for p in includes}
    assert re.search(r"^FROM \$\{CUDA_BASE\} AS os-cuda$", text, re.M) and \
        re.search(r"^FROM \$\{CPU_BASE\} AS os-cpu$", text, re.M) and "FROM os-${VARIANT}" in text
    # the control plane's image (the chart's default) installs the project without the engine extra: no torch
    control = re.search(r"^FROM \$\{CPU_BASE\} AS os-control\n(.*?)\n\n", text, re.M | re.S)
    assert control and 'TORCH_INDEX="" EXTRA=""' in control.group(1) and 'pip install --no-cache-dir ".${EXTRA}"' in text
    assert text.count('EXTRA="[engine]"') == 2
    uid = yaml.safe_load((CHART / "values.yaml").read_text())["podSecurityContext"]["runAsUser"]
    assert re.search(rf"^USER {uid}:{uid}$", text, re.M)
    assert "HOME=/tmp" in text and "TRITON_CACHE_DIR=/tmp/" in text   # the chart's writable /tmp (read-only root)
