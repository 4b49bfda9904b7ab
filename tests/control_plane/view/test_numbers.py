"""control_plane/numbers.py: how every renderer writes a number, on literal values."""
import math

import pytest

from sits.control_plane.numbers import (ABS, PLAIN, REL, TYPESET, count, delta, eta, finite, interval, limit, ms,
                                             number, percent, plural, points, rate, seconds)


@pytest.mark.parametrize("x,want", [(None, None), ("NaN", None), (math.nan, None), ("+Inf", math.inf),
                                    ("-Inf", -math.inf), (3, 3.0), ("x", None), (True, None), (0.25, 0.25)])
def test_finite_reads_what_the_store_and_the_api_hold(x, want):
    assert finite(x) == want


@pytest.mark.parametrize("f,x,want", [
    (percent, 0.031, "+3.1 %"), (percent, -0.02, "-2.0 %"), (percent, 0.0, "+0.0 %"), (percent, None, "-"),
    (percent, math.nan, "-"), (percent, math.inf, "+inf"), (percent, "-Inf", "-inf"), (percent, 5.927, "+592.7 %"),
    (points, 0.002, "+0.20 pt"), (points, -0.0312, "-3.12 pt"), (points, None, "-"),
    (rate, 0.005, "0.50 %"), (rate, None, "-"), (ms, 0.1235, "123.5 ms"), (ms, "NaN", "-"),
    (seconds, 60.04, "60.0 s"), (eta, 310.4, "~310 s"), (eta, None, "-"), (count, 263.0, "263"), (count, None, "-"),
])
def test_plain_numbers(f, x, want):
    assert f(x) == want


def test_typeset_numbers_use_a_real_minus_and_a_dash_for_nothing():
    assert percent(-0.02, TYPESET) == "\u22122.0 %" and percent(0.02, TYPESET) == "+2.0 %"
    assert points(-0.001, TYPESET) == "\u22120.10 pt" and percent(None, TYPESET) == "\u2013"
    assert interval(REL, -0.02, 0.08, TYPESET) == "[\u22122.0 %, +8.0 %]"
    assert "-" not in delta(ABS, -0.5, TYPESET) and delta(ABS, None, PLAIN) == "-"


def test_deltas_intervals_and_limits_by_kind():
    assert delta(REL, 0.18) == "+18.0 %" and delta(ABS, 0.031) == "+3.10 pt"
    assert interval(REL, -0.02, 0.08) == "[-2.0 %, +8.0 %]" and interval(ABS, 0.012, None) == "[+1.20 pt, -]"
    # a boundary as a policy writes it: no trailing zeros
    assert limit(REL, 0.25) == "+25 %" and limit(REL, 0.125) == "+12.5 %" and limit(ABS, 0.005) == "+0.5 pt"
    assert percent(1.951, unit=False) == "+195.1"


def test_counts_in_words_and_other_formats():
    assert plural(1, "request") == "1 request" and plural(640, "request") == "640 requests"
    assert plural(0, "window") == "0 windows"
    assert number(0.78, ".0%") == "78%" and number(None, ".0%") == "-" and number(0.0312, ".3g") == "0.0312"
