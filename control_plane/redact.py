"""Credentials out of text that is printed or stored: URLs' user:password@ and secret-looking query parameters.

`redact_url(url)` for one URL, `redact(text)` for any message that may quote URLs (errors from requests/httpx do).
Pure; used by the worker's log, stored events and every CLI output that can show a URL.
"""
from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit, urlunsplit

MASK = "***"
_SECRET_PARAMS = re.compile(r"(?i)^(.*(token|secret|passw|pwd|key|sig|auth|credential).*)$")
# scheme://userinfo@ anywhere in text (userinfo: no '/', '@' or whitespace)
_USERINFO_RE = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^/@\s]+)@")
_QUERY_SECRET_RE = re.compile(
    r"(?P<key>[?&](?:[^=&#\s]*(?:token|secret|passw|pwd|key|sig|auth|credential)[^=&#\s]*)=)(?P<value>[^&#\s]*)",
    re.IGNORECASE)


def redact_url(url: str) -> str:
    """http://user:pw@host/p?token=x -> http://***@host/p?token=***; anything unparsable goes through redact()."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = MASK + "@" + netloc.rsplit("@", 1)[1]
    query = "&".join(_mask_param(p) for p in parts.query.split("&")) if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _mask_param(param: str) -> str:
    key, eq, _ = param.partition("=")
    return f"{key}={MASK}" if eq and _SECRET_PARAMS.match(key) else param


def redact(text: str) -> str:
    """Every URL credential in free text masked (messages of exceptions, log lines, stored events)."""
    text = _USERINFO_RE.sub(lambda m: m["scheme"] + MASK + "@", text)
    return _QUERY_SECRET_RE.sub(lambda m: m["key"] + MASK, text)


def split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """(url without user:password@, (user, password) or None): credentials move out of the URL before it is kept."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None
    host = parts.netloc.rsplit("@", 1)[1]
    clean = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    return clean, (unquote(parts.username or ""), unquote(parts.password or ""))
