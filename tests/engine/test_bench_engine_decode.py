"""bench/engine_decode.py's CPU smoke mode and its --configs parsing (the GPU run is the benchmark itself)."""

import importlib.util
import json
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "engine_decode", Path(__file__).resolve().parents[2] / "bench" / "engine_decode.py")
engine_decode = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(engine_decode)


def test_configs_parse():
    assert engine_decode.parse_config("torch") == ("torch", None, False)
    assert engine_decode.parse_config("triton-v1.1:int8:graphs") == ("triton-v1.1", "int8", True)
    assert engine_decode.parse_config("triton-v1.1:none:graphs") == ("triton-v1.1", None, True)
    assert engine_decode.parse_config("triton-v1.1:graphs") == ("triton-v1.1", None, True)
    with pytest.raises(SystemExit, match="not KERNELS"):
        engine_decode.parse_config("triton-v1.1:int4")


def test_cpu_smoke_run_reports_every_batch(tmp_path, capsys):
    out = tmp_path / "decode.json"
    assert engine_decode.main(["--model", "tiny", "--cpu", "--batches", "1,2", "--tokens", "3", "--configs", "torch",
                               "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["kernels"], r["graphs"], r["batch"], r["steps"]) for r in rows] == [("torch", False, 1, 2),
                                                                                  ("torch", False, 2, 2)]
    assert all(r["step_ms_median"] > 0 and r["floor_ms"] > 0 for r in rows)
    assert "x floor" in capsys.readouterr().out
