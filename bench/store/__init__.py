"""Storage: every request's timings in SQL (SQLite by default, PostgreSQL for teams).

    writer = RunWriter(db, name=..., endpoint=..., model=..., secrets=[api_key])
    writer.start_load_point(0, target_rate=10)
    writer.submit(record)            # from the event loop: O(1), never blocks
    writer.finish("completed", summary)
    cols = load_columns(writer.run_id)   # -> metrics.summarize(cols)

See models.py for the schema and codec.py for how requests and token gaps are encoded.
"""

from bench.store.engine import get_engine, make_engine, resolve_url, safe_url_text
from bench.store.errors import RunNotFoundError, SchemaOutdatedError, SchemaTooNewError, StoreError
from bench.store.migrations import upgrade
from bench.store.read import (
    LoadPointInfo,
    RunInfo,
    delete_run,
    get_run,
    list_runs,
    load_artifact,
    load_columns,
    load_records,
    requests_dataframe,
    resolve_run,
    save_artifact,
)
from bench.store.writer import RunWriter

__all__ = [
    "LoadPointInfo",
    "RunInfo",
    "RunNotFoundError",
    "RunWriter",
    "SchemaOutdatedError",
    "SchemaTooNewError",
    "StoreError",
    "delete_run",
    "get_engine",
    "get_run",
    "list_runs",
    "load_artifact",
    "load_columns",
    "load_records",
    "make_engine",
    "requests_dataframe",
    "resolve_run",
    "resolve_url",
    "safe_url_text",
    "save_artifact",
    "upgrade",
]
