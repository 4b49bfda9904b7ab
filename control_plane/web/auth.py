"""Who is asking, and may they: Bearer tokens (API), the login page and its session cookie (UI), roles, CSRF.

A request is authenticated by `Authorization: Bearer TOKEN`, or by the session cookie set at login; without an auth
file every request acts as the local admin (the service then listens on loopback only). State-changing requests
that ride on a cookie (or on nothing, auth off) must carry the session's CSRF token (`X-CSRF-Token` header or a
`csrf_token` form field); with auth off a JSON body is accepted instead (a cross-site page cannot send one without
a CORS preflight, which this service never grants). Bearer requests need no CSRF token: browsers do not add them.
"""
from __future__ import annotations

import functools
import hmac
import secrets
from urllib.parse import urlsplit

from flask import (Blueprint, abort, current_app, flash, g, redirect, render_template, request, session,
                   url_for)
from flask.sessions import SecureCookieSessionInterface

from sits.control_plane.web.common import error_response, host_of, is_loopback, wants_json
from sits.control_plane.web.users import LOCAL_USER, LoginLimiter, SessionRevocations, User, Users

bp = Blueprint("auth", __name__)
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


class SessionInterface(SecureCookieSessionInterface):
    """The session cookie is Secure whenever the request came over TLS (or SESSION_COOKIE_SECURE forces it)."""

    def get_cookie_secure(self, app) -> bool:
        return bool(app.config["SESSION_COOKIE_SECURE"]) or request.is_secure


class AuthFailed(Exception):
    def __init__(self, status: int, code: str, message: str, retry_after: float = 0.0) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.retry_after = status, code, message, retry_after


def loopback_only() -> None:
    """Auth off (every request is the local admin, the service listens on loopback): a request must also *say* it is
    for a loopback host, or a DNS-rebinding page (attacker.example resolving to 127.0.0.1) would act as admin from
    the operator's browser. Host not loopback: 421; Origin present and not loopback: 403. A before_request hook."""
    if users() is not None:
        return
    host = host_of(request.host)
    if not is_loopback(host):
        raise AuthFailed(421, "misdirected", f"auth is off: this service answers only for a loopback Host "
                         f"(localhost, 127.0.0.1, [::1]), not {host[:100]!r}")
    origin = request.headers.get("Origin")
    if origin is not None:
        try:
            parts = urlsplit(origin)
        except ValueError:
            parts = None
        if parts is None or parts.scheme not in ("http", "https") or not is_loopback(parts.hostname or ""):
            raise AuthFailed(403, "cross_origin", f"auth is off: requests from the page {origin[:100]!r} are "
                             "refused (only loopback origins)")


def users() -> Users | None:
    return current_app.config["SITS_USERS"]


def limiter() -> LoginLimiter:
    return current_app.extensions["sits_login_limiter"]


def revocations() -> SessionRevocations:
    return current_app.extensions["sits_revoked_sessions"]


def client_addr() -> str:
    return request.remote_addr or "?"


def csrf_token() -> str:
    tok = session.get("csrf")
    if not tok:
        tok = session["csrf"] = secrets.token_urlsafe(32)
    return tok


def _resolve() -> tuple[User | None, str]:
    """(user, how): how is "bearer", "session", "none" (auth off) or "" (anonymous)."""
    header = request.headers.get("Authorization")
    table = users()
    if table is None:
        return LOCAL_USER, "none"
    if header is not None:
        scheme, _, token = header.partition(" ")
        return authenticate_token(token.strip() if scheme.lower() == "bearer" else None), "bearer"
    name = session.get("user")
    if name:
        sid = session.get("sid")
        user = table.get(name)
        if user is not None and isinstance(sid, str) and not revocations().revoked(sid):
            return user, "session"
        session.pop("user", None)   # removed from the auth file since login, logged out, or a cookie without a sid
    return None, ""


def authenticate_token(token: str | None) -> User:
    """The user of an API token, limited like the login page (LoginLimiter: per address with backoff, a user's
    known address passes a lock-out); AuthFailed otherwise. Also for a token that cannot travel in a header (a
    Flagger webhook's metadata: Flagger sends no headers)."""
    user = users().authenticate(token) if token else None
    addr = client_addr()
    wait = limiter().retry_after(addr, user.name if user else None)
    if wait > 0:
        raise AuthFailed(429, "rate_limited", f"too many failed logins from {addr}; try again in {wait:.0f} s", wait)
    if user is None:
        limiter().failed(addr)
        raise AuthFailed(401, "unauthorized", "invalid token (send Authorization: Bearer TOKEN)")
    limiter().succeeded(addr, user.name)
    return user


def use_token(token: str) -> None:
    """Authenticate this request by `token` (as if sent as a bearer token); a no-op with auth off."""
    if users() is not None and "sits_user" not in g:
        g.sits_user, g.sits_auth = authenticate_token(token), "bearer"


def current_user() -> User | None:
    if "sits_user" not in g:
        g.sits_user, g.sits_auth = _resolve()
    return g.sits_user


def _csrf_ok() -> bool:
    if g.sits_auth == "bearer":
        return True
    if g.sits_auth == "none" and request.is_json:
        return True
    sent = request.headers.get("X-CSRF-Token") or request.form.get("csrf_token", "")
    expected = session.get("csrf", "")
    return bool(expected) and hmac.compare_digest(str(sent), str(expected))


def require(role: str = "viewer"):
    """View decorator: 401 without a user (the UI redirects to the login page), 403 below `role`, 403 when a
    state-changing request lacks its CSRF token."""
    def wrap(view):
        @functools.wraps(view)
        def inner(*args, **kwargs):
            user = current_user()
            if user is None:
                if wants_json():
                    return error_response(401, "unauthorized", "log in or send Authorization: Bearer TOKEN")
                return redirect(url_for("auth.login", next=request.full_path.rstrip("?")))
            if request.method not in SAFE_METHODS and not _csrf_ok():
                if wants_json():
                    return error_response(403, "csrf", "missing or wrong CSRF token (X-CSRF-Token header)")
                abort(403, "missing or wrong CSRF token: reload the page and try again")
            if not user.can(role):
                msg = (f"{user.name} is {'an' if user.role[0] in 'aeiou' else 'a'} {user.role}; "
                       f"this needs the {role} role")
                if wants_json():
                    return error_response(403, "forbidden", msg)
                abort(403, msg)
            return view(*args, **kwargs)
        return inner
    return wrap


def _safe_next(target: str | None) -> str:
    """Only same-site relative paths (no open redirect to another host)."""
    if not target:
        return url_for("ui.rollouts")
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not target.startswith("/") or target.startswith("//"):
        return url_for("ui.rollouts")
    return target


@bp.route("/login", methods=["GET", "POST"])
def login():
    if users() is None:
        return redirect(url_for("ui.rollouts"))
    error, status = None, 200
    if request.method == "POST":
        addr = client_addr()
        sent = request.form.get("csrf_token", "")
        user = users().authenticate(request.form.get("token", "").strip())
        wait = limiter().retry_after(addr, user.name if user else None)
        if not session.get("csrf") or not hmac.compare_digest(sent, session.get("csrf", "")):
            error, status = "Your session expired. Please try again.", 400
        elif wait > 0:
            error, status = f"Too many failed attempts. Try again in {wait:.0f} s.", 429
        elif user is None:
            limiter().failed(addr)
            error, status = "That token is not valid.", 401
        else:
            limiter().succeeded(addr, user.name)
            session.clear()
            session.permanent = True
            session["user"] = user.name
            session["sid"] = secrets.token_urlsafe(16)   # what logout revokes server-side
            session["csrf"] = secrets.token_urlsafe(32)
            flash(f"Signed in as {user.name} ({user.role}).")
            return redirect(_safe_next(request.form.get("next")))
    resp = current_app.make_response((render_template("login.html", error=error,
                                                      next=_safe_next(request.values.get("next"))), status))
    if status == 429:
        resp.headers["Retry-After"] = str(int(wait) + 1)
    return resp


@bp.route("/logout", methods=["POST"])
def logout():
    sent = request.form.get("csrf_token", "")
    if session.get("csrf") and hmac.compare_digest(sent, session["csrf"]):
        if isinstance(session.get("sid"), str):
            revocations().revoke(session["sid"])   # a copy of this cookie replayed later is refused
        session.clear()
    return redirect(url_for("auth.login", signed_out=1) if users() is not None else url_for("ui.rollouts"))
