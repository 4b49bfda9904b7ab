"""The control plane's packages import one way (ARCHITECTURE.md, "Layers and imports"): cli -> demo -> web / worker /
crd -> service -> store -> adapters -> router -> rollout -> view -> analysis, each only from the layers below it; the
shared modules beside them (errors, validation, numbers, redact, small_files) from nothing above analysis.
Function-level imports count too."""
import ast
from pathlib import Path

CP = Path(__file__).resolve().parents[2] / "control_plane"
LAYERS = [{"cli"}, {"demo"}, {"web", "worker", "crd"}, {"service"}, {"store"}, {"adapters"}, {"router"}, {"rollout"},
          {"view"}, {"analysis"}]
SHARED = {"errors", "validation", "numbers", "redact", "small_files"}
RANK = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}


def _part(path: Path) -> str:
    """The layer package or shared module a file of control_plane/ belongs to."""
    first = path.relative_to(CP).parts[0]
    return first.removesuffix(".py")


def _imported_parts(path: Path) -> set[str]:
    """The control_plane packages and modules `path` imports (sits.control_plane.<part>...)."""
    parts = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "sits.control_plane":
            names = [f"sits.control_plane.{a.name}" for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        parts |= {n.split(".")[2] for n in names if n.startswith("sits.control_plane.")}
    return parts


def test_every_package_has_a_layer():
    found = {_part(p) for p in CP.rglob("*.py")} - {"__init__"}
    assert found == set(RANK) | SHARED, "place a new package in LAYERS (and ARCHITECTURE.md)"


def test_imports_run_one_way():
    bad = []
    for path in sorted(CP.rglob("*.py")):
        src = _part(path)
        for dst in _imported_parts(path) - {src}:
            allowed = (dst in SHARED | {"analysis"}) if src in SHARED | {"__init__"} else \
                dst in SHARED or RANK.get(dst, -1) > RANK[src]
            if not allowed:
                bad.append(f"{path.relative_to(CP)} imports {dst}")
    assert bad == []

