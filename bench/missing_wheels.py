"""Print the wheels in a directory whose distribution this interpreter does not have yet, one path per line.

bench/gpu_session.sh installs only these into its side directory: a carried wheel of something the machine already
has (huggingface_hub, requests, ...) would shadow the machine's own version and can break what depends on it there
(transformers refuses a huggingface_hub outside its range). A wheel whose version is not the one constraints/lock.txt
pins is refused (exit 2): fetch them with bench/fetch_wheels.sh.

    python3 bench/missing_wheels.py .whl
"""
from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path


def canonical(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


LOCK = Path(__file__).resolve().parents[1] / "constraints" / "lock.txt"


def locked_versions(lock: Path = LOCK) -> dict[str, str]:
    pins = (line.split("==", 1) for line in lock.read_text().splitlines() if "==" in line and not line.startswith("#"))
    return {canonical(name): version.strip() for name, version in pins}


def off_lock(wheels: list[Path], pins: dict[str, str]) -> list[str]:
    """'NAME VERSION (lock: V)' for each wheel that the lock pins to another version."""
    bad = []
    for w in wheels:
        name, version = w.name.split("-")[:2]
        want = pins.get(canonical(name))
        if want is not None and want != version:
            bad.append(f"{name} {version} (lock: {want})")
    return bad


def missing(wheel_dir: Path) -> list[Path]:
    have = {canonical(d.metadata["Name"]) for d in metadata.distributions() if d.metadata["Name"]}
    return sorted(w for w in wheel_dir.glob("*.whl") if canonical(w.name.split("-")[0]) not in have)


if __name__ == "__main__":
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        sys.exit(__doc__.strip().splitlines()[-1].strip() + "   (a directory of .whl files)")
    wanted = missing(Path(sys.argv[1]))
    bad = off_lock(wanted, locked_versions())
    if bad:
        print("not the lock's versions (bash bench/fetch_wheels.sh fetches them): " + ", ".join(bad), file=sys.stderr)
        sys.exit(2)
    for w in wanted:   # nothing at all when nothing is missing: an empty line would reach pip as a requirement
        print(w)
