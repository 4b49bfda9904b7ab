"""bench/throughput.py's CPU smoke mode: every requested row is reported with its floor and compile counts."""

import importlib.util
import json
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "throughput", Path(__file__).resolve().parents[2] / "bench" / "throughput.py")
throughput = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(throughput)


def test_smoke_run_reports_every_row(tmp_path, capsys):
    out = tmp_path / "t.json"
    assert throughput.main(["--smoke", "--rows", "ttft,decode1,b32,decode1-int8,b32-int8", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    names = [r["row"] for r in rows]
    assert names == ["warm-up int8", "decode b1 int8 first", "decode b1 int8 second", "3 x 20/4 int8 first",
                     "3 x 20/4 int8 steady", "warm-up bf16", "ttft 40 first", "ttft 40 median", "decode b1 bf16 first",
                     "decode b1 bf16 second", "3 x 20/4 first", "3 x 20/4 steady"]
    timed = [r for r in rows if "out_tok_s" in r]
    assert all(r["out_tok_s"] > 0 and r["floor_tok_s"] > 0 and r["compiles"] == 0 for r in timed)
    # decode rows measure their steps: 6 output tokens = 5 decode steps at batch 1
    assert [r["steps"] for r in timed if r["row"].startswith("decode b1")] == [5, 5, 5, 5]
    assert timed[8]["decode_steps_at_full_batch"]["steps"] == 3 == timed[2]["decode_steps_at_full_batch"]["steps"]
    assert "floor" in capsys.readouterr().out


def test_unknown_rows_are_refused():
    with pytest.raises(SystemExit, match="unknown"):
        throughput.main(["--smoke", "--rows", "b32,b1024"])
