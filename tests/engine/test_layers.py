"""The engine's layers (docs/layout.md, ARCHITECTURE.md): its subpackages and top-level modules import one way, down
this list, and the kernels never import the engine. Imports are read with ast, those inside functions included."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "engine"

# top first; a unit imports only units of the layers below its own (never one beside it)
LAYERS = [
    {"cli"},                                    # sits-engine: serve, generate, kernels
    {"server"},                                 # the HTTP server, its metrics and spans
    {"core"},                                   # the engine loop behind the server: a thread, or a process of its own
    {"llm"},                                    # the offline API
    {"llm_engine"},                             # LLMEngine: requests in, a scheduled and executed step out
    {"parallel"},                               # tensor parallelism: the process group, the worker ranks
    {"execution"},                              # a scheduled step on the device: model runner, CUDA graphs, warm-up
    {"model", "scheduling"},                    # the network and its loading; which sequences run (torch-free)
    {"config", "sampling_params", "outputs"},   # the vocabulary every layer speaks
    {"errors"},
]
LAYER_OF = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}


def _imports(path: Path) -> set[str]:
    """Every module `path` imports (`from a.b import c` gives `a.b.c` as well: c may be a module)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            raise AssertionError(f"{path}: relative import (write sits.engine.X)")
    return out


def _unit(path: Path) -> str:
    """The engine unit a file belongs to: its subpackage, or the top-level module itself."""
    return path.relative_to(ENGINE).with_suffix("").parts[0]


def _units(module: str) -> set[str]:
    parts = module.split(".")
    if parts[:2] != ["sits", "engine"]:
        return set()
    return {parts[2]} if len(parts) > 2 and parts[2] in LAYER_OF else {"sits.engine"}


def _edges() -> dict[tuple[str, str], list[str]]:
    """(importer unit, imported unit) -> the files that make the edge."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in sorted(ENGINE.rglob("*.py")):
        if path == ENGINE / "__init__.py":
            continue
        src = _unit(path)
        for dst in set().union(*map(_units, _imports(path))) - {src}:
            edges.setdefault((src, dst), []).append(str(path.relative_to(ROOT)))
    return edges


def test_every_unit_has_a_layer():
    units = {_unit(p) for p in ENGINE.rglob("*.py") if p != ENGINE / "__init__.py"}
    assert {"scheduling", "execution", "model", "core", "server", "llm_engine"} <= units
    assert units == set(LAYER_OF), "put the new module or package in LAYERS (and docs/layout.md)"


def test_no_engine_module_imports_the_package_front():
    # `from sits.engine import LLMEngine` hides which layer it reaches: inside the engine, name the module
    assert {edge: files for edge, files in _edges().items() if edge[1] == "sits.engine"} == {}


def test_no_two_units_import_each_other():
    edges = _edges()
    both = {tuple(sorted(e)): (edges[e], edges[e[::-1]]) for e in edges if e[::-1] in edges}
    assert both == {}


def test_imports_run_down_the_layers():
    edges = _edges()
    assert len(edges) >= 25   # the walk sees the engine's imports
    up = {f"{a} -> {b}": files for (a, b), files in edges.items()
          if b in LAYER_OF and LAYER_OF[b] <= LAYER_OF[a]}
    assert up == {}


def test_the_kernels_never_import_the_engine():
    bad = {str(p.relative_to(ROOT)): sorted(m for m in _imports(p) if m.startswith("sits.engine"))
           for p in sorted((ROOT / "kernels").rglob("*.py"))}
    assert len(bad) > 10 and {k: v for k, v in bad.items() if v} == {}
