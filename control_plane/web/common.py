"""What every blueprint shares: the one error response, the one JSON body parser, query-parameter parsing, numbers
made JSON-safe for the wire (`num`, `nonfinite_to_null`)."""
from __future__ import annotations

import ipaddress
import json
import math
import re
from typing import Any, Mapping
from urllib.parse import urlsplit

from flask import jsonify, request

from sits.control_plane.errors import ValidationError

API_PREFIX = "/api/v1"
MAX_JSON_DEPTH = 32
_BAD_CHARS = re.compile("[\x00\ud800-\udfff]")   # NUL and lone surrogates: neither survives storage or a subprocess


def error_response(status: int, code: str, message: str, field: str | None = None):
    """`{"error": {"code", "message", "field"}}` with a 4xx/5xx status: the only shape an API error takes."""
    resp = jsonify({"error": {"code": code, "message": message, "field": field}})
    resp.status_code = status
    if status == 401:
        resp.headers["WWW-Authenticate"] = 'Bearer realm="sits"'
    return resp


def json_body() -> Any:
    """The request's body as JSON, or a ValidationError saying why not: not UTF-8, nested deeper than
    MAX_JSON_DEPTH (checked before parsing, so `[` x 30000 never reaches the recursive parser), not JSON, NaN or
    Infinity, or a string (key or value, anywhere) holding NUL or a lone surrogate (`field` names where)."""
    raw = request.get_data(cache=True)   # bounded by MAX_CONTENT_LENGTH (413 beyond)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValidationError("the body is not UTF-8 JSON", field=None) from None
    if _nesting(text) > MAX_JSON_DEPTH:
        raise ValidationError(f"the body nests arrays/objects deeper than {MAX_JSON_DEPTH} levels", field=None)
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except ValueError as e:
        where = f": {e.msg} (line {e.lineno}, column {e.colno})" if isinstance(e, json.JSONDecodeError) else f": {e}"
        raise ValidationError(f"the body is not valid JSON{where}", field=None) from None
    _check_strings(value, "")
    return value


def _nesting(text: str) -> int:
    """The deepest [/{ nesting outside strings, in one linear pass (no regex: no backtracking on odd input)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _check_strings(v: Any, at: str) -> None:
    if isinstance(v, str):
        m = _BAD_CHARS.search(v)
        if m:
            what = "a NUL byte" if m.group() == "\x00" else f"a lone surrogate (U+{ord(m.group()):04X})"
            raise ValidationError(f"{at or 'the body'} contains {what}", field=at or None)
    elif isinstance(v, dict):
        for k, x in v.items():
            key_at = f"{at}.{k}" if at else k
            if _BAD_CHARS.search(k):
                _check_strings(k, f"{at}{'.' if at else ''}<key>")
            _check_strings(x, key_at)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            _check_strings(x, f"{at}[{i}]")


def is_loopback(host: str) -> bool:
    """localhost, 127.0.0.0/8 or ::1 (brackets allowed)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_of(authority: str) -> str:
    """The host of a Host header or URL authority ("[::1]:8080" -> "::1", "localhost:80" -> "localhost")."""
    try:
        return urlsplit("//" + authority).hostname or ""
    except ValueError:
        return ""


def wants_json() -> bool:
    return request.path.startswith(API_PREFIX + "/") or request.path == API_PREFIX


def int_arg(name: str, default: int, lo: int = 0, hi: int = 10**9) -> int:
    raw = request.args.get(name)
    if raw is None or raw == "":
        return default
    try:
        v = int(raw)
    except ValueError:
        raise ValidationError(f"{name} must be an integer", field=name) from None
    if not lo <= v <= hi:
        raise ValidationError(f"{name} must be between {lo} and {hi}", field=name)
    return v


def num(x: Any, digits: int = 4) -> Any:
    """Round floats to `digits` significant digits for the wire; NaN/inf become None (JSON has neither)."""
    if isinstance(x, float):
        if not math.isfinite(x):
            return None
        return float(f"{x:.{digits}g}")
    if isinstance(x, str) and x in ("NaN", "+Inf", "-Inf"):
        return None
    return x


def nonfinite_to_null(x: Any) -> Any:
    """JSON-safe deep copy for the API: non-finite Python floats become None (JSON has neither NaN nor inf); real
    floats stay exact and the store's "NaN"/"+Inf" strings stay as it wrote them (store/codec.py
    `nonfinite_to_strings` is the store's direction)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, Mapping):
        return {str(k): nonfinite_to_null(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [nonfinite_to_null(v) for v in x]
    return x
