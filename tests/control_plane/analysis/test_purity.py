"""The decision core imports no I/O frameworks and nothing from the engine (ARCHITECTURE.md: pure analysis), and
from the control plane only other pure modules."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CP = ROOT / "control_plane"
# the pure packages, whatever modules they grow, and the two vocabularies every layer shares
# (view/: the read model of stored checks every renderer shares)
PURE = (sorted((CP / "analysis").glob("*.py")) + sorted((CP / "rollout").glob("*.py"))
        + sorted((CP / "view").glob("*.py")) + [CP / "errors.py", CP / "validation.py", CP / "numbers.py"])
FORBIDDEN = {"flask", "kubernetes", "requests", "torch", "engine", "urllib", "http", "socket", "sqlite3",
             "subprocess", "threading", "numpy", "time"}


def _imports(path: Path) -> set[str]:
    mods = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            mods |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module == "sits":   # from sits import engine
            mods |= {f"sits.{a.name}" for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            mods.add(node.module)
    return mods


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return "sits." + ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_pure_modules_import_nothing_forbidden():
    assert len(PURE) >= 12 and all(p.exists() for p in PURE)
    bad = {p.name: sorted(m for m in _imports(p) if m.removeprefix("sits.").split(".")[0] in FORBIDDEN)
           for p in PURE}
    assert {k: v for k, v in bad.items() if v} == {}


def test_pure_modules_import_only_pure_control_plane_modules():
    pure = {_module(p) for p in PURE} | {"sits.control_plane"}
    assert {"sits.control_plane.rollout", "sits.control_plane.rollout.machine", "sits.control_plane.analysis",
            "sits.control_plane.view.check"} <= pure
    impure = {p.name: sorted(m for m in _imports(p) if m.startswith("sits.control_plane") and m not in pure)
              for p in PURE}
    assert {k: v for k, v in impure.items() if v} == {}
