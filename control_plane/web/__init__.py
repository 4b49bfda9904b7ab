"""The Flask control plane: `create_app(config=None)` (Flask tutorial style).

Config keys (besides Flask's own):
    STORE          a Store, or a path to one (default "sits.db")
    AUTH_FILE      path of the auth file (JSON/YAML); or SITS_USERS, a web.users.Users; neither: auth off
    WORKER         the Worker running beside the app (its registry is served on /metrics, /readyz checks it is
                   alive); None with --no-worker
    LOGIN_LIMIT / LOGIN_WINDOW_S / LOGIN_CLOCK   failed-login limit (5 per 300 s per address, backoff; web.users)
    SERIES_MAX_POINTS   points per chart series before thinning (300)
    POLICY_DEFAULTS     Policy fields (a dict) new rollouts get unless their body gives them (`--policy-defaults`)
    TRACING             a sits.wire.tracing.Tracing: one span per request (default: the worker's, else off)
    JUDGE_PROMETHEUS    a PrometheusConfig `POST /api/v1/judge` queries (default: the worker's Prometheus source)
    KERNEL_CATALOG      the KernelCatalog shown and validated against (default: the built-in sets; `sits-control
                        serve` passes KernelCatalog.discover(--kernel-catalog))
    LOCAL_MODELS        the engines run on this machine (the local deployer): a rollout's checkpoint path must be
                        a directory here (default False: a well-formed absolute path is all that is checked)
Views only read and write the store; the worker does everything else.
"""
from __future__ import annotations

import logging
import re
import secrets
import time
from datetime import timedelta

from flask import Flask, render_template, request
from markupsafe import Markup
from werkzeug.exceptions import HTTPException

from sits.control_plane.adapters.kernel_catalog import KernelCatalog
from sits.control_plane.errors import ConflictError, NotFoundError, ValidationError
from sits.control_plane.rollout import ROLES, Phase
from sits.control_plane.store.db import Store
from sits.control_plane.store.schema import StoreDamagedError, StoreWriteError
from sits.control_plane.view.names import SHORT_NAMES
from sits.control_plane.web import api, auth, judge, ops, ui
from sits.control_plane.web.common import error_response, wants_json
from sits.control_plane.web.present import HeadlineCache
from sits.control_plane.web.series import PointCache
from sits.control_plane.web.trace import instrument_flask
from sits.control_plane.web.users import LoginLimiter, SessionRevocations, Users

log = logging.getLogger(__name__)
MAX_BODY = 64 * 1024
# what the pages' scripts compare against (common.js: SITS.ROLES, SITS.PHASE.PAUSED) and the metric names they write
# in words (SITS.human), from the one definition
VOCABULARY = {"roles": list(ROLES), "phases": {p.name: p.value for p in Phase}, "metrics": SHORT_NAMES}
_SURROGATE = re.compile("[\ud800-\udfff]")


def create_app(config: dict | None = None) -> Flask:
    app = Flask(__name__, template_folder="templates", static_folder="static")
    app.config.update(
        SECRET_KEY=secrets.token_hex(32), STORE="sits.db", AUTH_FILE=None, SITS_USERS=None, WORKER=None,
        LOGIN_LIMIT=5, LOGIN_WINDOW_S=300.0, LOGIN_CLOCK=time.monotonic, SERIES_MAX_POINTS=300, POLICY_DEFAULTS=None,
        TRACING=None, JUDGE_PROMETHEUS=None, KERNEL_CATALOG=None, LOCAL_MODELS=False,
        MAX_CONTENT_LENGTH=MAX_BODY, SESSION_COOKIE_HTTPONLY=True, SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_NAME="sits_session", PERMANENT_SESSION_LIFETIME=timedelta(hours=12),
        JSON_SORT_KEYS=False)
    app.config.update(config or {})
    app.json.sort_keys = False
    app.json.compact = True   # JSON escapes lone surrogates (ensure_ascii); pages show them escaped too:
    app.jinja_env.finalize = _printable   # a stored "\ud800" must not make every page that shows it a 500
    if app.config["SITS_USERS"] is None and app.config["AUTH_FILE"]:
        app.config["SITS_USERS"] = Users.load(app.config["AUTH_FILE"])
    store = app.config["STORE"]
    if not isinstance(store, Store):
        store = app.config["STORE"] = Store(str(store))
    app.extensions["sits_store"] = store
    if app.config["KERNEL_CATALOG"] is None:   # serve and the demo discover the engines' sets once, and pass them
        app.config["KERNEL_CATALOG"] = KernelCatalog.shipped()
    app.extensions["sits_headlines"] = HeadlineCache()
    app.extensions["sits_points"] = PointCache()
    app.extensions["sits_login_limiter"] = LoginLimiter(app.config["LOGIN_LIMIT"], app.config["LOGIN_WINDOW_S"],
                                                        app.config["LOGIN_CLOCK"])
    app.extensions["sits_revoked_sessions"] = SessionRevocations(
        app.config["PERMANENT_SESSION_LIFETIME"].total_seconds(), app.config["LOGIN_CLOCK"])
    app.session_interface = auth.SessionInterface()
    worker = app.config["WORKER"]
    if app.config["TRACING"] is None and worker is not None:
        app.config["TRACING"] = worker.tracing
    if app.config["TRACING"] is not None:
        instrument_flask(app, app.config["TRACING"])

    app.before_request(auth.loopback_only)
    app.register_blueprint(auth.bp)
    app.register_blueprint(judge.bp)
    app.register_blueprint(api.bp)
    app.register_blueprint(ui.bp)
    app.register_blueprint(ops.bp)
    _register_errors(app)

    @app.context_processor
    def _globals():
        return {"current_user": auth.current_user(), "csrf_token": auth.csrf_token,
                "auth_on": app.config["SITS_USERS"] is not None, "vocabulary": VOCABULARY}

    @app.after_request
    def _headers(resp):
        resp.headers.setdefault("X-Content-Type-Options", "nosniff")
        resp.headers.setdefault("Referrer-Policy", "same-origin")
        if not request.path.startswith("/static/"):
            resp.headers.setdefault("Cache-Control", "no-store")
        if resp.mimetype == "text/html":
            resp.headers.setdefault("X-Frame-Options", "DENY")
            resp.headers.setdefault("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; "
                                    "style-src 'self' 'unsafe-inline'; frame-ancestors 'none'")
        return resp
    return app


def _printable(value):
    """What a template prints: strings with lone surrogates (not encodable as UTF-8) shown escaped, e.g. \\ud800;
    Markup stays Markup (tojson output is not escaped twice)."""
    if isinstance(value, str) and _SURROGATE.search(value):
        fixed = value.encode("utf-8", "backslashreplace").decode("utf-8")
        return Markup(fixed) if isinstance(value, Markup) else fixed
    return value


def _register_errors(app: Flask) -> None:
    def _typed(status: int, code: str, message: str, field: str | None = None):
        if wants_json():
            return error_response(status, code, message, field)
        return render_template("error.html", status=status, title=code.replace("_", " ").capitalize(),
                               message=message), status

    @app.errorhandler(ValidationError)
    def _validation(e: ValidationError):
        return _typed(422, "invalid", str(e), e.field)

    @app.errorhandler(NotFoundError)
    def _not_found(e: NotFoundError):
        return _typed(404, "not_found", str(e.args[0]) if e.args else "not found")

    @app.errorhandler(ConflictError)
    def _conflict(e: ConflictError):
        return _typed(409, "conflict", str(e))

    @app.errorhandler(StoreWriteError)
    def _store_unwritable(e: StoreWriteError):   # disk full or read-only: nothing was stored, retry later
        log.error("%s %s: %s", request.method, request.path, e)
        return _typed(503, "store_unavailable", "the store cannot be written now (disk full or read-only); "
                      "nothing was changed, try again later")

    @app.errorhandler(StoreDamagedError)
    def _store_damaged(e: StoreDamagedError):   # reads may still work; writes are refused until it is restored
        log.error("%s %s: %s", request.method, request.path, e)
        return _typed(503, "store_unavailable", "the store is damaged; nothing was changed. An administrator must "
                      "restore it from a backup (/readyz says what is wrong)")

    @app.errorhandler(auth.AuthFailed)
    def _auth_failed(e: auth.AuthFailed):
        resp = error_response(e.status, e.code, e.message)
        if e.retry_after:
            resp.headers["Retry-After"] = str(int(e.retry_after) + 1)
        return resp

    @app.errorhandler(HTTPException)
    def _http(e: HTTPException):
        codes = {400: "bad_request", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
                 413: "too_large", 415: "unsupported_media_type", 429: "rate_limited"}
        if wants_json():
            msg = e.description if e.code != 413 else f"request body over {app.config['MAX_CONTENT_LENGTH']} bytes"
            return error_response(e.code or 500, codes.get(e.code, "error"), msg)
        return render_template("error.html", status=e.code, title=e.name, message=e.description), e.code

    @app.errorhandler(Exception)
    def _unexpected(e: Exception):
        log.exception("unhandled error on %s %s", request.method, request.path)
        if wants_json():
            return error_response(500, "internal", "internal error (see the service log)")
        return render_template("error.html", status=500, title="Internal error",
                               message="Something went wrong; the service log has the details."), 500
