"""The kernels' benchmark-only PDL constexpr (programmatic dependent launch; kernels/linear_gemv.py,
kernels/rms_norm.py) and bench/pdl_chain.py, whose GPU run times it. On CPU: the bench's layer chain (PDL off, through
Triton's interpreter) computes what the ops compose to; compiled for sm_90 in a process without the interpreter, PDL
puts exactly one griddepcontrol.wait and one launch_dependents (and the GEMV's L2 prefetch) into each kernel, and
nothing without it."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sits.kernels import get_kernel_set

ROOT = Path(__file__).resolve().parents[2]
TORCH = get_kernel_set("torch")


@pytest.mark.parametrize("kind", ["bf16", "int8", "fp8"])
def test_the_chain_runs_each_layer_as_the_ops_compose(dev, kind):
    from bench.pdl_chain import EPS, Chain
    h = 64
    chain = Chain(kind, device=dev, layers=2, dims=(h, 96, 80),
                  configs={p: (8, 32, 1) for p in ("qkv", "o", "gate_up", "down")})
    x, r = chain.run(False)
    xr, rr = chain.x0, chain.r0
    for w in chain.layers:   # the same layers through the reference set's ops
        h1, r1 = TORCH.fused_add_rms_norm(xr, rr, w["n1"], EPS)
        o = TORCH.linear(TORCH.linear(h1, w["qkv"])[:, :h].contiguous(), w["o"])
        h2, rr = TORCH.fused_add_rms_norm(o, r1, w["n2"], EPS)
        xr = TORCH.linear(TORCH.silu_and_mul(TORCH.linear(h2, w["gate_up"])), w["down"])
    assert x.shape == (1, h) and torch.isfinite(x).all()
    # two layers of bf16 activations rounded at other points (fused epilogue, fp32 sums): a few bf16 steps
    assert (x.float() - xr.float()).abs().max().item() <= 0.05 * xr.float().abs().max().item()
    assert (r.float() - rr.float()).abs().max().item() <= 0.05 * rr.float().abs().max().item()
    assert torch.equal(chain.run(False)[0], x)   # the same bits again


_COMPILE = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from sits.kernels import linear_gemv as lg, rms_norm as rn

def ptx(fn, sig, const, warps, pdl):
    s = dict(sig); s.update({k: "constexpr" for k in const})
    src = ASTSource(fn=fn, signature=s, constexprs={(fn.arg_names.index(k),): v for k, v in const.items()})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "launch_pdl": pdl})
    assert k.metadata.launch_pdl == pdl
    p = k.asm["ptx"]
    return (p.count("griddepcontrol.wait"), p.count("griddepcontrol.launch_dependents"), p.count("prefetch.global.L2"))

gsig = {n: "*bf16" for n in ("x_ptr", "scale_ptr", "bias_ptr", "out_ptr", "r_ptr", "nw_ptr", "res_ptr")}
gsig.update({"w_ptr": "*i8", "M": "i32", "N": "i32", "K": "i32", "eps": "fp32", "stride_xm": "i32",
             "stride_wn": "i32", "stride_om": "i32", "stride_rm": "i32", "stride_resm": "i32"})
nsig = {n: "*bf16" for n in ("x_ptr", "r_ptr", "w_ptr", "out_ptr", "res_out_ptr")}
nsig.update({n: "i32" for n in ("stride_x", "stride_r", "stride_o", "stride_ro", "H")}, eps="fp32")
for pdl in (False, True):
    g = dict(HAS_SCALE=True, HAS_BIAS=False, BLOCK_N=8, BLOCK_K=512, EVEN_K=True, SILU_EPI=False, INT8_CONV=2,
             NORM=0, RES_AFTER=False, X_BCAST=False, NARROW_W=False, PDL=pdl)
    print("gemv", pdl, *ptx(lg._gemv_kernel, gsig, g, 4, pdl))
    print("norm", pdl, *ptx(rn._rms_norm_kernel, nsig, dict(HAS_RESIDUAL=True, BLOCK_H=4096, PDL=pdl), 16, pdl))
"""


def test_pdl_compiles_to_one_wait_and_one_early_launch_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-c", _COMPILE], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    if proc.returncode and "ptxas" in proc.stderr.lower() and "not found" in proc.stderr.lower():
        pytest.skip("this Triton has no ptxas to compile for sm_90")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.split("\n")
    assert "gemv False 0 0 0" in lines and "norm False 0 0 0" in lines
    assert "gemv True 1 1 1" in lines and "norm True 1 1 0" in lines
