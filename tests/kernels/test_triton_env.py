"""kernels/triton_env.py: Triton's on-disk cache is keyed by the GPU model and driver (use_device_cache_dir), the
autotuners persist their winners there (tests/engine/test_gpu.py checks a second process tunes nothing), and a kernel
refuses a device Triton cannot run on. FastLauncher, also there: test_fast_launch.py."""
import os

import pytest
import torch

from sits.kernels import get_kernel_set, triton_env
from sits.kernels.linear import _linear_small_m
from sits.kernels.paged_decode_attention import _paged_decode_attention_tuned
from sits.kernels.triton_env import TritonUnavailableError


@pytest.fixture
def on_a_gpu(monkeypatch):
    monkeypatch.setattr(triton_env, "interpreting", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200 (141 GB)")
    monkeypatch.setattr(triton_env, "_driver_version", lambda: "580.95.05")


def test_cache_dir_is_keyed_by_gpu_and_driver_under_the_users_dir(on_a_gpu, monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    want = str(tmp_path / "sits-NVIDIA-H200-141-GB-driver-580.95.05-tune2")
    assert triton_env.use_device_cache_dir(torch.device("cuda", 0)) == want == os.environ["TRITON_CACHE_DIR"]
    # a child process inherits the keyed directory: it is not nested again
    assert triton_env.use_device_cache_dir(torch.device("cuda", 0)) == want


def test_cache_dir_defaults_under_home(on_a_gpu, monkeypatch, tmp_path):
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    got = triton_env.use_device_cache_dir(torch.device("cuda"))
    assert got == str(tmp_path / ".triton" / "cache" / "sits-NVIDIA-H200-141-GB-driver-580.95.05-tune2")


def test_cpu_leaves_the_cache_alone(monkeypatch):
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    assert triton_env.use_device_cache_dir(torch.device("cpu")) is None
    assert "TRITON_CACHE_DIR" not in os.environ


def test_driver_version_reads_the_kernel_module_or_falls_back():
    v = triton_env._driver_version()
    assert v and " " not in v


def test_autotuners_persist_their_results(monkeypatch):
    seen = {}
    monkeypatch.setattr(triton_env.triton, "autotune", lambda configs, **kw: seen.update(kw))
    triton_env.autotune([], key=["N"], use_cuda_graph=True)
    # timed in CUDA graphs: 20 ms a replay, not Triton's 100 (~1 s a candidate whatever the kernel's length)
    assert seen == {"key": ["N"], "cache_results": True, "use_cuda_graph": True, "rep": triton_env.GRAPH_TUNE_REP_MS}
    assert triton_env.GRAPH_TUNE_REP_MS == 20
    seen.clear()
    triton_env.autotune([], key=["N"], use_cuda_graph=True, rep=50)
    assert seen["rep"] == 50
    seen.clear()
    triton_env.autotune([], key=["N"])   # timed eagerly: Triton's own warm-up and repetitions
    assert seen == {"key": ["N"], "cache_results": True}
    # compiled, the kernels' autotuners keep it (Triton's interpreter turns disk caching off)
    for tuned in (_linear_small_m, _paged_decode_attention_tuned):
        assert tuned.cache_results == (not triton_env.interpreting())


def test_kernels_reject_unsupported_device():
    x = torch.empty(2, 8, device="meta")
    with pytest.raises(TritonUnavailableError, match="meta"):
        get_kernel_set("triton-v1").rms_norm(x, torch.empty(8, device="meta"), 1e-5)
