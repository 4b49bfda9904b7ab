"""Writes the built-in kernel sets' catalogue, from the registry, to the three places that read it as data: the
engine's `sits.kernels.catalog.identity` (kernels/catalog.json), the control plane, which never imports the kernels
(control_plane/adapters/kernel_catalog.json), and the Helm chart (helm/sits-control/files/kernel-catalog.json).
A build step, run on purpose after a kernel set changes (it imports torch); commit what it writes:

    make catalog                               # = PYTHONPATH=. python .ci/kernel_catalog.py
    python .ci/kernel_catalog.py --check       # exit 1 naming each copy that differs from the registry

`--root DIR` writes or checks the copies under DIR instead of this checkout (tests/kernels/test_catalog.py).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sits.kernels.catalog import builtin_catalogue, dumps

ROOT = Path(__file__).resolve().parents[1]
COPIES = ("kernels/catalog.json", "control_plane/adapters/kernel_catalog.json",
          "helm/sits-control/files/kernel-catalog.json")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog=".ci/kernel_catalog.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if a copy differs from the registry")
    p.add_argument("--root", type=Path, default=ROOT, help="the checkout whose copies are written or checked")
    a = p.parse_args(argv)
    text = dumps(builtin_catalogue())
    paths = [a.root / c for c in COPIES]
    if a.check:
        stale = [str(path) for path in paths if not path.is_file() or path.read_text() != text]
        for path in stale:
            print(f"differs from the registry: {path} (regenerate: make catalog)", file=sys.stderr)
        return 1 if stale else 0
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
