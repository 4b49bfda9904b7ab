"""Grafana dashboards in code: `dashboards/<name>.dashboard.py` each define `dashboard` (grafanalib);
`python -m sits.dashboards generate --out DIR` writes one `<name>.json` per file, `python -m sits.dashboards rules --out FILE`
the chart's recording rules and alert expressions (the same PromQL, from control_plane/analysis/promql.py)."""
