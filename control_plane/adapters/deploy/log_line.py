"""An engine's last log line as the deployers show it (status messages, the detail page's engines list): one
printable line, terminal escapes and control characters out, bounded, URL credentials masked; the access lines of
probes (`"GET /readyz HTTP/1.1" 503`) are never that line, and runs of repeated lines in a log tail collapse into
one with a count."""
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


# uvicorn's access line for a probe: `INFO:     127.0.0.1:34820 - "GET /readyz HTTP/1.1" 503`
_PROBE = re.compile(r'"(?:GET|HEAD) /(?:readyz|healthz|livez|metrics|version)(?:\?[^" ]*)? HTTP/[0-9.]+" \d{3}')
# what differs between two otherwise identical lines: the client's address and port, timestamps
_VARYING = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}:\d+\b|\d{4}-\d\d-\d\d[T ][0-9:.,]+|\b\d\d:\d\d:\d\d(?:[.,]\d+)?\b")


def is_probe_line(line: str) -> bool:
    """Whether `line` is an engine's access-log line for a health, readiness, metrics or version probe."""
    return _PROBE.search(line) is not None


def without_probe_lines(text: str) -> str:
    return "\n".join(x for x in text.splitlines() if not is_probe_line(x))


def collapse_repeats(text: str) -> str:
    """`text` with every run of lines that differ only in client ports and timestamps kept as its first line and
    `(the line above N more times)`: a log tail of 30 probe lines becomes two lines."""
    out: list[str] = []
    run_key, run = None, 0

    def flush() -> None:
        if run:
            out.append(f"  (the line above {run} more time{'s' if run > 1 else ''})")
    for line in text.splitlines():
        key = _VARYING.sub("*", line.strip())
        if key == run_key:
            run += 1
            continue
        flush()
        out.append(line)
        run_key, run = key, 0
    flush()
    return "\n".join(out)
