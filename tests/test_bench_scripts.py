"""Every benchmark script with a command line still starts: `python bench/X.py --help` exits 0. They run rarely
(some only on a GPU), so a moved name would otherwise surface only in the next benchmark session (bench/low_traffic.py
imported the demo policy from where it used to live)."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.name for p in (REPO / "bench").glob("*.py") if "argparse" in p.read_text())


@pytest.mark.parametrize("script", SCRIPTS)
def test_bench_script_answers_help(script):
    r = subprocess.run([sys.executable, f"bench/{script}", "--help"], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "usage" in r.stdout.lower(), r.stderr[-2000:]


def test_missing_wheels_lists_only_what_this_interpreter_lacks(tmp_path):
    for name in ("pytest-8.0.0-py3-none-any.whl", "Prometheus_Client-0.1-py3-none-any.whl",
                 "surely_not_installed_sits_pkg-1.0-py3-none-any.whl"):
        (tmp_path / name).write_bytes(b"")
    r = subprocess.run([sys.executable, str(REPO / "bench" / "missing_wheels.py"), str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert [line.rsplit("/", 1)[-1] for line in r.stdout.split()] == ["surely_not_installed_sits_pkg-1.0-py3-none-any.whl"]
    (tmp_path / "surely_not_installed_sits_pkg-1.0-py3-none-any.whl").unlink()
    r = subprocess.run([sys.executable, str(REPO / "bench" / "missing_wheels.py"), str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    # nothing missing: no output at all (an empty line reached pip as a requirement when gpu_session.sh ran twice)
    assert r.returncode == 0 and r.stdout == "", (r.stdout, r.stderr)


def test_bundle_out_keeps_the_named_files_and_archives_the_rest_past_eight(tmp_path):
    import tarfile
    names = ["sits-demo.db", "demo.log", "report.txt"] + [f"f{i}.txt" for i in range(7)]
    for n in names:
        (tmp_path / n).write_text(n)
    r = subprocess.run(["bash", str(REPO / "bench" / "bundle_out.sh"), str(tmp_path), "sits-demo.db", "demo.log",
                        "report.txt"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.log", "others.tar.gz", "report.txt", "sits-demo.db"]
    with tarfile.open(tmp_path / "others.tar.gz") as t:
        assert sorted(t.getnames()) == [f"f{i}.txt" for i in range(7)]
        assert t.extractfile("f3.txt").read() == b"f3.txt"
    few = tmp_path / "few"   # 8 files or fewer come back as they are: nothing is packed
    few.mkdir()
    for i in range(8):
        (few / f"g{i}").write_text("x")
    assert subprocess.run(["bash", str(REPO / "bench" / "bundle_out.sh"), str(few)], timeout=60).returncode == 0
    assert sorted(p.name for p in few.iterdir()) == [f"g{i}" for i in range(8)]


def test_the_e4m3_q_and_p_attention_model_rounds_q_and_the_weights_and_nothing_else():
    # bench/kv_fp8_accuracy.py --qp: attention over FP8 pages with q and the softmax weights (each times its value's
    # scale, as kernels/paged_decode_attention_fp8_dots.py feeds them to the MMA) in e4m3. Against the torch
    # references on the same pages its decode and prefill move outputs by e4m3's rounding, not more; with one key per
    # query the output is that value with its scale rounded to e4m3's 3 mantissa bits: within 2^-4 of it, not equal
    import torch

    from bench.kv_fp8_accuracy import _decode_e4m3_qp, _prefill_e4m3_qp
    from sits.kernels import get_kernel_set
    from tests.kernels.helpers import decode_args, fp8_kv
    ref = get_kernel_set("torch")
    q, k8, v8, tables, lens, scale = fp8_kv(decode_args([1, 63, 65, 300], 8, 2, 64, torch.float32, seed=40))
    got, want = _decode_e4m3_qp(q, k8, v8, tables, lens, scale), ref.paged_decode_attention(q, k8, v8, tables, lens,
                                                                                            scale)
    err = ((got - want).norm() / want.norm()).item()
    assert 1e-4 < err < 0.1, err
    cu = torch.tensor([0, 1, 1 + 63, 1 + 63 + 65, 1 + 63 + 65 + 300], dtype=torch.int32)
    qs = torch.randn(int(cu[-1]), 8, 64, generator=torch.Generator().manual_seed(41))
    got = _prefill_e4m3_qp(qs, k8, v8, tables, cu, lens, scale)
    want = ref.prefill_attention(qs, k8, v8, tables, cu, lens, scale)
    err = ((got - want).norm() / want.norm()).item()
    assert 1e-4 < err < 0.1, err
    one = torch.tensor([1, 1, 1, 1], dtype=torch.int32)
    got, want = _decode_e4m3_qp(q, k8, v8, tables, one, scale), ref.paged_decode_attention(q, k8, v8, tables, one,
                                                                                           scale)
    ratio = (got.norm(dim=-1) / want.norm(dim=-1)).flatten()
    assert not torch.equal(got, want) and ((ratio - 1).abs() <= 2.0 ** -4 + 1e-6).all()


def test_the_gate_refuses_decode_attention_that_computes_in_e4m3_and_a_tolerance_for_it_barely_sees_a_bug():
    # bench/e4m3_attention_gate.py through the product's own measure() and judge(): bf16 over FP8 pages at llama3-8b's
    # heads. triton-v1.8 (exact conversions) passes; the fp8-dots kernel (q and the weights in e4m3) fails the gate as
    # it is, and passes once e4m3 q and weights are admitted -- under which the softmax-scale bug is caught by a
    # margin several times thinner than today's
    import os
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from bench.e4m3_attention_gate import judge_all, measure_all
    rows = {r["set"]: r for r in judge_all(measure_all(seed=0, device="cpu", max_model_len=200, max_num_seqs=4))}
    assert rows["triton-v1.8"]["gate"] == "pass" and rows["triton-v1.8"]["ratio"] < 0.5
    dots = rows["fp8-dots"]
    assert dots["gate"] == "fail" and dots["ratio"] > 1.2 and dots["gate_qp"] == "pass"
    for bug in ("bug: softmax scale +15 %", "bug: one key short"):
        assert rows[bug]["gate"] == "fail" and rows[bug]["ratio"] > 3, rows[bug]
    scale_bug = rows["bug: softmax scale +15 %"]
    assert scale_bug["ratio_qp"] < scale_bug["ratio"] / 2.5, scale_bug


def test_tuning_winners_reads_the_autotuners_timings_as_triton_writes_them(tmp_path):
    # bench/tuning_winners.py: Triton's cache_results files ("key", "configs_timings": [(Config.__dict__, timings)])
    # under a nested device directory, the candidates ranked fastest first, each with its tile and launch parameters
    import json

    import triton

    from bench.tuning_winners import describe, read_timings
    a = triton.Config({"BLOCK_M": 64, "BLOCK_N": 128}, num_warps=4, num_stages=3)
    b = triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8, num_stages=3)
    nested = tmp_path / "sits-H200-driver-1-tune2" / "abc"
    nested.mkdir(parents=True)
    timings = [(b.__dict__, [0.1168, 0.11, 0.12]), (a.__dict__, [0.070, 0.069, 0.071])]
    (nested / "_kernel.autotune.json").write_text(json.dumps({"key": [1024, 128], "configs_timings": timings},
                                                             default=str))
    (t,) = read_timings(str(tmp_path))
    assert t["kernel"] == "_kernel" and t["key"] == [1024, 128]
    assert [ms for _, ms in t["candidates"]] == [0.070, 0.1168]
    assert describe(t["candidates"][0][0]) == "BLOCK_M=64 BLOCK_N=128 warps=4 stages=3"


def test_gemv_rows_shows_which_config_timing_from_the_l2_picks_and_what_it_costs_past_it(capsys):
    # bench/gemv_rows.py's sweep times each config past the L2 ("us") and replaying one weight ("hot_us", as the
    # autotuner does): where the two rankings disagree, the hot winner's past-L2 time minus the past-L2 winner's
    from bench.gemv_rows import report, tuner_view

    def cfg(bn, bk, us, hot, shape="qkv", kind="fp8"):
        return dict(kind=kind, shape=shape, BLOCK_N=bn, BLOCK_K=bk, num_warps=4, num_stages=1, us=us, hot_us=hot)
    swept = [cfg(4, 2048, 10.5, 6.0), cfg(16, 512, 8.8, 6.4), cfg(8, 512, 9.7, 6.2),
             cfg(8, 1024, 7.0, 5.0, shape="o"), cfg(4, 2048, 7.5, 5.5, shape="o"),
             dict(kind="fp8", shape="down", BLOCK_N=4, BLOCK_K=4096, error="out of resources")]
    view = {v["shape"]: v for v in tuner_view(swept)}
    assert set(view) == {"qkv", "o"}   # a config that failed to compile is left out
    assert view["qkv"]["hot_pick"].startswith("N4 K2048") and view["qkv"]["cold_pick"].startswith("N16 K512")
    assert view["qkv"]["lost_us"] == pytest.approx(1.7) and view["o"]["lost_us"] == 0.0
    report({"device": "GPU", "torch": "t", "triton": "tr", "rows": [], "sweep": swept})
    out = capsys.readouterr().out
    assert "timing from the L2" in out and "a batch-1 step's linears lose, ms: fp8 0.054" in out


def test_throughput_reads_the_gpus_clock_from_nvidia_smi_or_nothing(monkeypatch):
    import subprocess

    from bench import throughput

    class Done:
        stdout = "1980, 655.21, 0x0000000000000004\n"
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: Done())
    assert throughput.gpu_clocks() == {"sm_mhz": 1980, "power_w": 655.21, "throttle": "0x0000000000000004"}

    def missing(*a, **k):
        raise FileNotFoundError("nvidia-smi")
    monkeypatch.setattr(subprocess, "run", missing)
    assert throughput.gpu_clocks() == {}


def test_tail_cliff_reads_back_each_check_interval_of_a_stored_rollout_and_its_two_estimators(tmp_path):
    # bench/tail_cliff.py --store: a rollout driven through the real reconcile() and Store with one two-mode window
    # per check; the replay's intervals (differences of the checks' cumulative evidence) are those windows, bucket for
    # bucket
    import argparse
    import math

    import numpy as np

    from bench import tail_cliff as tc
    from bench.sequential_sim import policy
    from sits.control_plane.analysis import HistogramSnapshot, VariantData
    from sits.control_plane.rollout import Observation, Rollout, reconcile
    from sits.control_plane.store.db import Store

    a = argparse.Namespace(tokens=3000, share=0.007, events=18, event_shape=2.0, fast_ms=0.55, fast_sigma=0.25,
                           slow_ms=6.3, slow_sigma=0.25, load_sd=0.08, slow_load_sd=0.18)
    rng = np.random.default_rng(5)

    def data(counts):
        return VariantData({tc.ITL: HistogramSnapshot._trusted(tc.BOUNDS, tuple(np.cumsum(counts).tolist()), 0.0,
                                                                float(counts.sum()))}, float(counts.sum()), 0.0)

    path = str(tmp_path / "s.db")
    fed = []
    with Store(path) as store:
        r = store.create(Rollout("r1", "svc", "new", "old", policy("sequential")))
        r, _ = reconcile(r, None, 0.0)
        r = store.save(r)
        r, _ = reconcile(r, Observation(0.0, 1.0, {"baseline": VariantData(), "canary": VariantData()}), 1.0)
        r = store.save(r)
        t = 1.0
        while len(fed) < 12:
            c, b = tc.window(rng, 1.0, a), tc.window(rng, 1.0, a)
            r, _ = reconcile(r, Observation(t, t + 5.0, {"canary": data(c), "baseline": data(b)}), t + 5.0)
            if r.new_checks and r.new_checks[-1].window_start is not None:   # not the warm-up's check
                fed.append((c, b))
            r = store.save(r)
            t += 5.0
    r, cs, bs, ends = tc.intervals(path, tc.ITL)
    assert (r.canary_kernels, r.production_kernels) == ("new", "old") and len(cs) == len(fed) and ends == sorted(ends)
    assert all(np.array_equal(c, fc) and np.array_equal(b, fb) for c, b, (fc, fb) in zip(cs, bs, fed))
    # identical arms: every window value is 0; an arm two buckets slower: log(2^(1/4)) each (bounds keep 9 digits)
    assert tc.per_window(cs, cs, 0.99) == [0.0] * len(cs)
    slower = np.roll(cs, 2, axis=1)
    assert np.allclose(tc.per_window(slower, cs, 0.9), math.log(2 ** 0.25))
    pooled, pv = tc.pooled_pseudo(slower, cs, 0.99)
    assert math.isclose(pooled, math.log(2 ** 0.25), rel_tol=1e-6) and np.allclose(pv, pooled)
    assert tc.main(["--store", path]) == 0 and tc.main(["--store", path, "--rollout", "r1"]) == 0
    assert tc.main(["--store", path, "--rollout", "nope"]) == 1     # "no rollout 'nope'", nothing else


def test_fused_prologue_check_counts_agreement_zero_tokens_and_finiteness_per_run():
    # bench/fused_prologue_check.py's table (the GPU runs need CUDA): runs against triton-v1.5 with CUDA graphs
    spec = importlib.util.spec_from_file_location("fused_prologue_check", REPO / "bench" / "fused_prologue_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    got = {("triton-v1.5", False): {"tokens": [[5, 6, 7], [8, 9, 10]], "alone": [[5, 0, 0], [8, 9, 10]],
                                    "finite": True},
           ("triton-v1.6", False): {"tokens": [[5, 0, 0], [8, 0, 0]], "alone": [[5, 6, 7], [8, 9, 10]],
                                    "finite": True},   # what the canary served
           ("triton-v1.6", True): {"tokens": [[5, 6, 7], [8, 9, 11]], "alone": [[5, 6, 7], [8, 9, 11]],
                                   "finite": False}}
    rows = [line.split() for line in mod.summary(got, "head")[2:]]
    assert rows == [["triton-v1.5", "graphs", "2", "6/6", "0", "True"], ["triton-v1.5", "graphs", "1", "4/6", "2"],
                    ["triton-v1.6", "graphs", "2", "2/6", "4", "True"], ["triton-v1.6", "graphs", "1", "6/6", "0"],
                    ["triton-v1.6", "eager", "2", "5/6", "0", "False"], ["triton-v1.6", "eager", "1", "5/6", "0"]]


def test_decode_graphs_check_counts_tokens_equal_position_by_position():
    spec = importlib.util.spec_from_file_location("decode_graphs_check", REPO / "bench" / "decode_graphs_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.same([[1, 2, 3], [4, 5]], [[1, 9, 3], [4, 5, 6]]) == 4
    with pytest.raises(SystemExit):   # a malformed size is refused before anything loads
        mod.main(["--sizes", "64by8192"])


def test_fused_prologue_served_flags_token_zero_and_forced_misses_and_tabulates_skips():
    # bench/fused_prologue_served.py (the servers need a device for the real case): which prompts it reports, and
    # its table with a skipped restart
    spec = importlib.util.spec_from_file_location("fused_prologue_served", REPO / "bench" / "fused_prologue_served.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod   # its dataclass looks its module up while the module runs
    try:
        spec.loader.exec_module(mod)
    finally:
        del sys.modules[spec.name]
    from sits.control_plane.analysis import Continuation, PromptReplay, TokenLogprob

    def cont(ids, top1s=None):
        # a position is top-1 unless another token has a higher logprob
        lps = tuple(TokenLogprob(t, -0.1, ((t, -0.1),) if ok else ((t + 1, -0.01),))
                    for t, ok in zip(ids, top1s or [True] * len(ids)))
        return Continuation(tuple(ids), "x", lps)
    good = PromptReplay("a", cont([5, 6, 7]), cont([5, 6, 7]), cont([5, 6, 7]))
    zeros = PromptReplay("b", cont([5, 6, 7]), cont([5, 0, 0]), cont([5, 6, 7], [True, False, False]))
    first_zero = PromptReplay("c", cont([0, 6]), cont([0, 6]), cont([0, 6]))   # token 0 first: not flagged
    assert mod.suspicious([good, zeros, first_zero]) == [{"index": 1, "zeros": 2, "forced_top1": 1 / 3, "error": ""}]
    rows = [{"replay": "v1.6 vs v1.5", "concurrency": 4, "outcome": "fail", "top1": 0.7285, "suspicious":
             [{"index": 4, "zeros": 2}, {"index": 8, "zeros": 4}]},
            {"replay": "eager: v1.6 --enforce-eager", "skipped": "20 s of the budget left, a start took 80 s"}]
    lines = mod.table(rows, "head")
    assert lines[2].split() == ["v1.6", "vs", "v1.5", "4", "fail", "0.729", "2", "4:2", "8:4"]
    assert "skipped" in lines[3] and "a start took 80 s" in lines[3]


def test_fused_prologue_pattern_fingerprints_every_weight_and_reports_the_signature():
    # bench/fused_prologue_pattern.py: a stray write into any weight tensor (plain, quantized, in a layer list)
    # changes the fingerprint; the prompts it reports and its table
    import torch

    spec = importlib.util.spec_from_file_location("fused_prologue_pattern", REPO / "bench" / "fused_prologue_pattern.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    from sits.kernels.quant import quantize_weight

    class Layer:
        def __init__(self):
            self.w = quantize_weight(torch.randn(8, 16), "int8")
            self.norm = torch.ones(16)

    class Proj:   # the engine's Linear: its weight one level further down
        def __init__(self):
            self.weight = quantize_weight(torch.randn(8, 16), "int8")

    class Model:
        def __init__(self):
            self.embed_tokens = torch.randn(32, 16)
            self.layers = [Layer(), Layer()]
            self.layers[1].down_proj = Proj()   # model -> layers -> [1] -> down_proj -> weight -> qweight
            self.ks = object()   # the kernel set: not a weight

    m = Model()
    names = set(mod.weight_tensors(m))
    assert names == {"embed_tokens", "layers[0].w.qweight", "layers[0].w.scale", "layers[0].norm",
                     "layers[1].w.qweight", "layers[1].w.scale", "layers[1].norm",
                     "layers[1].down_proj.weight.qweight", "layers[1].down_proj.weight.scale"}
    before = mod.fingerprint(m)
    m.layers[1].w.qweight[3, 5] += 1
    after = mod.fingerprint(m)
    assert [k for k in before if before[k] != after[k]] == ["layers[1].w.qweight"]
    result = [{"tokens": [5, 6, 7], "forced_top1": 1.0}, {"tokens": [5, 0, 0], "forced_top1": 1 / 16},
              {"tokens": [0, 4], "forced_top1": 0.9}]
    assert mod.bad_prompts(result) == [(1, 2, 1 / 16)]
    lines = mod.table([{"label": "triton-v1.6", "same": "20/32", "bad": [(4, 2, 0.06), (8, 5, 0.06)],
                        "weights": "unchanged"}], "head")
    assert lines[2].split() == ["triton-v1.6", "20/32", "2", "unchanged", "4:2", "8:5"]
