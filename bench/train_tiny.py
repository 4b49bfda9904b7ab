"""Build a TRAINED tiny checkpoint (the `tiny` preset's architecture, byte tokenizer) for the correctness gate's bf16
measurements: random weights give flat distributions (logprobs ~ -ln 512), a trained model peaked ones like a real
LLM's.

    .venv/bin/python bench/train_tiny.py [--out .cache/tiny-trained] [--steps 400] [--device cpu]

A plain differentiable LLaMA in torch (HF parameter names and layouts: rotate_half RoPE with the engine's own cos/sin
tables, GQA, RMSNorm, SwiGLU) trained with AdamW on the repository's own docs and Python sources (offline), seeded:
the same corpus and arguments give the same checkpoint. Prints the loss every --log-every steps and the final
training / held-out loss; writes config.json + model.safetensors (14 MB) with the engine's
`write_checkpoint` to --out (a cache directory, git-ignored), so `LLM(model=OUT)` / `sits-engine serve --model OUT`
serve the trained model. With --reuse an existing checkpoint there is kept.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from sits.engine.config import ModelConfig  # noqa: E402
from sits.engine.model.layers.rotary_embedding import rope_cos_sin  # noqa: E402
from sits.engine.model.loader import write_checkpoint  # noqa: E402
from sits.engine.model.presets import preset, random_weights  # noqa: E402
from sits.engine.model.tokenizer import BYTE_BOS, BYTE_EOS  # noqa: E402

DEFAULT_OUT = ROOT / ".cache" / "tiny-trained"

CORPUS_GLOBS = ("README.md", "ARCHITECTURE.md", "BENCHMARKS.md", "docs/*.md", "engine/**/*.py", "kernels/*.py",
                "control_plane/**/*.py", "bench/*.py")


def corpus_files(root: str | Path, globs: Iterable[str] = CORPUS_GLOBS) -> list[Path]:
    root = Path(root)
    return sorted({p for g in globs for p in root.glob(g) if p.is_file()})


def encode_corpus(files: Iterable[Path]) -> torch.Tensor:
    """Every file as BOS + its UTF-8 bytes + EOS, concatenated: [N] int64 token ids."""
    ids: list[int] = []
    for f in files:
        ids += [BYTE_BOS, *f.read_bytes(), BYTE_EOS]
    return torch.tensor(ids, dtype=torch.int64)


class TinyLlama(torch.nn.Module):
    """Differentiable twin of engine/model/llama.py for training (no KV cache, causal SDPA over whole sequences)."""

    def __init__(self, cfg: ModelConfig, max_positions: int):
        super().__init__()
        self.cfg = cfg
        self.params = torch.nn.ParameterDict()
        for name, t in random_weights(cfg, seed=0):
            self.params[name.replace(".", "__")] = torch.nn.Parameter(t.clone())
        cos, sin = rope_cos_sin(cfg.head_dim, max_positions, cfg.rope_theta, cfg.rope_scaling)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def w(self, name: str) -> torch.Tensor:
        return self.params[name.replace(".", "__")]

    def hf_weights(self):
        for key, p in self.params.items():
            yield key.replace("__", "."), p.detach()

    def _norm(self, x, name):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.cfg.rms_norm_eps)).to(x.dtype) * self.w(name)

    def _rope(self, x, pos):   # x: [B, H, T, D]; HF rotate_half layout
        half = x.shape[-1] // 2
        c, s = self.cos[pos][None, None], self.sin[pos][None, None]
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, T] -> logits [B, T, V]."""
        cfg = self.cfg
        b, t = ids.shape
        hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        pos = torch.arange(t, device=ids.device)
        h = F.embedding(ids, self.w("model.embed_tokens.weight"))
        for i in range(cfg.num_hidden_layers):
            p = f"model.layers.{i}."
            x = self._norm(h, p + "input_layernorm.weight")
            q = (x @ self.w(p + "self_attn.q_proj.weight").T).view(b, t, hq, d).transpose(1, 2)
            k = (x @ self.w(p + "self_attn.k_proj.weight").T).view(b, t, hkv, d).transpose(1, 2)
            v = (x @ self.w(p + "self_attn.v_proj.weight").T).view(b, t, hkv, d).transpose(1, 2)
            q, k = self._rope(q, pos), self._rope(k, pos)
            k, v = k.repeat_interleave(hq // hkv, dim=1), v.repeat_interleave(hq // hkv, dim=1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, hq * d)
            h = h + a @ self.w(p + "self_attn.o_proj.weight").T
            x = self._norm(h, p + "post_attention_layernorm.weight")
            x = F.silu(x @ self.w(p + "mlp.gate_proj.weight").T) * (x @ self.w(p + "mlp.up_proj.weight").T)
            h = h + x @ self.w(p + "mlp.down_proj.weight").T
        h = self._norm(h, "model.norm.weight")
        head = self.w("model.embed_tokens.weight") if cfg.tie_word_embeddings else self.w("lm_head.weight")
        return h @ head.T


@dataclasses.dataclass(slots=True)
class TrainResult:
    path: Path
    steps: int
    final_loss: float         # mean training loss over the last 10 % of steps (nats per byte)
    eval_loss: float          # on held-out windows (the corpus' last 5 %)
    seconds: float
    corpus_tokens: int


def train_tiny(out: str | Path, corpus: torch.Tensor, *, steps: int = 600, batch: int = 16, seq_len: int = 256,
               lr: float = 3e-3, seed: int = 0, device: str = "cpu", log_every: int = 50,
               log: Callable[[str], None] = print) -> TrainResult:
    """Train the tiny preset on `corpus` ([N] byte-token ids) and write the checkpoint directory `out`."""
    torch.manual_seed(seed)
    cfg = preset("tiny")
    model = TinyLlama(cfg, seq_len).to(device)
    split = int(len(corpus) * 0.95)
    train, held = corpus[:split], corpus[split:]
    if len(train) <= seq_len + 1 or len(held) <= seq_len + 1:
        raise ValueError(f"corpus of {len(corpus)} tokens is too small for windows of {seq_len}")
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))))

    def windows(data, n, g):
        starts = torch.randint(0, len(data) - seq_len - 1, (n,), generator=g)
        x = torch.stack([data[s:s + seq_len + 1] for s in starts.tolist()]).to(device)
        return x[:, :-1], x[:, 1:]

    t0, losses = time.perf_counter(), []
    for step in range(1, steps + 1):
        x, y = windows(train, batch, gen)
        loss = F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % log_every == 0 or step == steps:
            recent = losses[-log_every:]
            log(f"step {step:5d}/{steps}  loss {sum(recent) / len(recent):.3f}  lr {sched.get_last_lr()[0]:.2e}  "
                f"{time.perf_counter() - t0:.0f} s")
    with torch.no_grad():
        x, y = windows(held, 32, torch.Generator().manual_seed(seed + 1))
        eval_loss = F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten()).item()
    tail = losses[-max(1, steps // 10):]
    path = write_checkpoint(out, cfg, model.hf_weights())
    return TrainResult(Path(path), steps, sum(tail) / len(tail), eval_loss, time.perf_counter() - t0, len(corpus))


def build(out: Path = DEFAULT_OUT, *, steps: int = 400, batch: int = 8, seq_len: int = 256, lr: float = 3e-3,
          seed: int = 0, device: str = "cpu", reuse: bool = False, log_every: int = 50) -> Path:
    """The trained checkpoint directory (trained now, or kept from an earlier run with `reuse`)."""
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
