"""PromQL templates: strict rendering, and every template evaluated by a real Prometheus on backfilled histograms,
where the bucket increases equal HistogramSnapshot.delta and the quantile equals our histogram_quantile."""
import math
import re
import time

import pytest

from sits.control_plane.analysis import HistogramSnapshot, promql
from tests.fixtures.prometheus import backfill, format_value, value

BASE = dict(metric="http_request_duration_seconds", service="chat", env="canary", target="baseline", window="30s",
            q="0.9")


def args(name):
    return {k: BASE[k] for k in promql.keys(name) if k in BASE}


def test_render_is_strict():
    assert promql.render("bucket_increase", **args("bucket_increase")) == (
        'sum by (le) (increase(http_request_duration_seconds_bucket{service="chat",env="canary",'
        'status=~"[123].."}[30s]))')
    with pytest.raises(promql.TemplateError, match="needs env"):
        promql.render("bucket_increase", metric="m", service="s", window="1m")
    with pytest.raises(promql.TemplateError, match="takes no q"):
        promql.render("requests", service="s", env="canary", window="1m", q=0.9)
    with pytest.raises(promql.TemplateError, match="unknown PromQL template"):
        promql.render("nope")
    with pytest.raises(promql.TemplateError, match="quotes"):
        promql.render("requests", service='x"}) or vector(1', env="canary", window="1m")
    assert promql.series_key("m", {"route": "/v1/completions"}) == 'm{route="/v1/completions"}'
    assert promql.route_filter("/v1/x") == ',route="/v1/x",status=~"[123].."'


def _histogram_lines(t: int, env: str, counts: list[int], status="200") -> list[str]:
    bounds = [0.05, 0.1, 0.2, math.inf]
    out = []
    for le, c in zip(bounds, counts):
        out.append(f'http_request_duration_seconds_bucket{{service="chat",env="{env}",route="/v1/completions",'
                   f'status="{status}",le="{format_value(le)}"}} {c} {t}')
    out.append(f'http_request_duration_seconds_count{{service="chat",env="{env}",route="/v1/completions",'
               f'status="{status}"}} {counts[-1]} {t}')
    out.append(f'http_request_duration_seconds_sum{{service="chat",env="{env}",route="/v1/completions",'
               f'status="{status}"}} {counts[-1] * 0.1} {t}')
    return out


def test_templates_against_real_prometheus(prometheus_factory, tmp_path):
    t0 = (int(time.time()) // 60) * 60 - 3600
    series = {"canary": [[10, 30, 45, 50], [40, 90, 130, 150], [70, 160, 230, 260]],
              "baseline": [[20, 40, 48, 50], [80, 150, 170, 180], [140, 260, 300, 310]]}
    lines = ["# TYPE http_request_duration_seconds histogram"]
    for i in range(3):
        for env, s in series.items():
            lines += _histogram_lines(t0 + 15 * i, env, s[i])
        lines += _histogram_lines(t0 + 15 * i, "canary", [0, 0, 0, 5 * i], status="500")
    backfill("\n".join(lines) + "\n# EOF\n", tmp_path / "data")
    prom = prometheus_factory(data_dir=tmp_path / "data")
    at = t0 + 30
    bounds = (0.05, 0.1, 0.2, math.inf)
    snaps = {env: [HistogramSnapshot(bounds, c) for c in s] for env, s in series.items()}
    for env in ("canary", "baseline"):
        got = prom.query(promql.render("bucket_increase", **{**args("bucket_increase"), "env": env}), time=at)
        window = snaps[env][2].delta(snaps[env][0])
        by_le = {float(x["metric"]["le"]): value(x) for x in got}
        assert [by_le[b] for b in bounds] == pytest.approx(list(window.counts))
        q = prom.query(promql.render("quantile", **{**args("quantile"), "env": env}), time=at)
        assert value(q[0]) == pytest.approx(window.quantile(0.9), rel=1e-12)
    req = prom.query(promql.render("requests", **args("requests")), time=at)
    err = prom.query(promql.render("errors", **args("errors")), time=at)
    assert value(req[0]) == pytest.approx(210 + 10) and value(err[0]) == pytest.approx(10)
    rate = prom.query(promql.render("error_rate", **args("error_rate")), time=at)
    assert value(rate[0]) == pytest.approx(10 / 220)
    delta = prom.query(promql.render("quantile_delta", **args("quantile_delta")), time=at)
    expected = snaps["canary"][2].delta(snaps["canary"][0]).quantile(0.9) / \
        snaps["baseline"][2].delta(snaps["baseline"][0]).quantile(0.9) - 1
    assert value(delta[0]) == pytest.approx(expected, rel=1e-9)
    by_route = prom.query(promql.render("bucket_increase_by_route", **args("bucket_increase_by_route")), time=at)
    assert {x["metric"]["route"] for x in by_route} == {"/v1/completions"} and len(by_route) == 4
    cnt = prom.query(promql.render("count_increase", **args("count_increase")), time=at)
    assert value(cnt[0]) == pytest.approx(210)


def test_increase_with_a_counter_reset_matches_prometheus(prometheus_factory, tmp_path):
    """Five scrapes of one target that restarts after the third: our per-series reset handling == increase()."""
    from sits.control_plane.analysis import increase
    t0 = (int(time.time()) // 60) * 60 - 3600
    scrapes = [[1, 3, 4, 6], [4, 8, 10, 13], [9, 14, 18, 21], [1, 1, 2, 3], [3, 6, 7, 9]]   # reset before #4
    lines = ["# TYPE http_request_duration_seconds histogram"]
    for i, counts in enumerate(scrapes):
        lines += _histogram_lines(t0 + 15 * i, "canary", counts)
    backfill("\n".join(lines) + "\n# EOF\n", tmp_path / "data")
    prom = prometheus_factory(data_dir=tmp_path / "data")
    got = prom.query(promql.render("bucket_increase", metric="http_request_duration_seconds", service="chat",
                                   env="canary", window="60s"), time=t0 + 60)
    by_le = {float(x["metric"]["le"]): value(x) for x in got}
    bounds = (0.05, 0.1, 0.2, math.inf)
    mine = increase([HistogramSnapshot(bounds, c) for c in scrapes])
    assert [by_le[b] for b in bounds] == pytest.approx(list(mine.counts))
    assert mine.counts == (11.0, 17.0, 21.0, 24.0)    # e.g. le=0.05: (9-1) + 1 + (3-1)


def test_matchers_and_by_are_validated():
    m = promql.matchers("http_request_duration_seconds", namespace=("=~", "$namespace"), service="chat")
    assert m == 'namespace=~"$namespace",service="chat",status=~"[123].."'
    assert promql.matchers("sits_queue_time_seconds") == ""
    assert promql.render("rate_by", metric="m", by="env, kernel_version", match=m, window="1m") == (
        'sum by (env, kernel_version) (rate(m{namespace=~"$namespace",service="chat",status=~"[123].."}[1m]))')
    with pytest.raises(promql.TemplateError, match="unsafe matcher"):
        promql.matchers(service='x"} or up{a="')
    with pytest.raises(promql.TemplateError, match="operator"):
        promql.matchers(service=("==", "x"))
    with pytest.raises(promql.TemplateError, match="label names"):
        promql.render("rate_by", metric="m", by="env) or (up", match=m, window="1m")
    with pytest.raises(promql.TemplateError, match="'agg'"):
        promql.render("gauge_by", agg="sum) or (up", metric="m", by="env", match=m)


@pytest.mark.parametrize("text,want", [
    ('{service="chat",env="canary"}', 'service="chat",env="canary"'),
    (' service = "chat" , pod=~"chat-[a-z0-9]+" ', 'service="chat",pod=~"chat-[a-z0-9]+"'),
    ('{app="chat-primary",env!="test",x!~"y.*"}', 'app="chat-primary",env!="test",x!~"y.*"')])
def test_selector_normalises_a_users_label_selector(text, want):
    assert promql.selector(text) == want
    assert promql.render("count_increase_match", metric="m", window="5m", match=promql.selector(text)) == \
        f"sum(increase(m_count{{{want}}}[5m]))"


@pytest.mark.parametrize("text", ['', '{}', 'chat', 'a="b",', 'a="b" b="c"', 'a="b"}', 'a="\\"', 'a="x{y}"',
                                  '1a="b"', 'a=="b"', 'a!="b"', 'a=""', 'a="b"\n,c="d"' + "x" * 1000, 'a="b"} or up{'])
def test_selector_refuses_anything_else(text):
    with pytest.raises(promql.TemplateError):
        promql.selector(text)


def test_status_classes_time_answers_count_server_errors_and_leave_client_errors_out():
    cases = {"200": "timed", "204": "timed", "304": "timed", "400": "client", "408": "client", "413": "client",
             "499": "client", "429": "error", "500": "error", "503": "error", "": "client"}
    assert {s: promql.status_class(s) for s in cases} == cases
    # the PromQL regexes say the same (Prometheus anchors them)
    for status, kind in cases.items():
        assert bool(re.fullmatch(promql.TIMED, status)) == (kind == "timed"), status
        assert bool(re.fullmatch(promql.SERVER_ERROR, status)) == (kind == "error"), status
        assert bool(re.fullmatch(promql.COUNTED, status)) == (kind != "client"), status
