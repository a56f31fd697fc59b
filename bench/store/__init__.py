"""Storage: every request's timings in SQL (SQLite by default, PostgreSQL for teams).

    writer = RunWriter(db, name=..., endpoint=..., model=..., secrets=[api_key])
    writer.start_load_point(0, target_rate=10)
    writer.submit(record)            # from the event loop: O(1), never blocks
    writer.finish("completed", summary)
    cols = load_columns(writer.run_id)   # -> metrics.summarize(cols)

See models.py for the schema and codec.py for how requests and token gaps are encoded.
"""

import importlib

# name -> submodule. Imported on first use (PEP 562), so `from bench.store.errors import
# StoreError` does not pull in SQLAlchemy, Alembic and pandas (`tokenbench --help` stays fast).
_WHERE = {
    "get_engine": "engine",
    "make_engine": "engine",
    "resolve_url": "engine",
    "safe_url_text": "engine",
    "RunNotFoundError": "errors",
    "SchemaOutdatedError": "errors",
    "SchemaTooNewError": "errors",
    "StoreError": "errors",
    "upgrade": "migrations",
    "LoadPointInfo": "read",
    "RunInfo": "read",
    "delete_run": "read",
    "get_run": "read",
    "list_runs": "read",
    "load_artifact": "read",
    "load_columns": "read",
    "load_records": "read",
    "requests_dataframe": "read",
    "resolve_run": "read",
    "save_artifact": "read",
    "RunWriter": "writer",
}


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'bench.store' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"bench.store.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


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
