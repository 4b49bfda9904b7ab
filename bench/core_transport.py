"""The engine-core transport alone: one engine step's outputs (N streams, one token each) from a core process to the
API server over ZMQ ipc, as engine/core/ sends them (msgspec msgpack, array-like structs), against pickle of the same
objects. Reports per-step encode, decode and one-way latency (send -> received and decoded), and bytes per step.

    .venv/bin/python bench/core_transport.py                 # 256 streams, 2,000 steps
    .venv/bin/python bench/core_transport.py --streams 32 --steps 500
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import pickle
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import zmq  # noqa: E402

from sits.engine.core import messages as m  # noqa: E402
from sits.engine.outputs import EngineStats, RequestOutput  # noqa: E402


def _step(streams: int, i: int) -> m.StepOutputs:
    outs = [RequestOutput(f"cmpl-{k:032x}", [1000 + i % 5000], " tok", False, None, 24, i, 0, None, "default")
            for k in range(streams)]
    stats = EngineStats(streams, 0, 900, 1000, 0.1, 0, 0, 0, 24 * streams, i * streams)
    return m.StepOutputs(outs, time.perf_counter(), 0.01, stats, 1.0)


def _sender(address: str, streams: int, steps: int, codec: str) -> None:
    ctx = zmq.Context()
    out = ctx.socket(zmq.PUSH)
    out.connect(address)
    enc = m.encoder.encode if codec == "msgspec" else pickle.dumps
    for i in range(steps):
        msg = _step(streams, i)
        t0 = time.perf_counter()
        payload = enc(msg)
        t1 = time.perf_counter()
        out.send_multipart([payload, pickle.dumps((t0, t1))], copy=False)
        time.sleep(0.002)   # steps are apart in the engine too: measure latency, not a saturated queue
    out.send_multipart([b"", b""])
    out.close(linger=5000)
    ctx.term()


def measure(streams: int, steps: int, codec: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        address = f"ipc://{tmp}/bench"
        ctx = zmq.Context()
        sock = ctx.socket(zmq.PULL)
        sock.bind(address)
        proc = multiprocessing.get_context("spawn").Process(target=_sender, args=(address, streams, steps, codec))
        proc.start()
        dec = m.from_core_decoder.decode if codec == "msgspec" else pickle.loads
        enc_us, dec_us, lat_us, sizes = [], [], [], []
        while True:
            payload, times = sock.recv_multipart(copy=False)
            if not payload.bytes:
                break
            t2 = time.perf_counter()
            dec(payload.buffer)
            t3 = time.perf_counter()
            t0, t1 = pickle.loads(times.bytes)
            enc_us.append((t1 - t0) * 1e6)
            dec_us.append((t3 - t2) * 1e6)
            lat_us.append((t3 - t0) * 1e6)
            sizes.append(len(payload.bytes))
        proc.join()
        sock.close()
        ctx.term()
    med = statistics.median
    return {"codec": codec, "bytes": med(sizes), "encode_us": med(enc_us), "decode_us": med(dec_us),
            "latency_us": med(lat_us), "latency_p99_us": sorted(lat_us)[int(0.99 * len(lat_us))]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--steps", type=int, default=2000)
    args = p.parse_args()
    rows = [measure(args.streams, args.steps, codec) for codec in ("msgspec", "pickle")]
    print(f"# engine-core transport: {args.streams} outputs per step, {args.steps} steps, ZMQ ipc PUSH/PULL, "
          f"{os.cpu_count()} cores, load avg {os.getloadavg()[0]:.1f}")
    print("| codec | bytes/step | encode (us) | decode (us) | send -> decoded p50 / p99 (us) |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['codec']} | {r['bytes']:,.0f} | {r['encode_us']:.0f} | {r['decode_us']:.0f} | "
              f"{r['latency_us']:.0f} / {r['latency_p99_us']:.0f} |")


if __name__ == "__main__":
    main()
