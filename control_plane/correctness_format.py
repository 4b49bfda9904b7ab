"""Text lines for a correctness-gate check (`sits-control rollout show`, the demo): the summary, the tolerances
that failed, and each diverged prompt with both continuations (token ids and text) and the margins there."""
from __future__ import annotations

from typing import Mapping

_MAX_IDS = 24


def _num(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _ids(ids) -> str:
    ids = list(ids)
    return str(ids[:_MAX_IDS])[:-1] + (", ...]" if len(ids) > _MAX_IDS else "]")


def format_correctness(ev: Mapping, steps_total: int = 0) -> list[str]:
    """One correctness check (a check dict whose verdict has a "correctness" entry)."""
    cv, decision = ev["verdict"]["correctness"], ev["decision"]
    where = "before traffic" if ev["step"] < 0 else f"step {ev['step'] + 1}{f'/{steps_total}' if steps_total else ''}" \
        f" · canary at {ev['weight']} %"
    lines = [f"check {ev['seq']} · {where} · correctness gate: {cv['outcome'].upper()} -> {decision}"]
    cost = f"; {cv['requests']} requests in {cv['seconds']:.1f} s" if cv.get("seconds") is not None else ""
    if cv["prompts"]:
        lines.append(f"    {cv['prompts']} prompts ({cv['dtype'] or 'unknown dtype'} tolerances): "
                     f"{_num(cv['identical_fraction'], '.0%')} identical, {cv['diverged']} diverged, top-1 agreement "
                     f"{_num(cv['top1_agreement'], '.1%')} when fed the baseline's tokens, logprob drift mean "
                     f"{_num(cv['drift_mean'], '.2g')} max {_num(cv['drift_max'], '.2g')}{cost}")
    if cv["errors"]:
        lines.append(f"    {cv['errors']} prompt(s) could not be replayed")
    if cv["failed"]:
        lines.append(f"    failed: {', '.join(cv['failed'])}")
    for e in cv["evidence"]:
        label = e["prompt"].replace("\n", " ")
        if e.get("error"):
            lines.append(f"    prompt {e['index']} {label!r}: {e['error']}")
            continue
        at = e["first_divergence"]
        head = f"first divergence at token {at}" if at is not None else "no divergence"
        margins = f" (baseline margin {_num(e['baseline_margin'], '.3g')}, canary margin " \
                  f"{_num(e['canary_margin'], '.3g')})" if at is not None else ""
        lines.append(f"    prompt {e['index']} {label!r}: {head}{margins}, max drift {_num(e['drift_max'], '.2g')}")
        lines.append(f"      baseline: {_ids(e['baseline_tokens'])} {e['baseline_text']!r}")
        lines.append(f"      canary:   {_ids(e['canary_tokens'])} {e['canary_text']!r}")
    lines.append(f"    reason: {cv['reason']}")
    return lines
