"""The GPU demo's profile without a GPU: what `--device cuda` configures (Triton sets, the memory split, the engines'
device), and the GPU policy judged on the histograms an H200 run stored (fixtures/gpu_demo_h200_checks.json): the
slow Triton release fails it, the good release and the A/A run pass it. Those runs stored one pooled window per check
(before sequential statistics), so their gates are judged by the per-look test (`statistics: "fixed"`); the
sequential runs of the same demo are in BENCHMARKS.md "Sequential statistics"."""
import dataclasses
import json
from pathlib import Path

import pytest

from sits.control_plane.adapters.kernel_catalog import KernelCatalog
from sits.control_plane.analysis import Outcome, assess
from sits.control_plane.cli.main import main
from sits.control_plane.demo.profiles import GPU, GPU_MEMORY_SHARE, gpu_policy
from sits.control_plane.demo.runner import DemoConfig
from sits.control_plane.rollout import Phase
from sits.control_plane.store.codec import variant_from_dict

FIXTURE = Path(__file__).parent / "fixtures" / "gpu_demo_h200_checks.json"


def _fixed(policy):
    return dataclasses.replace(policy, statistics="fixed")


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
    assert ("--scenario 'slow,bogus': choose from slow, wrong, good, aa, w8a8, f16, fused, staged, gemv, normfused, bcast, pdl, pdlall, onewarp, waves, epilogue, normquant, tmafp8, transposed, dequant, bywork, tmagemm, pairedgemm, batchedgemm, kindot, prologue, kvfp8"
            in capsys.readouterr().err)


def test_an_engine_flag_release_runs_productions_set_with_the_flag_on_the_canary_alone():
    cfg = DemoConfig(device="cuda", scenarios=("kvfp8", "prologue"), production_kernels="triton-v1.5",
                     engine_extra=("--quantization", "fp8"))
    kv = cfg.scenario("kvfp8")
    assert kv.canary_kernels(cfg.production_kernels) == "triton-v1.5" and kv.canary_args == ("--kv-cache-dtype", "fp8")
    assert kv.canary("triton-v1.5") == "triton-v1.5 --kv-cache-dtype fp8" and kv.expected is Phase.SUCCEEDED
    assert cfg.scenario("prologue").canary("triton-v1.5") == "triton-v1.6"
    cfg.check_kernels(KernelCatalog.shipped())
    # production's set must read the pages the canary gets, and every engine must not have the flag already
    with pytest.raises(ValueError, match="scenario kvfp8: --kv-cache-dtype fp8 needs a kernel set that reads such "
                                         "KV pages; triton-v1 reads auto only"):
        DemoConfig(device="cuda", scenarios=("kvfp8",)).check_kernels(KernelCatalog.shipped())
    with pytest.raises(ValueError, match="production: --kv-cache-dtype fp8 needs .*triton-v1.2 reads auto only"):
        DemoConfig(device="cuda", scenarios=("aa",), production_kernels="triton-v1.2",
                   engine_extra=("--kv-cache-dtype", "fp8")).check_kernels(KernelCatalog.shipped())
    with pytest.raises(ValueError, match="scenario kvfp8 releases --kv-cache-dtype fp8 on the canary alone; "
                                         "--engine-arg already gives every engine --kv-cache-dtype"):
        DemoConfig(device="cuda", scenarios=("kvfp8",), production_kernels="triton-v1.8",
                   engine_extra=("--kv-cache-dtype=fp8",))


def test_the_fp8_releases_run_with_every_engine_serving_fp8(capsys):
    # --engine-arg goes to production, baseline and canary alike, after the profile's memory split
    cfg = DemoConfig(device="cuda", scenarios=("w8a8", "f16", "fused", "staged"), production_kernels="triton-v1.3",
                     engine_extra=("--quantization", "fp8", "--kv-cache-dtype", "fp8"))
    assert [cfg.scenario(s).kernels for s in cfg.scenarios] == ["triton-v1.4", "triton-v1.5", "triton-v1.7",
                                                                  "triton-v1.8"]
    assert cfg.engine_args == (*GPU.engine_args, "--quantization", "fp8", "--kv-cache-dtype", "fp8")
    cfg.check_kernels(KernelCatalog.shipped())
    assert DemoConfig(engine_extra=("--seed", "7")).engine_args == ("--seed", "7")   # the CPU profile has none
    # a flag no rollout may set, or a bad value, is refused before anything starts
    with pytest.raises(ValueError, match="--engine-arg: --port is set by the deployer"):
        DemoConfig(engine_extra=("--port", "9"))
    assert main(["demo", "--engine-arg", "--quantization fp4"]) == 2
    assert "--quantization" in capsys.readouterr().err
    assert main(["demo", "--engine-arg", "--seed '7"]) == 2
    assert "--engine-arg \"--seed '7\"" in capsys.readouterr().err


@pytest.mark.parametrize("kernels,outcome", [("triton-v1-unsplit", Outcome.FAIL), ("triton-v1.1", Outcome.PASS),
                                             ("triton-v1", Outcome.PASS)])
def test_the_time_sliced_gpu_policy_on_the_h200_run_fails_the_slow_set_and_passes_good_and_aa(kernels, outcome):
    run = json.loads(FIXTURE.read_text())["rollouts"][kernels]
    variants = {role: variant_from_dict(v) for role, v in run["variants"].items()}
    v = assess(variants, _fixed(gpu_policy(mps=False)))
    assert v.outcome is outcome, v.reason
    if outcome is Outcome.FAIL:
        failed = {r.check for r in v.results if r.outcome is Outcome.FAIL}
        assert failed == {"sits_inter_token_latency_seconds:p90", "sits_inter_token_latency_seconds:p50"}, v.reason


MPS_FIXTURE = Path(__file__).parent / "fixtures" / "gpu_demo_h200_mps_checks.json"


def test_the_mps_gpu_policy_on_three_h200_runs_fails_every_slow_check_and_no_good_or_aa_one():
    """13 rollouts of three runs under CUDA MPS, each rollout's last latency check: the slow release fails on ITL
    P90 (and request P90); triton-v1 (8 A/A runs) and triton-v1.1 (3) never fail, also the check where the
    time-sliced gates (ITL P50/P90 +10 %) failed the good release at ITL P50 +40 %, P90 +13 %."""
    runs = json.loads(MPS_FIXTURE.read_text())["rollouts"]
    assert len(runs) == 13 and sum(r["kernels"] == "triton-v1" for r in runs) == 8
    for r in runs:
        variants = {role: variant_from_dict(v) for role, v in r["variants"].items()}
        v = assess(variants, _fixed(gpu_policy(mps=True)))
        if r["kernels"] == "triton-v1-unsplit":
            assert v.outcome is Outcome.FAIL, v.reason
            assert "sits_inter_token_latency_seconds:p90" in {x.check for x in v.results if x.outcome is Outcome.FAIL}
        else:
            assert v.outcome is not Outcome.FAIL, (r["run"], r["kernels"], v.reason)
    good_rolled_back = next(r for r in runs if r["kernels"] == "triton-v1.1" and r["phase"] == "rolled_back")
    old = assess({k: variant_from_dict(v) for k, v in good_rolled_back["variants"].items()},
                 _fixed(gpu_policy(mps=False)))
    assert old.outcome is Outcome.FAIL      # what the run decided under the time-sliced gates


def test_the_gpu_profile_picks_its_gates_by_whether_an_mps_daemon_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    assert {c.name for c in DemoConfig(device="cuda").policy.checks} >= {"sits_inter_token_latency_seconds:p50"}
    (tmp_path / "control").touch()
    names = {c.name for c in DemoConfig(device="cuda").policy.checks}
    assert "sits_inter_token_latency_seconds:p90" in names and "sits_inter_token_latency_seconds:p50" not in names
    # the ITL tail gate sits inside the prefill-carrying steps' mode, not on the cliff below it (bench/tail_cliff.py)
    assert "sits_inter_token_latency_seconds:p99_9" in names and "sits_inter_token_latency_seconds:p99" not in names


def test_gpu_memory_sampler_keeps_each_roles_peak_from_the_engines_metrics(tmp_path):
    """The GPU demo's memory line: each variant's /metrics gauge, the peak per role; a CPU engine's /metrics (no
    gauge) and an unreachable replica are skipped."""
    import http.server
    import threading

    from sits.control_plane.adapters.deploy import VariantStatus
    from sits.control_plane.demo.gpu_memory import GpuMemorySampler, gauge_value

    values = {"/a/metrics": [2e9, 3e9, 2.5e9], "/b/metrics": [1e9]}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seq = values.get(self.path)
            body = (f'# TYPE sits_device_memory_reserved_bytes gauge\nsits_device_memory_reserved_bytes{{env="x",'
                    f'service="demo",kernel_version="v"}} {seq.pop(0) if len(seq) > 1 else seq[0]}\n' if seq
                    else "sits_kv_cache_total_blocks 5.0\n").encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{srv.server_address[1]}"

    class Deployer:
        def status(self, service):
            assert service == "demo"
            return {"canary": VariantStatus("canary", True, 1, 1, base + "/a", endpoints=(base + "/a",)),
                    "baseline": VariantStatus("baseline", True, 1, 1, base + "/b"),
                    "production": VariantStatus("production", True, 2, 2, base + "/cpu",
                                                endpoints=(base + "/cpu", "http://127.0.0.1:9")),
                    }
    try:
        s = GpuMemorySampler(Deployer(), "demo")
        for _ in range(3):
            s.sample()
        assert s.take() == {"canary": 3e9, "baseline": 1e9}
        assert s.take() == {}     # taken: the next scenario starts afresh
    finally:
        srv.shutdown()
    assert gauge_value("sits_device_memory_reserved_bytes 12.0\n") == 12.0
    assert gauge_value("sits_kv_cache_total_blocks 5\n") is None
