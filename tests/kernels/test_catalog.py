"""The control plane's kernel catalogue is the registry as data: the committed copy equals what the registry says,
and the installed engine's answer (`sits-engine kernels --json`) lists plugin sets too."""
import json
import os
import sys

import pytest

from sits.control_plane.adapters.kernel_catalog import CatalogError, KernelCatalog
from sits.control_plane.errors import ValidationError
from sits.kernels.catalog import SHIPPED, builtin_catalogue, catalogue


def test_the_committed_catalogue_equals_the_registry():
    shipped = json.loads(SHIPPED.read_text())["kernel_sets"]
    # builtin_catalogue: the sets kernels/sets.py registers (other tests of this process register their own)
    assert shipped == builtin_catalogue(), "regenerate it: python -m sits.kernels.catalog --write"
    assert [e["name"] for e in shipped] == ["torch", "triton-v1", "triton-v1.1", "triton-v1.2", "torch-wrong-rope",
                                            "torch-slow-attn", "triton-v1-unsplit", "triton-v1-floor-pages"]


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


def test_a_broken_catalogue_is_a_clear_error(tmp_path):
    bad = tmp_path / "cat.json"
    bad.write_text('{"kernel_sets": [{"name": "x"}]}')
    with pytest.raises(CatalogError, match="lacks 'version'"):
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
