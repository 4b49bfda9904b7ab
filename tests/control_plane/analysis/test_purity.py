"""The decision core imports no I/O frameworks and nothing from the engine (ARCHITECTURE.md: pure analysis)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PURE = sorted((ROOT / "control_plane" / "analysis").glob("*.py")) + [ROOT / "control_plane" / "rollout.py"]
FORBIDDEN = {"flask", "kubernetes", "requests", "torch", "engine", "urllib", "http", "socket", "sqlite3",
             "subprocess", "threading", "numpy", "time"}


def _imports(path: Path) -> set[str]:
    mods = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            mods |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            mods.add(node.module.split(".")[0])
    return mods


def test_pure_modules_import_nothing_forbidden():
    assert len(PURE) >= 8
    bad = {p.name: sorted(_imports(p) & FORBIDDEN) for p in PURE if _imports(p) & FORBIDDEN}
    assert bad == {}
