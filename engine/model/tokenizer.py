"""Tokenizers: a checkpoint's tokenizer.json (via `tokenizers`) or the byte-level fallback; incremental decoding."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

BYTE_BOS, BYTE_EOS = 256, 257
_FALLBACK_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
                      "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


class ByteTokenizer:
    """UTF-8 bytes are ids 0..255; 256 = BOS, 257 = EOS. Ids above (the model's vocab padding, never produced by
    encode) decode to a printable ASCII character, so random-weight models print readable gibberish."""

    def __init__(self, vocab_size: int = 512):
        assert vocab_size >= 258
        self.vocab_size = vocab_size
        self.bos_token_id = BYTE_BOS
        self.eos_token_id = BYTE_EOS
        self.bos_token, self.eos_token = "<s>", "</s>"
        self.chat_template = _FALLBACK_TEMPLATE

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [BYTE_BOS] + ids if add_special_tokens else ids

    def decode(self, ids: list[int]) -> str:
        return bytes(i if i < 256 else 32 + (i - 258) % 95 for i in ids if i < 256 or i > BYTE_EOS).decode(
            "utf-8", errors="replace")

    def apply_chat_template(self, messages: list[dict]) -> str:
        return render_chat(self.chat_template, messages, bos_token="", eos_token="")


class HFTokenizer:
    """A checkpoint directory's tokenizer.json (+ tokenizer_config.json for special tokens and chat template)."""

    def __init__(self, path: Path, eos_token_ids: list[int] | None = None, bos_token_id: int | None = None):
        from tokenizers import Tokenizer

        path = Path(path)
        self._tok = Tokenizer.from_file(str(path / "tokenizer.json"))
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        tcfg = {}
        if (path / "tokenizer_config.json").is_file():
            tcfg = json.loads((path / "tokenizer_config.json").read_text())
        self.bos_token = _token_text(tcfg.get("bos_token")) or ""
        self.eos_token = _token_text(tcfg.get("eos_token")) or ""
        eos = self._tok.token_to_id(self.eos_token) if self.eos_token else None
        self.eos_token_id = eos if eos is not None else (eos_token_ids[0] if eos_token_ids else None)
        bos = self._tok.token_to_id(self.bos_token) if self.bos_token else None
        self.bos_token_id = bos if bos is not None else bos_token_id
        template = tcfg.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            template = next((t["template"] for t in template if t.get("name") == "default"), template[0]["template"])
        self.chat_template = template or _FALLBACK_TEMPLATE
        self._add_bos = bool(tcfg.get("add_bos_token")) and self.bos_token_id is not None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=add_special_tokens).ids
        if add_special_tokens and self._add_bos and ids[:1] != [self.bos_token_id]:
            ids = [self.bos_token_id] + ids  # tokenizer_config asks for a BOS the post-processor does not add
        if self.bos_token_id is not None and ids[:2] == [self.bos_token_id] * 2:
            ids = ids[1:]  # a chat template already wrote the BOS the post-processor adds again
        return ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def apply_chat_template(self, messages: list[dict]) -> str:
        return render_chat(self.chat_template, messages, bos_token=self.bos_token, eos_token=self.eos_token)


def load_tokenizer(path: Path | None, vocab_size: int, eos_token_ids: list[int] | None = None,
                   bos_token_id: int | None = None):
    if path is not None and (Path(path) / "tokenizer.json").is_file():
        return HFTokenizer(Path(path), eos_token_ids, bos_token_id)
    return ByteTokenizer(max(vocab_size, 258))


def render_chat(template: str, messages: list[dict], *, bos_token: str, eos_token: str) -> str:
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from sits.engine.errors import InvalidRequestError

    def raise_exception(msg):
        raise TemplateError(msg)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)  # used by Llama 3.x templates
    try:
        return env.from_string(template).render(messages=messages, bos_token=bos_token, eos_token=eos_token,
                                                add_generation_prompt=True)
    except TemplateError as e:
        raise InvalidRequestError(f"chat template rejected the messages: {e}", "messages") from None


def _token_text(tok) -> str | None:
    if isinstance(tok, dict):
        return tok.get("content")
    return tok


def detokenize_incrementally(tokenizer, token_ids: list[int], prefix_offset: int, read_offset: int,
                             final: bool = False) -> tuple[str, int, int]:
    """Text of token_ids[read_offset:], decoded in the context of token_ids[prefix_offset:read_offset].

    Returns (new_text, prefix_offset', read_offset'). Text ending in an incomplete UTF-8 sequence is held back until
    more tokens arrive (at most 4 tokens, then emitted as U+FFFD), or until `final`.
    """
    prefix_text = tokenizer.decode(token_ids[prefix_offset:read_offset])
    full_text = tokenizer.decode(token_ids[prefix_offset:])
    pending = len(token_ids) - read_offset
    if len(full_text) > len(prefix_text) and (final or pending >= 4 or not full_text.endswith("\ufffd")):
        return full_text[len(prefix_text):], read_offset, len(token_ids)
    if final:
        return "", prefix_offset, len(token_ids)
    return "", prefix_offset, read_offset


class IncrementalDetokenizer:
    """One request's text, decoded token by token exactly as LLMEngine does it for a request without stop strings
    (the same offsets and hold-back), for a caller that decodes outside the engine (the API server, engine/core/)."""

    __slots__ = ("tokenizer", "token_ids", "prefix_offset", "read_offset")

    def __init__(self, tokenizer, prompt_token_ids: list[int]):
        self.tokenizer = tokenizer
        self.token_ids = list(prompt_token_ids)
        self.prefix_offset, self.read_offset = max(0, len(self.token_ids) - 5), len(self.token_ids)

    def add(self, new_token_ids: list[int], final: bool) -> str:
        """The text the new tokens add; `final`: the request ended with them (emit whatever is held back)."""
        text = ""
        for i, token in enumerate(new_token_ids):
            self.token_ids.append(token)
            piece, self.prefix_offset, self.read_offset = detokenize_incrementally(
                self.tokenizer, self.token_ids, self.prefix_offset, self.read_offset,
                final=final and i == len(new_token_ids) - 1)
            text += piece
        return text
