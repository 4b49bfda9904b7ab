"""HistogramSnapshot: layout validation, window deltas with counter resets (as rate() does), merging, codec."""
import math

import pytest

from sits.control_plane.analysis import HistogramError, HistogramSnapshot, histogram_quantile, merge_all

INF = math.inf
B = (0.1, 0.2, 0.4, INF)


def snap(counts, s=0.0, count=None):
    return HistogramSnapshot(B, counts, s, count)


def test_defaults_and_views():
    h = snap((1, 3, 6, 10), 2.5)
    assert h.count == 10 and h.total == 10
    assert h.per_bucket() == (1, 2, 3, 4)
    assert h.buckets() == list(zip(B, (1.0, 3.0, 6.0, 10.0)))
    assert h.quantile(0.5) == histogram_quantile(0.5, h.buckets()) == 0.2 + 0.2 * (2 / 3)


@pytest.mark.parametrize("bounds,counts,msg", [
    ((0.1, 0.2), (1, 2), r"end at \+Inf"),
    ((0.2, 0.1, INF), (1, 2, 3), "ascending"),
    ((0.1, 0.1, INF), (1, 2, 3), "ascending"),
    ((0.1, INF), (1, 2, 3), "counts"),
    ((), (), r"end at \+Inf"),
])
def test_bad_layouts(bounds, counts, msg):
    with pytest.raises(HistogramError, match=msg):
        HistogramSnapshot(bounds, counts)


def test_delta_plain():
    d = snap((5, 8, 12, 20), 9.0, 20).delta(snap((1, 3, 6, 10), 2.5, 10))
    assert d.counts == (4, 5, 6, 10) and d.sum == 6.5 and d.count == 10


def test_delta_counter_reset_per_series():
    # the target restarted: every series went down, so the new values are the increase since the reset
    older, newer = snap((50, 80, 90, 100), 40.0, 100), snap((2, 3, 3, 4), 1.0, 4)
    d = newer.delta(older)
    assert d.counts == (2, 3, 3, 4) and d.sum == 1.0 and d.count == 4
    # a series that did not go down is a plain difference, as rate() treats each series on its own
    d2 = snap((0, 3, 3, 4), 1.0, 4).delta(snap((0, 5, 6, 8), 2.0, 8))
    assert d2.counts == (0, 3, 3, 4)


def test_delta_and_merge_reject_other_layouts():
    other = HistogramSnapshot((0.1, 0.3, INF), (1, 2, 3))
    with pytest.raises(HistogramError, match="layouts differ"):
        snap((1, 2, 3, 4)).delta(other)
    with pytest.raises(HistogramError, match="layouts differ"):
        snap((1, 2, 3, 4)).merge(other)


def test_merge_replicas():
    a, b = snap((1, 2, 3, 4), 1.0, 4), snap((0, 5, 5, 6), 2.0, 6)
    m = a.merge(b)
    assert m.counts == (1, 7, 8, 10) and m.sum == 3.0 and m.count == 10
    assert merge_all([a, b, a]).counts == (2, 9, 11, 14)
    assert merge_all([]) is None


def test_from_buckets_sorts_and_sums_duplicate_le():
    h = HistogramSnapshot.from_buckets([("+Inf", 4), (0.2, 2), (0.1, 1), (0.2, 1)], sum=1.5)
    assert h.bounds == (0.1, 0.2, INF) and h.counts == (1, 3, 4) and h.count == 4


def test_from_values_is_le_inclusive():
    h = HistogramSnapshot.from_values([0.1, 0.15, 0.2, 0.5, 7.0], (0.1, 0.2, 0.4))
    assert h.counts == (1, 3, 3, 5) and h.sum == pytest.approx(7.95)


def test_codec_round_trip_and_nan():
    h = snap((1, 2, 3, 4), 1.25, 4)
    assert HistogramSnapshot.from_dict(h.to_dict()) == h
    assert h.to_dict()["bounds"][-1] == "+Inf"
    assert not h.has_nan() and snap((1, math.nan, 3, 4)).has_nan() and snap((1, 2, 3, 4), math.nan).has_nan()


def test_inputs_not_mutated():
    a, b = snap((1, 2, 3, 4)), snap((2, 3, 4, 5))
    b.delta(a), a.merge(b)
    assert a.counts == (1, 2, 3, 4) and b.counts == (2, 3, 4, 5)


def test_delta_then_merge_recovers_the_newer_snapshot():
    import random
    rng = random.Random(3)
    for _ in range(200):
        per_old = [rng.randint(0, 20) for _ in B]
        per_new = [a + rng.randint(0, 20) for a in per_old]
        cum = lambda xs: tuple(float(sum(xs[: i + 1])) for i in range(len(xs)))  # noqa: E731
        older, newer = snap(cum(per_old), 1.0, None), snap(cum(per_new), 3.0, None)
        window = newer.delta(older)
        assert older.merge(window) == newer
        assert window.total == sum(per_new) - sum(per_old) and min(window.per_bucket()) >= 0
