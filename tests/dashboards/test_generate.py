"""Generating the dashboards: one JSON per *.dashboard.py with the structure Grafana needs, the chart's copies
current, and the canary's deltas the very expressions of control_plane/analysis/promql.py."""
from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sits.control_plane.analysis import promql
from sits.dashboards import generate, rules
from sits.dashboards.__main__ import CHART, chart_files
from tests.dashboards.support import SchemaError, check_schema

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str):
    return subprocess.run([sys.executable, "-m", "sits.dashboards", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_generate_writes_one_valid_json_per_definition(tmp_path):
    r = _cli("generate", "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == sorted(f"{n}.json" for n in generate.sources()) == ["canary.json", "control-plane.json",
                                                                      "engine.json"]
    uids = set()
    for name in names:
        d = json.loads((tmp_path / "out" / name).read_text())
        check_schema(d)
        uids.add(d["uid"])
    assert len(uids) == 3


@pytest.mark.parametrize("breakage, message", [
    (lambda d: d["panels"][1]["gridPos"].update(x=d["panels"][0]["gridPos"]["x"],
                                                y=d["panels"][0]["gridPos"]["y"]), "overlaps"),
    (lambda d: d["panels"][0]["targets"][0].update(datasource="Prometheus"), "target datasource"),
    (lambda d: d["panels"][0]["targets"][0].update(expr="up{job=\"$nope\"}"), "undefined variables"),
    (lambda d: d["templating"]["list"].pop(1), "template variables"),
    (lambda d: d["panels"][2].update(id=d["panels"][0]["id"]), "reused"),
    (lambda d: d.pop("uid"), "uid"),
    (lambda d: d["panels"][0]["fieldConfig"]["defaults"]["thresholds"].update(steps=""), "thresholds.steps"),
])
def test_schema_check_rejects_what_grafana_would(breakage, message):
    d = json.loads(generate.render_all()["canary.json"])
    check_schema(copy.deepcopy(d))
    breakage(d)
    with pytest.raises(SchemaError, match=message):
        check_schema(d)


def test_chart_copies_are_current():
    stale = [str(p) for p, text in chart_files().items() if not p.exists() or p.read_text() != text]
    assert not stale, f"run `python -m sits.dashboards chart`: stale {stale}"
    assert sorted(p.name for p in (CHART / "dashboards").glob("*.json")) == sorted(generate.render_all())


def test_chart_check_reports_a_stale_copy(tmp_path):
    chart = tmp_path / "chart"
    shutil.copytree(CHART / "dashboards", chart / "dashboards")
    shutil.copytree(CHART / "files", chart / "files")
    assert _cli("chart", "--check", "--chart", str(chart)).returncode == 0
    (chart / "dashboards" / "canary.json").write_text("{}")
    (chart / "dashboards" / "old.json").write_text("{}")
    r = _cli("chart", "--check", "--chart", str(chart))
    assert r.returncode == 1 and "canary.json" in r.stderr and "old.json" in r.stderr
    assert _cli("chart", "--chart", str(chart)).returncode == 0           # refresh
    assert not (chart / "dashboards" / "old.json").exists()
    assert _cli("chart", "--check", "--chart", str(chart)).returncode == 0


def test_canary_deltas_are_the_analysis_templates():
    d = json.loads(generate.render_all()["canary.json"])
    got = {t["expr"] for p in d["panels"] for t in p["targets"]}
    for metric in ("http_request_duration_seconds", "sits_time_to_first_token_seconds",
                   "sits_inter_token_latency_seconds"):
        extra = ',namespace=~"$namespace"' + promql.LATENCY_FILTER.get(metric, "")
        for q in (0.9, 0.99):
            for target in ("baseline", "production"):
                assert promql.render("quantile_delta", q=q, metric=metric, service="$service", target=target,
                                     extra=extra, window="$__rate_interval") in got
    assert any("sits_canary_weight_percent" in e for e in got)
    names = {a["name"] for a in d["annotations"]["list"]}
    assert {"Rollout phase", "Check verdicts"} <= names


def test_recording_rules_are_promql_templates():
    recs = {r["record"]: r["expr"] for r in rules.recording_rules()}
    assert recs["sits:http_request_duration_seconds:p99_rate5m"] == promql.render(
        "quantile_by", q=0.99, metric="http_request_duration_seconds", by="namespace, service, env",
        match='env=~"production|baseline|canary",status=~"[123].."', window="5m")
    assert len(recs) == 8   # 4 latency metrics x P90/P99


def test_a_definition_without_dashboard_is_a_clear_error(tmp_path):
    path = tmp_path / "broken.dashboard.py"
    path.write_text("x = 1\n")
    with pytest.raises(generate.DashboardDefinitionError, match="broken.dashboard.py defines no"):
        generate.load(path)
