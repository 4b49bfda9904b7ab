"""bench/kernel_resources.py: the prefill attention kernels compiled for sm_90 here (no GPU), and what their key loop
does -- the FP8 kernels send both converted tiles back through shared memory and wait for each dot at once, v1.1's
bf16 loop does neither; triton-v1.19's loop with the scores transposed sends one (BENCHMARKS.md "FP8 prefill fronts
and the issue's rows")."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import kernel_resources as kr

ROOT = Path(__file__).resolve().parents[2]

_TTGIR = """\
module {
  tt.func @k() {
    %q = ttg.local_alloc %a : (tensor<128x128xf16>) -> !ttg.memdesc<128x128xf16>
    %r:3 = scf.for %i = %c0 to %n step %c64 iter_args(%x = %z) -> (tensor<128xf32>) {
      %k = ttg.local_load %t : !ttg.memdesc<64x128xf8E4M3FN> -> tensor<64x128xf8E4M3FN>
      %kk = ttg.local_alloc %k16 : (tensor<64x128xf16>) -> !ttg.memdesc<64x128xf16>
      %s = ttng.warp_group_dot %q, %kk, %c {isAsync = true} : x
      %s2:2 = ttng.warp_group_dot_wait %s, %kk {pendings = 0 : i32} : x
      %o = ttng.warp_group_dot %p, %v, %acc {isAsync = true} : x
      scf.yield %o : x
    } loc(#loc1)
    %w = ttng.warp_group_dot_wait %r#2 {pendings = 0 : i32} : x
    %e = scf.for %j = %c0 to %m step %c1 iter_args(%y = %z) -> (i32) {
      scf.yield %y : i32
    }
    tt.return
  }
}
"""


def test_the_key_loop_is_the_one_with_the_most_dots_and_its_ops_are_counted():
    got = kr.loop_ops(_TTGIR)
    # the wait after the loop and the allocation before it are not the loop's; the second loop has no dots
    assert got == {"loops": 2, "stores": 1, "loads": 1, "dots": 2, "waited_at_once": 1}
    assert kr.loop_ops("module {}")["loops"] == 0


def test_every_named_kernel_is_described():
    assert set(kr._kernels()) == set(kr.KERNELS)


def test_unknown_kernels_are_refused(capsys):
    with pytest.raises(SystemExit):
        kr.main(["--kernels", "v9"])
    assert "unknown kernels ['v9']" in capsys.readouterr().err


def test_fp8_loops_send_tiles_back_through_shared_memory_and_wait_for_every_dot(tmp_path):
    # a process without TRITON_INTERPRET (this one imported the kernels for the interpreter): Triton compiles for
    # Hopper here and cuobjdump reads its cubin
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    out = tmp_path / "resources.json"
    proc = subprocess.run([sys.executable, "bench/kernel_resources.py", "--kernels", "v1.1,v1.18,v1.19", "--json",
                           str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode and "carries no cuobjdump" in proc.stderr + proc.stdout:
        pytest.skip("this Triton has no cuobjdump")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    bf16 = [r for r in rows if "bf16" in r["kernel"]]
    fp8 = [r for r in rows if r["kernel"].endswith("TMA, FP8 pages")]
    transposed = [r for r in rows if "scores transposed" in r["kernel"]]
    assert len(bf16) == 5 and len(fp8) == 4 and len(transposed) == 2
    assert all(r["stores"] == 0 and r["waited_at_once"] < r["dots"] for r in bf16), bf16
    assert all(r["stores"] == 2 and r["waited_at_once"] == r["dots"] == 2 for r in fp8), fp8
    # scores transposed: the converted K and V stay wgmma's register operands, only P^T goes to shared memory
    assert all(r["stores"] == 1 and r["dots"] == 2 for r in transposed), transposed
    assert all(0 < r["registers"] <= 255 and r["spill_stack_bytes"] >= 0 for r in rows)
    # every kernel issues wgmma (HGMMA) and reads shared memory; the FP8 loops convert through warp shuffles too
    assert all(r["sass"]["tensor-core ops"] > 0 and r["sass"]["shared loads"] > 0 for r in rows), rows
    assert all(r["sass"]["shuffles"] > max(b["sass"]["shuffles"] for b in bf16) for r in fp8 + transposed), rows
    assert "| triton-v1.18 TMA, FP8 pages | BLOCK_M 128, 4 warps, 2 stages |" in proc.stdout


def test_tiles_in_flight_reads_the_pipeliners_buffers():
    ttgir = ("%k = ttg.local_alloc : () -> !ttg.memdesc<2x32x128xf8E4M3FN, #shared2, #smem, mutable>\n"
             "%b = ttg.local_alloc : () -> !ttg.memdesc<1x32xi32, #shared1, #smem, mutable>\n"
             "%q = ttg.local_alloc %x : (tensor<16x128xf16>) -> !ttg.memdesc<16x128xf16, #shared, #smem>")
    assert kr.tiles_in_flight(ttgir) == 2
    assert kr.tiles_in_flight("module {}") == 0


def test_decode_attention_keeps_two_tiles_in_flight_from_five_stages_and_k_in_the_dot_skips_staging(tmp_path):
    # compiled as a launch specializes it: with its strides marked, the page loads are 16-byte async copies, one K/V
    # tile buffered up to 4 stages (the next tile's copies wait for this one's to land) and two from 5
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    out = tmp_path / "decode.json"
    proc = subprocess.run([sys.executable, "bench/kernel_resources.py", "--kernels", "decode", "--json", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode and "carries no cuobjdump" in proc.stderr + proc.stdout:
        pytest.skip("this Triton has no cuobjdump")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["config"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["BLOCK_N 32, 1 warps, 3 stages"]["tiles_in_flight"] == 1
    assert rows["BLOCK_N 32, 1 warps, 5 stages"]["tiles_in_flight"] == 2
    # the key tile converted in the q.k dot's operand layout: only the value tile goes back through shared memory
    assert rows["BLOCK_N 32, 1 warps, 3 stages"]["stores"] == 2
    assert rows["BLOCK_N 32, STAGE_K False, 1 warps, 3 stages"]["stores"] == 1
    assert all(r["sass"]["tensor-core ops"] > 0 and r["spill_stack_bytes"] == 0 for r in rows.values()), rows
