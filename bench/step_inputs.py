"""Host time to build an eager step's inputs (engine/execution/step_inputs.py) against the per-field builder it replaced
(each field a Python list, then its own tensor), on the shape of an arrival step: D sequences decoding at random
contexts plus one P-token prompt, block tables at the full width of max_model_len / 64. On a GPU it also times the whole
build-and-copy with the stream busy (a matmul queued first), where each of the old builder's copies from pageable
memory waits for the stream.

    .venv/bin/python bench/step_inputs.py [--decodes 128] [--prompt 20] [--max-model-len 8192] [--device cpu|cuda]
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from sits.engine.sampling_params import SamplingParams  # noqa: E402
from sits.engine.scheduling.sequence import Sequence  # noqa: E402
from sits.engine.execution.step_inputs import build_step_inputs  # noqa: E402

BS = 64


def per_field(prefill, decode, w, dev):
    """The former builder (engine/execution/model_runner.py before step_inputs.py): lists, then one tensor per field."""
    ids, pos, slots, rows = [], [], [], []
    for s, n in prefill + [(s, 1) for s in decode]:
        a = s.num_computed_tokens
        ids += s.token_ids[a:a + n]
        pos += range(a, a + n)
        bt = s.block_table
        slots += [bt[p // BS] * BS + p % BS for p in range(a, a + n)]
        if a + n == len(s.token_ids):
            rows.append(len(ids) - 1)

    def tables(seqs):
        flat: list[int] = []
        for s in seqs:
            flat += s.block_table
            flat += [0] * (w - len(s.block_table))
        return torch.tensor(flat, dtype=torch.int32).view(-1, w).to(dev, non_blocking=True)

    i32 = lambda v: torch.tensor(v, dtype=torch.int32, device=dev)   # noqa: E731
    cu = [0]
    for _, n in prefill:
        cu.append(cu[-1] + n)
    return (torch.tensor(slots, dtype=torch.int64, device=dev), i32(cu), i32([s.num_computed_tokens + n for s, n in prefill]),
            tables([s for s, _ in prefill]), i32([s.num_computed_tokens + 1 for s in decode]), tables(decode),
            torch.tensor(ids, dtype=torch.int64, device=dev), torch.tensor(pos, dtype=torch.int64, device=dev),
            torch.tensor(rows, device=dev))


def packed(prefill, decode, w, dev):
    return build_step_inputs(prefill, decode, 0, block_size=BS, max_blocks=w, device=dev)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--decodes", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=20)
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--iters", type=int, default=300)
    a = ap.parse_args()
    rng = random.Random(0)
    dev = torch.device(a.device)
    w = -(-a.max_model_len // BS)

    def seq(n, done):
        s = Sequence("r", [rng.randrange(1000) for _ in range(n)], SamplingParams(max_tokens=4))
        s.num_computed_tokens = done
        s.block_table = rng.sample(range(50_000), -(-n // BS))
        return s

    decode = [seq(n, n - 1) for n in (rng.randrange(200, min(2400, a.max_model_len)) for _ in range(a.decodes))]
    prefill = [(seq(a.prompt, 0), a.prompt)] if a.prompt else []
    busy = None
    if dev.type == "cuda":
        m = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        busy = lambda: m @ m   # noqa: E731  (~1.4 ms of work ahead of the copies on an H200)
    rows = []
    for name, f in (("per-field lists (before)", per_field), ("packed (engine/execution/step_inputs.py)", packed)) * 2:
        times = []
        for i in range(a.iters + 20):
            if busy is not None:
                busy()
            t0 = time.perf_counter()
            f(prefill, decode, w, dev)
            dt = time.perf_counter() - t0
            if busy is not None:
                torch.cuda.synchronize()
            if i >= 20:
                times.append(dt)
        rows.append((name, statistics.median(times) * 1e6, sorted(times)[int(0.9 * len(times))] * 1e6))
    print(f"{a.decodes} decoding + one {a.prompt}-token prompt, block tables {w} wide, device {dev} "
          f"(torch {torch.__version__}); host time to build and launch the copies, {a.iters} iterations:")
    print(f"{'builder':34} {'median us':>10} {'p90 us':>10}")
    for name, med, p90 in rows:
        print(f"{name:34} {med:10.0f} {p90:10.0f}")


if __name__ == "__main__":
    main()
