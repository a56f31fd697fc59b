"""Faults a run must survive with its data: SIGTERM, a full disk, a damaged or read-only
database. Each compares what was measured with what a server or the store says is true."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from bench.store import get_run, load_records
from bench.store.engine import dispose_all


@pytest.fixture
def db(tmp_path):
    yield f"sqlite:///{tmp_path / 'd.db'}"
    dispose_all()


def wait_for(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def stored_count(db: str) -> int:
    from bench.store import list_runs

    dispose_all()
    try:
        runs = list_runs(db)
    except Exception:  # noqa: BLE001 - the database may not exist yet
        return 0
    return runs[0].request_count if runs else 0


@pytest.mark.slow
def test_sigterm_stops_like_ctrl_c_and_keeps_every_finished_request(server_factory, tmp_path, db):
    sends = tmp_path / "sends.json"
    server = server_factory("--ttft-ms", "20", "--itl-ms", "20", "--sends-log", str(sends))
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench", "run", "--base-url", server.url, "--num-prompts", "400",
         "--request-rate", "20", "--random-output-len", "10", "--db", db],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: stored_count(db) >= 10, 60, "10 stored requests")
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, (proc.returncode, stderr[-2000:])
    server.stop()  # writes the server's own log of every token it sent
    truth = json.loads(sends.read_text())
    served_whole = sum(1 for tokens in truth if len(tokens) == 10)

    dispose_all()
    run = get_run(get_run_id(db), db)
    records = load_records(run.id, db=db)
    states = [r.state for r in records]
    ok, cancelled = states.count("ok"), states.count("cancelled")
    assert (run.status, run.stored_status) == ("interrupted", "interrupted")
    assert run.request_count == len(records) == len(truth), "every request sent is stored"
    assert 10 <= ok < 400 and ok + cancelled == len(records)
    # Every request the server finished is stored finished, or was in flight at the stop.
    assert ok <= served_whole <= ok + cancelled, (ok, cancelled, served_whole)


def get_run_id(db: str) -> str:
    from bench.store import list_runs

    return list_runs(db)[0].id
