"""`python -m sits.dashboards push` against a local double of Grafana's `POST /api/dashboards/db` that checks the request
shape as Grafana's HTTP API documents it (no Grafana server can be obtained here)."""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sits.dashboards import generate, push
from sits.dashboards.__main__ import main

TOKEN = "glsa_test_0123456789abcdef"


class Grafana(BaseHTTPRequestHandler):
    """Stores dashboards by uid; answers like Grafana: 401 without the token, 412 for a changed dashboard without
    overwrite, 200 {id, uid, url, status, version, slug} otherwise."""
    dashboards: dict = {}
    requests: list = []

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers["content-length"]))
        Grafana.requests.append((self.path, dict(self.headers), body))
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self._answer(401, {"message": "Unauthorized"})
        if self.path != "/grafana/api/dashboards/db" or self.headers.get_content_type() != "application/json":
            return self._answer(404, {"message": "Not found"})
        req = json.loads(body)
        d = req["dashboard"]
        if d.get("id") is not None or not d.get("uid") or not d.get("title") or not isinstance(d.get("panels"), list):
            return self._answer(400, {"message": "bad dashboard"})
        old = Grafana.dashboards.get(d["uid"])
        if old is not None and not req.get("overwrite"):
            return self._answer(412, {"message": "The dashboard has been changed by someone else",
                                      "status": "version-mismatch"})
        version = (old["version"] + 1) if old else 1
        Grafana.dashboards[d["uid"]] = {"version": version, "folderUid": req.get("folderUid"), "dashboard": d,
                                        "message": req.get("message")}
        self._answer(200, {"id": len(Grafana.dashboards), "uid": d["uid"], "url": f"/d/{d['uid']}/x",
                           "status": "success", "version": version, "slug": "x"})

    def _answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def grafana():
    Grafana.dashboards, Grafana.requests = {}, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Grafana)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/grafana"
    server.shutdown()
    server.server_close()


def test_push_creates_then_updates_every_dashboard(grafana, tmp_path, capsys):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    argv = ["push", "--url", grafana + "/", "--token-file", str(token_file), "--folder-uid", "sits"]
    assert main(argv) == 0
    generated = {json.loads(t)["uid"]: json.loads(t) for t in generate.render_all().values()}
    assert set(Grafana.dashboards) == set(generated) == {"sits-canary", "sits-control-plane", "sits-engine"}
    for uid, stored in Grafana.dashboards.items():
        assert stored["version"] == 1 and stored["folderUid"] == "sits"
        assert stored["dashboard"] == {**generated[uid], "id": None}   # the generated JSON, unchanged
    assert main(argv) == 0   # again: the same dashboards, updated in place
    assert {uid: s["version"] for uid, s in Grafana.dashboards.items()} == dict.fromkeys(generated, 2)
    out = capsys.readouterr().out
    assert "sits-canary version 2" in out and TOKEN not in out
    path, headers, _ = Grafana.requests[0]
    assert headers["Accept"] == "application/json"


def test_refusals_are_one_line_errors_without_the_token(grafana, monkeypatch, capsys):
    monkeypatch.setenv("GRAFANA_TOKEN", "wrong-token")
    assert main(["push", "--url", grafana]) == 2
    err = capsys.readouterr().err
    assert "401" in err and "dashboards:write" in err and "wrong-token" not in err and len(err.splitlines()) == 1
    monkeypatch.setenv("GRAFANA_TOKEN", TOKEN)
    assert main(["push", "--url", grafana]) == 0
    assert main(["push", "--url", grafana, "--no-overwrite"]) == 2   # changed there: Grafana's 412 is reported
    assert "412" in capsys.readouterr().err
    monkeypatch.delenv("GRAFANA_TOKEN")
    assert main(["push", "--url", grafana]) == 2   # no token at all: refused before any request
    assert "token" in capsys.readouterr().err


def test_unreachable_grafana_and_bad_config():
    with pytest.raises(push.PushError, match="ConnectionError"):
        push.push_all(push.GrafanaConfig("http://127.0.0.1:9", TOKEN), {"x.json": '{"uid": "x"}'})
    for kwargs in ({"url": "grafana:3000"}, {"url": "http://admin:pw@grafana"}, {"token": " "},
                   {"folder_uid": "x" * 41}):
        with pytest.raises(ValueError):
            push.GrafanaConfig(**{"url": "http://grafana", "token": TOKEN, **kwargs})
