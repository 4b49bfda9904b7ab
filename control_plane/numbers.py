"""How SITS writes a number, in one place: signed percent deltas ("+3.1 %"), point deltas of rates ("+0.20 pt"),
intervals, rates, milliseconds, seconds, counts and the policy's own limits ("+25 %"). The analysis' reasons and
every renderer of a check (the CLI's text, the demo's lines, the web UI's sentences, a KernelRollout's status) format
through these: like errors.py and validation.py, a vocabulary every layer shares, pure and importing nothing.

Two typographies, one rule: PLAIN (ASCII: terminals, Kubernetes status) and TYPESET (the web page: U+2212 minus and
an en dash for "no value"). A missing or NaN value is the style's `none`; an infinite one "+inf" / "-inf"."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Style:
    minus: str
    none: str


PLAIN = Style(minus="-", none="-")
TYPESET = Style(minus="\u2212", none="\u2013")

REL, ABS = "rel", "abs"   # a relative delta (latency: 0.1 = +10 %) or an absolute one (error rate: 0.01 = 1 point)


def finite(x: Any) -> float | None:
    """`x` as a float; None for None, NaN and anything that is not a number (the store's "NaN" string included).
    Infinities stay (the store writes them "+Inf" / "-Inf")."""
    if x is None or isinstance(x, bool):
        return None
    if isinstance(x, str):
        return {"+Inf": math.inf, "-Inf": -math.inf, "Inf": math.inf}.get(x)
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def number(x: Any, spec: str, style: Style = PLAIN, scale: float = 1.0, prefix: str = "", suffix: str = "") -> str:
    """`x` times `scale` by a format spec (".0%", "+.1f"), between `prefix` and `suffix`; the style's `none` when
    missing, "+inf" / "-inf" when infinite. Every formatter below is this one with its spec."""
    v = finite(x)
    if v is None:
        return style.none
    if math.isinf(v):
        return ("+" if v > 0 else style.minus) + "inf"
    text = format(v * scale, spec)
    return prefix + (text if style.minus == "-" else text.replace("-", style.minus)) + suffix


def percent(x: Any, style: Style = PLAIN, digits: int = 1, unit: bool = True) -> str:
    """A relative delta: 0.031 -> "+3.1 %" (unit False: "+3.1")."""
    return number(x, f"+.{digits}f", style, 100, suffix=" %" if unit else "")


def points(x: Any, style: Style = PLAIN) -> str:
    """An absolute delta of a rate: 0.002 -> "+0.20 pt"."""
    return number(x, "+.2f", style, 100, suffix=" pt")


def delta(kind: str, x: Any, style: Style = PLAIN) -> str:
    """A delta of either kind: points for ABS (the error rate), percent for REL (latency)."""
    return points(x, style) if kind == ABS else percent(x, style)


def interval(kind: str, low: Any, high: Any, style: Style = PLAIN) -> str:
    """"[-2.0 %, +8.0 %]"."""
    return f"[{delta(kind, low, style)}, {delta(kind, high, style)}]"


def limit(kind: str, x: Any, style: Style = PLAIN) -> str:
    """A boundary as a policy writes it: 0.25 -> "+25 %", 0.005 -> "+0.5 pt" (no trailing zeros)."""
    return number(x, "g", style, 100, prefix="+", suffix=" pt" if kind == ABS else " %")


def rate(x: Any, style: Style = PLAIN) -> str:
    """A rate, unsigned: 0.005 -> "0.50 %"."""
    return number(x, ".2f", style, 100, suffix=" %")


def ms(x: Any, style: Style = PLAIN) -> str:
    """Seconds as milliseconds: 0.1235 -> "123.5 ms"."""
    return number(x, ".1f", style, 1000, suffix=" ms")


def seconds(x: Any, style: Style = PLAIN, digits: int = 1) -> str:
    """"60.0 s"."""
    return number(x, f".{digits}f", style, suffix=" s")


def eta(x: Any, style: Style = PLAIN) -> str:
    """About how long until a sequential check decides: 310.4 -> "~310 s"."""
    return number(x, ".0f", style, prefix="~", suffix=" s")


def count(x: Any, style: Style = PLAIN) -> str:
    """A count of requests (stored as floats): 263.0 -> "263"."""
    return number(x, ".0f", style)


def plural(n: int, word: str) -> str:
    """"1 request", "20 requests"."""
    return f"{n} {word}{'' if n == 1 else 's'}"
