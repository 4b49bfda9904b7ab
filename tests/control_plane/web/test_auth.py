"""Auth: the auth file, the login page and its session cookie, CSRF, the failed-login limit, auth off, and that
tokens never reach the logs."""
from __future__ import annotations

import json
import logging
import re

import pytest

from sits.control_plane.web import create_app
from sits.control_plane.web.users import AuthFileError, LoginLimiter, Users, token_sha256

from .accounts import TOKENS
from .conftest import auth, drive, new_rollout, snapshot


def login(client, token: str, next_url: str = "/"):
    client.get("/login")
    with client.session_transaction() as s:
        csrf = s["csrf"]
    return client.post("/login", data={"token": token, "csrf_token": csrf, "next": next_url})


def csrf_of(client) -> str:
    with client.session_transaction() as s:
        return s["csrf"]


def test_auth_file_json_and_yaml(tmp_path):
    entry = {"name": "alice", "role": "operator", "token_sha256": token_sha256("s3cret")}
    (tmp_path / "a.json").write_text(json.dumps({"users": [entry]}))
    (tmp_path / "a.yaml").write_text(f"users:\n  - name: alice\n    role: operator\n    token_sha256: "
                                     f"{entry['token_sha256']}\n")
    for name in ("a.json", "a.yaml"):
        u = Users.load(tmp_path / name)
        assert u.authenticate("s3cret").name == "alice" and u.authenticate("s3cret").role == "operator"
        assert u.authenticate("wrong") is None and u.authenticate("") is None


@pytest.mark.parametrize("data,words", [
    ({"users": [{"name": "a", "role": "root", "token_sha256": "0" * 64}]}, "role"),
    ({"users": [{"name": "a", "role": "viewer", "token_sha256": "abc"}]}, "token_sha256"),
    ({"users": [{"name": "a", "role": "viewer", "token": "plain"}]}, "plaintext"),
    ({"users": []}, "no users"),
    ([1], "users"),
    ({"users": [{"name": "a", "role": "viewer", "token_sha256": "0" * 64},
                {"name": "a", "role": "admin", "token_sha256": "1" * 64}]}, "twice"),
])
def test_bad_auth_files_are_refused_with_the_reason(data, words):
    with pytest.raises(AuthFileError, match=words):
        Users.from_dict(data)


def test_unreadable_or_malformed_auth_file(tmp_path):
    with pytest.raises(AuthFileError, match="cannot read"):
        Users.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(AuthFileError, match="not valid JSON"):
        Users.load(tmp_path / "bad.json")


@pytest.mark.parametrize("mode", [0o666, 0o664, 0o646])
def test_an_auth_file_others_can_write_is_refused(tmp_path, mode):
    f = tmp_path / "auth.json"
    f.write_text(json.dumps({"users": [{"name": "ada", "role": "admin", "token_sha256": "a" * 64}]}))
    f.chmod(mode)
    with pytest.raises(AuthFileError, match=rf"writable by its group or by everyone \(mode {mode:04o}\).*chmod go-w"):
        Users.load(f)
    link = tmp_path / "link.json"   # through a symlink (a Kubernetes Secret mount): the file's own mode counts
    link.symlink_to(f)
    with pytest.raises(AuthFileError, match="writable by its group"):
        Users.load(link)
    f.chmod(0o644)   # readable by all is fine: it holds hashes of random tokens
    assert Users.load(link).get("ada").role == "admin"


def test_login_sets_an_httponly_lax_session_cookie_and_logout_ends_it(client):
    assert client.get("/").status_code == 302
    r = login(client, TOKENS["operator"], "/kernels")
    assert r.status_code == 302 and r.headers["Location"] == "/kernels"
    cookie = r.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Secure" not in cookie
    assert TOKENS["operator"] not in cookie
    page = client.get("/")
    assert page.status_code == 200 and b"otto" in page.data
    assert client.get("/api/v1/me").get_json() == {"name": "otto", "role": "operator"}
    r = client.post("/logout", data={"csrf_token": csrf_of(client)})
    assert r.status_code == 302
    assert client.get("/").status_code == 302
    assert client.get("/api/v1/me").status_code == 401


def test_cookie_is_secure_behind_tls(app):
    c = app.test_client()
    c.get("/login", base_url="https://sits.example")
    with c.session_transaction(base_url="https://sits.example") as s:
        csrf = s["csrf"]
    r = c.post("/login", data={"token": TOKENS["viewer"], "csrf_token": csrf}, base_url="https://sits.example")
    assert r.status_code == 302 and "Secure" in r.headers["Set-Cookie"]


def test_login_redirect_never_leaves_the_site(client):
    r = login(client, TOKENS["viewer"], "https://evil.example/")
    assert r.headers["Location"] == "/"
    r = login(client, TOKENS["viewer"], "//evil.example/x")
    assert r.headers["Location"] == "/"


def test_wrong_token_does_not_say_whether_a_user_exists(client):
    r = login(client, "nobody-has-this")
    assert r.status_code == 401 and b"That token is not valid." in r.data
    assert client.get("/api/v1/me").status_code == 401


def test_login_without_csrf_is_refused(client):
    client.get("/login")
    r = client.post("/login", data={"token": TOKENS["admin"]})
    assert r.status_code == 400
    assert client.get("/api/v1/me").status_code == 401


def test_failed_logins_are_rate_limited_per_client(client, login_clock):
    for _ in range(5):
        assert login(client, "bad-token").status_code == 401
    r = login(client, TOKENS["admin"])   # right token, but blocked
    assert r.status_code == 429 and int(r.headers["Retry-After"]) > 0
    assert client.get("/api/v1/me", headers=auth("admin")).status_code == 429   # bearer too
    other = client.application.test_client()
    other.environ_base["REMOTE_ADDR"] = "127.0.0.9"
    assert login(other, TOKENS["viewer"]).status_code == 302   # another address is not blocked
    login_clock.t += 301
    assert login(client, TOKENS["admin"]).status_code == 302


def test_bad_bearer_tokens_count_as_failed_logins(client):
    for _ in range(5):
        assert client.get("/api/v1/rollouts", headers={"Authorization": "Bearer nope"}).status_code == 401
    r = client.get("/api/v1/rollouts", headers=auth("viewer"))
    assert r.status_code == 429 and r.get_json()["error"]["code"] == "rate_limited"


def test_session_actions_need_the_csrf_token(client, store):
    ro = new_rollout(store)
    drive(store, ro.id, 3)
    login(client, TOKENS["operator"])
    before = snapshot(store)
    r = client.post(f"/api/v1/rollouts/{ro.id}/pause", json={})
    assert r.status_code == 403 and r.get_json()["error"]["code"] == "csrf"
    r = client.post(f"/api/v1/rollouts/{ro.id}/pause", json={}, headers={"X-CSRF-Token": "forged"})
    assert r.status_code == 403
    r = client.post("/api/v1/rollouts", json={"service": "x", "kernels": "torch"})
    assert r.status_code == 403
    assert snapshot(store) == before
    r = client.post(f"/api/v1/rollouts/{ro.id}/pause", json={}, headers={"X-CSRF-Token": csrf_of(client)})
    assert r.status_code == 202 and store.commands.pending(ro.id)[0]["actor"] == "otto"


def test_logout_needs_the_csrf_token(client):
    login(client, TOKENS["viewer"])
    client.post("/logout", data={"csrf_token": "forged"})
    assert client.get("/api/v1/me").status_code == 200


def test_user_removed_from_the_auth_file_loses_the_session(store, users):
    app = create_app({"TESTING": True, "STORE": store, "SITS_USERS": users, "SECRET_KEY": "k"})
    c = app.test_client()
    login(c, TOKENS["viewer"])
    assert c.get("/api/v1/me").status_code == 200
    app.config["SITS_USERS"] = Users.from_dict({"users": [{"name": "ada", "role": "admin",
                                                           "token_sha256": token_sha256(TOKENS["admin"])}]})
    assert c.get("/api/v1/me").status_code == 401


def test_auth_off_acts_as_local_admin_but_still_blocks_cross_site_posts(store):
    app = create_app({"TESTING": True, "STORE": store})
    c = app.test_client()
    ro = new_rollout(store)
    assert c.get("/api/v1/me").get_json() == {"name": "local", "role": "admin"}
    assert c.get("/").status_code == 200
    before = snapshot(store)
    # what a cross-site form can send: no JSON content type, no CSRF token
    r = c.post(f"/api/v1/rollouts/{ro.id}/abort", data="x", content_type="text/plain")
    assert r.status_code == 403
    assert snapshot(store) == before
    r = c.post(f"/api/v1/rollouts/{ro.id}/abort", json={})   # the CLI
    assert r.status_code == 202 and store.commands.pending(ro.id)[0]["actor"] == "local"


def test_tokens_never_reach_the_logs(client, store, caplog):
    caplog.set_level(logging.DEBUG)
    ro = new_rollout(store)
    login(client, "wrong-secret-token-xyz")
    login(client, TOKENS["operator"])
    client.get("/api/v1/rollouts", headers=auth("admin"))
    client.get("/api/v1/rollouts", headers={"Authorization": "Bearer another-wrong-token-abc"})
    client.post(f"/api/v1/rollouts/{ro.id}/abort", headers=auth("operator"))
    text = caplog.text
    for secret in (*TOKENS.values(), "wrong-secret-token-xyz", "another-wrong-token-abc"):
        assert secret not in text
    assert not re.search(r"sits_session=", text)


@pytest.mark.parametrize("headers,status,code", [
    ({"Host": "attacker.example"}, 421, "misdirected"),
    ({"Host": "attacker.example:8080", "Origin": "http://attacker.example:8080"}, 421, "misdirected"),
    ({"Host": "127.0.0.1:8080", "Origin": "http://attacker.example"}, 403, "cross_origin"),
    ({"Host": "localhost", "Origin": "null"}, 403, "cross_origin"),
    ({"Host": "[::1]:8080", "Origin": "http://127.0.0.1.attacker.example"}, 403, "cross_origin"),
])
def test_auth_off_refuses_non_loopback_host_and_origin(store, headers, status, code):
    """Issue 26 row 6: with auth off, a DNS-rebinding page (Host/Origin attacker.example) created a rollout (201)."""
    app = create_app({"TESTING": True, "STORE": store})
    c = app.test_client()
    before = snapshot(store)
    r = c.post("/api/v1/rollouts", json={"service": "chat", "kernels": "torch"}, headers=headers)
    assert r.status_code == status, r.get_json()
    err = r.get_json()["error"]
    assert err["code"] == code and "loopback" in err["message"]
    assert c.get("/api/v1/config", headers=headers).status_code == status   # reads too: a rebound page reads
    assert snapshot(store) == before


@pytest.mark.parametrize("host,origin", [("127.0.0.1:8080", None), ("localhost", "http://localhost:8080"),
                                         ("[::1]:9", "http://[::1]:9"), ("127.0.0.1", "https://127.0.0.1")])
def test_auth_off_serves_loopback_hosts_and_origins(store, host, origin):
    app = create_app({"TESTING": True, "STORE": store})
    headers = {"Host": host, **({"Origin": origin} if origin else {})}
    r = app.test_client().post("/api/v1/rollouts", json={"service": "chat", "kernels": "torch"}, headers=headers)
    assert r.status_code == 201, r.get_json()


def test_auth_on_does_not_restrict_the_host(client):
    r = client.get("/api/v1/me", headers={**auth("viewer"), "Host": "sits.example.com",
                                          "Origin": "https://sits.example.com"})
    assert r.status_code == 200


def test_logout_revokes_the_session_server_side(app, login_clock):
    """Issue 26 row 12: a copy of the session cookie replayed after POST /logout stayed valid for up to 12 h."""
    c = app.test_client()
    login(c, TOKENS["operator"])
    stolen = c.get_cookie("sits_session").value
    assert c.get("/api/v1/me").status_code == 200
    assert c.post("/logout", data={"csrf_token": csrf_of(c)}).status_code == 302
    replay = app.test_client()
    replay.set_cookie("sits_session", stolen)
    assert replay.get("/api/v1/me").status_code == 401
    login_clock.t += 11 * 3600   # still refused until the cookie itself would have expired
    assert replay.get("/api/v1/me").status_code == 401
    # other sessions of the same user are not affected, and logging in again works
    other = app.test_client()
    login(other, TOKENS["operator"])
    login(c, TOKENS["operator"])
    assert other.get("/api/v1/me").status_code == 200 and c.get("/api/v1/me").status_code == 200


def test_a_session_without_a_server_side_id_is_refused(app):
    """A cookie signed with the key but never issued by login (no sid) is no session."""
    c = app.test_client()
    with c.session_transaction() as s:
        s["user"] = "ada"
    assert c.get("/api/v1/me").status_code == 401


def test_one_anonymous_caller_cannot_lock_out_the_regular_users_of_its_address(client, login_clock):
    """Issue 26 row 7: 5 wrong tokens from one address (behind an Ingress: everyone's) made the right token 429 for
    300 s. Now the lock-out is per (user, address): a user known at that address keeps working; one who never
    logged in from there waits; the lock-out doubles each time."""
    assert client.get("/api/v1/me", headers=auth("admin")).status_code == 200   # ada uses this address
    for _ in range(5):
        assert client.get("/api/v1/me", headers={"Authorization": "Bearer guess"}).status_code == 401
    r = client.get("/api/v1/me", headers={"Authorization": "Bearer guess"})
    assert r.status_code == 429 and r.get_json()["error"]["code"] == "rate_limited"
    assert client.get("/api/v1/me", headers=auth("admin")).get_json()["name"] == "ada"   # known here: not locked
    assert login(client, TOKENS["admin"]).status_code == 302
    r = client.get("/api/v1/me", headers=auth("viewer"))   # never came from here: waits like the guesser
    assert r.status_code == 429 and 0 < int(r.headers["Retry-After"]) <= 301
    login_clock.t += 301
    assert client.get("/api/v1/me", headers=auth("viewer")).status_code == 200
    for _ in range(5):   # the second lock-out lasts twice as long
        client.get("/api/v1/me", headers={"Authorization": "Bearer guess"})
    login_clock.t += 301
    assert client.get("/api/v1/me", headers={"Authorization": "Bearer guess"}).status_code == 429
    assert client.get("/api/v1/me", headers=auth("viewer")).status_code == 200   # known since it succeeded
    login_clock.t += 300
    assert client.get("/api/v1/me", headers={"Authorization": "Bearer guess"}).status_code == 401


def test_login_limiter_backoff_is_capped_and_forgotten(login_clock):
    lim = LoginLimiter(limit=2, window_s=10, clock=login_clock, max_lock_s=40)
    waits = []
    for _ in range(5):
        lim.failed("a")
        lim.failed("a")
        waits.append(lim.retry_after("a"))
        login_clock.t += waits[-1]
    assert waits == [10, 20, 40, 40, 40]
    login_clock.t += 51   # max_lock_s + window without a failure: back to the first step
    lim.failed("a")
    lim.failed("a")
    assert lim.retry_after("a") == 10 and lim.retry_after("b") == 0
