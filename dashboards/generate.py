"""Load every `*.dashboard.py` here and turn it into the JSON Grafana imports."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from grafanalib._gen import DashboardEncoder

HERE = Path(__file__).resolve().parent


class DashboardDefinitionError(Exception):
    """A *.dashboard.py file that does not define a module-level `dashboard`."""


def sources() -> dict[str, Path]:
    """name -> path of every dashboard definition, e.g. {"canary": .../canary.dashboard.py}."""
    return {p.name.removesuffix(".dashboard.py"): p for p in sorted(HERE.glob("*.dashboard.py"))}


def load(path: Path):
    spec = importlib.util.spec_from_file_location(f"dashboards._defs.{path.stem.replace('.', '_').replace('-', '_')}",
                                                  path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "dashboard"):
        raise DashboardDefinitionError(f"{path.name} defines no module-level `dashboard`")
    return module.dashboard


def to_json(dashboard) -> str:
    return json.dumps(dashboard.to_json_data(), sort_keys=True, indent=2, cls=DashboardEncoder) + "\n"


def render_all() -> dict[str, str]:
    """file name -> JSON text, e.g. {"canary.json": "{...}"}."""
    return {f"{name}.json": to_json(load(path)) for name, path in sources().items()}


def write_all(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_all().items():
        (out / name).write_text(text)
        written.append(out / name)
    return written
