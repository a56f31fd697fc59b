"""The same store on a real PostgreSQL server (a throwaway database per test)."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text

from bench.metrics import summarize
from bench.store import (
    RunWriter,
    delete_run,
    get_run,
    list_runs,
    load_columns,
    load_records,
    requests_dataframe,
)
from bench.store.engine import safe_url_text
from tests.test_store_helpers import assert_same_records, make_records, pg_url  # noqa: F401

pytestmark = pytest.mark.postgres


def test_round_trip_and_metrics(pg_url):  # noqa: F811
    records = make_records(3000, seed=7, load_points=2)
    writer = RunWriter(
        pg_url,
        name="pg",
        gpu_type="B200",
        secrets=["sk-pg-secret-value"],
        endpoint="http://u:sk-pg-secret-value@h:8000/v1",
    )
    writer.start_load_point(0, target_rate=1.0)
    writer.start_load_point(1, target_rate=2.0)
    for r in records:
        writer.submit(r)
    writer.finish("completed", summarize(records))
    assert_same_records(load_records(writer.run_id, db=pg_url), records)
    assert (
        summarize(load_columns(writer.run_id, db=pg_url)).to_json() == summarize(records).to_json()
    )
    assert len(requests_dataframe(writer.run_id, 1, pg_url)) == sum(
        r.load_point == 1 for r in records
    )
    info = get_run("pg", pg_url)
    assert info.endpoint == "http://h:8000/v1" and [lp.target_rate for lp in info.load_points] == [
        1.0,
        2.0,
    ]
    assert list_runs(pg_url, gpu="b200")[0].id == writer.run_id
    engine = create_engine(pg_url)
    with engine.connect() as conn:
        dump = conn.execute(text("SELECT string_agg(t::text, '') FROM runs t")).scalar()
        n = conn.execute(text("SELECT count(*) FROM requests")).scalar()
    engine.dispose()
    assert "sk-pg-secret-value" not in dump and n == 3000
    assert delete_run(writer.run_id, pg_url) == 3000
    assert list_runs(pg_url) == []


def test_password_never_shown():
    url = "postgresql+psycopg://bench:hunter2@db.example.com/tokenbench"
    assert "hunter2" not in safe_url_text(url)
