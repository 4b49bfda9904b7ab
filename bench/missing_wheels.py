"""Print the wheels in a directory whose distribution this interpreter does not have yet, one path per line.

bench/gpu_session.sh installs only these into its side directory: a carried wheel of something the machine already
has (huggingface_hub, requests, ...) would shadow the machine's own version and can break what depends on it there
(transformers refuses a huggingface_hub outside its range).

    python3 bench/missing_wheels.py .whl
"""
from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path


def canonical(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def missing(wheel_dir: Path) -> list[Path]:
    have = {canonical(d.metadata["Name"]) for d in metadata.distributions() if d.metadata["Name"]}
    return sorted(w for w in wheel_dir.glob("*.whl") if canonical(w.name.split("-")[0]) not in have)


if __name__ == "__main__":
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        sys.exit(__doc__.strip().splitlines()[-1].strip() + "   (a directory of .whl files)")
    print("\n".join(str(w) for w in missing(Path(sys.argv[1]))))
