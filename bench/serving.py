"""How much of the serving wall time is the HTTP layer? N concurrent streaming clients against `sits-engine serve`,
next to the same requests offline, in one run.

1. Offline: the same requests straight into LLMEngine (no HTTP): wall time and summed step time.
2. Served, once per `--engine-process` mode (default both): `on` (the engine core in its own process, the default of
   `sits-engine serve`) and `off` (the engine loop in a thread of the HTTP process: the baseline). `sits-engine serve`
   runs as a separate process; N clients (a minimal asyncio HTTP/1.1 client, so the load generator itself stays
   cheap) each stream one completion at the same time. From the server's /metrics before and after: summed engine
   step time (sits_engine_step_seconds), and CPU seconds of the engine loop and of the HTTP (event-loop) thread
   (sits_thread_cpu_seconds); on the client side TTFT/ITL/e2e and whether every token arrived.

    .venv/bin/python bench/serving.py                 # tiny on CPU: 256 clients x 64 tokens, best of 2 alternating runs
    .venv/bin/python bench/serving.py --model llama3-8b --device cuda --kernels triton-v1.1 --max-tokens 128 --repeat 1
    .venv/bin/python bench/serving.py --rates 2,4,8 --open-requests 32   # plus open-loop Poisson arrivals per rate
    .venv/bin/python bench/serving.py --prefill-caps none,512,256       # the core process once per prefill cap
    .venv/bin/python bench/serving.py --piecewise-compare               # and once more with --no-piecewise-graphs
    python3 bench/serving.py --model llama3-8b --device cuda --kernels triton-v1.5 --quantization fp8 --kv-cache-dtype fp8

`--prefill-caps`: `sits-engine serve --max-prefill-tokens-while-decoding N` per value (none: the flag left out), each
in the core-process mode (the in-process baseline runs with the first value). Besides the clients' own timings, the
table shows the servers' histograms: ITL and TTFT as the engine observed them (no client-side parsing in them) and the
engine step's p50/p99, which says whether long gaps come from long steps.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import socket
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from sits.control_plane.analysis.quantile import histogram_quantile  # noqa: E402
from sits.wire.metrics import ENGINE_STEP, ITL, TTFT  # noqa: E402

HISTOGRAMS = (ITL, TTFT, ENGINE_STEP)


def _prompt(i: int) -> str:
    return f"Client {i:03d} asks: tell me about canary releases of GPU kernels, please."


def offline(args) -> dict:
    from sits.engine import EngineConfig, LLMEngine, SamplingParams

    engine = LLMEngine(EngineConfig(model=args.model, kernels=args.kernels, device=args.device,
                                    max_num_seqs=args.max_num_seqs, quantization=args.quantization,
                                    kv_cache_dtype=args.kv_cache_dtype))
    engine.warmup()
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(args.clients):
        engine.add_request(f"r{i}", _prompt(i), params)
    steps, step_s = 0, 0.0
    while engine.has_unfinished_requests():
        s0 = time.perf_counter()
        engine.step()
        step_s += time.perf_counter() - s0
        steps += 1
    result = {"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0, "step_s": step_s, "steps": steps,
              "tokens": engine.stats().generation_tokens_total}
    del engine  # free its KV cache before the server process sizes its own from free GPU memory
    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result


async def _stream_one(host: str, port: int, i: int, max_tokens: int, model: str = "tiny") -> dict:
    body = json.dumps({"model": model, "prompt": _prompt(i), "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}).encode()
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    await writer.drain()
    status = (await reader.readline()).split()[1]
    while (await reader.readline()) not in (b"\r\n", b""):
        pass  # headers; the body is chunked
    buf, arrivals, usage = b"", [], None
    while True:
        size = int((await reader.readline()).strip(), 16)
        if size == 0:
            break
        buf += await reader.readexactly(size)
        await reader.readexactly(2)
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            data = event.removeprefix(b"data: ")
            if data == b"[DONE]":
                continue
            msg = json.loads(data)
            if msg["choices"]:
                arrivals.append(time.perf_counter())
            if msg.get("usage"):
                usage = msg["usage"]
    writer.close()
    end = time.perf_counter()
    return {"status": status, "t0": t0, "end": end, "arrivals": arrivals,
            "tokens": usage["completion_tokens"] if usage else 0}


def _scrape(url: str) -> dict:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    out: dict = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name + ("{thread=%s}" % s.labels["thread"] if "thread" in s.labels else "")
            if not s.labels.get("le"):
                out[key] = out.get(key, 0.0) + s.value
            elif s.name.removesuffix("_bucket") in HISTOGRAMS:   # cumulative bucket counts, summed over labels
                key = (s.name.removesuffix("_bucket"), float(s.labels["le"]))
                out[key] = out.get(key, 0.0) + s.value
    return out


def _hist_pct(delta: dict, name: str, q: float) -> float:
    """q-quantile (Prometheus' interpolation) of histogram `name` between two scrapes."""
    buckets = [(le, c) for k, c in delta.items() if isinstance(k, tuple) and k[0] == name for le in (k[1],)]
    return histogram_quantile(q, buckets) if buckets else float("nan")


def served(args, mode: str, cap: int | None = None, gc_freeze: bool = True, piecewise: bool = True) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "sits.engine.cli", "serve", "--model", args.model, "--kernels", args.kernels,
                             "--device", args.device, "--port", str(port), "--max-num-seqs", str(args.max_num_seqs),
                             "--engine-process", mode, "--log-level", "warning", "--no-access-log",
                             *(["--max-prefill-tokens-while-decoding", str(cap)] if cap else []),
                             *(["--quantization", args.quantization] if args.quantization else []),
                             "--kv-cache-dtype", args.kv_cache_dtype,
                             *([] if piecewise else ["--no-piecewise-graphs"])],
                            stdin=subprocess.DEVNULL, env={**os.environ, "SITS_GC_FREEZE": "on" if gc_freeze else "off"})
    t_start = time.perf_counter()
    try:
        deadline = time.monotonic() + (120 if args.device == "cpu" else 600)
        while True:
            try:
                with urllib.request.urlopen(url + "/readyz", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("server did not become ready")
            time.sleep(0.1)
        ready_s = time.perf_counter() - t_start
        before = _scrape(url)

        async def run():
            return await asyncio.gather(*(_stream_one("127.0.0.1", port, i, args.max_tokens, args.model)
                                          for i in range(args.clients)))

        t0 = time.perf_counter()
        results = asyncio.run(run())
        wall = time.perf_counter() - t0
        after = _scrape(url)
        open_loop = [_open_loop(port, args, rate) for rate in args.rates]
    finally:
        proc.terminate()
        proc.wait(30)
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    ttft = [r["arrivals"][0] - r["t0"] for r in results if r["arrivals"]]
    itl = [b - a for r in results for a, b in zip(r["arrivals"], r["arrivals"][1:])]
    hist = {f"{h}_{q}": _hist_pct(d, h, q) for h in HISTOGRAMS for q in (0.5, 0.99)}
    return {"mode": mode, "cap": cap, "hist": hist, "ready_s": ready_s, "wall": wall, "results": results, "open_loop": open_loop, "step_s": d.get("sits_engine_step_seconds_sum", 0.0),
            "steps": d.get("sits_engine_step_seconds_count", 0.0),
            "cpu_engine": d.get("sits_thread_cpu_seconds_total{thread=engine}", float("nan")),
            "cpu_http": d.get("sits_thread_cpu_seconds_total{thread=http}", float("nan")),
            "cpu_process": d.get("process_cpu_seconds_total", float("nan")),
            "ttft": ttft, "itl": itl, "e2e": [r["end"] - r["t0"] for r in results]}


def _open_loop(port: int, args, rate: float) -> dict:
    """`args.open_requests` requests arriving as a Poisson process of `rate` per second (open loop: an arrival never
    waits for an answer), each streamed; what the clients saw."""
    import random

    rng = random.Random(int(rate * 1000))
    starts, t = [], 0.0
    for _ in range(args.open_requests):
        t += rng.expovariate(rate)
        starts.append(t)

    async def one(i: int, start: float) -> dict:
        await asyncio.sleep(start)   # the arrival schedule of the load generator
        return await _stream_one("127.0.0.1", port, 10_000 + i, args.max_tokens, args.model)

    async def run():
        return await asyncio.gather(*(one(i, st) for i, st in enumerate(starts)))

    before = _scrape(f"http://127.0.0.1:{port}")
    t0 = time.perf_counter()
    results = asyncio.run(run())
    wall = time.perf_counter() - t0
    after = _scrape(f"http://127.0.0.1:{port}")
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    return {"rate": rate, "wall": wall, "hist": {f"{h}_{q}": _hist_pct(d, h, q) for h in HISTOGRAMS for q in (0.5, 0.99)}, "tokens": sum(r["tokens"] for r in results),
            "complete": sum(r["status"] == b"200" and r["tokens"] == args.max_tokens for r in results),
            "n": len(results), "ttft": [r["arrivals"][0] - r["t0"] for r in results if r["arrivals"]],
            "itl": [b - a for r in results for a, b in zip(r["arrivals"], r["arrivals"][1:])]}


def open_loop_report(served_runs: dict[tuple, dict]) -> str:
    lines = ["| mode | arrivals/s | complete | output tok/s | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) | "
             "server ITL p50 / p99 (ms) | engine step p50 / p99 (ms) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for mode, r in served_runs.items():
        for o in r["open_loop"]:
            lines.append(f"| {_name(*mode).removeprefix('served, ')} | {o['rate']:g} | {o['complete']}/{o['n']} | {o['tokens'] / o['wall']:,.0f} | "
                         f"{_pct(o['ttft'], .5) * 1e3:.0f} / {_pct(o['ttft'], .99) * 1e3:.0f} | "
                         f"{_pct(o['itl'], .5) * 1e3:.1f} / {_pct(o['itl'], .99) * 1e3:.1f} | "
                         f"{_ms(o, 'sits_inter_token_latency_seconds')} | {_ms(o, 'sits_engine_step_seconds')} |")
    return "\n".join(lines)


def _ms(r: dict, h: str) -> str:
    return f"{r['hist'][h + '_0.5'] * 1e3:.1f} / {r['hist'][h + '_0.99'] * 1e3:.1f}"


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--kernels", default="torch")
    p.add_argument("--quantization", choices=["int8", "fp8"], default=None, help="offline and served engines alike")
    p.add_argument("--kv-cache-dtype", choices=["auto", "fp8"], default="auto",
                   help="fp8: a kernel set that takes FP8 pages (torch, triton-v1.3..v1.5)")
    p.add_argument("--model", default="tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeat", type=int, default=2, help="alternate offline/served runs; keep each one's fastest")
    p.add_argument("--engine-process", choices=["on", "off", "both"], default="both",
                   help="served mode(s) to measure; both: the engine-core process and the in-process baseline")
    p.add_argument("--rates", type=lambda v: [float(x) for x in v.split(",") if x], default=[],
                   help="open-loop Poisson arrival rates (requests/s) to run after the closed loop, e.g. 8,16,32")
    p.add_argument("--open-requests", type=int, default=128, help="requests per open-loop rate")
    p.add_argument("--gc-compare", action="store_true",
                   help="also run the core-process server with SITS_GC_FREEZE=off (engine/core/heap.py) for comparison")
    p.add_argument("--piecewise-compare", action="store_true",
                   help="also run the core-process server with --no-piecewise-graphs: steps with prefill tokens "
                        "run eagerly (engine/execution/piecewise_graphs.py, on by default)")
    p.add_argument("--prefill-caps", type=_caps, default=[None],
                   help="comma-separated --max-prefill-tokens-while-decoding values for the core-process server, "
                        "none = left out (default: none)")
    args = p.parse_args()
    modes = [("on", c, True) for c in args.prefill_caps] if args.engine_process != "off" else []
    if args.gc_compare and args.engine_process != "off":
        modes.append(("on", args.prefill_caps[0], False))
    if args.piecewise_compare and args.engine_process != "off":
        modes.append(("on", args.prefill_caps[0], True, False))
    if args.engine_process != "on":
        modes.append(("off", args.prefill_caps[0], True))

    offs: list[dict] = []
    srvs: dict[tuple, list[dict]] = {m: [] for m in modes}
    for _ in range(args.repeat):  # the host is shared: alternate and keep the best of each
        offs.append(offline(args))
        print(f"offline: {offs[-1]['wall']:.2f} s", flush=True)
        for m in modes:
            srvs[m].append(served(args, *m))
            print(f"{_name(*m)}: {srvs[m][-1]['wall']:.2f} s (ready after {srvs[m][-1]['ready_s']:.0f} s)",
                  flush=True)
    off = min(offs, key=lambda r: r["wall"])
    best = {mode: min(runs, key=lambda r: r["wall"]) for mode, runs in srvs.items()}
    want = args.clients * args.max_tokens
    print(f"\n# serving bench  {time.strftime('%Y-%m-%d %H:%M')}  {platform.node()}  {platform.processor() or ''} "
          f"{os.cpu_count()} cores  load avg {os.getloadavg()[0]:.1f}  python {platform.python_version()}")
    print(f"model={args.model} device={args.device} clients={args.clients} max_tokens={args.max_tokens} "
          f"max_num_seqs={args.max_num_seqs} kernels={args.kernels}")
    print(report(off, best, want))
    if args.rates:
        print(f"\nopen loop: {args.open_requests} streamed requests per rate, Poisson arrivals, {args.max_tokens} tokens "
              f"each (the same servers, after the closed loop)")
        print(open_loop_report(best))


def _caps(v: str) -> list[int | None]:
    caps = [None if x.strip() in ("none", "") else int(x) for x in v.split(",")]
    if any(c is not None and c <= 0 for c in caps):
        raise argparse.ArgumentTypeError("prefill caps are positive integers or none")
    return caps


def _name(mode: str, cap: int | None, gc_freeze: bool = True, piecewise: bool = True) -> str:
    name = {"on": "served, core process", "off": "served, in-process"}[mode]
    return name + (f", prefill cap {cap}" if cap else "") + ("" if gc_freeze else ", GC not frozen") \
        + ("" if piecewise else ", no piecewise graphs")


def report(off: dict, served_runs: dict[tuple, dict], want: int) -> str:
    """The comparison table: offline, then each served mode; the last lines are the headline ratios."""
    cols = [(_name(*m), r, sum(x["tokens"] for x in r["results"])) for m, r in served_runs.items()]
    per_stream = want // max(len(cols[0][1]["results"]), 1) if cols else 0
    rows = [("streams complete, tokens", "-",
             [f"{sum(x['status'] == b'200' and x['tokens'] == per_stream for x in r['results'])}/{len(r['results'])}"
              f", {got}/{want}" for _, r, got in cols])]

    def num(label, offline_value, fn, fmt="{:.3f}"):
        rows.append((label, fmt.format(offline_value) if offline_value is not None else "-",
                     [fmt.format(fn(r, got)) for _, r, got in cols]))

    num("wall time (s)", off["wall"], lambda r, g: r["wall"])
    num("output tokens/s", off["tokens"] / off["wall"], lambda r, g: g / r["wall"], "{:,.0f}")
    num("served / offline tokens/s", None, lambda r, g: (g / r["wall"]) / (off["tokens"] / off["wall"]), "{:.2f}x")
    num("engine steps", off["steps"], lambda r, g: r["steps"], "{:.0f}")
    num("mean step (ms)", 1e3 * off["step_s"] / max(off["steps"], 1),
        lambda r, g: 1e3 * r["step_s"] / max(r["steps"], 1), "{:.2f}")
    num("engine step time / wall", off["step_s"] / off["wall"], lambda r, g: r["step_s"] / r["wall"], "{:.2f}")
    num("CPU s, engine loop", off["cpu"], lambda r, g: r["cpu_engine"], "{:.2f}")
    num("CPU s, HTTP event-loop thread", None, lambda r, g: r["cpu_http"], "{:.2f}")
    num("HTTP CPU per streamed token (us)", None, lambda r, g: 1e6 * r["cpu_http"] / max(g, 1), "{:.0f}")
    rows.append(("TTFT p50 / p99 (ms)", "-", [f"{_pct(r['ttft'], .5) * 1e3:.0f} / {_pct(r['ttft'], .99) * 1e3:.0f}"
                                              for _, r, _ in cols]))
    rows.append(("ITL p50 / p99 (ms)", "-", [f"{_pct(r['itl'], .5) * 1e3:.1f} / {_pct(r['itl'], .99) * 1e3:.1f}"
                                             for _, r, _ in cols]))
    for label, h in (("server ITL p50 / p99 (ms)", "sits_inter_token_latency_seconds"),
                     ("server TTFT p50 / p99 (ms)", "sits_time_to_first_token_seconds"),
                     ("engine step p50 / p99 (ms)", "sits_engine_step_seconds")):
        rows.append((label, "-", [f"{r['hist'][h + '_0.5'] * 1e3:.1f} / {r['hist'][h + '_0.99'] * 1e3:.1f}"
                                  for _, r, _ in cols]))
    rows.append(("ready after start (s)", "-", [f"{r['ready_s']:.0f}" for _, r, _ in cols]))
    head = ["", "offline LLMEngine"] + [c[0] for c in cols]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *[(r[0], r[1], *r[2]) for r in rows])]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    for label, o, vals in rows:
        lines.append("| " + " | ".join(str(x).ljust(w) for x, w in zip([label, o, *vals], widths)) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
