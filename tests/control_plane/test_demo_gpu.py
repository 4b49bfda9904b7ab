"""The GPU demo's profile without a GPU: what `--device cuda` configures (Triton sets, the memory split, the engines'
device), and the GPU policy judged on the histograms an H200 run stored (fixtures/gpu_demo_h200_checks.json): the
slow Triton release fails it, the good release and the A/A run pass it."""
import json
from pathlib import Path

import pytest

from control_plane.adapters.kernel_catalog import KernelCatalog
from control_plane.analysis import Outcome, assess
from control_plane.cli.main import main
from control_plane.demo.profiles import GPU, GPU_MEMORY_SHARE, gpu_policy
from control_plane.demo.runner import DemoConfig
from control_plane.rollout import Phase
from control_plane.store.codec import variant_from_dict

FIXTURE = Path(__file__).parent / "fixtures" / "gpu_demo_h200_checks.json"


def test_device_cuda_runs_triton_sets_on_the_gpu_with_a_memory_split():
    cfg = DemoConfig(device="cuda", scenarios=("slow", "wrong", "good", "aa", "aa"))
    assert cfg.production_kernels == "triton-v1" and cfg.model == "tiny-trained" and cfg.rate == GPU.rate
    assert [cfg.scenario(s).kernels for s in cfg.scenarios] == [
        "triton-v1-unsplit", "triton-v1-floor-pages", "triton-v1.1", "triton-v1", "triton-v1"]
    assert [cfg.scenario(s).expected for s in ("slow", "wrong", "good", "aa")] == [
        Phase.ROLLED_BACK, Phase.ROLLED_BACK, Phase.SUCCEEDED, Phase.SUCCEEDED]
    assert GPU.engine_args[:2] == ("--gpu-memory-utilization", str(GPU_MEMORY_SHARE)) and 4 * GPU_MEMORY_SHARE <= 1
    cfg.check_kernels(KernelCatalog.shipped())      # every set it runs is catalogued for cuda
    cpu = DemoConfig()
    assert cpu.production_kernels == "torch" and cpu.model == "tiny" and cpu.rate == 25.0
    with pytest.raises(ValueError, match="unknown scenario"):
        DemoConfig(scenarios=("aa",))                  # the A/A run is the GPU profile's
    with pytest.raises(ValueError, match="device"):
        DemoConfig(device="tpu")


def test_the_cli_takes_scenario_lists_and_names_a_bad_one(capsys):
    assert main(["demo", "--device", "cuda", "--scenario", "slow,bogus"]) == 2
    assert "--scenario 'slow,bogus': choose from slow, wrong, good, aa" in capsys.readouterr().err


@pytest.mark.parametrize("kernels,outcome", [("triton-v1-unsplit", Outcome.FAIL), ("triton-v1.1", Outcome.PASS),
                                             ("triton-v1", Outcome.PASS)])
def test_the_gpu_policy_on_the_h200_run_fails_the_slow_set_and_passes_good_and_aa(kernels, outcome):
    run = json.loads(FIXTURE.read_text())["rollouts"][kernels]
    variants = {role: variant_from_dict(v) for role, v in run["variants"].items()}
    v = assess(variants, gpu_policy())
    assert v.outcome is outcome, v.reason
    if outcome is Outcome.FAIL:
        failed = {r.check for r in v.results if r.outcome is Outcome.FAIL}
        assert failed == {"sits_inter_token_latency_seconds:p90", "sits_inter_token_latency_seconds:p50"}, v.reason
