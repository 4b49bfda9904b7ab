"""What the router accepts from a client and passes on: request targets, headers, and who may pin a variant.

Pure functions over ASGI-style byte pairs; the router (proxy.py) calls them for every request.
- Targets: origin-form only (RFC 9112 3.2.1: absolute-path [ "?" query ]). Absolute-form, authority-form, asterisk-form
  and anything else h11 lets through (`@host:port/x`, `:port`) is refused, and the upstream URL is built from the
  backend's parsed parts plus the validated path, never by string concatenation.
- Headers: hop-by-hop headers (RFC 9110 7.6.1) and every header named in `Connection` are dropped in both directions;
  the upstream's `Date`/`Server` are replaced by the router's own; `X-Forwarded-For` carries the client's address,
  extending a client-sent chain only when the client is a trusted proxy.
- Pins: `X-SITS-Variant` is honoured only with the shared pin token (`X-SITS-Pin-Token`) or from an allow-listed
  source network, so an arbitrary client cannot steer (bad) requests onto the canary and fail a good release. The
  same callers alone may send the other internal `X-SITS-*` headers (probe, priority, tenant): stripped otherwise.
- Framing: a request with both Content-Length and Transfer-Encoding (request smuggling) is a 400 (`ambiguous_framing`).
"""
from __future__ import annotations

import hmac
import ipaddress
import re
from typing import Iterable, Sequence

import httpx

PIN_HEADER = b"x-sits-variant"
PIN_TOKEN_HEADER = b"x-sits-pin-token"
INTERNAL_PREFIX = b"x-sits-"   # headers the engines act on for the control plane's own callers
_HOP = frozenset({b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"proxy-connection",
                  b"te", b"trailer", b"transfer-encoding", b"upgrade", b"host", b"content-length"})
_FORWARDING = frozenset({b"x-forwarded-for", b"forwarded", b"x-real-ip"})
_REPLACED_IN_RESPONSE = frozenset({b"date", b"server"})   # the router's server adds its own
# absolute-path = 1*( "/" segment ), segment = *pchar, pchar = unreserved / pct-encoded / sub-delims / ":" / "@"
_PATH_RE = re.compile(rb"^(?:/(?:[A-Za-z0-9\-._~!$&'()*+,;=:@]|%[0-9A-Fa-f]{2})*)+$")
_QUERY_RE = re.compile(rb"^[\x21-\x22\x24-\x7e]*$")   # visible ASCII but '#': clients send [ ] | " unencoded


class BadTarget(ValueError):
    """The request target is not origin-form, or the URL built from it is not valid."""


Networks = tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]


def parse_networks(cidrs: Iterable[str]) -> Networks:
    """'127.0.0.1', '10.0.0.0/8', '::1' -> networks; ValueError for anything else."""
    return tuple(ipaddress.ip_network(c.strip(), strict=False) for c in cidrs)


def in_networks(host: str | None, networks: Networks) -> bool:
    if not host or not networks:
        return False
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False
    return any(addr in n for n in networks)


def parse_backend(url: str) -> httpx.URL:
    """A backend base URL: http(s), a host, no credentials, query or fragment."""
    u = httpx.URL(url.rstrip("/"))
    if u.scheme not in ("http", "https") or not u.host or u.userinfo or u.query or u.fragment:
        raise ValueError(f"backend URL {url!r} must be http(s)://host[:port][/prefix] without credentials or query")
    return u


def check_target(raw_path: bytes, query: bytes) -> None:
    """BadTarget unless the request target is origin-form."""
    if not _PATH_RE.match(raw_path) or (query and not _QUERY_RE.match(query)):
        raise BadTarget("the request target must be an absolute path (origin-form: /path?query)")


def upstream_url(base: httpx.URL, raw_path: bytes, query: bytes) -> httpx.URL:
    """base + an origin-form target, from parts; BadTarget for any other form."""
    check_target(raw_path, query)
    try:
        return base.copy_with(raw_path=base.raw_path.rstrip(b"/") + raw_path + (b"?" + query if query else b""))
    except (httpx.InvalidURL, ValueError) as e:
        raise BadTarget(f"the request target does not form a valid URL: {e}") from None


def _connection_tokens(headers: Sequence[tuple[bytes, bytes]]) -> set[bytes]:
    return {t.strip().lower() for k, v in headers if k.lower() == b"connection" for t in v.split(b",") if t.strip()}


def request_headers(headers: Sequence[tuple[bytes, bytes]], client_host: str | None,
                    trusted_proxies: Networks, trusted: bool = False) -> list[tuple[bytes, bytes]]:
    """The end-to-end headers to send upstream, with one X-Forwarded-For. The pin headers are the router's, not the
    variant's, and are dropped (the token is a secret). The other internal headers (`X-SITS-*`: probe, priority,
    tenant, ...) pass only from a `trusted` caller (pin_allowed): from anyone else they are dropped, so a client
    can neither hide its requests from the judged metrics nor claim another tenant or priority."""
    drop = _HOP | _connection_tokens(headers) | {PIN_HEADER, PIN_TOKEN_HEADER}
    out = [(k, v) for k, v in headers if k.lower() not in drop and k.lower() not in _FORWARDING
           and (trusted or not k.lower().startswith(INTERNAL_PREFIX))]
    chain = [v.strip() for k, v in headers if k.lower() == b"x-forwarded-for" and v.strip()]
    me = (client_host or "").encode()
    if chain and in_networks(client_host, trusted_proxies):   # a proxy we trust: keep its chain, append it
        out.extend((k, v) for k, v in headers if k.lower() in (b"forwarded", b"x-real-ip"))
        out.append((b"x-forwarded-for", b", ".join([*chain, me])))
    elif me:
        out.append((b"x-forwarded-for", me))
    return out


def response_headers(headers: Sequence[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The upstream's response headers to pass on (its Content-Length is kept: the body passes through unchanged)."""
    drop = (_HOP - {b"content-length"}) | _connection_tokens(headers) | _REPLACED_IN_RESPONSE
    return [(k, v) for k, v in headers if k.lower() not in drop]


def pin_allowed(headers: Sequence[tuple[bytes, bytes]], client_host: str | None, token: bytes | None,
                sources: Networks) -> bool:
    """May this caller pin a variant: the right X-SITS-Pin-Token (compared in constant time), or an allow-listed
    source address."""
    if in_networks(client_host, sources):
        return True
    if not token:
        return False
    sent = [v.strip() for k, v in headers if k.lower() == PIN_TOKEN_HEADER]
    return len(sent) == 1 and hmac.compare_digest(sent[0], token)


def declared_length(headers: Sequence[tuple[bytes, bytes]]) -> int | None:
    """The Content-Length the client declared (h11 has validated its syntax), or None."""
    for k, v in headers:
        if k.lower() == b"content-length":
            v = v.strip()
            return int(v) if len(v) <= 18 else 10 ** 18
    return None


def ambiguous_framing(headers: Sequence[tuple[bytes, bytes]]) -> bool:
    """Both Content-Length and Transfer-Encoding (RFC 9112 6.3: a proxy must not forward such a message)."""
    names = {k.lower() for k, _ in headers}
    return b"content-length" in names and b"transfer-encoding" in names


def has_body(headers: Sequence[tuple[bytes, bytes]]) -> bool:
    n = declared_length(headers)
    return bool(n) or any(k.lower() == b"transfer-encoding" for k, _ in headers)
