"""`sits-control demo --parallel K`: scenarios dealt round-robin to K lanes, one service each (control_plane/demo/
lanes.py); the flag validated; every lane's engines scraped by the local Prometheus; the GPU demo's report counting
decisions per scenario over every lane; and one short real run of two lanes."""
import importlib.util
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from sits.control_plane.adapters.deploy import VariantStatus
from sits.control_plane.adapters.deploy.spec import DeploySpec
from sits.control_plane.cli.main import main
from sits.control_plane.demo.lanes import deal, lane_services, tagged
from sits.control_plane.demo.profiles import GPU_MEMORY_SHARE, KV_FP8
from sits.control_plane.demo.prometheus import scrape_targets
from sits.control_plane.demo.runner import DemoConfig
from sits.control_plane.rollout import Phase, Rollout
from sits.control_plane.store.db import Store
from tests.control_plane.e2e.support import engine_pids

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("scenarios,k,lanes", [
    (("slow", "wrong", "good", "aa", "aa"), 2, [("slow", "good", "aa"), ("wrong", "aa")]),
    (("aa",) * 7, 3, [("aa",) * 3, ("aa",) * 2, ("aa",) * 2]),
    (("slow", "wrong", "good"), 1, [("slow", "wrong", "good")]),
    (("slow", "wrong", "good"), 3, [("slow",), ("wrong",), ("good",)]),
])
def test_scenarios_are_dealt_round_robin_each_lane_keeping_their_order(scenarios, k, lanes):
    assert deal(scenarios, k) == lanes


@pytest.mark.parametrize("k", [0, -1, 3])
def test_a_lane_count_outside_one_to_the_number_of_scenarios_is_refused(k):
    with pytest.raises(ValueError, match=rf"from 1 to the number of scenarios \(2\), got {k}"):
        deal(("slow", "good"), k)
    with pytest.raises(ValueError, match="number of scenarios"):
        DemoConfig(scenarios=("slow", "good"), parallel=k)


def test_the_cli_names_a_bad_parallel_and_a_lane_service_that_is_no_dns_label(capsys):
    assert main(["demo", "--scenario", "wrong,good", "--parallel", "3"]) == 2
    assert "--parallel) must be from 1 to the number of scenarios (2), got 3" in capsys.readouterr().err
    assert main(["demo", "--scenario", "wrong,good", "--parallel", "2", "--service", "x" * 39]) == 2
    assert f"service '{'x' * 39}-1' must be a DNS label" in capsys.readouterr().err


def test_one_lane_is_the_service_itself_more_are_numbered():
    assert lane_services("demo", 1) == ["demo"]
    assert lane_services("chat", 3) == ["chat-1", "chat-2", "chat-3"]
    cfg = DemoConfig(scenarios=("wrong", "good", "wrong"), parallel=2)
    assert cfg.lanes == [("wrong", "wrong"), ("good",)] and DemoConfig().lanes == [("slow", "wrong", "good")]


def test_lanes_split_the_gpu_memory_share_unless_one_is_given():
    assert DemoConfig(device="cuda", scenarios=("aa",) * 6).engine_args[:2] == (
        "--gpu-memory-utilization", str(GPU_MEMORY_SHARE))           # one lane: as before
    three = DemoConfig(device="cuda", scenarios=("aa",) * 6, parallel=3)
    assert three.engine_args[:2] == ("--gpu-memory-utilization", f"{round(GPU_MEMORY_SHARE / 3, 4):g}")
    given = DemoConfig(device="cuda", scenarios=("aa",) * 6, parallel=3, gpu_memory_share=0.1)
    assert given.engine_args[:2] == ("--gpu-memory-utilization", "0.1")
    assert DemoConfig(scenarios=("good", "good"), parallel=2).engine_args == ()   # CPU engines take no share


def test_a_lane_tags_its_lines_and_one_lane_prints_as_before():
    lines = []
    plain = lines.append
    out = tagged(plain, "demo-2")
    out("      => PROMOTED")
    out("")
    assert lines == ["[demo-2]       => PROMOTED", ""]
    assert tagged(plain, "") is plain


def test_the_local_prometheus_scrapes_every_lanes_variants():
    class Deployer:
        def status(self, service):
            return {"demo-1": {"production": VariantStatus("production", True, 1, 1, "http://127.0.0.1:9001",
                                                           endpoints=("http://127.0.0.1:9001",))},
                    "demo-2": {"production": VariantStatus("production", True, 2, 2, None,
                                                           endpoints=("http://127.0.0.1:9003", "http://127.0.0.1:9002")),
                               "canary": VariantStatus("canary", False, 1, 0, None)}}.get(service, {})
    assert scrape_targets(Deployer(), ["demo-1", "demo-2"]) == ["127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9003"]
    assert scrape_targets(Deployer(), ["demo-1"]) == ["127.0.0.1:9001"]


def _report_module():
    spec = importlib.util.spec_from_file_location("gpu_demo_report", REPO / "bench" / "gpu_demo_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_gpu_demo_report_matches_each_lanes_lines_and_counts_decisions_per_scenario(tmp_path, capsys):
    runs = [("demo-1", "triton-v1", Phase.SUCCEEDED), ("demo-2", "triton-v1", Phase.ROLLED_BACK),
            ("demo-1", "triton-v1-unsplit", Phase.ROLLED_BACK), ("demo-2", "triton-v1", Phase.SUCCEEDED),
            ("demo-1", "triton-v1", Phase.PROGRESSING)]   # still running at the demo's timeout
    with Store(str(tmp_path / "s.db")) as s:
        for i, (svc, ks, phase) in enumerate(runs):
            s.create_rollout(Rollout(f"r{i}", svc, ks, "triton-v1", phase=phase, created_at=100.0 + i))
        # an engine-flag release (kvfp8): production's own set, FP8 pages on the canary only -- not an A/A run
        s.create_rollout(Rollout("r5", "demo-2", "triton-v1.8", "triton-v1.8", phase=Phase.SUCCEEDED,
                                 created_at=106.0), DeploySpec(production_args=("--quantization", "fp8"),
                                                               canary_args=("--quantization", "fp8", *KV_FP8)))
    # the lanes' lines interleave: demo-2 finished its first scenario before demo-1 did
    log = tmp_path / "demo.log"
    log.write_text("[  90.0s] [demo-2]       scenario load: B1\n[  95.0s] [demo-1]       scenario load: A1\n"
                   "[ 150.0s] [demo-1]       scenario load: A2\n[ 160.0s] [demo-2]       scenario load: B2\n")
    assert _report_module().main(str(tmp_path / "s.db"), str(log), str(tmp_path / "none.csv")) == 0
    text = capsys.readouterr().out
    assert [line.split()[-1] for line in text.splitlines() if "load:" in line] == ["A1", "B1", "A2", "B2"]
    rows = [line.split()[:4] for line in text.splitlines() if line[:2].strip().isdigit()]
    assert rows == [["1", "demo-1", "triton-v1", "succeeded"], ["2", "demo-2", "triton-v1", "rolled_back"],
                    ["3", "demo-1", "triton-v1-unsplit", "rolled_back"], ["4", "demo-2", "triton-v1", "succeeded"],
                    ["5", "demo-1", "triton-v1", "progressing"], ["6", "demo-2", "triton-v1.8", "--kv-cache-dtype"]]
    table = text[text.index("decisions per scenario (6 rollouts, 2 lane(s)):"):].splitlines()
    assert table[2].split() == ["aa", "triton-v1", "4", "2", "1", "0", "1", "2/3"]   # one false rollback of three
    assert table[3].split() == ["kvfp8", "triton-v1.8", "--kv-cache-dtype", "fp8", "1", "1", "0", "0", "0", "1/1"]
    assert table[4].split() == ["slow", "triton-v1-unsplit", "1", "0", "1", "0", "0", "1/1"]


@pytest.mark.slow   # ~1 min alone on 2 cores: two lanes, each a production engine, a wrong canary and its baseline
def test_two_lanes_run_side_by_side_and_the_summary_covers_both(tmp_path):
    """The correctness gate decides `wrong` before traffic (op-level conformance, not latency): cheap and not blurred
    by what runs beside it."""
    work = tmp_path / "w"
    proc = subprocess.run([sys.executable, "-m", "sits.control_plane.cli", "demo", "--scenario", "wrong,wrong",
                           "--parallel", "2", "--rate", "5", "--exit-when-done", "--workdir", str(work)],
                          cwd=REPO, capture_output=True, text=True, timeout=540)
    text = proc.stdout
    assert proc.returncode == 0 and "demo passed" in text, text[-3000:] + proc.stderr[-2000:]
    assert "2 lanes side by side, each its own service (demo-1, demo-2)" in text
    for svc in ("demo-1", "demo-2"):
        assert f"[{svc}] [2/4] production:" in text and f"[{svc}] [4/4] canary 1/1 (wrong)" in text
        assert f"[{svc}]       => ROLLED BACK (as expected)" in text
        assert f"  load [{svc}]: production " in text
    summary = text[text.index("Summary ("):]
    assert re.findall(r"\d\. \[(demo-\d)\] wrong +torch-wrong-rope +rolled_back", summary) == ["demo-1", "demo-2"]
    with sqlite3.connect(work / "sits-demo.db") as db:
        rows = sorted(db.execute("SELECT service, phase FROM rollouts"))
    assert rows == [("demo-1", "rolled_back"), ("demo-2", "rolled_back")]
    assert not engine_pids("demo-1", under=tmp_path) and not engine_pids("demo-2", under=tmp_path)


def test_a_lane_compares_each_scenario_with_what_production_runs_after_a_promotion(tmp_path, monkeypatch):
    # a release train: kvfp8 promoted leaves production on torch with an FP8 KV cache, so the next scenario's
    # baseline runs those flags and its canary keeps them (adding none twice); a rolled-back one changes nothing; a
    # set that cannot read those pages is refused by the product and reported, and the lane goes on
    import dataclasses

    from sits.control_plane.adapters.kernel_catalog import KernelCatalog
    from sits.control_plane.demo import lanes, narrate
    outcomes = iter([Phase.SUCCEEDED, Phase.ROLLED_BACK, Phase.SUCCEEDED])

    def follow(store, rid, load, policy, timeout, out):   # the worker's part: the rollout ends as scripted
        r = store.get(rid)
        store.save(dataclasses.replace(r, phase=next(outcomes)))
        return store.get(rid).phase.value
    monkeypatch.setattr(narrate, "follow", follow)

    class Load:
        def counts(self):
            return {}
    cfg = DemoConfig(scenarios=("kvfp8", "good", "slow", "kvfp8"), workdir=str(tmp_path))
    lines = []
    with Store(str(tmp_path / "s.db")) as store:
        base = DeploySpec(production_args=("--max-num-seqs", "8"), canary_args=("--max-num-seqs", "8"))
        lane = lanes.Lane(cfg, 0, cfg.scenarios, lines.append, deployer=None, store=store,
                          catalog=KernelCatalog.shipped(), spec=base, tracing=None)
        lane.load = Load()
        lane.run("http://ui/")
        got = [(r.production_kernels, r.canary_kernels, store.spec(r.id).production_args, store.spec(r.id).canary_args)
               for r in sorted(store.list(limit=10), key=lambda r: r.created_at)]
    eight, kv = ("--max-num-seqs", "8"), ("--max-num-seqs", "8", *KV_FP8)
    assert got == [("torch", "torch", eight, kv),                   # the flag release
                   ("torch", "torch", kv, kv),                      # compared with production's FP8 pages
                   ("torch", "torch", kv, kv)]                       # the flag again: nothing added twice
    assert sum("production now runs torch with --kv-cache-dtype fp8" in line for line in lines) == 3
    refused = [line for line in lines if "NOT RUN" in line]
    assert len(refused) == 1 and "torch-slow-attn reads auto only" in refused[0]
    assert (lane.production_kernels, lane.production_args) == ("torch", kv)
    assert [sc.name for _, sc, _ in lane.rollouts] == ["kvfp8", "good", "kvfp8"]


def test_an_engine_short_of_gpu_memory_gets_a_hint_about_the_share(monkeypatch, capsys):
    """An 80 GB card holds llama3-8b int8 at a fifth of its memory per engine only with less KV than one sequence of
    max_model_len needs: the demo says which flag gives each engine more (the engine's own error names its flag)."""
    from sits.control_plane.adapters.deploy import DeployError
    from sits.control_plane.cli import commands

    def short(cfg):
        raise DeployError("demo/production: engine failed to load: InvalidRequestError: --gpu-memory-utilization "
                          "0.2 leaves 0.96 GiB for the KV cache after the weights (9.5 GiB) and activations")
    monkeypatch.setattr(commands, "run_demo", short)
    assert main(["demo", "--scenario", "good", "--device", "cuda"]) == 1
    err = capsys.readouterr().err
    assert "a variant could not be deployed" in err and f"each engine has {GPU_MEMORY_SHARE:g} of the GPU" in err
    assert "--gpu-memory-share" in err and "--max-model-len 2048" in err
    assert main(["demo", "--scenario", "good", "--device", "cuda", "--gpu-memory-share", "0.23"]) == 1
    assert "each engine has 0.23 of the GPU" in capsys.readouterr().err

    def other(cfg):
        raise DeployError("demo/canary: not ready after 600 s")
    monkeypatch.setattr(commands, "run_demo", other)
    assert main(["demo", "--scenario", "good", "--device", "cuda"]) == 1
    assert "--gpu-memory-share" not in capsys.readouterr().err
