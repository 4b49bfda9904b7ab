"""The prompt set the correctness gate replays by default (Policy.correctness.prompt_set = "default"), and what a
policy may name instead (`prompt_set_problem`): a set by name (`prompts-<name>.json` in the worker's configured
prompt-set directory, `--prompt-set-dir`: the chart's ConfigMap mount) or the prompts themselves, inline and bounded.
Never a path: a policy comes from API users, and the worker must not read files they choose.

32 prompts of mixed lengths: short questions, code, numbers, prose and a few past a 64-token KV block boundary
(byte-level tokenizer: about one token per character), up to one past 1,000 tokens, so prefill chunks, several KV
blocks and long-context RoPE positions are all exercised. Plain data.
"""
from __future__ import annotations

import re

# a set's name: letters, digits, '_' and '-' (so no '/', no '..', nothing absolute); the file is prompts-<name>.json
PROMPT_SET_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
MAX_INLINE_PROMPTS = 256
MAX_INLINE_CHARS = 64 * 1024       # all inline prompts together (the policy is stored with the rollout)


def stored_prompt_set(value: object) -> object:
    """A prompt_set as stored by a version that took file paths, as a name: `.../prompts-<name>.json` (the chart's
    ConfigMap layout) is `<name>`; any other path becomes a name made of its file's stem, which the worker looks up in
    its prompt-set directory like any other (a set it does not find makes the gate INCONCLUSIVE, never a pass, and
    no path is ever read). Valid values are returned as they are."""
    if not isinstance(value, str) or prompt_set_problem(value) is None:
        return value
    stem = value.replace("\\", "/").rsplit("/", 1)[-1].removesuffix(".json").removeprefix("prompts-")
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", stem).strip("-_")[:64]
    return name if name and PROMPT_SET_NAME_RE.match(name) else "legacy-path"


def prompt_set_problem(value: object) -> str | None:
    """Why `value` is not a prompt set a policy may give ("default", a set name, or a non-empty list of non-empty
    strings within the inline bounds), or None when it is: the problem, after the field's name
    (`correctness.prompt_set ...`)."""
    if isinstance(value, str):
        if PROMPT_SET_NAME_RE.match(value):
            return None
        return (f"{value[:80]!r} must be 'default', the name of a set in the worker's prompt-set directory "
                "(letters, digits, '_' and '-'; no paths) or a list of prompts")
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(p, str) and p for p in value):
        return "must be a set name or a non-empty list of non-empty strings"
    if len(value) > MAX_INLINE_PROMPTS or sum(map(len, value)) > MAX_INLINE_CHARS:
        return (f"holds at most {MAX_INLINE_PROMPTS} inline prompts of {MAX_INLINE_CHARS} characters in all (a larger "
                "set goes in the prompt-set directory)")
    if not all(c.isprintable() or c in "\n\t\r" for p in value for c in p):
        return "prompts must be text (no control characters but newlines and tabs)"
    return None

_PARAGRAPHS = (
    "The river rose for three days before the town council met. Nobody had expected the old levee to hold, and "
    "yet it did, which left the engineers arguing about why rather than how to repair it.",
    "A kernel that computes attention reads every key and value of the context once per query block. The faster "
    "versions tile the work so that the tiles stay in on-chip memory, and they rescale partial sums as they go.",
    "In the spring the market square filled with stalls again: bread, cheese, second-hand books, a man who "
    "sharpened knives while he told long stories about the sea, and children chasing each other between them.",
    "Numbers in a log line are easy to misread: 1,024 requests at 99.9 percent success still means one failure, "
    "and a p99 of 250 ms over five minutes says nothing about the slowest second of the busiest hour.",
    "She wrote the letter twice. The first version said everything; the second said only what needed saying, and "
    "that was the one she sent, with a pressed flower from the garden folded into the last page.",
    "def merge(a, b):\n    out, i, j = [], 0, 0\n    while i < len(a) and j < len(b):\n        if a[i] <= b[j]:\n"
    "            out.append(a[i]); i += 1\n        else:\n            out.append(b[j]); j += 1\n"
    "    return out + a[i:] + b[j:]\n",
)

DEFAULT_PROMPTS: tuple[str, ...] = (
    "Hello",
    "The capital of France is",
    "1, 2, 3, 4, 5,",
    "Once upon a time",
    "Q: What is 17 times 3?\nA:",
    "def fibonacci(n):",
    "Translate to German: good morning",
    "The opposite of hot is",
    "SELECT name FROM users WHERE",
    "Roses are red, violets are",
    "A haiku about autumn rain:\n",
    "The three primary colours are red,",
    "In 1969 the first people to walk on the Moon were",
    "import numpy as np\nx = np.arange(10)\nprint(",
    "Dear team, the release planned for Friday",
    "To make a cup of tea, first boil",
    # just under, at and just past one 64-token block (the byte tokenizer adds a BOS token)
    "The weather report for tomorrow says light rain in the morning",
    "A canary release sends a small share of traffic to a new version",
    "Write a short paragraph that explains why the sky looks blue during the day and red at sunset.",
    _PARAGRAPHS[0],
    _PARAGRAPHS[1],
    _PARAGRAPHS[2] + " " + _PARAGRAPHS[3],
    _PARAGRAPHS[5] + "\n# merge two sorted lists of numbers, then",
    "Summarise the following in one sentence.\n\n" + _PARAGRAPHS[4],
    "Question: " + _PARAGRAPHS[3] + "\nWhich of these numbers is the most misleading, and why?\nAnswer:",
    "List five fruits, one per line:\n1.",
    "The quick brown fox jumps over the lazy dog. " * 4,
    "Error: connection refused (os error 111) while connecting to 127.0.0.1:8080; retrying in",
    "{\"name\": \"sits\", \"version\": \"1.0\", \"kernels\": [\"torch\", \"triton-v1\"], \"next\":",
    " ".join(_PARAGRAPHS[:3]) + " Continue the story:",
    # past 1,000 tokens: long-context positions (RoPE scaling, many KV blocks, chunked prefill)
    "\n\n".join(_PARAGRAPHS + _PARAGRAPHS[:1]) + "\n\nThe end of the document. One line summary:",
    "Ein kurzer Satz auf Deutsch, dann",
)
