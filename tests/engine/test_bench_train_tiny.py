"""bench/train_tiny.py: the trained tiny checkpoint the correctness gate's bf16 measurements use. A few steps on a
small corpus: the loss falls, training is deterministic, and the engine serving the written checkpoint computes the
same logprobs as the training model (so what is trained is what the gate replays)."""
import torch
from safetensors.torch import load_file

from bench.train_tiny import TinyLlama, corpus_files, encode_corpus, train_tiny
from sits.engine import LLM, SamplingParams
from sits.engine.model.loader import resolve_model

TEXT = ("def add(a, b):\n    return a + b\n\n" * 40).encode()


def _train(path, steps=12):
    corpus = torch.tensor(list(TEXT) * 3, dtype=torch.int64)
    losses = []
    r = train_tiny(path, corpus, steps=steps, batch=2, seq_len=32, lr=3e-3, log_every=4,
                   log=lambda s: losses.append(float(s.split("loss")[1].split()[0])))
    return r, losses


def test_training_lowers_the_loss_and_is_deterministic(tmp_path):
    r, losses = _train(tmp_path / "a")
    assert len(losses) == 3 and losses[-1] < losses[0] - 0.5 and r.final_loss < 5.0
    assert (r.path / "config.json").is_file() and r.steps == 12
    _train(tmp_path / "b")
    a, b = load_file(str(tmp_path / "a" / "model.safetensors")), load_file(str(tmp_path / "b" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_engine_serves_what_was_trained(tmp_path):
    r, _ = _train(tmp_path / "ck", steps=6)
    llm = LLM(model=str(r.path), kernels="torch", dtype="float32", device="cpu")
    text = "def add(a, b):\n    return"
    ids = llm.tokenizer.encode(text)
    out = llm.generate([text], SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1), use_tqdm=False)[0]
    engine_lp = [e["logprob"] for e in out.prompt_logprobs]   # entry i scores token i + 1
    sd = load_file(str(r.path / "model.safetensors"))
    model = TinyLlama(resolve_model(str(r.path)).config, 64)
    with torch.no_grad():
        for k in model.params:
            model.params[k].copy_(sd[k.replace("__", ".")])
        lp = torch.log_softmax(model(torch.tensor([ids])).float()[0], -1)
    ref = [lp[i, ids[i + 1]].item() for i in range(len(ids) - 1)]
    assert len(engine_lp) == len(ref)
    assert max(abs(a - b) for a, b in zip(engine_lp, ref)) < 1e-4


def test_the_corpus_is_the_repositorys_own_text():
    files = corpus_files(".")
    assert any(f.name == "README.md" for f in files) and any(f.suffix == ".py" for f in files)
    ids = encode_corpus(files[:2])
    assert ids[0] == 256 and int((ids == 257).sum()) == 2 and int(ids.max()) <= 257
