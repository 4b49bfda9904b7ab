"""What every blueprint shares: the one error response, query-parameter parsing, JSON number cleaning."""
from __future__ import annotations

import math
from typing import Any, Mapping

from flask import jsonify, request

from control_plane.errors import ValidationError

API_PREFIX = "/api/v1"


def error_response(status: int, code: str, message: str, field: str | None = None):
    """`{"error": {"code", "message", "field"}}` with a 4xx/5xx status: the only shape an API error takes."""
    resp = jsonify({"error": {"code": code, "message": message, "field": field}})
    resp.status_code = status
    if status == 401:
        resp.headers["WWW-Authenticate"] = 'Bearer realm="sits"'
    return resp


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


def clean(x: Any) -> Any:
    """JSON-safe deep copy: NaN/inf floats (and the store's "NaN"/"+Inf" strings where a number belongs) stay as the
    store wrote them, real floats are left exact. Only non-finite Python floats are replaced (by None)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, Mapping):
        return {str(k): clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    return x
