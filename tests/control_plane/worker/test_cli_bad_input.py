"""`sits-control` against hostile or broken input: one line on stderr and exit 2, never a traceback, nothing
half-written. Policy files, store files (garbage, truncated, read-only), secrets, kernel set names."""
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sits.control_plane.cli.main import build_parser, main
from sits.control_plane.cli.build import build_worker
from sits.control_plane.store.db import Store

REPO = Path(__file__).resolve().parents[3]


def cli(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def one_line_error(rc, err):
    assert rc == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("sits-control: error: ")


POLICIES = [
    ("checks-strings.json", '{"checks": ["abc"]}', "checks\\[0\\] must be an object"),
    ("list.json", "[1, 2]", "must be an object"),
    ("list.yaml", "- 1\n- 2\n", "must be an object"),
    ("scalar.yaml", "just text\n", "must be an object"),
    ("tag.yaml", '!!python/object/apply:os.system ["touch /tmp/sits-pwned"]\n', "not valid JSON/YAML"),
    ("tag-inside.yaml", "steps: !!python/tuple [5, 10]\n", "not valid JSON/YAML"),
    ("deep.json", "[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ("deep.yaml", "a: " + "[" * 100_000 + "]" * 100_000 + "\n", "nested too deeply"),
    ("binary.json", b"\xff\xfe\x00garbage", "not valid JSON/YAML"),
    ("huge.json", json.dumps({"report_metrics": ["m"] * 400_000}), "larger than"),
    ("many-metrics.json", json.dumps({"report_metrics": ["m"] * 10_000}), "at most 32"),
    ("tiny-interval.yaml", "check_interval_s: 1e-300\n", "check_interval_s"),
    ("huge-limit.json", '{"failure_limit": 10000000000000000000000000}', "failure_limit"),
    ("int-key.yaml", "1: 2\n", "1 is not a policy field"),
]


@pytest.mark.parametrize("name,content,msg", POLICIES, ids=[p[0] for p in POLICIES])
def test_bad_policy_files_are_one_line_errors(tmp_path, capsys, name, content, msg):
    pol = tmp_path / name
    pol.write_bytes(content if isinstance(content, bytes) else content.encode())
    db = str(tmp_path / "s.db")
    rc, _, err = cli(capsys, "rollout", "start", "--service", "chat", "--kernels", "torch", "--policy", str(pol),
                     "--store", db)
    one_line_error(rc, err)
    assert __import__("re").search(msg, err), err
    assert not Path("/tmp/sits-pwned").exists()
    with Store(db) as store:
        assert store.list() == []   # nothing was created


def _store_with_one_rollout(path: Path, capsys) -> str:
    rc, out, _ = cli(capsys, "rollout", "start", "--service", "chat", "--kernels", "torch", "--store", str(path))
    assert rc == 0
    return out.split()[1]


def _damage(kind: str, good: Path, path: Path) -> None:
    if kind == "garbage":
        path.write_bytes(b"this is not a database\n" * 100)
    elif kind == "zeros":
        path.write_bytes(b"\0" * 4096)
    elif kind == "truncated":
        path.write_bytes(good.read_bytes()[:3000])
    elif kind == "wrong header":
        data = bytearray(good.read_bytes())
        data[:16] = b"SQLite format 4\0"
        path.write_bytes(bytes(data))
    elif kind == "random pages":
        data = bytearray(good.read_bytes())
        for i in range(4096, len(data), 97):
            data[i] = (data[i] * 31 + 7) % 256
        path.write_bytes(bytes(data))


@pytest.mark.parametrize("kind", ["garbage", "zeros", "truncated", "wrong header", "random pages"])
@pytest.mark.parametrize("argv", [["rollout", "list"], ["rollout", "show", "{id}"], ["rollout", "abort", "{id}"],
                                  ["rollout", "start", "--service", "other", "--kernels", "torch"]])
def test_broken_store_files_are_one_line_errors(tmp_path, capsys, kind, argv):
    good = tmp_path / "good.db"
    rid = _store_with_one_rollout(good, capsys)
    with Store(str(good)):
        pass   # closed: the WAL is checkpointed into the file
    bad = tmp_path / "bad.db"
    _damage(kind, good, bad)
    rc, out, err = cli(capsys, *[a.format(id=rid) for a in argv], "--store", str(bad))
    if rc == 0:   # a page the command never reads may be damaged: then the answer must be right
        assert kind == "random pages"
        return
    one_line_error(rc, err)


def test_store_path_is_a_directory(tmp_path, capsys):
    rc, _, err = cli(capsys, "rollout", "list", "--store", str(tmp_path))
    one_line_error(rc, err)
    assert "directory" in err


def _unprivileged() -> list[str]:
    if os.geteuid() != 0:
        return []
    if not shutil.which("setpriv"):
        pytest.skip("running as root without setpriv: file permissions cannot be tested")
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def _run_cli(*argv, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([*_unprivileged(), sys.executable, "-m", "sits.control_plane.cli", *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=60, env=env)


@pytest.fixture
def shared_dir():
    """A directory other users can enter (pytest's own tmp dirs are 0700)."""
    d = Path(tempfile.mkdtemp(prefix="sits-ro-", dir="/tmp"))
    os.chmod(d, 0o755)
    yield d
    for p in [d, *d.rglob("*")]:
        os.chmod(p, 0o755)
    shutil.rmtree(d)


@pytest.mark.parametrize("readonly", ["file", "directory", "both"])
def test_read_only_stores_can_be_listed_and_refuse_writes_in_one_line(shared_dir, capsys, readonly):
    d = shared_dir / "ro"
    d.mkdir()
    db = d / "s.db"
    rid = _store_with_one_rollout(db, capsys)
    if readonly in ("file", "both"):
        os.chmod(db, 0o444)
    if readonly in ("directory", "both"):
        os.chmod(d, 0o555)
    try:
        unreadable = _run_cli("rollout", "list", "--store", str(db) + "-nope/s.db")
        one_line_error(unreadable.returncode, unreadable.stderr)
        listed = _run_cli("rollout", "list", "--store", str(db))
        assert listed.returncode == 0 and rid in listed.stdout, listed.stderr
        shown = _run_cli("rollout", "show", rid, "--store", str(db))
        assert shown.returncode == 0 and f"rollout {rid}" in shown.stdout, shown.stderr
        for argv in (["rollout", "abort", rid], ["rollout", "start", "--service", "other", "--kernels", "torch"]):
            p = _run_cli(*argv, "--store", str(db))
            one_line_error(p.returncode, p.stderr)
            assert "not writable" in p.stderr
    finally:
        os.chmod(d, 0o755)
        os.chmod(db, 0o644)


# ---- secrets ----

def test_secret_flags_are_gone_and_files_or_env_work(tmp_path, monkeypatch):
    parser = build_parser()
    for flag in ("--prometheus-password", "--prometheus-token"):
        with pytest.raises(SystemExit):
            parser.parse_args(["worker", flag, "x"])
    pw, tok = tmp_path / "pw", tmp_path / "tok"
    pw.write_text("from-file-pw\n")
    tok.write_text("from-file-token\n")
    base = ["worker", "--store", str(tmp_path / "s.db"), "--metrics", "prometheus",
            "--prometheus-url", "http://127.0.0.1:9"]
    w = build_worker(parser.parse_args(base + ["--prometheus-user", "u", "--prometheus-password-file", str(pw)]))
    assert w.source.config.basic_auth == ("u", "from-file-pw")
    w.deployer.close()
    w = build_worker(parser.parse_args(base + ["--prometheus-token-file", str(tok)]))
    assert w.source.config.bearer_token == "from-file-token"
    w.deployer.close()
    monkeypatch.setenv("SITS_PROMETHEUS_PASSWORD", "from-env-pw")
    monkeypatch.setenv("SITS_PIN_TOKEN", "pin-token-from-env-123")
    w = build_worker(parser.parse_args(base + ["--prometheus-user", "u"]))
    assert w.source.config.basic_auth == ("u", "from-env-pw") and w.deployer.pin_token == "pin-token-from-env-123"
    w.deployer.close()


def test_credentials_in_the_prometheus_url_never_reach_output_or_the_store(tmp_path, capsys):
    db = str(tmp_path / "s.db")
    rid = _store_with_one_rollout(tmp_path / "s.db", capsys)
    # an event written by an older version (before redaction), and a failed action quoting a URL with credentials
    with sqlite3.connect(db) as c:
        c.execute("INSERT INTO events (rollout_id, at, kind, phase, message, actor) VALUES (?, 1, 'metrics', "
                  "'pending', 'metrics unavailable: http://sits:hunter2@prom:9090/api/v1/query', '')", (rid,))
        aid = c.execute("INSERT INTO actions (rollout_id, version, kind, body, created_at) VALUES (?, 1, 'notify', "
                        "'{}', 1)", (rid,)).lastrowid
    with Store(db) as store:
        store.mark_action(aid, "failed", "ConnectionError: http://sits:hunter3@prom:9090/api?token=tok3")
    (error,) = sqlite3.connect(db).execute("SELECT error FROM actions WHERE id = ?", (aid,)).fetchone()
    assert error == "ConnectionError: http://***@prom:9090/api?token=***"
    for argv in (["rollout", "show", rid], ["rollout", "show", rid, "--json"]):
        rc, out, err = cli(capsys, *argv, "--store", db)
        assert rc == 0 and "hunter2" not in out and "***@prom:9090" in out
    p = subprocess.run([sys.executable, "-m", "sits.control_plane.cli", "worker", "--store", db, "--metrics", "prometheus",
                        "--prometheus-url", "ftp://sits:hunter4@prom"], cwd=REPO, capture_output=True, text=True,
                       timeout=60)
    one_line_error(p.returncode, p.stderr)
    assert "hunter4" not in p.stderr + p.stdout


# ---- kernel sets ----

@pytest.mark.parametrize("flag,name", [("--kernels", "no-such-kernels"), ("--production-kernels", "../../etc"),
                                       ("--kernels", "torch/../x"), ("--production-kernels", ""),
                                       ("--kernels", "x" * 65), ("--kernels", "tor ch")])
def test_unknown_or_malformed_kernel_sets_are_refused_at_creation(tmp_path, capsys, flag, name):
    db = str(tmp_path / "s.db")
    args = {"--kernels": "torch", "--production-kernels": "torch", flag: name}
    rc, _, err = cli(capsys, "rollout", "start", "--service", "chat", *[x for kv in args.items() for x in kv],
                     "--store", db)
    one_line_error(rc, err)
    assert "kernel set" in err
    with Store(db) as store:
        assert store.list() == []


def test_kernel_set_names_follow_the_registry_pattern_everywhere():
    from sits.control_plane.adapters.deploy import InvalidVariantError, VariantSpec
    from sits.control_plane.validation import _KERNEL_SET_RE
    from sits.kernels.registry import _NAME

    assert _KERNEL_SET_RE.pattern == _NAME.pattern
    with pytest.raises(InvalidVariantError, match="kernel set name"):   # a deploy from a tampered store, too
        VariantSpec(service="chat", role="canary", kernels="../../etc")


@pytest.mark.parametrize("flag,value", [("--replicas", "100000"), ("--replicas", "257"), ("--replicas", "0"),
                                        ("--gpus", "17"), ("--replicas", "9" * 5000)])
def test_absurd_replica_and_gpu_counts_are_refused_at_creation(tmp_path, capsys, flag, value):
    db = str(tmp_path / "s.db")
    try:
        rc, _, err = cli(capsys, "rollout", "start", "--service", "chat", "--kernels", "torch", flag, value,
                         "--store", db)
        one_line_error(rc, err)
    except SystemExit as e:   # argparse's own usage error (usage line + one error line), for a non-number
        rc, err = e.code, capsys.readouterr().err
        assert rc == 2 and "Traceback" not in err
    assert flag.lstrip("-") in err and len(err) < 1000
    with Store(db) as store:
        assert store.list() == []


# ---- issue 26 row 16: a short pin token stops the start, in one line ----

@pytest.mark.parametrize("command", ["worker", "serve"])
@pytest.mark.parametrize("source", ["env", "file"])
def test_a_short_pin_token_refuses_to_start(tmp_path, capsys, monkeypatch, command, source):
    short = "x" * 15
    argv = [command, "--store", str(tmp_path / "s.db")] + (["--port", "0"] if command == "serve" else [])
    if source == "env":
        monkeypatch.setenv("SITS_PIN_TOKEN", short)
    else:
        (tmp_path / "pin").write_text(short + "\n")
        argv += ["--pin-token-file", str(tmp_path / "pin")]
    rc, _, err = cli(capsys, *argv)
    one_line_error(rc, err)
    assert "at least 16 characters, got 15" in err and short not in err


# ---- issue 26 row 4 through the CLI: the same allow-list as the API ----

@pytest.mark.parametrize("flag,args", [("--args", ["--host", "0.0.0.0"]),
                                       ("--production-args", ["--fault-error-rate", "0.5"])])
def test_deployer_owned_engine_flags_are_refused_by_the_cli(tmp_path, capsys, flag, args):
    db = str(tmp_path / "s.db")
    rc, _, err = cli(capsys, "rollout", "start", "--service", "chat", "--kernels", "torch", "--store", db,
                     flag, *args)   # REMAINDER: the flag comes last
    one_line_error(rc, err)
    assert f"{args[0]} is set by the deployer" in err
    if os.path.exists(db):                                     # nothing was started
        with Store(db) as s:
            assert s.list() == []
