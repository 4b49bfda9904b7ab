import pytest
import torch

from sits import kernels
from sits.kernels import KernelSetError, UnknownKernelSetError, get_kernel_set, list_kernel_sets, register_kernel_set
from sits.kernels.registry import OP_NAMES, unregister_kernel_set


def test_torch_set_is_registered_with_all_ops():
    assert "torch" in list_kernel_sets()
    ks = get_kernel_set("torch")
    assert (ks.name, ks.version, ks.devices) == ("torch", "1.0.0", ("cpu", "cuda"))
    assert ks.description
    for op in OP_NAMES:
        assert callable(getattr(ks, op))
    assert ks.supports("cuda:1") and ks.supports("cpu")


def test_unknown_name_lists_known_sets():
    with pytest.raises(UnknownKernelSetError) as ei:
        get_kernel_set("triton-v999")
    assert isinstance(ei.value, KeyError)
    msg = str(ei.value)
    assert "triton-v999" in msg and "torch" in msg
    assert "torch" in ei.value.known


def test_derive_overrides_one_op_and_reuses_the_rest():
    base = get_kernel_set("torch")

    def my_silu_and_mul(x):
        return base.silu_and_mul(x)

    canary = base.derive("torch-canary-test", "1.1.0-rc.1", silu_and_mul=my_silu_and_mul)
    assert canary.silu_and_mul is my_silu_and_mul
    assert canary.rms_norm is base.rms_norm and canary.linear is base.linear
    assert "silu_and_mul" in canary.description
    register_kernel_set(canary)
    try:
        assert get_kernel_set("torch-canary-test") is canary
        assert list_kernel_sets().count("torch-canary-test") == 1
        with pytest.raises(KernelSetError, match="already registered"):
            register_kernel_set(base.derive("torch-canary-test", "1.2.0"))
        register_kernel_set(base.derive("torch-canary-test", "1.2.0"), replace=True)
        assert get_kernel_set("torch-canary-test").version == "1.2.0"
    finally:
        unregister_kernel_set("torch-canary-test")
    assert "torch-canary-test" not in list_kernel_sets()


@pytest.mark.parametrize("kwargs, match", [
    ({"version": "1.0"}, "semver"),
    ({"version": "v1.0.0"}, "semver"),
    ({"devices": ("tpu",)}, "devices"),
    ({"devices": ()}, "devices"),
    ({"rms_norm": None}, "rms_norm"),
])
def test_malformed_sets_are_rejected(kwargs, match):
    ops = {"name": "bad", "version": "1.0.0", "devices": ("cpu",)}
    ops.update({k: v for k, v in kwargs.items() if k in ("version", "devices")})
    extra = {k: v for k, v in kwargs.items() if k not in ("version", "devices")}
    with pytest.raises(KernelSetError, match=match):
        get_kernel_set("torch").derive(ops["name"], ops["version"], devices=ops["devices"], **extra)


def test_a_fused_op_is_inherited_until_an_op_it_fuses_is_replaced():
    v15, v16 = get_kernel_set("triton-v1.5"), get_kernel_set("triton-v1.6")
    fused = v16.silu_and_mul_linear
    assert "silu_and_mul_linear" in kernels.FUSED_OPS and "silu_and_mul_linear" in v16.ops()
    assert "silu_and_mul_linear" not in v15.ops() and v15.op("silu_and_mul_linear") is not None
    assert v16.derive("fused-kept", "1.0.0", rms_norm=v15.rms_norm).silu_and_mul_linear is fused
    assert "silu_and_mul_linear" in v16.derive("fused-kept", "1.0.0").catalogue_entry()["ops"]

    def my_linear(x, w, b=None):
        return v16.linear(x, w, b)
    new_linear = v16.derive("new-linear", "1.0.0", linear=my_linear)   # the new linear must run for the MLP too
    assert new_linear.silu_and_mul_linear is None and new_linear.overrides == ("linear",)
    assert "silu_and_mul_linear" not in new_linear.catalogue_entry()["ops"]
    assert "linear" in new_linear.description and "silu_and_mul_linear" not in new_linear.description
    assert v16.derive("new-act", "1.0.0", silu_and_mul=v15.silu_and_mul).silu_and_mul_linear is None
    both = v16.derive("both", "1.0.0", linear=my_linear, silu_and_mul_linear=fused)
    assert both.silu_and_mul_linear is fused and both.overrides == ("linear", "silu_and_mul_linear")
    # where a set has none, op() composes its own two: the engine runs exactly that
    calls = []
    torch_set = get_kernel_set("torch")
    traced = torch_set.derive("traced", "1.0.0", linear=lambda x, w, b=None: calls.append(x.shape) or
                              torch_set.linear(x, w, b))
    x, w = torch.randn(3, 8), torch.randn(5, 4)
    assert torch.equal(traced.op("silu_and_mul_linear")(x, w), torch_set.linear(torch_set.silu_and_mul(x), w))
    assert calls == [(3, 4)]
    with pytest.raises(KernelSetError, match="fused op 'silu_and_mul_linear' must be callable or None"):
        torch_set.derive("bad-fused", "1.0.0", silu_and_mul_linear="not a function")


def test_the_epilogue_fusion_is_inherited_and_composed_like_the_prologue_one():
    v15, v17 = get_kernel_set("triton-v1.5"), get_kernel_set("triton-v1.7")
    assert kernels.FUSED_OPS["linear_silu_and_mul"] == ("linear", "silu_and_mul")
    assert "linear_silu_and_mul" in v17.ops() and "linear_silu_and_mul" not in v15.ops()
    assert v17.derive("kept", "1.0.0", rms_norm=v15.rms_norm).linear_silu_and_mul is v17.linear_silu_and_mul
    assert v17.derive("new-act", "1.0.0", silu_and_mul=v15.silu_and_mul).linear_silu_and_mul is None
    torch_set = get_kernel_set("torch")
    x, w = torch.randn(3, 4), torch.randn(10, 4)   # [gate; up] of 5 each
    assert torch.equal(torch_set.op("linear_silu_and_mul")(x, w), torch_set.silu_and_mul(torch_set.linear(x, w)))


def test_the_norm_fusions_are_inherited_composed_and_dropped_with_any_op_they_fold():
    v19, v110 = get_kernel_set("triton-v1.9"), get_kernel_set("triton-v1.10")
    assert kernels.FUSED_OPS["add_rms_norm_linear"] == ("rms_norm", "fused_add_rms_norm", "linear")
    assert {"add_rms_norm_linear", "add_rms_norm_linear_silu_and_mul"} <= set(v110.ops())
    assert v110.derive("kept", "1.0.0", rope_and_cache=v19.rope_and_cache).add_rms_norm_linear is \
        v110.add_rms_norm_linear
    for op in ("rms_norm", "fused_add_rms_norm", "linear"):   # a replaced part runs: no inherited fusion bypasses it
        d = v110.derive("new-part", "1.0.0", **{op: getattr(v19, op)})
        assert d.add_rms_norm_linear is None and d.add_rms_norm_linear_silu_and_mul is None
    d = v110.derive("new-epilogue", "1.0.0", linear_silu_and_mul=v19.linear_silu_and_mul)
    assert d.add_rms_norm_linear is v110.add_rms_norm_linear and d.add_rms_norm_linear_silu_and_mul is None
    torch_set = get_kernel_set("torch")
    x, r, nw, w = torch.randn(3, 4), torch.randn(3, 4), torch.rand(4) + 0.5, torch.randn(10, 4)
    y, res = torch_set.op("add_rms_norm_linear")(x, w, r, nw, 1e-5)
    h, want_res = torch_set.fused_add_rms_norm(x, r, nw, 1e-5)
    assert torch.equal(y, torch_set.linear(h, w)) and torch.equal(res, want_res)
    y, res = torch_set.op("add_rms_norm_linear_silu_and_mul")(x, w, None, nw, 1e-5)
    assert torch.equal(y, torch_set.silu_and_mul(torch_set.linear(torch_set.rms_norm(x, nw, 1e-5), w)))
    assert res is x


def test_derive_rejects_unknown_op():
    with pytest.raises(KernelSetError, match="unknown op"):
        get_kernel_set("torch").derive("x", "1.0.0", flash=lambda: None)


def test_plugin_module_registers_sets(tmp_path, monkeypatch):
    (tmp_path / "my_kernel_plugin.py").write_text(
        "from sits import kernels\n"
        "kernels.register_kernel_set(kernels.get_kernel_set('torch').derive('plugin-set', '0.1.0'))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("SITS_KERNEL_PLUGINS", "my_kernel_plugin")
    monkeypatch.setattr(kernels.registry, "_plugins_loaded", False)
    try:
        assert "plugin-set" in list_kernel_sets()
        assert get_kernel_set("plugin-set").version == "0.1.0"
    finally:
        unregister_kernel_set("plugin-set")


def test_quantized_weight_validates():
    from sits.kernels.quant import QuantizationError, QuantizedWeight, quantize_weight
    with pytest.raises(QuantizationError):
        quantize_weight(torch.randn(4, 4), "int4")
    with pytest.raises(QuantizationError):
        QuantizedWeight(torch.zeros(4, 4, dtype=torch.int8), torch.ones(3), "int8")
    with pytest.raises(QuantizationError):
        QuantizedWeight(torch.zeros(4, 4, dtype=torch.int8), torch.ones(4), "fp8")


def test_triton_v1_is_registered():
    TRI, REF = get_kernel_set("triton-v1"), get_kernel_set("torch")
    assert TRI.version == "1.0.0" and set(TRI.devices) == {"cuda", "cpu"}
    for op in ("rms_norm", "fused_add_rms_norm", "silu_and_mul", "rope_and_cache", "prefill_attention",
               "paged_decode_attention", "linear"):
        assert getattr(TRI, op) is not getattr(REF, op), op


def test_triton_v1_1_replaces_only_the_prefill_kernel():
    # a new version is a new set: v1 keeps its kernels, v1.1 shares every op but prefill_attention with it
    v1, v11 = get_kernel_set("triton-v1"), get_kernel_set("triton-v1.1")
    assert (v1.version, v11.version) == ("1.0.0", "1.1.0")
    differ = [op for op in OP_NAMES if getattr(v1, op) is not getattr(v11, op)]
    assert differ == ["prefill_attention"]
    assert v11.prefill_attention.__name__ == "prefill_attention_tma"


def test_example_regressions_are_flagged_and_real_releases_are_not():
    flags = {n: get_kernel_set(n).regression for n in list_kernel_sets()}
    assert flags["torch-wrong-rope"] == "wrong" and flags["torch-slow-attn"] == "slow"
    assert flags["triton-v1-floor-pages"] == "wrong" and flags["triton-v1-unsplit"] == "slow"
    assert flags["torch"] is flags["triton-v1"] is flags["triton-v1.1"] is None


def test_derive_records_parent_and_overrides_and_inherits_the_regression_flag():
    base = get_kernel_set("torch")
    wrong = get_kernel_set("torch-wrong-rope")
    assert (base.parent, base.overrides) == (None, ())
    assert (wrong.parent, wrong.overrides) == ("torch", ("rope_and_cache",))
    slow = get_kernel_set("torch-slow-attn")
    assert slow.overrides == ("prefill_attention", "paged_decode_attention")
    child = wrong.derive("wrong-child", "1.0.2", silu_and_mul=base.silu_and_mul)
    assert child.regression == "wrong" and child.parent == "torch-wrong-rope" and child.overrides == ("silu_and_mul",)
    assert wrong.derive("fixed", "1.0.3", regression=None, rope_and_cache=base.rope_and_cache).regression is None
    assert base.derive("now-slow", "1.0.1", regression="slow").regression == "slow"


def test_triton_v1_3_replaces_the_kv_ops_and_takes_fp8_pages():
    v12, v13 = get_kernel_set("triton-v1.2"), get_kernel_set("triton-v1.3")
    assert (v13.version, v13.parent, v13.overrides) == (
        "1.3.0", "triton-v1.2", ("rope_and_cache", "prefill_attention", "paged_decode_attention"))
    assert [op for op in OP_NAMES if getattr(v12, op) is not getattr(v13, op)] == list(v13.overrides)
    assert v13.kv_cache_dtypes == ("auto", "fp8") and v13.graph_safe and v13.regression is None
    # the shipped releases keep their plain pages only; the reference takes both
    assert all(get_kernel_set(n).kv_cache_dtypes == ("auto",) for n in ("triton-v1", "triton-v1.1", "triton-v1.2"))
    assert get_kernel_set("torch").kv_cache_dtypes == ("auto", "fp8")


def test_derive_keeps_the_kv_cache_dtypes_unless_a_kv_op_is_replaced():
    base = get_kernel_set("torch")
    assert base.derive("a", "1.0.0", silu_and_mul=base.silu_and_mul).kv_cache_dtypes == ("auto", "fp8")
    # a replaced attention or cache write claims plain pages only, unless it says more
    assert get_kernel_set("torch-wrong-rope").kv_cache_dtypes == ("auto",)
    assert get_kernel_set("torch-slow-attn").kv_cache_dtypes == ("auto",)
    assert base.derive("b", "1.0.0", paged_decode_attention=base.paged_decode_attention).kv_cache_dtypes == ("auto",)
    assert base.derive("c", "1.0.0", kv_cache_dtypes=("auto", "fp8"),
                       rope_and_cache=base.rope_and_cache).kv_cache_dtypes == ("auto", "fp8")
    for bad in (("fp8",), ("auto", "int4"), ("auto", "auto")):
        with pytest.raises(KernelSetError, match="kv_cache_dtypes"):
            base.derive("bad", "1.0.0", kv_cache_dtypes=bad)


@pytest.mark.parametrize("kwargs, match", [
    ({"regression": "broken"}, "regression"),
    ({"regression": True}, "regression"),
])
def test_bad_regression_flag_is_rejected(kwargs, match):
    with pytest.raises(KernelSetError, match=match):
        get_kernel_set("torch").derive("bad", "1.0.0", **kwargs)


def test_kernels_json_lists_every_set_with_the_catalogue_fields(tmp_path):
    import json
    import os
    import subprocess
    import sys

    (tmp_path / "json_plugin.py").write_text(
        "from sits import kernels\n"
        "kernels.register_kernel_set(kernels.get_kernel_set('torch').derive('json-plugin-set', '0.2.0', "
        "regression='slow', graph_safe=True))\n")
    env = {**os.environ, "SITS_KERNEL_PLUGINS": "json_plugin",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "sits.engine.cli", "kernels", "--json"], env=env, check=True,
                         capture_output=True, text=True).stdout
    entries = {e["name"]: e for e in json.loads(out)["kernel_sets"]}
    builtin = {v.name for v in vars(kernels.sets).values() if isinstance(v, kernels.KernelSet)}
    assert set(entries) == builtin | {"json-plugin-set"}   # a fresh process: the built-ins and the plugin's
    fields = {"name", "version", "devices", "description", "parent", "overrides", "cuda_graphs", "regression",
              "kv_cache_dtypes", "ops"}
    assert all(set(e) == fields for e in entries.values())
    plugin = entries.pop("json-plugin-set")
    assert plugin.pop("ops") == entries["torch"]["ops"]   # derive copied every op
    assert plugin == {"name": "json-plugin-set", "version": "0.2.0", "devices": ["cpu", "cuda"],
                      "description": "torch 1.0.0 with no ops replaced", "parent": "torch", "overrides": [],
                      "cuda_graphs": True, "regression": "slow", "kv_cache_dtypes": ["auto", "fp8"]}
    assert entries["torch-wrong-rope"]["regression"] == "wrong"
    assert entries["triton-v1.1"]["parent"] == "triton-v1" and entries["triton-v1.1"]["overrides"] == [
        "prefill_attention"]
