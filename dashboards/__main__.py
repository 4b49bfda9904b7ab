"""python -m sits.dashboards generate --out DIR | rules --out FILE | chart [--check] | push --url URL [--token-file F]"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from sits.dashboards import generate, push, rules

CHART = Path(__file__).resolve().parents[1] / "helm" / "sits-control"


def chart_files(chart: Path = CHART) -> dict[Path, str]:
    """What the chart carries from here: the dashboards' JSON and the rules file."""
    out = {chart / "dashboards" / name: text for name, text in generate.render_all().items()}
    out[chart / "files" / "rules.yaml"] = rules.render()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m sits.dashboards", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="write one JSON per dashboards/*.dashboard.py")
    g.add_argument("--out", required=True, type=Path)
    r = sub.add_parser("rules", help="write the recording rules and alert expressions (YAML)")
    r.add_argument("--out", required=True, type=Path)
    c = sub.add_parser("chart", help="refresh the copies in helm/sits-control (dashboards/*.json, files/rules.yaml)")
    c.add_argument("--check", action="store_true", help="only report stale copies (exit 1 if any)")
    c.add_argument("--chart", type=Path, default=CHART, help=argparse.SUPPRESS)
    u = sub.add_parser("push", help="create or update every dashboard in a Grafana (POST /api/dashboards/db)")
    u.add_argument("--url", default=os.environ.get("GRAFANA_URL"), help="Grafana's base URL (or $GRAFANA_URL)")
    u.add_argument("--token-file", default=None, help="file holding a Grafana service-account token (or "
                   "$GRAFANA_TOKEN)")
    u.add_argument("--folder-uid", default=None, help="folder to put them in (default: Grafana's root)")
    u.add_argument("--no-overwrite", action="store_true", help="refuse to replace dashboards changed in Grafana")
    a = p.parse_args(argv)
    try:
        if a.cmd == "push":
            return _push(a)
        if a.cmd == "generate":
            for path in generate.write_all(a.out):
                print(path)
        elif a.cmd == "rules":
            a.out.parent.mkdir(parents=True, exist_ok=True)
            a.out.write_text(rules.render())
            print(a.out)
        else:
            files = chart_files(a.chart)
            stale = [path for path, text in files.items() if not path.exists() or path.read_text() != text]
            stale += sorted(set((a.chart / "dashboards").glob("*.json")) - set(files))   # a removed dashboard
            if a.check:
                for path in stale:
                    print(f"stale: {path} (run `python -m sits.dashboards chart`)", file=sys.stderr)
                return 1 if stale else 0
            for path in stale:
                if path in files:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(files[path])
                else:
                    path.unlink()
                print(path)
    except (generate.DashboardDefinitionError, push.PushError, ValueError, OSError) as e:
        print(f"python -m sits.dashboards: error: {e}", file=sys.stderr)
        return 2
    return 0


def _push(a) -> int:
    if not a.url:
        raise ValueError("push needs --url (or $GRAFANA_URL)")
    if a.token_file:
        with open(a.token_file, encoding="utf-8") as f:
            token = f.read()
    else:
        token = os.environ.get("GRAFANA_TOKEN", "")
    config = push.GrafanaConfig(a.url, token, folder_uid=a.folder_uid, overwrite=not a.no_overwrite)
    for r in push.push_all(config):
        print(f"{r['name']}: {r['status']} uid {r['uid']} version {r['version']} {config.url}{r['url'] or ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
