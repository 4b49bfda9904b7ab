"""Schema migrations: a file written by an older schema (v1: the store, worker.SideTables and the webhook journal
each creating their own tables, fixtures/store_v1.sql; v3: the step data inside the state, fixtures/store_v3.sql)
opens with the current code, reaches the current version with every row intact, and keeps working; a v1 file that
never had the side tables gets them; a newer file is refused."""
import json
import sqlite3
from pathlib import Path

import pytest

from sits.control_plane.rollout import Command, Observation, Phase, reconcile
from sits.control_plane.adapters.deploy.spec import DeploySpec
from sits.control_plane.store.schema import SCHEMA_VERSION, StoreError
from sits.control_plane.store.db import Store
from sits.control_plane.store.codec import rollout_from_dict
from sits.control_plane.store.schema import MIGRATIONS

V1_SQL = (Path(__file__).parent / "fixtures" / "store_v1.sql").read_text()


def v1_file(path: Path, *, side_tables: bool = True) -> str:
    db = sqlite3.connect(path)
    db.executescript(V1_SQL)
    if not side_tables:   # a v1 file no worker or journaled notifier ever opened
        db.executescript("DROP TABLE rollout_specs; DROP TABLE commands; DROP TABLE deliveries;")
    db.close()
    return str(path)


def version(path: str) -> int:
    db = sqlite3.connect(path)
    try:
        return db.execute("PRAGMA user_version").fetchone()[0]
    finally:
        db.close()


def test_the_fixture_is_a_v1_file(tmp_path):
    path = v1_file(tmp_path / "v1.db")
    assert version(path) == 1 and SCHEMA_VERSION == 6 and sorted(MIGRATIONS) == [1, 2, 3, 4, 5]
    db = sqlite3.connect(path)
    assert "by" in {r[1] for r in db.execute("PRAGMA table_info(commands)")}
    assert "actor" not in {r[1] for r in db.execute("PRAGMA table_info(events)")}
    db.close()


def test_a_v1_file_migrates_with_its_data_intact(tmp_path):
    path = v1_file(tmp_path / "v1.db")
    raw = sqlite3.connect(path)
    before = {t: raw.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
              for t in ("rollouts", "checks", "events", "actions", "rollout_specs", "commands", "deliveries")}
    evidence = raw.execute("SELECT evidence FROM checks WHERE rollout_id = 'chat-1' AND seq = 1").fetchone()[0]
    raw.close()
    with Store(path) as s:
        assert s.migrated_from == 1 and version(path) == SCHEMA_VERSION
        chat = s.get("chat-1")
        assert chat.phase is Phase.PROMOTING and chat.checks == 1 and chat.version == 4
        assert [r.id for r in s.list()] == ["search-1", "chat-1"] and s.count(active=True) == 2
        # the spec the v1 worker wrote, read by the store
        assert s.spec("chat-1") == DeploySpec(replicas=2, canary_args=("--seed", "7"))
        assert s.spec("search-1") == DeploySpec()
        # checks: the evidence row is byte for byte what v1 stored
        assert s.check("chat-1", 1)["decision"] == "promote" and s.check_summaries("chat-1")[0]["seq"] == 1
        db = sqlite3.connect(path)
        assert db.execute("SELECT evidence FROM checks WHERE seq = 1").fetchone()[0] == evidence
        after = {t: db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in before}
        db.close()
        assert after == before
        # events gained an empty actor; commands kept theirs (the `by` column is now `actor`)
        events = s.events("chat-1")
        assert events and all(e["actor"] == "" for e in events) and events[0]["kind"] == "phase"
        assert s.commands.next("chat-1")[1:] == (Command.PAUSE, "alice")
        assert [c["command"] for c in s.commands.pending("chat-1")] == ["pause"]   # the consumed resume is not
        # deliveries: found by rollout without reading JSON in SQL; one sent, one pending
        log = s.deliveries.of_rollout("chat-1")
        assert [(d["event"], d["status"], d["key"]) for d in log] == [("started", "sent", "chat-1:3"),
                                                                    ("step", "pending", "chat-1:6")]
        assert s.deliveries.of_rollout("search-1") == []
        pending = [a for _, a in s.pending_actions("chat-1")]
        assert len(pending) == before["actions"] - 3          # three were marked done by the v1 code
        # and the migrated file keeps working: reconcile, save, commands, leases
        r, actions = reconcile(chat, None, 2000.0)
        saved = s.save(r, actions)
        assert s.get("chat-1") == saved and saved.phase is Phase.SUCCEEDED
        assert s.leases.acquire("search-1", "w1", 30.0, now=0.0) and s.leases.get("search-1") == ("w1", 30.0)
    with Store(path) as s:                                    # opening it again migrates nothing
        assert s.migrated_from == SCHEMA_VERSION and s.get("chat-1").phase is Phase.SUCCEEDED


def test_a_v1_file_without_the_side_tables_gets_them(tmp_path):
    path = v1_file(tmp_path / "bare.db", side_tables=False)
    with Store(path) as s:
        assert s.spec("chat-1") == DeploySpec()               # no spec was ever written: the default
        assert s.commands.add("chat-1", "abort", "carol") == 1 and s.commands.next("chat-1") == (1, Command.ABORT,
                                                                                               "carol")
        assert s.deliveries.of_rollout("chat-1") == []
        assert s.deliveries.record("t", "k", "chat-1", {"event": "step", "at": 1.0, "key": "k"}, limit=10) is True
        assert [d["key"] for d in s.deliveries.of_rollout("chat-1")] == ["k"]


def test_a_new_file_and_memory_reach_the_same_schema(tmp_path):
    def schema(db):
        return sorted(tuple(r) for r in db.execute("SELECT type, name, sql FROM sqlite_master "
                                                   "WHERE name NOT LIKE 'sqlite_%'"))
    with Store(str(tmp_path / "new.db")) as f, Store(":memory:") as m:
        assert f.migrated_from == 0 == m.migrated_from
        assert schema(f._db.conn) == schema(m._db.conn)
    migrated = v1_file(tmp_path / "v1.db", side_tables=False)
    Store(migrated).close()
    db = sqlite3.connect(migrated)
    got = {name: sql for _, name, sql in schema(db)}
    db.close()
    with Store(":memory:") as m:
        want = {name: sql for _, name, sql in schema(m._db.conn)}
    assert got == want and "leases" in got                    # the same statements whichever way it came


def test_refuses_a_newer_schema(tmp_path):
    path = str(tmp_path / "n.db")
    Store(path).close()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(StoreError, match="newer"):
        Store(path)


def test_listings_newest_first_use_an_index(tmp_path):
    """Version 3: choosing a page of rollouts reads an index, not every row's state."""
    with Store(str(tmp_path / "s.db")) as s:
        pass
    db = sqlite3.connect(str(tmp_path / "s.db"))
    try:
        for where in ("", " WHERE service = 'chat'", " WHERE phase = 'progressing'"):
            plan = " ".join(r[-1] for r in db.execute(f"EXPLAIN QUERY PLAN SELECT id FROM rollouts{where} "
                                                        "ORDER BY created_at DESC, id LIMIT 50"))
            assert "USING" in plan and "INDEX" in plan and "TEMP B-TREE" not in plan, (where, plan)
        plan = " ".join(r[-1] for r in db.execute("EXPLAIN QUERY PLAN SELECT rollout_id, outcome, COUNT(*) FROM "
                                                   "checks GROUP BY rollout_id, outcome"))
        assert "COVERING INDEX checks_outcome" in plan, plan
    finally:
        db.close()


V3_SQL = (Path(__file__).parent / "fixtures" / "store_v3.sql").read_text()


def test_a_v3_file_moves_the_step_data_out_of_the_state(tmp_path):
    """Version 4: the step data written inside the state by the v3 code (fixtures/store_v3.sql) moves to its own
    row, with the version of the state it came from; the rollout loads exactly as the v3 code stored it."""
    path = str(tmp_path / "v3.db")
    raw = sqlite3.connect(path)
    raw.executescript(V3_SQL)
    states = {rid: (json.loads(state), v) for rid, state, v in raw.execute("SELECT id, state, version FROM rollouts")}
    evidence = raw.execute("SELECT evidence FROM checks").fetchall()
    raw.close()
    assert version(path) == 3 and states["chat-1"][0]["data"] and states["search-1"][0]["data"] == {}
    with Store(path) as s:
        assert s.migrated_from == 3 and version(path) == SCHEMA_VERSION
        for rid, (state, v) in states.items():
            assert s.get(rid) == rollout_from_dict(state, v)       # the v3 codec's reading of the v3 row
        chat = s.get("chat-1")
        assert chat.phase is Phase.PROGRESSING and chat.checks == 1 and chat.data["canary"].requests == 600.0
        db = sqlite3.connect(path)
        assert all("data" not in json.loads(st) for st, in db.execute("SELECT state FROM rollouts"))
        assert db.execute("SELECT rollout_id, version FROM rollout_data").fetchall() == [("chat-1", chat.version)]
        assert db.execute("SELECT evidence FROM checks").fetchall() == evidence
        db.close()
        # the migrated file keeps working: a window more is added to the step's data
        v = chat.data["canary"]
        window = Observation(1035.0, 1040.0, {"canary": v, "baseline": chat.data["baseline"]}, "scrape")
        saved = s.save(*reconcile(chat, window, 1040.0))
        assert s.get("chat-1") == saved and saved.data["canary"].requests == 1200.0


def test_version_5_keeps_where_each_service_enters(tmp_path):
    """Version 5: a services table (router URL per service) that the worker writes and the views read; a v4 file
    gains it empty, and the URL survives a reopen."""
    path = str(tmp_path / "v3.db")
    raw = sqlite3.connect(path)
    raw.executescript(V3_SQL)
    raw.close()
    with Store(path) as s:
        assert s.migrated_from == 3 and version(path) == SCHEMA_VERSION and s.services.routers() == {}
        s.services.set_router("chat", "http://127.0.0.1:1234", now=1.0)
        s.services.set_router("chat", "http://127.0.0.1:5678", now=2.0)   # a restarted router: the new URL wins
    with Store(path) as s:
        assert s.services.routers() == {"chat": "http://127.0.0.1:5678"}


def test_version_6_links_retries_and_keeps_each_rollouts_engines(tmp_path):
    """Version 6: rollouts.retry_of (indexed, for "retried as") and rollout_engines; an older file's rollouts are
    retries of nothing, with no engines listed, and a retry stored after the migration links both ways."""
    path = str(tmp_path / "v3.db")
    raw = sqlite3.connect(path)
    raw.executescript(V3_SQL)
    raw.close()
    with Store(path) as s:
        assert s.migrated_from == 3 and version(path) == SCHEMA_VERSION
        old = s.get("chat-1")
        assert old.retry_of is None and s.retries_of("chat-1") == [] and s.engines.get("chat-1") is None
        s.engines.put("chat-1", [{"role": "canary", "name": "canary-0", "ready": False}], 5.0)
        s.engines.put("chat-1", [{"role": "canary", "name": "canary-0", "ready": True}], 6.0)   # the newest wins
    with Store(path) as s:
        assert s.engines.get("chat-1") == ([{"role": "canary", "name": "canary-0", "ready": True}], 6.0)
        plan = sqlite3.connect(path).execute("EXPLAIN QUERY PLAN SELECT id FROM rollouts WHERE retry_of = ?",
                                             ("chat-1",)).fetchall()
        assert "rollouts_retry_of" in str(plan)
