"""The writer under failure: SIGKILL, a locked, read-only or full database."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import event, text

from bench.store import RunWriter, StoreError, get_run, list_runs
from bench.store.engine import dispose_all, make_engine
from tests.test_store_helpers import make_records

ROOT = Path(__file__).resolve().parent.parent
DRIVER = ROOT / "tests" / "data" / "store_sigkill_driver.py"


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "f.db"
    list_runs(str(path))  # create the schema
    yield path
    dispose_all()


@pytest.mark.slow
def test_sigkill_keeps_everything_older_than_a_second(db, monkeypatch):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, str(DRIVER), str(db)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        run_id = proc.stdout.readline().strip()
        assert run_id, "driver did not start"
        time.sleep(2.5)
        killed_at = time.time_ns()
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    con = sqlite3.connect(db)
    rows = con.execute(
        "SELECT request_index, intended_ns FROM requests WHERE run_id = ?", (run_id,)
    ).fetchall()
    con.close()
    indexes = sorted(i for i, _ in rows)
    assert len(indexes) > 1000
    assert indexes == list(range(len(indexes))), "stored records are not a gap-free prefix"
    newest = max(t for _, t in rows)
    assert newest >= killed_at - 1_000_000_000, (
        f"lost records submitted {(killed_at - newest) / 1e9:.2f} s before the kill"
    )
    import bench.store.read as read

    monkeypatch.setattr(read, "STALE_AFTER_S", 0.5)
    time.sleep(0.6)
    assert get_run(run_id, str(db)).status == "interrupted"


def test_locked_database_at_start_is_a_clear_error(db):
    blocker = sqlite3.connect(db, timeout=0)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        engine = make_engine(str(db), busy_timeout_s=0.2)
        t0 = time.monotonic()
        with pytest.raises(StoreError, match=rf"{db.name}.*locked"):
            RunWriter(engine, name="x")
        assert time.monotonic() - t0 < 5
    finally:
        blocker.rollback()
        blocker.close()


def test_locked_database_mid_run_raises_at_finish_and_keeps_records(db):
    engine = make_engine(str(db), busy_timeout_s=0.2)
    writer = RunWriter(engine, name="locked", flush_interval_s=0.1)
    records = make_records(300)
    blocker = sqlite3.connect(db, timeout=0)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        for r in records:
            writer.submit(r)
        t0 = time.monotonic()
        with pytest.raises(StoreError, match=r"locked.*300 records of run .* not saved"):
            writer.finish()
        assert time.monotonic() - t0 < 10
        assert writer.error is not None
        with pytest.raises(StoreError):
            writer.submit(records[0])
        assert len(writer.unsaved_records()) == 300
    finally:
        blocker.rollback()
        blocker.close()


def test_read_only_database_is_a_clear_error(db):
    url = f"sqlite:///file:{db}?mode=ro&uri=true"
    with pytest.raises(StoreError, match=r"readonly|read-only"):
        RunWriter(url, name="ro")
    assert list_runs(url) == []  # reading still works


def test_full_database_never_drops_records_silently(db):
    engine = make_engine(str(db), busy_timeout_s=0.2)
    with engine.connect() as conn:
        pages = conn.execute(text("PRAGMA page_count")).scalar()

    @event.listens_for(engine, "connect")
    def _limit(dbapi_conn, _record):
        dbapi_conn.execute(f"PRAGMA max_page_count = {pages + 40}")

    engine.dispose()
    writer = RunWriter(engine, name="full", flush_interval_s=0.05)
    records = make_records(5000)
    for r in records:
        writer.submit(r)
    with pytest.raises(StoreError, match=r"full"):
        writer.finish()
    assert writer.written + len(writer.unsaved_records()) == 5000
    assert writer.written < 5000


def test_a_missing_folder_is_created_only_for_the_default_results_folder(tmp_path, monkeypatch):
    missing = tmp_path / "nonexistent" / "dir"
    with pytest.raises(StoreError, match=f"the folder {missing} does not exist"):
        make_engine(f"sqlite:///{missing / 'x.db'}")
    assert not missing.parent.exists()  # nothing created for a mistyped path
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TOKENBENCH_DB", raising=False)
    make_engine(None)  # the default, results/tokenbench.db under the current folder
    assert (tmp_path / "results").is_dir()
    dispose_all()
