"""Checkpoint loading: single-file and sharded safetensors, tokenizer.json, config layouts, broken checkpoints."""

import json

import pytest
import torch

from sits.engine import EngineConfig, LLMEngine, SamplingParams, UnknownModelError
from sits.engine.config import ModelConfig
from sits.engine.model.loader import write_tiny
from sits.engine.model.presets import preset
from sits.engine.model.tokenizer import ByteTokenizer, HFTokenizer
from tests.engine.helpers import run_to_completion

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def make_engine(model) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(model), device="cpu", dtype="float32", num_kv_blocks=8))


def weights(engine) -> dict[str, torch.Tensor]:
    m = engine.model_runner.model
    out = {"embed": m.embed_tokens, "norm": m.norm.weight, "lm_head": m.lm_head.weight}
    for i, layer in enumerate(m.layers):
        for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
            out[f"{i}.{name}"] = getattr(layer, name).weight
        out[f"{i}.in_norm"] = layer.input_layernorm.weight
    return out


def test_sharded_single_file_and_preset_are_the_same_model(tmp_path, tiny_ckpt):
    sharded = write_tiny(tmp_path / "sharded", shards=3)
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("*.safetensors"))) == 3
    engines = [make_engine("tiny"), make_engine(tiny_ckpt),
               LLMEngine(EngineConfig(model=sharded, device="cpu", dtype="float32", num_kv_blocks=8))]  # a Path
    ref = weights(engines[0])
    for e in engines[1:]:
        w = weights(e)
        assert all(torch.equal(ref[k], w[k]) for k in ref)
    assert engines[1].model_name == tiny_ckpt.name and isinstance(engines[1].tokenizer, ByteTokenizer)
    outs = []
    for e in engines:
        e.add_request("r", "same weights, same words", GREEDY)
        outs.append(run_to_completion(e)["r"]["tokens"])
    assert outs[0] == outs[1] == outs[2]
    different = make_engine(write_tiny(tmp_path / "seed1", seed=1))
    assert not torch.equal(weights(different)["0.qkv_proj"], ref["0.qkv_proj"])


def test_missing_shard_or_weight_is_reported(tmp_path):
    sharded = write_tiny(tmp_path / "sharded", shards=2)
    (sharded / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(UnknownModelError, match="model-00002-of-00002"):
        make_engine(sharded)
    from safetensors.torch import load_file, save_file
    single = write_tiny(tmp_path / "single")
    tensors = load_file(str(single / "model.safetensors"))
    del tensors["model.layers.2.mlp.up_proj.weight"]
    save_file(tensors, str(single / "model.safetensors"))
    with pytest.raises(UnknownModelError, match="lacks 1 weight"):
        make_engine(single)
    tensors["model.layers.2.mlp.up_proj.weight"] = torch.zeros(3, 3)
    save_file(tensors, str(single / "model.safetensors"))
    with pytest.raises(UnknownModelError, match="up_proj"):
        make_engine(single)


def test_not_a_model(tmp_path):
    with pytest.raises(UnknownModelError, match="not a preset"):
        make_engine(tmp_path / "nowhere")
    with pytest.raises(UnknownModelError, match="config.json"):
        make_engine(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(UnknownModelError, match="LLaMA"):
        make_engine(tmp_path)


def test_transformers_v5_rope_parameters_layout_parses_like_v4():
    v4 = preset("tiny").to_hf()
    v5 = dict(v4)
    v5["rope_parameters"] = {**v5.pop("rope_scaling"), "rope_theta": v5.pop("rope_theta")}
    assert ModelConfig.from_hf(v5) == ModelConfig.from_hf(v4) == preset("tiny")
    plain = dict(v4, rope_scaling={"rope_type": "default"})
    assert ModelConfig.from_hf(plain).rope_scaling is None
    with pytest.raises(UnknownModelError, match="yarn"):
        ModelConfig.from_hf(dict(v4, rope_scaling={"rope_type": "yarn", "factor": 2.0}))


def write_word_tokenizer(path):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, 512)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<s>", "</s>"])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": {"content": "</s>"},
        "chat_template": "{{ bos_token }}{% for m in messages %}w{{ 10 + loop.index }} {{ m['content'] }} "
                         "{% endfor %}{% if add_generation_prompt %}w99{% endif %}"}))


def test_tokenizer_json_is_used_when_present(tmp_path):
    ckpt = write_tiny(tmp_path / "tok", bos_token_id=1, eos_token_id=[2])
    write_word_tokenizer(ckpt)
    engine = make_engine(ckpt)
    tok = engine.tokenizer
    assert isinstance(tok, HFTokenizer)
    assert tok.encode("w5 w300 w7") == [1, 5, 300, 7]
    assert tok.decode([1, 5, 300, 7]) == "w5 w300 w7"
    assert tok.eos_token_id == 2 and 2 in engine.eos_token_ids
    chat = tok.apply_chat_template([{"role": "user", "content": "w42"}])
    assert chat == "<s>w11 w42 w99"
    assert tok.encode(chat) == [1, 11, 42, 99]  # the template's BOS is not doubled by the post-processor
    cfg = json.loads((ckpt / "tokenizer_config.json").read_text())
    from tokenizers import Tokenizer, processors
    raw = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    raw.post_processor = processors.ByteLevel()  # no BOS from the post-processor ...
    raw.save(str(ckpt / "tokenizer.json"))
    assert HFTokenizer(ckpt).encode("w5") == [5]
    (ckpt / "tokenizer_config.json").write_text(json.dumps({**cfg, "add_bos_token": True}))
    assert HFTokenizer(ckpt).encode("w5") == [1, 5]  # ... but tokenizer_config asks for one
    engine.add_request("r", "w5 w6 w7", GREEDY)
    res = run_to_completion(engine)["r"]
    prompt_ids = tok.encode("w5 w6 w7")
    # the continuation of the prompt's text (a word-level decoder puts a space between words)
    expected = tok.decode(prompt_ids + res["tokens"])[len(tok.decode(prompt_ids)):]
    assert res["text"] == expected and expected.startswith(" w")


def test_generation_config_adds_end_of_turn_ids(tmp_path):
    ckpt = write_tiny(tmp_path / "gen", eos_token_id=[257])
    (ckpt / "generation_config.json").write_text(json.dumps({"eos_token_id": [257, 300]}))
    engine = make_engine(ckpt)
    assert engine.model_config.eos_token_id == [257, 300] and {257, 300} <= engine.eos_token_ids
