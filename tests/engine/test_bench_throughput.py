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
    # and every step of a batch row by kind: 3 prompts, 4 tokens each (prompt steps, 3 decode-only at 3 sequences)
    for r in (timed[2], timed[3], timed[8], timed[9]):
        k = r["steps_by_kind"]
        assert k["prefill"]["steps"] >= 1 and k["decode_full"]["steps"] == 3 and k["decode_fewer"]["steps"] == 0
        assert 0 < sum(v["s"] for v in k.values()) <= r["wall_s"]
    # the TTFT median row keeps each run (the first and the 2 smoke repetitions); on CPU no clocks
    med = next(r for r in rows if r["row"] == "ttft 40 median")
    assert len(med["runs_ms"]) == 3 and all(ms > 0 for ms in med["runs_ms"]) and med["runs_sm_mhz"] == [None] * 3
    out = capsys.readouterr().out
    assert "floor" in out and "runs: " in out
    assert "steps: " in out and " 3 decode-only at full batch " in out and "outside steps" in out


def test_unknown_rows_are_refused():
    with pytest.raises(SystemExit, match="unknown"):
        throughput.main(["--smoke", "--rows", "b32,b1024"])


def test_smoke_run_compares_the_kv_cache_dtypes(tmp_path, capsys):
    # --kv-cache-dtype both (bench/gpu_session.sh kv-fp8): every row with the model-dtype pages, then with FP8 ones
    out = tmp_path / "t.json"
    assert throughput.main(["--smoke", "--rows", "b32", "--kv-cache-dtype", "both", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["row"] for r in rows] == ["warm-up bf16", "3 x 20/4 first", "3 x 20/4 steady", "warm-up bf16 fp8kv",
                                        "3 x 20/4 first fp8kv", "3 x 20/4 steady fp8kv"]
    # the tiny model in fp32: 4 layers x 2 kv heads x 64 x 4 bytes, K and V; e4m3 and a 4-byte scale per head
    assert (rows[0]["kv_bytes_per_token"], rows[3]["kv_bytes_per_token"]) == (4096, 1088)
    assert all(r["kv_capacity_tokens"] > 0 for r in (rows[0], rows[3]))
    printed = capsys.readouterr().out
    assert "warm-up bf16: KV capacity" in printed and "4096 -> 1088 bytes a token" in printed
    assert "3 x 20/4 steady: " in printed and "with FP8 KV" in printed
