"""Push the generated dashboards into a Grafana through its HTTP API (`POST /api/dashboards/db`), for Grafanas without
the sidecar that loads the chart's ConfigMaps. Each dashboard keeps its `uid` (sits-canary, ...), so a second push
updates the same dashboard (`overwrite`) instead of creating a copy.

    python -m sits.dashboards push --url https://grafana.example --token-file /run/secrets/grafana-token [--folder-uid UID]

The token (a Grafana service-account token) comes from `--token-file` or `$GRAFANA_TOKEN`, never from a flag value;
it is sent only as `Authorization: Bearer ...` and never printed.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Mapping

import requests

from sits.dashboards import generate

MAX_UID = 40   # Grafana's limit on a dashboard or folder uid


class PushError(Exception):
    """Grafana refused a dashboard, or could not be reached; the message says which and why."""


@dataclass(slots=True)
class GrafanaConfig:
    url: str
    token: str = field(repr=False)
    folder_uid: str | None = None
    overwrite: bool = True
    timeout_s: float = 10.0
    verify_tls: bool | str = True

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url.startswith(("http://", "https://")) or "@" in self.url:
            raise ValueError(f"Grafana URL must be http(s)://host[:port][/path] without credentials, got "
                             f"{str(self.url).split('@')[-1]!r}")
        self.url = self.url.rstrip("/")
        self.token = self.token.strip() if isinstance(self.token, str) else ""   # a token file ends in a newline
        if not self.token or any(c in self.token for c in "\r\n"):
            raise ValueError("the Grafana token is empty or spans lines (give --token-file FILE or $GRAFANA_TOKEN)")
        if self.folder_uid is not None and (not self.folder_uid or len(self.folder_uid) > MAX_UID):
            raise ValueError(f"folder uid must be 1-{MAX_UID} characters")
        if not self.timeout_s > 0:
            raise ValueError("timeout_s must be > 0")


def request_body(dashboard_json: str, config: GrafanaConfig, name: str) -> dict:
    """What Grafana's create-or-update endpoint takes: the dashboard without a numeric id (Grafana assigns it; the
    uid identifies the dashboard across pushes), the folder, overwrite, and a version message."""
    dashboard = json.loads(dashboard_json)
    dashboard["id"] = None
    body = {"dashboard": dashboard, "overwrite": config.overwrite, "message": f"sits: {name} from dashboards/"}
    if config.folder_uid is not None:
        body["folderUid"] = config.folder_uid
    return body


def push_all(config: GrafanaConfig, dashboards: Mapping[str, str] | None = None,
             session: requests.Session | None = None) -> list[dict]:
    """Push every dashboard (default: generate.render_all()); returns Grafana's answer per dashboard
    ({name, uid, url, version, status}). Stops at the first refusal with a PushError."""
    own = session is None
    s = session or requests.Session()
    s.trust_env = False
    out = []
    try:
        for name, text in (dashboards if dashboards is not None else generate.render_all()).items():
            try:
                r = s.post(config.url + "/api/dashboards/db", json=request_body(text, config, name),
                           headers={"Authorization": f"Bearer {config.token}", "Accept": "application/json"},
                           timeout=config.timeout_s, verify=config.verify_tls)
            except requests.RequestException as e:
                raise PushError(f"{name}: POST {config.url}/api/dashboards/db failed: {type(e).__name__}") from None
            try:
                answer = r.json()
            except ValueError:
                answer = {}
            if r.status_code != 200 or not isinstance(answer, dict) or answer.get("status") != "success":
                msg = answer.get("message") if isinstance(answer, dict) else None
                raise PushError(f"{name}: Grafana answered {r.status_code}: {str(msg or r.text[:200]).strip()}"
                                + (" (check the token and its role: it needs dashboards:write)"
                                   if r.status_code in (401, 403) else ""))
            out.append({"name": name, **{k: answer.get(k) for k in ("uid", "url", "version", "status")}})
    finally:
        if own:
            s.close()
    return out
