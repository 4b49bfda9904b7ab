"""An engine's last log line as the deployers show it (status messages, the detail page's engines list): one
printable line, terminal escapes and control characters out, bounded, URL credentials masked."""
from __future__ import annotations

import re

from sits.control_plane.redact import redact

# CSI (colours, cursor moves), OSC (titles, links: up to BEL, ST or the line's end), the other escapes
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b\r\n]*(?:\x07|\x1b\\)?|\x1b[@-_]?")


def last_log_line(text: str, limit: int = 200) -> str:
    """The last line of `text` with something printable on it (a progress bar's last state after a carriage
    return counts as a line), without terminal escapes or control characters, whitespace collapsed, at most
    `limit` characters (cut with a trailing "…")."""
    for raw in reversed(_ANSI.sub("", text).splitlines()):
        line = " ".join("".join(ch if ch.isprintable() else " " for ch in raw).split())
        if line:
            return line if len(line) <= limit else line[:limit - 1] + "…"
    return ""


def shown_log_line(text: str, limit: int = 200) -> str:
    """last_log_line(text, limit) with URL credentials masked (redact.py) before the line is cut (a cut could
    leave half a credential unrecognised): what may be stored and shown."""
    return last_log_line(redact(text), limit)
