"""The image the chart runs (building it needs a container runtime, which this machine lacks): the Dockerfile copies
every package the project installs, has its CUDA and CPU variants, and runs as the user the chart expects."""
import ast
import re

import yaml

from tests.helm.support import CHART, ROOT


def test_dockerfile_matches_the_project_and_the_chart():
    text = (ROOT / "Dockerfile").read_text()
    copied = set(re.findall(r"^COPY (\w+) \1$", text, re.M))
    folders = re.search(r"^FOLDERS = (\(.*?\))$", (ROOT / "setup.py").read_text(), re.M).group(1)
    assert copied == {"sits", *ast.literal_eval(folders)}   # the sits namespace and every folder it maps
    assert re.search(r"^COPY pyproject.toml setup.py README.md ./$", text, re.M)
    # the exact versions of the lock (torch comes from its own index: its CPU pin is dropped there)
    assert "COPY constraints/lock.txt constraints/lock.txt" in text and "-c /tmp/lock.txt" in text
    assert re.search(r"^FROM \$\{CUDA_BASE\} AS os-cuda$", text, re.M) and \
        re.search(r"^FROM \$\{CPU_BASE\} AS os-cpu$", text, re.M) and "FROM os-${VARIANT}" in text
    # the control plane's image (the chart's default) installs the project without the engine extra: no torch
    control = re.search(r"^FROM \$\{CPU_BASE\} AS os-control\n(.*?)\n\n", text, re.M | re.S)
    assert control and 'TORCH_INDEX="" EXTRA=""' in control.group(1) and 'pip install --no-cache-dir -c /tmp/lock.txt ".${EXTRA}"' in text
    assert text.count('EXTRA="[engine]"') == 2
    uid = yaml.safe_load((CHART / "values.yaml").read_text())["podSecurityContext"]["runAsUser"]
    assert re.search(rf"^USER {uid}:{uid}$", text, re.M)
    assert "HOME=/tmp" in text and "TRITON_CACHE_DIR=/tmp/" in text   # the chart's writable /tmp (read-only root)
