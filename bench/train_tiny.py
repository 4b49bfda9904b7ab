"""Build a TRAINED tiny checkpoint (the `tiny` preset's architecture, byte tokenizer) for the correctness gate's bf16
measurements: random weights give flat distributions, a trained model peaked ones like a real LLM's.

    .venv/bin/python bench/train_tiny.py [--out .cache/tiny-trained] [--steps 400] [--device cpu]

Trains on the repository's own docs and Python sources (offline, engine/train_tiny.py), seeded; prints the loss
every --log-every steps and the final training / held-out loss; writes config.json + model.safetensors (14 MB) to
--out (a cache directory, git-ignored). `LLM(model=OUT)` / `sits-engine serve --model OUT` load it. With --reuse an
existing checkpoint there is kept.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT_OUT = ROOT / ".cache" / "tiny-trained"


def build(out: Path = DEFAULT_OUT, *, steps: int = 400, batch: int = 8, seq_len: int = 256, lr: float = 3e-3,
          seed: int = 0, device: str = "cpu", reuse: bool = False, log_every: int = 50) -> Path:
    """The trained checkpoint directory (trained now, or kept from an earlier run with `reuse`)."""
    from sits.engine.train_tiny import corpus_files, encode_corpus, train_tiny
    if reuse and (out / "model.safetensors").is_file():
        print(f"train_tiny: reusing {out}", flush=True)
        return out
    files = corpus_files(ROOT)
    corpus = encode_corpus(files)
    print(f"train_tiny: {len(files)} files, {len(corpus):,} byte tokens; {steps} steps x {batch} x {seq_len} "
          f"on {device}", flush=True)
    r = train_tiny(out, corpus, steps=steps, batch=batch, seq_len=seq_len, lr=lr, seed=seed, device=device,
                   log_every=log_every, log=lambda s: print("train_tiny: " + s, flush=True))
    info = {"steps": r.steps, "final_loss": round(r.final_loss, 4), "eval_loss": round(r.eval_loss, 4),
            "seconds": round(r.seconds, 1), "corpus_tokens": r.corpus_tokens, "batch": batch, "seq_len": seq_len,
            "lr": lr, "seed": seed, "device": device}
    (out / "training.json").write_text(json.dumps(info, indent=1) + "\n")
    print(f"train_tiny: final loss {r.final_loss:.3f} (held out {r.eval_loss:.3f}) nats/byte in {r.seconds:.0f} s "
          f"-> {out}", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--reuse", action="store_true", help="keep an existing checkpoint at --out")
    a = ap.parse_args(argv)
    if a.steps < 1 or a.batch < 1 or a.seq_len < 8:
        ap.error("--steps and --batch must be >= 1, --seq-len >= 8")
    build(a.out, steps=a.steps, batch=a.batch, seq_len=a.seq_len, lr=a.lr, seed=a.seed, device=a.device,
          reuse=a.reuse, log_every=a.log_every)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
