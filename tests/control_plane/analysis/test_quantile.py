"""histogram_quantile == Prometheus 2.42's, on literal edge cases and against a real Prometheus (backfilled)."""
import math
import random
import time

import pytest

from sits.control_plane.analysis import histogram_quantile
from tests.fixtures.prometheus import backfill, format_value

INF, NAN = math.inf, math.nan


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


CASES = [
    # (name, q, buckets, expected)
    ("interpolates in bucket", 0.5, [(1, 10), (2, 20), (INF, 20)], 1.0),
    ("natural lower bound 0", 0.25, [(1, 10), (2, 20), (INF, 20)], 0.5),
    ("second bucket", 0.75, [(1, 10), (2, 20), (INF, 20)], 1.5),
    ("rank in +Inf -> 2nd highest bound", 0.99, [(1, 10), (2, 20), (INF, 40)], 2.0),
    ("all in +Inf", 0.5, [(1, 0), (2, 0), (INF, 5)], 2.0),
    ("empty -> NaN", 0.5, [(1, 0), (2, 0), (INF, 0)], NAN),
    ("no buckets -> NaN", 0.5, [], NAN),
    ("only +Inf -> NaN", 0.5, [(INF, 10)], NAN),
    ("no +Inf -> NaN", 0.5, [(1, 10), (2, 20)], NAN),
    ("q < 0 -> -Inf", -0.1, [(1, 10), (INF, 10)], -INF),
    ("q > 1 -> +Inf", 1.1, [(1, 10), (INF, 10)], INF),
    ("q NaN -> NaN", NAN, [(1, 10), (INF, 10)], NAN),
    ("q < 0 wins over empty", -1, [], -INF),
    ("lowest bound <= 0 returned", 0.1, [(-1, 10), (1, 20), (INF, 20)], -1.0),
    ("lowest bound 0 returned", 0.1, [(0, 10), (1, 20), (INF, 20)], 0.0),
    ("negative buckets interpolate", 0.75, [(-2, 10), (-1, 20), (INF, 20)], -1.5),
    ("unsorted input", 0.5, [(INF, 20), (2, 20), (1, 10)], 1.0),
    ("duplicate bounds are summed", 0.5, [(1, 5), (1, 5), (2, 20), (INF, 20)], 1.0),
    ("non-monotonic raised to envelope", 0.75, [(1, 10), (2, 5), (3, 20), (INF, 20)], 2.5),
    ("q = 0 in empty first bucket -> NaN (0/0)", 0.0, [(1, 0), (2, 10), (INF, 10)], NAN),
    ("q = 0 with data", 0.0, [(1, 4), (2, 10), (INF, 10)], 0.0),
    ("q = 1 -> top of highest finite bucket with data", 1.0, [(1, 4), (2, 10), (INF, 10)], 2.0),
]


@pytest.mark.parametrize("name,q,buckets,expected", CASES, ids=[c[0] for c in CASES])
def test_literal_cases(name, q, buckets, expected):
    assert same(histogram_quantile(q, buckets), expected), histogram_quantile(q, buckets)


def _random_histograms(rng: random.Random, n: int) -> list[list[tuple[float, float]]]:
    out = []
    for i in range(n):
        k = rng.randint(1, 12)
        kind = i % 6
        if kind == 0:     # positive exponential-ish bounds, monotonic counts
            bounds = sorted({round(rng.uniform(0.001, 10.0), rng.randint(1, 6)) for _ in range(k)})
        elif kind == 1:   # bounds crossing zero
            bounds = sorted({round(rng.uniform(-5, 5), 3) for _ in range(k)})
        else:
            bounds = sorted({rng.choice([0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10]) for _ in range(k)})
        counts, acc = [], 0.0
        for _ in bounds:
            acc += rng.choice([0, 0, 1, rng.randint(0, 50), rng.uniform(0, 30)])
            counts.append(acc)
        total = acc + rng.choice([0, 0, rng.randint(0, 20)])
        if kind == 3 and len(counts) > 1:      # non-monotonic (inconsistent) data
            j = rng.randrange(len(counts))
            counts[j] = max(0.0, counts[j] - rng.randint(1, 30))
        if kind == 4:
            counts = [0.0] * len(counts)
            total = rng.choice([0.0, 0.0, 7.0])   # empty, or everything in +Inf
        if i % 37 == 36 and counts:             # a NaN count (Go's comparisons with NaN are all false)
            counts[rng.randrange(len(counts))] = NAN
        pairs = list(zip(bounds, counts))
        if kind != 5 or rng.random() < 0.7:       # some lack +Inf entirely
            pairs.append((INF, max(total, counts[-1] if counts else 0.0) if kind != 3 else total))
        out.append(pairs)
    return out


def test_matches_real_prometheus(prometheus_factory, tmp_path):
    rng = random.Random(20261130)
    hists = _random_histograms(rng, 240)
    t0 = (int(time.time()) // 60) * 60 - 3600
    lines = ["# TYPE rnd_bucket gauge"]
    for i, h in enumerate(hists):
        for le, c in h:
            lines.append(f'rnd_bucket{{h="{i}",le="{format_value(le)}"}} {format_value(c)} {t0}')
    lines.append("# EOF")
    backfill("\n".join(lines) + "\n", tmp_path / "data")
    prom = prometheus_factory(data_dir=tmp_path / "data")
    qs = [0.0, 0.01, 0.25, 0.5, 0.9, 0.99, 0.999, 1.0, -0.5, 1.5, NAN, rng.random(), rng.random()]
    compared = 0
    for q in qs:
        got = prom.query(f"histogram_quantile({format_value(q)}, rnd_bucket)", time=t0)
        by_h = {int(s["metric"]["h"]): float(s["value"][1]) for s in got}
        # a series whose buckets are all absent is no result; every histogram here has >= 1 bucket
        assert set(by_h) == set(range(len(hists))), f"q={q}: {len(by_h)} series from Prometheus"
        for i, h in enumerate(hists):
            mine = histogram_quantile(q, h)
            assert same(mine, by_h[i]), f"q={q} h={h}: prometheus {by_h[i]!r}, ours {mine!r}"
            compared += 1
    assert compared == len(qs) * len(hists)
    nan_share = sum(math.isnan(histogram_quantile(0.5, h)) for h in hists) / len(hists)
    assert 0.05 < nan_share < 0.6   # the edge cases (empty, no +Inf) are really exercised
