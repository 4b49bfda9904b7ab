"""The one reader of operator-named small files: regular files only, never more than limit + 1 bytes read."""
import os

import pytest

from sits.control_plane.small_files import FileTooLargeError, read_small_file


def test_reads_a_small_regular_file_and_refuses_a_larger_one(tmp_path):
    p = tmp_path / "policy.yaml"
    p.write_bytes(b"steps: [10, 100]\n")
    assert read_small_file(p, 100) == b"steps: [10, 100]\n"
    with pytest.raises(FileTooLargeError):
        read_small_file(p, 5)


def test_a_fifo_a_device_or_a_folder_is_refused_at_once(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)   # no writer: a plain open() would block here for ever
    for path in (fifo, "/dev/zero", tmp_path):
        with pytest.raises(OSError):
            read_small_file(path, 1 << 20)
