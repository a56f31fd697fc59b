"""Store round trips on SQLite: records, Columns == in-memory metrics, pandas, runs, secrets."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from sqlalchemy import text, update

from bench.metrics import Columns, parse_goodput, summarize
from bench.store import (
    RunWriter,
    SchemaTooNewError,
    delete_run,
    get_engine,
    get_run,
    list_runs,
    load_columns,
    load_records,
    requests_dataframe,
    resolve_run,
)
from bench.store.engine import dispose_all, make_engine
from bench.store.errors import RunNotFoundError
from bench.store.models import Run
from bench.store.raw_export import export_raw
from tests.test_store_helpers import assert_same_records, make_records


@pytest.fixture
def db(tmp_path):
    yield str(tmp_path / "t.db")
    dispose_all()


def write_run(db, records, **meta):
    writer = RunWriter(db, **meta)
    for lp in sorted({r.load_point for r in records}):
        writer.start_load_point(lp, target_rate=float(lp + 1), started_ns=0, warmup_s=1.0)
    for r in records:
        writer.submit(r)
    writer.finish("completed", summarize(records))
    return writer


def test_records_round_trip_exactly(db):
    records = make_records(2500, load_points=3)
    writer = write_run(db, records, name="rt", batch_rows=400)
    assert writer.written == 2500
    assert_same_records(load_records(writer.run_id, db=db), records)
    assert_same_records(
        load_records(writer.run_id, 1, db=db), [r for r in records if r.load_point == 1]
    )


def test_metrics_from_db_equal_metrics_in_memory(db):
    records = make_records(3000, seed=3, load_points=2)
    writer = write_run(db, records)
    goodput = parse_goodput("ttft:200 tpot:30 itl:40")
    for lp in (None, 0, 1):
        mine = [r for r in records if lp is None or r.load_point == lp]
        cols = load_columns(writer.run_id, lp, db=db)
        ref = Columns.from_records(mine)
        for field in (
            "intended_ns",
            "sent_ns",
            "first_token_ns",
            "end_ns",
            "output_tokens",
            "itl_ns",
        ):
            np.testing.assert_array_equal(getattr(cols, field), getattr(ref, field))
        a = summarize(mine, goodput=goodput)
        b = summarize(cols, goodput=goodput)
        assert a.to_json() == b.to_json()
        assert a.ttft_from_intended == b.ttft_from_intended


def test_dataframe_columns_and_nulls(db):
    records = make_records(500)
    writer = write_run(db, records)
    frame = requests_dataframe(writer.run_id, db=db, gaps=True)
    assert len(frame) == 500
    assert frame["sent_ns"].tolist() == [r.sent_ns for r in records]
    assert frame["first_token_ns"].isna().sum() == sum(r.first_token_ns is None for r in records)
    assert str(frame["first_token_ns"].dtype) == "Int64"
    assert set(frame["state"].astype(str)) == {"ok", "failed"}
    assert np.array_equal(frame["chunk_gaps_ns"][3], records[3].itl_ns())
    # SQL rows agree with the blobs
    with get_engine(db).connect() as conn:
        n, s = conn.execute(text("SELECT count(*), sum(sent_ns) FROM requests")).one()
    assert (n, s) == (500, sum(r.sent_ns for r in records))


def test_metadata_list_resolve_delete(db):
    a = write_run(
        db,
        make_records(10),
        name="h100-run",
        label="sweep-a",
        model="llama-8b",
        gpu_type="H100-SXM",
        gpu_count=8,
        backend="vllm",
        scenario="rate: 5\n",
    )
    b = write_run(
        db, make_records(10), name="b200-run", model="llama-8b", gpu_type="B200", simulated=True
    )
    info = get_run("h100-run", db)
    assert (info.gpu_type, info.gpu_count, info.status, info.request_count) == (
        "H100-SXM",
        8,
        "completed",
        10,
    )
    assert info.scenario_text == "rate: 5\n" and info.hostname and info.python_version
    assert info.summary_json["completed"] == sum(r.ok for r in make_records(10))
    assert [lp.warmup_s for lp in info.load_points] == [1.0]
    assert [r.id for r in list_runs(db, gpu="h100")] == [a.run_id]
    assert {r.id for r in list_runs(db, model="LLAMA")} == {a.run_id, b.run_id}
    assert list_runs(db, label="sweep")[0].name == "h100-run"
    assert get_run("b200-run", db).simulated
    assert resolve_run(a.run_id[:6], db) == a.run_id
    with pytest.raises(RunNotFoundError):
        resolve_run("nope", db)
    assert delete_run(a.run_id, db) == 10
    assert [r.id for r in list_runs(db)] == [b.run_id]
    with get_engine(db).connect() as conn:
        for table in ("requests", "request_batches", "load_points"):
            assert (
                conn.execute(
                    text(f"SELECT count(*) FROM {table} WHERE run_id = :r"), {"r": a.run_id}
                ).scalar()
                == 0
            )


def test_dead_process_reads_as_interrupted(db):
    writer = RunWriter(db, name="dying", heartbeat_s=0.1)
    writer.submit(make_records(1)[0])
    assert get_run("dying", db).status == "running"
    writer.finish("completed")
    with get_engine(db).begin() as conn:  # as if the process died long ago, mid-run
        old = datetime.now(UTC) - timedelta(minutes=5)
        conn.execute(
            update(Run).where(Run.id == writer.run_id).values(status="running", heartbeat_at=old)
        )
    info = get_run("dying", db)
    assert (info.status, info.stored_status) == ("interrupted", "running")
    assert list_runs(db, status="interrupted")[0].id == writer.run_id


def test_api_key_is_never_stored(db, tmp_path, monkeypatch):
    key = "sk-live-7f3a9c2b1d4e5f60718293a4b5c6d7e8"
    monkeypatch.setenv("OPENAI_API_KEY", key)
    records = make_records(5)
    records[1].error_message = f"401 Unauthorized: invalid api key {key}"
    scenario = f"endpoint: https://api.example.com/v1\napi_key: {key}\nheaders:\n  Authorization: Bearer {key}\n"
    writer = RunWriter(
        db,
        name="secret",
        scenario=scenario,
        secrets=[key],
        endpoint=f"https://user:{key}@api.example.com/v1?api_key={key}&model=m",
        extra={"note": "x"},
    )
    for r in records:
        writer.submit(r)
    writer.finish()
    info = get_run("secret", db)
    assert info.endpoint == "https://api.example.com/v1?model=m"
    assert info.scenario() == {  # scrubbed by structure: it parses back
        "endpoint": "https://api.example.com/v1",
        "api_key": "***",
        "headers": {"Authorization": "***"},
    }
    dispose_all()
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("t.db*"))
    assert key.encode() not in raw


def test_newer_schema_gives_clear_error(db):
    write_run(db, make_records(2))
    dispose_all()
    engine = make_engine(db)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999_future'"))
    engine.dispose()
    with pytest.raises(SchemaTooNewError, match="upgrade tokenbench"):
        list_runs(db)


def test_migrations_match_models(db):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from bench.store.models import Base

    engine = get_engine(db)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []


@pytest.mark.parametrize("fmt", ["json", "csv", "parquet"])
def test_export_raw(db, tmp_path, fmt):
    import json

    import pandas as pd

    records = make_records(50)
    writer = write_run(db, records, name="ex")
    path = export_raw("ex", fmt, tmp_path / f"out.{fmt}", db=db)
    if fmt == "json":
        doc = json.loads(path.read_text())
        assert doc["run"]["id"] == writer.run_id and len(doc["requests"]) == 50
        assert doc["requests"][3]["chunk_gaps_ns"] == records[3].itl_ns().tolist()
    elif fmt == "csv":
        frame = pd.read_csv(path)
        assert frame["sent_ns"].tolist() == [r.sent_ns for r in records]
    else:
        frame = pd.read_parquet(path)
        assert list(frame["chunk_gaps_ns"][3]) == records[3].itl_ns().tolist()


@pytest.mark.slow
def test_every_new_database_gets_its_schema_even_when_engines_are_recycled(tmp_path):
    """The schema check once remembered engines by id(); a freed engine's id, reused by a
    new engine for a new file, made that file skip its tables."""
    import gc

    from sqlalchemy import inspect

    from bench.store.engine import dispose_all, get_engine

    for i in range(60):
        engine = get_engine(f"sqlite:///{tmp_path / f'db{i}.db'}")
        assert "runs" in inspect(engine).get_table_names(), f"database {i} has no tables"
        del engine
        dispose_all()
        gc.collect()


def test_batches_and_databases_from_before_schema_0002_still_read(tmp_path, monkeypatch):
    from alembic import command
    from sqlalchemy import create_engine, inspect

    from bench.store import codec
    from bench.store.migrations import alembic_config, current_revision, head_revision, upgrade

    records = make_records(5)
    records[0].cached_prompt_tokens, records[0].slot_wait_ns = 7, 1234
    # A batch written by the codec before the two columns existed ...
    with monkeypatch.context() as m:
        m.setattr(codec, "INT_FIELDS", tuple(
            f for f in codec.INT_FIELDS if f[0] not in ("cached_prompt_tokens", "slot_wait_ns")
        ))  # fmt: skip
        m.setattr(codec, "SQL_COLUMNS", tuple(
            c for c in codec.SQL_COLUMNS if c not in ("cached_prompt_tokens", "slot_wait_ns")
        ))  # fmt: skip
        old_blob, _ = codec.encode_batch(records)
    new_blob, _ = codec.encode_batch(records)
    # ... decodes beside a new one: the old rows say nothing (NULL), the new ones keep theirs.
    d = codec.decode_batches([(0, old_blob), (1, new_blob)])
    assert (d.ints["cached_prompt_tokens"][:5] == codec.NULL).all()
    assert d.ints["cached_prompt_tokens"][5] == 7 and d.ints["slot_wait_ns"][5] == 1234
    # A database at revision 0001 upgrades to 0002 with both columns added.
    engine = create_engine(f"sqlite:///{tmp_path / 'old.db'}")
    config = alembic_config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "0001")
    assert current_revision(engine) == "0001"
    assert upgrade(engine) == head_revision()
    columns = {c["name"] for c in inspect(engine).get_columns("requests")}
    assert {"cached_prompt_tokens", "slot_wait_ns"} <= columns
    engine.dispose()


def test_export_raw_csv_quotes_formula_text_of_every_text_column(db, tmp_path):
    """A server's error message that a spreadsheet would run goes out as text, whatever
    dtype the column comes back as (categorical, pandas 3's str), with no pandas warning."""
    import warnings

    import pandas as pd

    records = make_records(5)
    records[2].error_message = "=1+41"
    write_run(db, records, name="ex")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        path = export_raw("ex", "csv", tmp_path / "out.csv", db=db)
    assert pd.read_csv(path)["error_message"].tolist()[2] == "'=1+41"
