"""The control plane's kernel catalogue is the registry as data: every committed copy (the engine's, the control
plane's, the chart's) equals what the registry says, `make catalog` (.ci/kernel_catalog.py) writes them, and the
installed engine's answer (`sits-engine kernels --json`) lists plugin sets too."""
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from sits.control_plane.adapters import kernel_catalog
from sits.control_plane.adapters.kernel_catalog import CatalogError, KernelCatalog, KernelSetInfo
from sits.control_plane.errors import ValidationError
from sits.kernels import catalog as kernels_catalog
from sits.kernels.catalog import builtin_catalogue, catalogue, dumps

ROOT = Path(__file__).resolve().parents[2]
CHART_COPY = ROOT / "helm" / "sits-control" / "files" / "kernel-catalog.json"


def _tool():
    spec = importlib.util.spec_from_file_location("kernel_catalog_tool", ROOT / ".ci" / "kernel_catalog.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_committed_catalogue_equals_the_registry():
    # builtin_catalogue: the sets kernels/sets.py registers (other tests of this process register their own); the
    # copies: what identity() reads, what the control plane reads, what the chart mounts
    for path in (kernels_catalog.SHIPPED, kernel_catalog.SHIPPED, CHART_COPY):
        shipped = json.loads(path.read_text())["kernel_sets"]
        assert shipped == builtin_catalogue(), f"{path} is stale: regenerate it with `make catalog`"
    assert [e["name"] for e in shipped] == ["torch", "triton-v1", *(f"triton-v1.{i}" for i in range(1, 27)),
                                            "torch-wrong-rope", "torch-slow-attn", "triton-v1-unsplit",
                                            "triton-v1-floor-pages"]


def test_the_catalogue_tool_writes_every_copy_and_checks_them(tmp_path, capsys):
    tool = _tool()
    assert tool.main(["--check", "--root", str(tmp_path)]) == 1   # nothing written yet: every copy differs
    assert tool.main(["--root", str(tmp_path)]) == 0
    written = [tmp_path / c for c in tool.COPIES]
    assert {p.relative_to(tmp_path).as_posix() for p in written} == {
        p.relative_to(ROOT).as_posix() for p in (kernels_catalog.SHIPPED, kernel_catalog.SHIPPED, CHART_COPY)}
    assert all(p.read_text() == dumps(builtin_catalogue()) for p in written)
    assert tool.main(["--check", "--root", str(tmp_path)]) == 0
    written[1].write_text(written[1].read_text().replace('"torch"', '"torch-renamed"', 1))
    capsys.readouterr()
    assert tool.main(["--check", "--root", str(tmp_path)]) == 1
    assert capsys.readouterr().err.count("differs from the registry") == 1


def test_parents_and_overrides_follow_derive():
    by = {e["name"]: e for e in catalogue()}
    assert by["torch"]["parent"] is None and by["torch"]["overrides"] == []
    assert by["triton-v1.1"]["parent"] == "triton-v1" and by["triton-v1.1"]["overrides"] == ["prefill_attention"]
    assert by["triton-v1.2"]["parent"] == "triton-v1.1" and by["triton-v1.2"]["overrides"] == ["linear"]
    assert by["torch-wrong-rope"]["parent"] == "torch" and by["torch-wrong-rope"]["overrides"] == ["rope_and_cache"]


def test_the_installed_engine_lists_a_plugin_set(tmp_path, monkeypatch):
    (tmp_path / "catalog_plugin.py").write_text(
        "from sits import kernels\n"
        "kernels.register_kernel_set(kernels.get_kernel_set('torch').derive('plugin-cat', '0.2.0'))\n")
    monkeypatch.setenv("SITS_KERNEL_PLUGINS", "catalog_plugin")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    cat = KernelCatalog.from_engine((sys.executable, "-m", "sits.engine.cli", "kernels", "--json"))
    info = cat.require("plugin-cat", "kernels")
    assert (info.version, info.parent, info.overrides) == ("0.2.0", "torch", ())
    assert "plugin-cat" not in KernelCatalog.shipped()
    with pytest.raises(ValidationError) as e:
        cat.require("no-such-set", "production_kernels")
    assert e.value.field == "production_kernels" and "plugin-cat" in str(e.value)


def test_the_control_plane_knows_which_kv_pages_each_set_reads():
    cat = KernelCatalog.shipped()
    assert cat.get("triton-v1.2").kv_cache_dtypes == ("auto",) and cat.get("triton-v1.8").kv_cache_dtypes == (
        "auto", "fp8")
    assert cat.kv_cache_dtype_problem("triton-v1.8", ("--kv-cache-dtype", "fp8"), "args") is None
    assert cat.kv_cache_dtype_problem("triton-v1.2", ("--seed", "7"), "args") is None   # auto, the default
    why = cat.kv_cache_dtype_problem("triton-v1.1", ("--kv-cache-dtype", "fp8"), "args")
    assert why.startswith("args: --kv-cache-dtype fp8 needs a kernel set that reads such KV pages; triton-v1.1 "
                          "reads auto only (kernel sets that read fp8: torch, triton-v1.3, triton-v1.4, ")
    # a catalogue that does not say (an older engine's) is not second-guessed
    old = KernelCatalog.parse(json.dumps({"kernel_sets": [{"name": "x", "version": "1", "devices": ["cpu"]}]}), "t")
    assert old.get("x").kv_cache_dtypes is None and "kv_cache_dtypes" not in old.get("x").to_dict()
    assert old.kv_cache_dtype_problem("x", ("--kv-cache-dtype", "fp8"), "args") is None
    assert KernelSetInfo.from_dict(cat.get("triton-v1.8").to_dict()) == cat.get("triton-v1.8")


def test_a_broken_catalogue_is_a_clear_error(tmp_path):
    bad = tmp_path / "cat.json"
    bad.write_text('{"kernel_sets": [{"name": "x"}]}')
    with pytest.raises(CatalogError, match="lacks 'version'"):
        KernelCatalog.from_file(bad)
    bad.write_text('{"kernel_sets": [{"name": "x", "version": "1", "devices": [], "kv_cache_dtypes": "fp8"}]}')
    with pytest.raises(CatalogError, match="kv_cache_dtypes must be a non-empty list"):
        KernelCatalog.from_file(bad)
    with pytest.raises(CatalogError, match="cannot read"):
        KernelCatalog.from_file(tmp_path / "missing.json")
    with pytest.raises(CatalogError, match="exited with 2"):
        KernelCatalog.from_engine((sys.executable, "-m", "sits.engine.cli", "kernels", "--no-such-flag"))


def test_discover_asks_the_engine_only_for_a_set_the_built_ins_lack(tmp_path, monkeypatch):
    (tmp_path / "need_plugin.py").write_text(
        "from sits import kernels\n"
        "kernels.register_kernel_set(kernels.get_kernel_set('torch').derive('plugin-need', '0.3.0'))\n")
    monkeypatch.setenv("SITS_KERNEL_PLUGINS", "need_plugin")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    assert KernelCatalog.discover(need=("torch", "triton-v1.1")).source.startswith("built-in")
    asked = KernelCatalog.discover(need=("plugin-need", "torch"))
    assert asked.source.startswith("the installed engine") and "plugin-need" in asked


def test_discover_without_plugins_lists_the_built_in_sets_and_starts_no_engine(monkeypatch):
    from sits.control_plane.adapters import kernel_catalog
    from sits.kernels import registry
    assert kernel_catalog.PLUGINS_ENV == registry.PLUGINS_ENV == "SITS_KERNEL_PLUGINS"   # the same variable
    monkeypatch.delenv("SITS_KERNEL_PLUGINS", raising=False)
    asked = []
    monkeypatch.setattr(KernelCatalog, "from_engine", classmethod(lambda cls, *a, **k: asked.append(a) or cls.shipped()))
    got = KernelCatalog.discover()
    assert got.source.startswith("built-in") and "torch" in got and asked == []
    monkeypatch.setenv("SITS_KERNEL_PLUGINS", " , ")    # names no module: still none to ask for
    assert KernelCatalog.discover().source.startswith("built-in") and asked == []
    monkeypatch.setenv("SITS_KERNEL_PLUGINS", "someone_elses_kernels")
    KernelCatalog.discover()
    assert len(asked) == 1
