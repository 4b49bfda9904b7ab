"""bench/profile_steps.py's CPU smoke mode: every case is timed, profiled and split by kind of kernel."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

_BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(_BENCH))   # it imports throughput and engine_decode as the bench scripts beside it
_spec = importlib.util.spec_from_file_location("profile_steps", _BENCH / "profile_steps.py")
profile_steps = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(profile_steps)


def test_smoke_run_profiles_every_case(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert profile_steps.main(["--smoke", "--cases", "arrivals,decode1,ttft,b32", "--json", str(out)]) == 0
    rows = {r["case"]: r for r in json.loads(out.read_text())}
    arrivals = "arrivals: 4 decoding, a 20-token prompt arrives (that step)"
    assert set(rows) == {"decode, batch 1", "prefill, one 40-token prompt (TTFT)", "3 x 20: prefill steps (60 tokens)",
                         "3 x 20: decode steps at 3", arrivals}
    split = rows[arrivals]["split"]   # 18 steps, a prompt arriving every 6th: 3 steps prefill it
    assert split["with a prefill"]["steps"] == 3 and split["decode only"]["steps"] == 15
    for case in ("decode, batch 1", "prefill, one 40-token prompt (TTFT)", "3 x 20: decode steps at 3"):
        r = rows[case]
        assert r["wall_ms"] > 0 and r["floor_ms"] > 0 and r["profiled_steps"] >= 1
        assert 0 < r["busy_ms"] <= r["wall_ms"] * 1.5   # profiled steps run a little slower than timed ones
        assert sum(r["kind_ms"].values()) >= max(ms for _, _, ms, _ in r["top"])
        assert set(r["kind_ms"]) == set(profile_steps.KINDS) and r["top"]
    # 3 prompts of 20 tokens fit one step: one prefill step, then the engine decodes
    assert rows["3 x 20: prefill steps (60 tokens)"]["timed_steps"] == 1
    assert "| decode, batch 1 |" in capsys.readouterr().out


@pytest.mark.parametrize("name, kind", [("nvjet_tst_128x64_64x8_1x1_v_bz_TNT", "matmul"), ("_linear_int8_kernel", "matmul"),
                                        ("_w8a8_tma_kernel", "matmul"),
                                        ("paged_decode_attention_kernel", "attention"), ("_rms_norm_kernel", "norm"),
                                        ("_rope_and_cache_kernel", "rope"), ("_silu_and_mul_kernel", "activation"),
                                        ("void at::native::reduce_kernel<512, 1>", "other")])
def test_kernels_are_sorted_by_their_names(name, kind):
    assert profile_steps.kind_of(name) == kind


def test_unknown_cases_are_refused():
    with pytest.raises(SystemExit):
        profile_steps.main(["--smoke", "--cases", "decode1,b1024"])
