"""Every benchmark script with a command line still starts: `python bench/X.py --help` exits 0. They run rarely
(some only on a GPU), so a moved name would otherwise surface only in the next benchmark session (bench/low_traffic.py
imported the demo policy from where it used to live)."""
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.name for p in (REPO / "bench").glob("*.py") if "argparse" in p.read_text())


@pytest.mark.parametrize("script", SCRIPTS)
def test_bench_script_answers_help(script):
    r = subprocess.run([sys.executable, f"bench/{script}", "--help"], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "usage" in r.stdout.lower(), r.stderr[-2000:]


def test_missing_wheels_lists_only_what_this_interpreter_lacks(tmp_path):
    for name in ("pytest-8.0.0-py3-none-any.whl", "Prometheus_Client-0.1-py3-none-any.whl",
                 "surely_not_installed_sits_pkg-1.0-py3-none-any.whl"):
        (tmp_path / name).write_bytes(b"")
    r = subprocess.run([sys.executable, str(REPO / "bench" / "missing_wheels.py"), str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert [line.rsplit("/", 1)[-1] for line in r.stdout.split()] == ["surely_not_installed_sits_pkg-1.0-py3-none-any.whl"]


def test_bundle_out_keeps_the_named_files_and_archives_the_rest_past_eight(tmp_path):
    import tarfile
    names = ["sits-demo.db", "demo.log", "report.txt"] + [f"f{i}.txt" for i in range(7)]
    for n in names:
        (tmp_path / n).write_text(n)
    r = subprocess.run(["bash", str(REPO / "bench" / "bundle_out.sh"), str(tmp_path), "sits-demo.db", "demo.log",
                        "report.txt"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.log", "others.tar.gz", "report.txt", "sits-demo.db"]
    with tarfile.open(tmp_path / "others.tar.gz") as t:
        assert sorted(t.getnames()) == [f"f{i}.txt" for i in range(7)]
        assert t.extractfile("f3.txt").read() == b"f3.txt"
    few = tmp_path / "few"   # 8 files or fewer come back as they are: nothing is packed
    few.mkdir()
    for i in range(8):
        (few / f"g{i}").write_text("x")
    assert subprocess.run(["bash", str(REPO / "bench" / "bundle_out.sh"), str(few)], timeout=60).returncode == 0
    assert sorted(p.name for p in few.iterdir()) == [f"g{i}" for i in range(8)]
