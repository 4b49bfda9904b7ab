"""Reading a small file an operator names (a policy, a kernel catalogue, a prompt set) without trusting it.

`read_small_file(path, limit)` returns its bytes only if it is a regular file of at most `limit` bytes: a FIFO, a
device (/dev/zero) or a folder is refused at once instead of blocking or being read without end, and a larger file is
`FileTooLargeError` after reading `limit + 1` bytes at most. Callers turn both into their own errors.
"""
from __future__ import annotations

import errno
import os
import stat


class FileTooLargeError(ValueError):
    def __init__(self, path: str | os.PathLike, limit: int) -> None:
        super().__init__(f"{path} is larger than {limit} bytes")
        self.limit = limit


def read_small_file(path: str | os.PathLike, limit: int) -> bytes:
    """OSError if it cannot be opened or is not a regular file; FileTooLargeError if over `limit` bytes."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(raw) > limit:
        raise FileTooLargeError(path, limit)
    return raw
