"""The wire contract (sits/wire/) sits between the engine and the control plane: the engine and the kernels never
import the control plane (or the dashboards), the contract imports neither side, and its data modules import nothing
at all, so the pure analysis may use them. tests/control_plane/test_slim.py holds the other direction."""
import ast
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from sits.engine.server.metrics import EngineMetrics, MetricLabels
from sits.wire import headers, metrics

ROOT = Path(__file__).resolve().parents[1]
WIRE = ROOT / "sits" / "wire"
DATA_MODULES = ("metrics.py", "buckets.py", "headers.py", "models.py", "zygote.py")


def _sits_imports(path: Path) -> set[str]:
    """Every module `path` imports, `sits.`-prefixed names as written (`from sits import x` gives `sits.x`)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module == "sits":
            out |= {f"sits.{a.name}" for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
    return out


def _top(module: str) -> str:
    return module.removeprefix("sits.").split(".")[0]


def _offenders(folder: Path, forbidden: set[str]) -> dict[str, list[str]]:
    bad = {str(p.relative_to(ROOT)): sorted(m for m in _sits_imports(p) if _top(m) in forbidden)
           for p in sorted(folder.rglob("*.py"))}
    return {k: v for k, v in bad.items() if v}


def test_the_engine_and_the_kernels_never_import_the_control_plane():
    assert len(list((ROOT / "engine").rglob("*.py"))) > 20   # the walk sees the engine's modules
    assert _offenders(ROOT / "engine", {"control_plane", "dashboards"}) == {}
    assert _offenders(ROOT / "kernels", {"control_plane", "dashboards"}) == {}


def test_the_wire_contract_imports_neither_side():
    assert _offenders(WIRE, {"engine", "kernels", "control_plane", "dashboards", "torch", "flask", "kubernetes"}) == {}


def test_the_contract_data_modules_import_only_the_standard_typing():
    # the decision core (control_plane/analysis) imports these: they must stay free of I/O and frameworks
    got = {name: sorted(_sits_imports(WIRE / name) - {"__future__", "typing"}) for name in DATA_MODULES}
    assert got == {name: [] for name in DATA_MODULES}


def test_the_engine_server_loads_no_control_plane_module():
    code = ("import sys, json; import sits.engine.server.main, sits.engine.server.app, sits.engine.server.metrics, "
            "sits.engine.server.tracing; print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('flask', 'kubernetes', 'grafanalib') or m.startswith(('sits.control_plane', 'sits.dashboards')))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.splitlines()[-1]) == []


def test_the_engine_exposes_every_contract_metric_with_its_labels():
    m = EngineMetrics(MetricLabels("canary", "chat", "v2"), model="tiny", kernel_set="torch")
    m.observe_http("/v1/completions", 200, 0.01)
    for observe in (m.observe_ttft, m.observe_itl, m.observe_e2e, m.observe_queue_time, m.observe_step):
        observe(0.01)
    m.observe_tokens(5, 7)
    m.count_inference("/v1/completions", replay=True, stream=False)
    m.count_probe(200)
    m.set_stats_source(lambda: SimpleNamespace(
        prompt_tokens_total=5, generation_tokens_total=7, num_preemptions=0, prefix_cache_queries=5,
        prefix_cache_hits=0, num_running=1, num_waiting=0, kv_cache_usage=0.1, num_free_blocks=9, num_total_blocks=10,
        device_memory_bytes=1 << 20))
    text = m.render().decode()
    families = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    assert set(metrics.LATENCY_HISTOGRAMS) | {metrics.PROMPT_TOKENS, metrics.GENERATION_TOKENS} <= families
    # counters are exposed with _total, the info metric with _info
    assert {metrics.INFERENCE_REQUESTS + "_total", metrics.PROBE_REQUESTS + "_total", metrics.ENGINE_INFO_METRIC} \
        <= families
    engine_state = {metrics.PROMPT_TOKENS_TOTAL, metrics.GENERATION_TOKENS_TOTAL, metrics.PREEMPTIONS,
                    metrics.PREFIX_CACHE_QUERIES, metrics.PREFIX_CACHE_HITS}
    assert {name + "_total" for name in engine_state} | {
        metrics.REQUESTS_RUNNING, metrics.REQUESTS_WAITING, metrics.KV_CACHE_USAGE, metrics.KV_CACHE_FREE_BLOCKS,
        metrics.KV_CACHE_TOTAL_BLOCKS, metrics.DEVICE_MEMORY} <= families
    assert _labels(text, metrics.REQUEST_LATENCY + "_count") == set(metrics.HTTP_LABELS)
    for name in (metrics.TTFT, metrics.ITL, metrics.E2E, metrics.QUEUE_TIME):
        assert _labels(text, name + "_count") == set(metrics.ENGINE_LABELS), name
    assert f'{metrics.ORIGIN}="{metrics.ORIGIN_REPLAY}"' in text
    assert metrics.ENGINE_INFO_METRIC + "{" in text and 'kernel_version="v2"' in text


def _labels(text: str, sample: str) -> set[str]:
    (line,) = [x for x in text.splitlines() if x.startswith(sample + "{")]
    return {pair.split("=", 1)[0] for pair in line[len(sample) + 1:line.index("}")].split(",")}


def test_the_marks_are_read_case_insensitively_and_only_as_1():
    asgi = [(b"x-sits-probe", b"1"), (b"x-sits-replay", b"0")]
    assert headers.marked_raw(asgi, headers.PROBE_HEADER) and not headers.marked_raw(asgi, headers.REPLAY_HEADER)
    assert headers.marked({headers.REPLAY_HEADER: " 1 "}, headers.REPLAY_HEADER)
    assert not headers.marked({headers.REPLAY_HEADER: "yes"}, headers.REPLAY_HEADER)


def test_the_engines_presets_are_the_names_the_contract_gives():
    # the control plane accepts a rollout's model by these names (control_plane/validation.py)
    from sits.engine.model.presets import PRESETS
    from sits.engine.server.main import PRESET_NAMES as served
    from sits.wire.models import PRESET_NAMES
    assert set(PRESETS) == set(PRESET_NAMES) and served is PRESET_NAMES
