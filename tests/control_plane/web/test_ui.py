"""The server-rendered pages through Flask's test client: login redirects, roles, what each page carries, headers,
and the vendored assets."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from .conftest import TOKENS, drive, new_rollout
from .test_auth import login

STATIC = Path(__file__).resolve().parents[3] / "control_plane" / "web" / "static"


@pytest.mark.parametrize("path", ["/", "/rollouts/new", "/rollouts/x", "/kernels", "/services"])
def test_pages_redirect_to_login_when_signed_out(client, path):
    r = client.get(path)
    assert r.status_code == 302 and r.headers["Location"].startswith("/login?next=")


def test_every_page_renders_for_a_viewer(client, store):
    ro = new_rollout(store)
    drive(store, ro.id, 6)
    login(client, TOKENS["viewer"])
    for path in ("/", "/rollouts/new", f"/rollouts/{ro.id}", "/kernels", "/services"):
        r = client.get(path)
        assert r.status_code == 200, path
        html = r.get_data(as_text=True)
        assert 'name="csrf-token"' in html and "vera" in html
        assert r.headers["X-Frame-Options"] == "DENY" and "default-src 'self'" in r.headers["Content-Security-Policy"]
        assert not re.search(r'(src|href)="(https?:)?//', html), path   # no CDN: every asset is ours


def test_new_canary_page_offers_the_catalogue_and_defaults(client):
    login(client, TOKENS["operator"])
    html = client.get("/rollouts/new").get_data(as_text=True)
    assert '<option value="triton-v1.1"' in html and '<option value="torch"' in html
    defaults = json.loads(re.search(r'id="policy-defaults">(.*?)</script>', html, re.S).group(1))
    assert defaults["steps"] == [5, 10, 25, 50, 100]
    assert 'id="start"' in html and 'id="start" disabled' not in html


def test_new_canary_page_tells_a_viewer_they_cannot_start(client):
    login(client, TOKENS["viewer"])
    html = client.get("/rollouts/new").get_data(as_text=True)
    assert "needs the operator role" in html and 'id="start" disabled' in html


def test_detail_page_embeds_the_rollout_and_the_ops_that_differ(client, store):
    ro = new_rollout(store, canary="triton-v1.1", production="triton-v1")
    login(client, TOKENS["viewer"])
    html = client.get(f"/rollouts/{ro.id}").get_data(as_text=True)
    data = json.loads(re.search(r'id="rollout-data">(.*?)</script>', html, re.S).group(1))
    assert data["id"] == ro.id and data["phase"] == "pending"
    assert "prefill_attention" in html and "1.1.0" in html
    assert json.loads(re.search(r'id="can-act">(.*?)</script>', html, re.S).group(1)) is False


def test_unknown_rollout_page_is_a_404_page(client):
    login(client, TOKENS["viewer"])
    r = client.get("/rollouts/nope")
    assert r.status_code == 404 and "text/html" in r.content_type and b"no rollout" in r.data


def test_kernels_and_services_pages(client, store):
    ro = new_rollout(store)
    drive(store, ro.id, 3)
    login(client, TOKENS["viewer"])
    k = client.get("/kernels").get_data(as_text=True)
    assert 'id="k-triton-v1.1"' in k and "prefill_attention" in k
    s = client.get("/services").get_data(as_text=True)
    assert ">chat<" in s and "triton-v1" in s


def test_vendored_assets_are_served_with_their_licence_and_pinned_version(client):
    r = client.get("/static/vendor/uplot/uPlot.iife.min.js")
    assert r.status_code == 200 and b"uPlot" in r.data[:2000]
    assert (STATIC / "vendor" / "uplot" / "LICENSE").read_text().startswith("The MIT License")
    assert "1.6.32" in (STATIC / "vendor" / "README.md").read_text()
    for js in ("common.js", "rollouts.js", "detail.js", "new.js", "charts.js"):
        assert client.get(f"/static/js/{js}").status_code == 200
