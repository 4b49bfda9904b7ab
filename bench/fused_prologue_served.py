"""triton-v1.6's GPU canary failure, replayed as the product ran it: two `sits-engine serve` processes and the gate.

Its GPU canary (bench/gpu_demo.sh prologue, H200, 2026-12-05; store /work/.device/2) was rolled back by the
correctness gate, and the evidence has a shape an arithmetic fault in the fused op does not explain:
- the replay runs 4 prompts at a time (baseline greedy -> canary greedy -> canary teacher-forced echo per prompt);
  of the 8 diverged prompts the store keeps, the 7 with token-0 continuations are 4, 8, ..., 28: each the prompt
  taken by the first worker to finish its previous one, whose requests reach the canary while the other three
  workers' requests are still there;
- in those prompts' teacher-forced (echo) pass only the first position was right (top-1 1/16), although that pass is
  a prefill of 41+ tokens (byte tokenizer, prompt + 16), where triton-v1.6 runs v1.5's two ops (the fused kernel
  takes at most 32 rows): every row from the first generated token on read something wrong;
- the greedy continuations were token 0 at zero margin for 2-6 tokens, then other tokens again.
So the suspects are state that outlives a step (split-K's lock counters and partials, the CUDA graphs' static
buffers, the KV pages of a finished request) and the steps that mix a prompt with running decodes, not the fused
op's arithmetic (right alone at 1 and 7 rows on the GPU, bit for bit v1.5's on CPU).

This starts a baseline (production's set) and a canary engine as the demo did, runs the product's own replay
(adapters/inference/correctness.py, the default prompt set and policy) at concurrency 4, at 1, and with the roles
swapped, then restarts the canary per variant -- an A/A control with production's set, --enforce-eager,
--no-piecewise-graphs, split-K off (SPLIT_K 1 in every weight-only tuning candidate) -- and replays at concurrency 4
again. Per replay: the gate's outcome, top-1 agreement, and the prompts whose canary continuation holds token 0 or
whose teacher-forced top-1 is below 50 %, with their round. The table comes last; --json keeps every row.

    python3 bench/fused_prologue_served.py [--model llama3-8b] [--quantization int8] [--budget-s 540]
    .venv/bin/python bench/fused_prologue_served.py --device cpu --model tiny --canary torch --baseline torch \\
        --variants aa,eager      # the plumbing on CPU (no graphs there)
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# canary variants after the first start: (name, kernel set: None = --canary, extra serve flags, split-K off)
VARIANTS = {
    "aa": (None, (), False),                           # production's set as the canary: the engine's own noise
    "eager": ("canary", ("--enforce-eager",), False),
    "no-piecewise": ("canary", ("--no-piecewise-graphs",), False),
    "no-split-k": ("canary", ("--engine-process", "off"), True),
    "no-engine-process": ("canary", ("--engine-process", "off"), False),   # split-K on: which of the two matters
}
DEFAULT_VARIANTS = "aa,eager,no-split-k,no-piecewise"   # the most telling first: the budget may cut the last
_SPLIT_K_OFF = ("import sys; sys.path.insert(0, {root!r}); from bench.fused_prologue_check import without_split_k; "
                "without_split_k(); from sits.engine.cli import main; sys.exit(main(sys.argv[1:]))")


@dataclass
class Engine:
    name: str
    port: int
    proc: subprocess.Popen
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(name: str, a, kernels: str, extra: tuple[str, ...] = (), split_k_off: bool = False) -> Engine:
    port = free_port()
    serve = ["serve", "--model", a.model, "--kernels", kernels, "--device", a.device, "--port", str(port),
             "--service", name, "--no-access-log", "--log-level", "warning", "--max-num-seqs", "64", *extra]
    if a.device == "cuda":
        serve += ["--gpu-memory-utilization", str(a.gpu_memory_utilization)]
    if a.quantization:
        serve += ["--quantization", a.quantization]
    if split_k_off:
        cmd = [sys.executable, "-c", _SPLIT_K_OFF.format(root=str(ROOT)), *serve]
    else:
        cmd = [sys.executable, "-m", "sits.engine.cli", *serve]
    log = a.logs / f"{name}-{port}.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    return Engine(name, port, proc, log)


def wait_ready(*engines: Engine, timeout: float = 420) -> float:
    import requests
    t0 = time.monotonic()
    pending = list(engines)
    while pending:
        e = pending[0]
        if e.proc.poll() is not None:
            tail = e.log.read_text(errors="replace").splitlines()[-15:]
            raise RuntimeError(f"engine {e.name} exited with code {e.proc.returncode}:\n" + "\n".join(tail))
        try:
            if requests.get(e.url + "/readyz", timeout=2).status_code == 200:
                pending.pop(0)
                continue
        except requests.RequestException:
            pass
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"engine {e.name} not ready after {timeout:g} s (log {e.log})")
        time.sleep(1)
    return time.monotonic() - t0


def suspicious(replays) -> list[dict]:
    """Prompts whose canary continuation holds token 0 after its first token, or whose teacher-forced top-1
    agreement is under 50 %: (index, zeros, forced top-1)."""
    rows = []
    for i, r in enumerate(replays):
        zeros = sum(t == 0 for t in r.canary.token_ids[1:])
        forced = r.forced.logprobs
        top1 = sum(f.is_top1 for f in forced) / len(forced) if forced else None
        if zeros or (top1 is not None and top1 < 0.5) or r.canary.error:
            rows.append({"index": i, "zeros": zeros, "forced_top1": top1, "error": r.canary.error or ""})
    return rows


def replay(label: str, canary: Engine, baseline: Engine, concurrency: int) -> dict:
    from sits.control_plane.adapters.inference.correctness import CorrectnessProbe, load_prompt_set
    from sits.control_plane.analysis.correctness import compare_replays
    from sits.control_plane.analysis.gate_policy import tolerances_key
    from sits.control_plane.analysis.gate_policy import CorrectnessPolicy
    policy = CorrectnessPolicy(concurrency=concurrency)
    probe = CorrectnessProbe()
    prompts = load_prompt_set(policy.prompt_set, None)
    model, dtype, quantized = probe.describe(baseline.url, policy.request_timeout_s)
    t0 = time.perf_counter()
    replays, _, _ = probe.replay(canary.url, baseline.url, policy, model, prompts)
    seconds = time.perf_counter() - t0
    v = compare_replays(replays, policy, tolerances_key(dtype or "unknown", quantized, quantized))
    bad = suspicious(replays)
    row = {"replay": label, "canary": canary.name, "baseline": baseline.name, "concurrency": concurrency,
           "outcome": v.outcome.value, "top1": v.top1_agreement, "identical": v.identical_fraction,
           "seconds": round(seconds, 1), "suspicious": bad, "reason": v.reason}
    shown = ", ".join(f"#{b['index']} (round {b['index'] // concurrency}, zeros {b['zeros']}, forced top-1 "
                      f"{'-' if b['forced_top1'] is None else format(b['forced_top1'], '.2f')})" for b in bad)
    print(f"[{label}] {v.outcome.value}: top-1 {v.top1_agreement:.3f}, identical {v.identical_fraction:.2f}, "
          f"{len(bad)} suspicious prompt(s){': ' + shown if bad else ''}", flush=True)
    return row


def table(rows: list[dict], header: str) -> list[str]:
    out = [header, f"{'replay':48} {'conc':>4} {'gate':>12} {'top-1':>6} {'bad':>4}  bad prompts (index:zeros)"]
    for r in rows:
        if "skipped" in r:
            out.append(f"{r['replay']:48} {'':>4} {'skipped':>12}  {r['skipped']}")
            continue
        bad = " ".join(f"{b['index']}:{b['zeros']}" for b in r["suspicious"][:10])
        out.append(f"{r['replay']:48} {r['concurrency']:>4} {r['outcome']:>12} {r['top1']:6.3f} "
                   f"{len(r['suspicious']):>4}  {bad}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama3-8b")
    p.add_argument("--quantization", default="int8", help="'' for none")
    p.add_argument("--device", default="cuda")
    p.add_argument("--canary", default="triton-v1.6")
    p.add_argument("--baseline", default="triton-v1.5")
    p.add_argument("--variants", default=DEFAULT_VARIANTS,
                   help=f"canary restarts after the first replays, in order (of {','.join(VARIANTS)}; '' for none)")
    p.add_argument("--first", default="c4,c1,swapped",
                   help="the replays against the first canary: c4 (concurrency 4), c1 (1), swapped (roles swapped)")
    p.add_argument("--variant-concurrency", type=int, default=4, help="the variants' replays' concurrency")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    p.add_argument("--budget-s", type=float, default=540, help="skip a restart that would not finish inside it")
    p.add_argument("--logs", type=Path, default=Path(os.environ.get("OUT", "/tmp")) / "fused-prologue-served")
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args(argv)
    variants = [v for v in a.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        p.error(f"unknown variant(s) {unknown}; choose from {sorted(VARIANTS)}")
    if set(a.first.split(",")) - {"c4", "c1", "swapped", ""}:
        p.error(f"--first {a.first!r}: a comma-separated list of c4, c1, swapped")
    a.logs.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    rows: list[dict] = []

    def save() -> None:
        if a.json:
            a.json.write_text(json.dumps(rows, indent=1))

    base = start("baseline", a, a.baseline)
    canary = start("canary", a, a.canary)
    try:
        ready = wait_ready(base, canary)
        print(f"baseline {a.baseline} and canary {a.canary} ready in {ready:.0f} s ({a.model}, "
              f"{a.quantization or 'no'} quantization, {a.device}); logs in {a.logs}", flush=True)
        first = {"c4": (f"{a.canary} vs {a.baseline}", canary, base, 4),
                 "c1": (f"{a.canary} vs {a.baseline}", canary, base, 1),
                 "swapped": (f"swapped: {a.baseline} vs {a.canary}", base, canary, 4)}
        for label, c, b, conc in (first[f] for f in a.first.split(",") if f):
            rows.append(replay(label, c, b, conc))
            save()
        restart_s = ready
        for name in variants:
            kernels, extra, split_off = VARIANTS[name]
            ks = a.baseline if kernels is None else a.canary
            label = f"{name}: {ks}" + (f" {' '.join(extra)}" if extra else "") + (" SPLIT_K 1" if split_off else "")
            left = a.budget_s - (time.monotonic() - t_start)
            if left < restart_s + 30:
                rows.append({"replay": label, "skipped": f"{left:.0f} s of the budget left, a start took "
                                                          f"{restart_s:.0f} s"})
                print(f"[{label}] skipped: {rows[-1]['skipped']}", flush=True)
                continue
            canary.stop()
            canary = start(f"canary-{name}", a, ks, extra, split_off)
            restart_s = wait_ready(canary)
            print(f"canary {label} ready in {restart_s:.0f} s", flush=True)
            rows.append(replay(label, canary, base, a.variant_concurrency))
            save()
    finally:
        canary.stop()
        base.stop()
    print()
    print("\n".join(table(rows, f"{a.model}, {a.quantization or 'no'} quantization, {a.device}: the product's gate "
                                "replay (32 prompts, greedy 16 tokens, teacher-forced echo) per canary engine")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
