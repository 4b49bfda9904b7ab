"""bench/tensor_parallel.py: its CPU smoke mode measures every row for TP 1 and TP 2 (gloo) and prints the table;
on a host without enough GPUs it says so and exits 2 before starting anything."""

import importlib.util
import json
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "tensor_parallel_bench", Path(__file__).resolve().parents[2] / "bench" / "tensor_parallel.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_smoke_run_measures_both_sizes(tmp_path, capsys):
    out = tmp_path / "tp.json"
    assert bench.main(["--smoke", "--json", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [r["size"] for r in runs] == [1, 2]
    for r in runs:
        assert all(r[key] > 0 for key, _ in bench.ROWS), r
    table = capsys.readouterr().out.split("\n\ntiny torch on CPU (gloo)\n", 1)[1].splitlines()
    assert table[0].split() == ["row", "TP", "1", "TP", "2", "TP", "2", "/", "TP", "1"]
    assert [line[:32].strip() for line in table[1:]] == [
        "decode b1 (tok/s)", "ttft 40 (ms, median)", "3 x 20/4 (tok/s)", "load + warm-up (s)"]


def test_too_few_gpus_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setattr(bench, "gpu_count", lambda: 1)
    monkeypatch.setattr(bench.subprocess, "run", lambda *a, **k: (_ for _ in ()).throw(AssertionError("a run")))
    assert bench.main(["--sizes", "1,2"]) == 2
    assert "tensor_parallel_size 2 needs 2 CUDA GPUs (one per rank), 1 visible" in capsys.readouterr().err
