"""bench/api_latency.py at a tiny size: it populates a store with real checks, serves it and reports every route."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_api_latency_bench_smoke(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "api_latency.py"), "--rollouts", "20",
                          "--checks-per-rollout", "3", "--requests", "3", "--keep", str(tmp_path / "b.db")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "store: 20 rollouts, 60 checks" in out.stdout
    for route in ("list (50 newest)", "detail ", "series", "checks ?view=compact&last=10", "metrics"):
        assert re.search(re.escape(route) + r"\s+\d+\.\d\s+\d+\.\d\s+\d+", out.stdout), route
    assert "detail page first load:" in out.stdout
