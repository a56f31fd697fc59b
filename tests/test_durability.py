"""Faults a run must survive with its data: SIGTERM, a full disk, a damaged or read-only
database. Each compares what was measured with what a server or the store says is true."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench.store import get_run, load_records
from bench.store.engine import dispose_all
from tests.helpers import wait_for


@pytest.fixture
def db(tmp_path):
    yield f"sqlite:///{tmp_path / 'd.db'}"
    dispose_all()


def stored_count(db: str) -> int:
    from bench.store import list_runs

    dispose_all()
    try:
        runs = list_runs(db)
    except Exception:  # noqa: BLE001 - the database may not exist yet
        return 0
    return runs[0].request_count if runs else 0


@pytest.mark.slow
def test_sigterm_stops_like_ctrl_c_and_keeps_every_finished_request(server_factory, db):
    server = server_factory("--ttft-ms", "20", "--itl-ms", "20")
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench", "run", "--base-url", server.url, "--num-prompts", "400",
         "--request-rate", "20", "--random-output-len", "10", "--db", db],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: server.stats()["finished"] >= 15, 120, "15 finished streams")
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, (proc.returncode, stderr[-2000:])
    truth = server.stats()  # the server's own counts: requests, finished streams

    dispose_all()
    run = get_run(get_run_id(db), db)
    records = load_records(run.id, db=db)
    states = [r.state for r in records]
    ok, cancelled = states.count("ok"), states.count("cancelled")
    assert (run.status, run.stored_status) == ("interrupted", "interrupted")
    assert run.request_count == len(records) == truth["requests"], "every request sent is stored"
    assert 15 <= ok < 400 and ok + cancelled == len(records)
    # Every request the server finished is stored finished, or was in flight at the stop.
    assert ok <= truth["finished"] <= ok + cancelled, (ok, cancelled, truth)


def get_run_id(db: str) -> str:
    from bench.store import list_runs

    return list_runs(db)[0].id


@pytest.mark.slow
def test_full_disk_counts_exactly_and_the_fallback_imports(fake_server, tmp_path):
    """The database fills mid-run: the count of missing records is exact, and the fallback
    file, holding every record, loads with `tokenbench import`."""
    import re

    from sqlalchemy import event, text

    from bench.drive import measure
    from bench.executor import plan_from_scenario
    from bench.scenario import parse_scenario
    from bench.store.engine import get_engine, make_engine
    from bench.store.errors import StoreError
    from bench.store.read import list_runs

    full = tmp_path / "full.db"
    engine = get_engine(make_engine(str(full)))
    with engine.connect() as conn:
        pages = conn.exec_driver_sql("PRAGMA page_count").scalar()

    @event.listens_for(engine, "connect")
    def cap(dbapi_conn, _record) -> None:  # noqa: ANN001 - a disk that fills up
        dbapi_conn.execute(f"PRAGMA max_page_count = {pages + 10}")

    engine.dispose()
    sc = parse_scenario(
        "load: {request_rate: 300, num_prompts: 800}\n"
        "workload: {input: {mean: 16}, output: {mean: 4}}\n",
        overrides={"target": {"base_url": fake_server.url, "model": "m"}, "label": "full"},
    )
    plan = plan_from_scenario(sc, api_key="sk-fallback-secret-123")
    with pytest.raises(StoreError) as err:
        measure(sc, plan=plan, db=engine)
    message = str(err.value)
    m = re.search(r"(\d+) of the (\d+) records measured are not in the database", message)
    assert m, message
    with make_engine(str(full)).connect() as conn:
        in_db = conn.execute(text("SELECT count(*) FROM requests")).scalar()
    assert int(m.group(2)) == 800 and int(m.group(1)) == 800 - in_db and in_db < 800
    assert "full" in message  # names the cause
    path = re.search(r"saved to (\S+):", message).group(1)
    lines = Path(path).read_text().splitlines()
    assert len(lines) == 801 and "sk-fallback-secret-123" not in "".join(lines)

    other = f"sqlite:///{tmp_path / 'other.db'}"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "import", path, "--db", other],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    dispose_all()
    run = get_run(list_runs(other)[0].id, other)
    assert (run.request_count, run.label, run.status) == (800, "full", "completed")
    assert run.imported_from == "tokenbench" and len(run.load_points) == 1
    records = load_records(run.id, db=other)
    assert sum(r.state == "ok" for r in records) == 800
    assert all(len(r.chunk_times_ns) >= 1 for r in records)


def damage_a_page(path: Path) -> None:
    size = path.stat().st_size
    with path.open("r+b") as f:
        f.seek(4096 * (size // 4096 // 2))
        f.write(bytes(range(256)) * 16)


def test_a_page_corrupted_sqlite_file_is_refused_not_written(tmp_path):
    from bench.store import RunWriter
    from bench.store.errors import DamagedDatabaseError
    from tests.helpers import store_sweep

    path = tmp_path / "bad.db"
    store_sweep(f"sqlite:///{path}", per_point=400)
    dispose_all()
    damage_a_page(path)
    before = path.read_bytes()
    with pytest.raises(DamagedDatabaseError, match=r"(?s)is damaged .*\.recover"):
        RunWriter(str(path), name="more")
    dispose_all()
    assert path.read_bytes() == before, "nothing was written to the damaged file"


async def test_the_service_says_a_database_is_damaged(tmp_path):
    import httpx

    from bench.store import list_runs
    from server.app import create_app
    from tests.helpers import store_sweep

    path = tmp_path / "bad.db"
    run_id = store_sweep(f"sqlite:///{path}", per_point=400)
    dispose_all()
    damage_a_page(path)
    assert list_runs(str(path))  # the run list itself still reads
    app = create_app(str(path), api_token="t" * 16, allow_hosts=[], open_reads=True)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        statuses = set()
        for lp in range(3):
            r = await c.get(f"/api/runs/{run_id}/requests?load_point={lp}&limit=5000")
            statuses.add(r.status_code)
            if r.status_code != 200:
                assert r.status_code == 503 and "damaged" in r.json()["detail"], r.text
        assert 503 in statuses
    app.state.tb.jobs.shutdown()


@pytest.mark.slow
def test_a_database_on_a_read_only_filesystem_can_be_read(tmp_path):
    """Bind-mounted read-only in a private mount namespace (root only; skipped otherwise)."""
    import shutil

    from tests.helpers import store_sweep

    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare to mount a read-only filesystem")
    folder = tmp_path / "ro"
    folder.mkdir()
    run_id = store_sweep(f"sqlite:///{folder / 'runs.db'}", per_point=5)
    dispose_all()
    # A commit still in the WAL (not checkpointed) must be read too.
    import sqlite3

    keep = sqlite3.connect(folder / "runs.db")
    keep.execute("PRAGMA wal_autocheckpoint = 0")
    keep.execute("UPDATE runs SET name = 'walrun'")
    keep.commit()
    script = (
        f"mount --bind {folder} {folder} && mount -o remount,bind,ro {folder} || exit 77; "
        f"touch {folder}/probe 2>/dev/null && exit 78; "
        f"{sys.executable} -m bench show {run_id} --db {folder / 'runs.db'}"
    )
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=120
    )
    keep.close()
    if proc.returncode == 77:
        pytest.skip(f"cannot mount here: {proc.stderr[-300:]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert run_id[:8] in proc.stdout and "walrun" in proc.stdout
