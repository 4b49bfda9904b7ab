"""The control plane runs without the engine: no module of it imports `engine` or `kernels` (kernel sets reach it as
a catalogue, engines as processes), and importing its entry points loads neither torch nor Triton."""
import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_no_control_plane_module_imports_the_engine_or_the_kernels():
    bad = {}
    for path in sorted((ROOT / "control_plane").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [f"sits.{a.name}" for a in node.names] if isinstance(node, ast.ImportFrom)
                     and node.module == "sits"
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                     else [])
            hits = [n for n in names if n.removeprefix("sits.").split(".")[0] in ("engine", "kernels", "torch",
                                                                                   "triton")]
            if hits:
                bad[str(path.relative_to(ROOT))] = hits
    assert bad == {}


def test_importing_the_cli_the_app_and_the_worker_loads_no_torch_or_triton():
    code = ("import sys, json; import sits.control_plane.cli.main, sits.control_plane.web, "
            "sits.control_plane.worker.loop, sits.control_plane.demo.runner; print(json.dumps(sorted(m for m in "
            "sys.modules if m.removeprefix('sits.').split('.')[0] in ('torch', 'triton', 'engine', 'kernels', "
            "'numpy'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
